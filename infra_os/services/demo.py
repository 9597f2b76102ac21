"""The demo that `make run` seeds: a platform admin, tenants `demo` and `research`, a tenant admin
and a member. Passwords come from the environment or are generated and printed once."""

import os
import secrets
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import transaction

from infra_os.choices import RatedResource, Role
from infra_os.models import Membership, PricingPlan, ProvisioningProfile, Tenant
from infra_os.services.billing import pricing_plan_create, pricing_rate_set
from infra_os.services.provisioning import profile_create
from infra_os.services.tenancy import membership_create, tenant_create

DEMO_TENANT = "demo"


def _password(variable: str) -> tuple[str, str]:
    given = os.environ.get(variable, "")
    if given:
        return given, f"from {variable}"
    return secrets.token_urlsafe(12), f"generated; set {variable} to choose it"


@transaction.atomic
def demo_seed(*, stdout) -> None:
    user_model = get_user_model()
    admin_name = os.environ.get("OGAI_ADMIN_USERNAME", "admin")
    created: list[tuple[str, str, str, str]] = []

    admin = user_model.objects.filter(username=admin_name).first()
    if admin is None:
        password, origin = _password("OGAI_ADMIN_PASSWORD")
        admin = user_model.objects.create_superuser(
            username=admin_name, email="", password=password
        )
        created.append(("platform admin", admin_name, password, origin))

    if not Tenant.objects.filter(name=DEMO_TENANT).exists():
        demo = tenant_create(
            actor=admin, name=DEMO_TENANT, display_name="Demo",
            description="A tenant to try OGAI with.",
            gpus=8, cpu_cores=64, memory_gib=512, storage_gib=1024,
        )
        research = tenant_create(
            actor=admin, name="research", display_name="Research lab",
            description="A second tenant, to try the tenant switcher.",
            gpus=4, cpu_cores=32, memory_gib=256, storage_gib=512,
        )
        password, origin = _password("OGAI_DEMO_PASSWORD")
        for username, role in (("demo-admin", Role.ADMIN), ("demo-user", Role.MEMBER)):
            existing = user_model.objects.filter(username=username).exists()
            membership_create(
                actor=admin, tenant=demo, username=username, role=role,
                password="" if existing else password,
            )
            if not existing:
                created.append((Role(role).label.lower(), username, password, origin))
        if not Membership.objects.filter(tenant=research, user__username="demo-admin").exists():
            membership_create(actor=admin, tenant=research, username="demo-admin",
                              role=Role.ADMIN)

    _seed_operator_settings(admin)

    for what, username, password, origin in created:
        stdout.write(f"  {what:<15} {username:<12} password: {password}  ({origin})\n")


# Demo prices, per unit, in USD.
DEMO_RATES = (
    (RatedResource.GPU_HOUR, "H100", "3.50"),
    (RatedResource.GPU_HOUR, "", "2.00"),
    (RatedResource.SERVER_HOUR, "", "28.00"),
    (RatedResource.MILLION_TOKENS, "", "0.80"),
    (RatedResource.RESERVED_GPU_MONTH, "H100", "1800.00"),
)


def _seed_operator_settings(admin) -> None:
    """A default pricing plan, so usage shows on invoices, and an install profile for
    provisioning servers."""
    if not PricingPlan.objects.exists():
        plan = pricing_plan_create(actor=admin, name="standard", is_default=True,
                                   description="On-demand prices (demo)")
        for resource, match, price in DEMO_RATES:
            pricing_rate_set(actor=admin, plan=plan, resource=resource, match=match,
                             unit_price=Decimal(price))
    if not ProvisioningProfile.objects.exists():
        profile_create(actor=admin, name="ubuntu-24-04-gpu", boot_method="pxe",
                       description="Ubuntu 24.04 with the NVIDIA driver (demo)",
                       user_data="#cloud-config\npackages: [nvidia-driver-570-server]\n")
