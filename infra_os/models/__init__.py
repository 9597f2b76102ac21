from infra_os.models.audit import AuditEvent
from infra_os.models.quotas import Quota
from infra_os.models.tenancy import Membership, Tenant
from infra_os.models.tokens import ApiToken
from infra_os.models.usage import UsageRecord

__all__ = ["ApiToken", "AuditEvent", "Membership", "Quota", "Tenant", "UsageRecord"]
