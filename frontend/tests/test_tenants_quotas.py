from django.urls import reverse

from frontend.forms import QuotaForm
from infra_os.models import Quota, Tenant
from infra_os.services.quotas import quota_update


def test_platform_admin_creates_a_tenant_with_its_quota(signed_in, world):
    response = signed_in(world.operator, world.alpha).post(reverse("frontend:tenant-create"), {
        "name": "gamma", "display_name": "Gamma", "description": "Third",
        "gpus": "4", "cpu_cores": "16", "memory_gib": "64", "storage_gib": "100",
    })
    assert response.status_code == 302
    quota = Quota.objects.get(tenant__name="gamma")
    assert (quota.gpus, quota.cpu_cores, quota.memory_gib, quota.storage_gib) == (4, 16, 64, 100)


def test_duplicate_tenant_name_is_a_form_error(signed_in, world):
    response = signed_in(world.operator, world.alpha).post(reverse("frontend:tenant-create"), {
        "name": "alpha", "gpus": "0", "cpu_cores": "0", "memory_gib": "0", "storage_gib": "0",
    })
    assert response.status_code == 200
    assert "already exists" in response.context["form"].errors["name"][0]


def test_tenant_admin_cannot_create_tenants(signed_in, world):
    client = signed_in(world.alpha_admin)
    assert b"New tenant" not in client.get(reverse("frontend:tenants")).content
    response = client.post(reverse("frontend:tenant-create"), {
        "name": "gamma", "gpus": "0", "cpu_cores": "0", "memory_gib": "0", "storage_gib": "0",
    })
    assert response.status_code == 403
    assert not Tenant.objects.filter(name="gamma").exists()


def test_tenant_admin_edits_own_tenant(signed_in, world):
    client = signed_in(world.alpha_admin)
    url = reverse("frontend:tenant-edit", args=["alpha"])
    assert "is_active" not in client.get(url).context["form"].fields
    response = client.post(url, {"display_name": "Alpha Lab", "description": "Ours"})
    assert response.status_code == 302
    world.alpha.refresh_from_db()
    assert (world.alpha.display_name, world.alpha.description) == ("Alpha Lab", "Ours")


def test_member_cannot_edit_tenant(signed_in, world):
    client = signed_in(world.alpha_member)
    url = reverse("frontend:tenant-edit", args=["alpha"])
    assert client.get(url).status_code == 403
    assert client.post(url, {"display_name": "Hacked"}).status_code == 403
    world.alpha.refresh_from_db()
    assert world.alpha.display_name != "Hacked"


def test_edit_of_an_unseen_tenant_is_not_found(signed_in, world):
    response = signed_in(world.alpha_admin).get(reverse("frontend:tenant-edit", args=["beta"]))
    assert response.status_code == 404


def test_platform_admin_edits_quota_with_model_limits(signed_in, world):
    client = signed_in(world.operator, world.beta)
    response = client.post(reverse("frontend:quota-edit"), {
        "gpus": "16", "cpu_cores": "128", "memory_gib": "1024", "storage_gib": "2048",
        "gpu_model_limits": "H100=8\n\nA100 = 4\n",
    })
    assert response.status_code == 302
    world.beta.quota.refresh_from_db()
    assert world.beta.quota.gpus == 16
    assert world.beta.quota.gpu_model_limits == {"H100": 8, "A100": 4}
    page = client.get(reverse("frontend:quotas")).content.decode()
    assert "A100: 4, H100: 8" in page


def test_quota_limit_lines_are_checked(signed_in, world):
    client = signed_in(world.operator, world.beta)
    data = {"gpus": "4", "cpu_cores": "1", "memory_gib": "1", "storage_gib": "1"}
    response = client.post(reverse("frontend:quota-edit"), {**data, "gpu_model_limits": "H100"})
    assert "MODEL=COUNT" in response.context["form"].errors["gpu_model_limits"][0]
    # The service's own check (a model above the tenant's GPUs) lands on the same field.
    response = client.post(reverse("frontend:quota-edit"), {**data, "gpu_model_limits": "H100=9"})
    assert response.status_code == 200
    assert "above the tenant" in response.context["form"].errors["gpu_model_limits"][0]


def test_tenant_admin_cannot_edit_quota(signed_in, world):
    client = signed_in(world.alpha_admin)
    assert b"Edit quota" not in client.get(reverse("frontend:quotas")).content
    response = client.post(reverse("frontend:quota-edit"), {
        "gpus": "999", "cpu_cores": "1", "memory_gib": "1", "storage_gib": "1",
    })
    assert response.status_code == 403
    world.alpha.quota.refresh_from_db()
    assert world.alpha.quota.gpus != 999


def test_the_quota_form_and_page_say_that_0_cores_and_0_gib_mean_no_limit(signed_in, world):
    form = QuotaForm()
    assert "0: no CPU limit" in form.fields["cpu_cores"].help_text
    assert "0: no memory limit" in form.fields["memory_gib"].help_text
    quota_update(actor=world.operator, quota=world.alpha.quota, cpu_cores=0, memory_gib=0)
    page = signed_in(world.alpha_member).get(reverse("frontend:quotas")).content.decode()
    assert page.count("no limit") == 3  # CPU cores, memory and RDMA devices


def test_platform_admin_sets_how_long_a_tenants_logs_are_kept(signed_in, world):
    client = signed_in(world.operator, world.alpha)
    response = client.post(reverse("frontend:tenant-create"), {
        "name": "gamma", "gpus": "0", "cpu_cores": "0", "memory_gib": "0", "storage_gib": "0",
        "log_retention_days": "90",
    })
    assert response.status_code == 302
    assert Tenant.objects.get(name="gamma").log_retention_days == 90
    url = reverse("frontend:tenant-edit", args=["alpha"])
    assert client.get(url).context["form"].initial["log_retention_days"] == 30
    refused = client.post(url, {"display_name": "A", "is_active": "on",
                                "log_retention_days": "3651"})
    assert refused.status_code == 200
    assert "log_retention_days" in refused.context["form"].errors
    assert client.post(url, {"display_name": "A", "is_active": "on",
                             "log_retention_days": "7"}).status_code == 302
    world.alpha.refresh_from_db()
    assert world.alpha.log_retention_days == 7
    listing = client.get(reverse("frontend:tenants")).content.decode()
    assert "Logs kept" in listing and "7 days" in listing


def test_tenant_admins_cannot_change_log_retention(signed_in, world):
    client = signed_in(world.alpha_admin)
    url = reverse("frontend:tenant-edit", args=["alpha"])
    assert "log_retention_days" not in client.get(url).context["form"].fields
    client.post(url, {"display_name": "Alpha", "log_retention_days": "3650"})
    world.alpha.refresh_from_db()
    assert world.alpha.log_retention_days == 30
