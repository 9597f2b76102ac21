"""The demo that `make run` seeds: a platform admin, tenants `demo` and `research`, a tenant admin
and a member. Passwords come from the environment or are generated and printed once."""

import os
import secrets

from django.contrib.auth import get_user_model
from django.db import transaction

from infra_os.choices import Role
from infra_os.models import Membership, Tenant
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

    for what, username, password, origin in created:
        stdout.write(f"  {what:<15} {username:<12} password: {password}  ({origin})\n")
