"""The notebook pages (/environments/) on a fake cluster: starting from the form, the list's
Open link and buttons, stop and resume, form errors, isolation, viewers, the idle limit, and
query counts."""

import pytest
from django.urls import reverse
from django.utils.html import escape

from aistation.choices import JobState
from aistation.models import Notebook, NotebookPolicy
from aistation.services.notebooks import notebook_start
from aistation.services.scheduling import schedule_cluster

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def farm(farm):
    """The shared fake cluster, with quotas covering all of it."""
    for tenant in (farm.world.alpha, farm.world.beta):
        tenant.quota.gpus = 16
        tenant.quota.save()
    return farm


def _form(farm, **changes):
    data = {"name": "explore", "queue": str(farm.queues["alpha"].pk), "image": "",
            "gpus": "1", "gpu_model": "", "cpu": "2", "memory_mib": "4096"}
    return {**data, **changes}


def _start(farm, user=None, name="explore", gpus=1):
    user = user or farm.world.alpha_member
    return notebook_start(actor=user, tenant=farm.world.alpha, queue=farm.queues["alpha"],
                          name=name, gpus=gpus)


def _cycle(farm):
    schedule_cluster(cluster_id=farm.cluster.pk)


def test_starting_from_the_form_shows_it_waiting_then_running(signed_in, farm):
    client = signed_in(farm.world.alpha_member)
    assert client.get(reverse("frontend:notebook-start")).status_code == 200
    response = client.post(reverse("frontend:notebook-start"), _form(farm))
    notebook = Notebook.objects.get(name="explore")
    assert response.status_code == 302
    assert response.url == reverse("frontend:notebook", args=[notebook.pk])
    assert notebook.owner == farm.world.alpha_member and notebook.gpus == 1
    page = client.get(response.url).content.decode()
    assert 'data-state="waiting"' in page
    assert "every 3s" in page  # it follows the notebook while it waits
    assert reverse("frontend:job", args=[notebook.job_id]) in page
    assert 'data-event="started"' in page

    _cycle(farm)
    status = client.get(response.url, {"part": "status"}, **HTMX).content.decode()
    assert 'data-state="running"' in status
    assert f'href="/notebooks/{notebook.pk}/lab"' in status
    assert "<html" not in status


def test_the_list_shows_open_only_while_running(signed_in, farm):
    notebook = _start(farm)
    client = signed_in(farm.world.alpha_member)
    page = client.get(reverse("frontend:notebooks")).content.decode()
    assert f'data-notebook="{notebook.pk}"' in page
    assert 'data-state="waiting"' in page
    assert f'data-open="{notebook.pk}"' not in page

    _cycle(farm)
    table = client.get(reverse("frontend:notebooks"), **HTMX).content.decode()
    assert "<html" not in table and 'id="notebook-table"' in table
    assert f'data-open="{notebook.pk}"' in table
    assert f'href="/notebooks/{notebook.pk}/lab" target="_blank"' in table
    assert "stops after 60 min idle" in table and "min left" in table


def test_a_waiting_notebook_says_why(signed_in, farm):
    farm.submit(gpus=8, replicas=2)
    _cycle(farm)
    notebook = _start(farm, gpus=2)
    _cycle(farm)
    notebook.refresh_from_db()
    assert notebook.job.state == JobState.QUEUED and notebook.job.reason
    page = signed_in(farm.world.alpha_member).get(reverse("frontend:notebooks")).content.decode()
    assert escape(notebook.job.reason[1:]) in page


def test_stop_then_resume_through_the_buttons(signed_in, farm):
    notebook = _start(farm)
    _cycle(farm)
    client = signed_in(farm.world.alpha_member)
    response = client.post(reverse("frontend:notebook-stop", args=[notebook.pk]),
                           {"next": "list"})
    assert response.status_code == 302 and response.url == reverse("frontend:notebooks")
    notebook.refresh_from_db()
    assert notebook.job.state == JobState.CANCELLED
    page = client.get(reverse("frontend:notebooks")).content.decode()
    assert 'data-state="stopped"' in page and "stopped: its GPUs are freed" in page
    assert reverse("frontend:notebook-resume", args=[notebook.pk]) in page

    response = client.post(reverse("frontend:notebook-resume", args=[notebook.pk]))
    assert response.url == reverse("frontend:notebook", args=[notebook.pk])
    notebook.refresh_from_db()
    assert notebook.job.state == JobState.QUEUED
    _cycle(farm)
    page = client.get(response.url).content.decode()
    assert 'data-state="running"' in page
    assert [e.kind for e in notebook.events.all()] == ["started", "stopped", "resumed"]

    # Stopping twice is refused with a message, not an error page.
    client.post(reverse("frontend:notebook-stop", args=[notebook.pk]))
    response = client.post(reverse("frontend:notebook-stop", args=[notebook.pk]), follow=True)
    assert "is not running" in response.content.decode()


def test_delete_hides_it(signed_in, farm):
    notebook = _start(farm)
    client = signed_in(farm.world.alpha_member)
    response = client.post(reverse("frontend:notebook-delete", args=[notebook.pk]))
    assert response.url == reverse("frontend:notebooks")
    notebook.refresh_from_db()
    assert notebook.deleted
    assert client.get(reverse("frontend:notebook", args=[notebook.pk])).status_code == 404


def test_a_bad_form_re_renders_with_field_errors(signed_in, farm):
    client = signed_in(farm.world.alpha_member)
    response = client.post(reverse("frontend:notebook-start"), _form(farm, name="", gpus="-1"))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert "name" in errors and "gpus" in errors
    assert 'class="field-error"' in response.content.decode()
    assert not Notebook.objects.exists()


def test_another_tenants_member_gets_404(signed_in, farm):
    notebook = _start(farm)
    client = signed_in(farm.world.beta_member)
    for name in ("notebook",):
        assert client.get(reverse(f"frontend:{name}", args=[notebook.pk])).status_code == 404
    for name in ("notebook-stop", "notebook-resume", "notebook-delete"):
        assert client.post(reverse(f"frontend:{name}", args=[notebook.pk])).status_code == 404
    assert f'data-notebook="{notebook.pk}"' not in client.get(
        reverse("frontend:notebooks")).content.decode()
    notebook.refresh_from_db()
    assert not notebook.deleted


def test_a_viewer_sees_no_start_button_and_cannot_start(signed_in, farm):
    client = signed_in(farm.world.alpha_viewer)
    page = client.get(reverse("frontend:notebooks"))
    assert page.status_code == 200
    assert reverse("frontend:notebook-start") not in page.content.decode()
    response = client.post(reverse("frontend:notebook-start"), _form(farm))
    assert response.status_code == 403
    assert b"Viewers cannot start notebooks" in response.content
    assert not Notebook.objects.exists()


def test_the_tenant_admin_sets_the_idle_limit(signed_in, farm):
    admin = signed_in(farm.world.alpha_admin)
    assert 'id="notebook-policy"' in admin.get(reverse("frontend:notebooks")).content.decode()
    response = admin.post(reverse("frontend:notebook-policy"), {"idle_minutes": "30"},
                          follow=True)
    assert NotebookPolicy.objects.get(tenant=farm.world.alpha).idle_timeout_s == 1800
    assert "stop after 30 min idle" in response.content.decode()
    response = admin.post(reverse("frontend:notebook-policy"), {"idle_minutes": "1"},
                          follow=True)
    assert NotebookPolicy.objects.get(tenant=farm.world.alpha).idle_timeout_s == 1800
    assert "greater than or equal to 5" in response.content.decode()


def test_a_member_cannot_set_the_idle_limit(signed_in, farm):
    member = signed_in(farm.world.alpha_member)
    assert 'id="notebook-policy"' not in member.get(reverse("frontend:notebooks")).content.decode()
    response = member.post(reverse("frontend:notebook-policy"), {"idle_minutes": "30"},
                           follow=True)
    assert not NotebookPolicy.objects.exists()
    assert "Only the tenant&#x27;s admins" in response.content.decode()


def test_navigation_lists_notebooks_beside_jobs(signed_in, farm):
    response = signed_in(farm.world.alpha_member).get(reverse("frontend:notebooks"))
    sections = {section.label: [(link.label, link.active) for link in section.links]
                for section in response.context["nav_sections"]}
    assert ("Notebooks", True) in sections["Jobs"]


def test_the_list_pins_its_query_count(signed_in, farm, django_assert_max_num_queries):
    for number in range(10):
        _start(farm, name=f"crowd-{number}")
    _start(farm, user=farm.world.alpha_admin, name="admins")
    _cycle(farm)
    client = signed_in(farm.world.alpha_admin)
    with django_assert_max_num_queries(10):
        response = client.get(reverse("frontend:notebooks"))
    assert response.content.decode().count('data-notebook="') == 11
    with django_assert_max_num_queries(9):
        client.get(reverse("frontend:notebooks"), **HTMX)
