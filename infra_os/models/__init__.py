from infra_os.models.audit import AuditEvent
from infra_os.models.billing import Invoice, InvoiceLine, PricingPlan, PricingRate, Reservation
from infra_os.models.invitations import Invitation
from infra_os.models.leases import Lease
from infra_os.models.provisioning import (
    ProvisioningBatch,
    ProvisioningProfile,
    ProvisioningRun,
    ProvisioningStep,
)
from infra_os.models.quotas import Quota
from infra_os.models.servers import Bmc, InventorySnapshot, Rack, Server
from infra_os.models.tenancy import Membership, Tenant
from infra_os.models.tokens import ApiToken
from infra_os.models.usage import UsageRecord

__all__ = [
    "ApiToken", "AuditEvent", "Bmc", "InventorySnapshot", "Invitation", "Invoice", "InvoiceLine",
    "Lease", "Membership", "PricingPlan", "PricingRate", "ProvisioningBatch",
    "ProvisioningProfile", "ProvisioningRun", "ProvisioningStep", "Quota", "Rack", "Reservation",
    "Server", "Tenant", "UsageRecord",
]
