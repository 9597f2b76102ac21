"""The job, queue and cluster pages (L1, L2) on a fake cluster: who sees what, submitting,
cancelling and rerunning, the live parts (polling, logs, GPU squares) and query counts."""

import re
from types import SimpleNamespace

import pytest
from django.urls import reverse

from aistation.choices import JobState
from aistation.models import Job, Queue
from aistation.services.jobs import job_cancel, job_submit
from aistation.services.queues import queue_create
from aistation.services.scheduling import schedule_cluster
from infra_os.models import AuditEvent
from podsys.models import Cluster, Node
from podsys.services.clusters import cluster_sync_nodes

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def farm(farm):
    """The shared fake cluster, with quotas covering all of it: these tests are about pages,
    not about borrowing."""
    for tenant in (farm.world.alpha, farm.world.beta):
        tenant.quota.gpus = 16
        tenant.quota.save()
    return farm


def _pages(farm):
    job = farm.submit(name="page-job")
    return {
        "jobs": reverse("frontend:jobs"),
        "job-submit": reverse("frontend:job-submit"),
        "job": reverse("frontend:job", args=[job.pk]),
        "queues": reverse("frontend:queues"),
        "queue": reverse("frontend:queue", args=[farm.queues["alpha"].pk]),
        "clusters": reverse("frontend:clusters"),
        "cluster": reverse("frontend:cluster", args=["farm"]),
    }


# Who may open the pages --------------------------------------------------------------------

def test_anonymous_users_are_sent_to_login(client, farm):
    for url in _pages(farm).values():
        response = client.get(url)
        assert response.status_code == 302, url
        assert response.url == f"{reverse('frontend:login')}?next={url}"


def test_every_page_renders_for_a_member(signed_in, farm):
    client = signed_in(farm.world.alpha_member)
    for name, url in _pages(farm).items():
        response = client.get(url)
        assert response.status_code == 200, name
        assert 'class="sidebar"' in response.content.decode()


def test_every_page_renders_for_a_viewer_except_submit(signed_in, farm):
    client = signed_in(farm.world.alpha_viewer)
    pages = _pages(farm)
    submit = pages.pop("job-submit")
    for name, url in pages.items():
        assert client.get(url).status_code == 200, name
    response = client.get(submit)
    assert response.status_code == 403
    assert b"Viewers cannot submit jobs" in response.content


def test_navigation_lists_clusters_jobs_and_queues(signed_in, farm):
    job = farm.submit()
    response = signed_in(farm.world.alpha_member).get(reverse("frontend:job", args=[job.pk]))
    sections = {section.label: [(link.label, link.active) for link in section.links]
                for section in response.context["nav_sections"]}
    assert sections["Clusters"] == [("Clusters", False)]
    assert sections["Jobs"] == [("Jobs", True), ("Logs", False), ("Queues", False),
                                ("Notebooks", False)]
    assert sections["Toolchain"] == [("Datasets", False), ("Pipelines", False),
                                     ("Training", False)]


# Isolation ---------------------------------------------------------------------------------

def test_jobs_of_another_tenant_never_show(signed_in, farm):
    farm.submit("alpha", name="alpha-secret-job")
    beta_job = farm.submit("beta", name="beta-secret-job")
    farm.cycle()
    client = signed_in(farm.world.alpha_member)

    listing = client.get(reverse("frontend:jobs")).content.decode()
    assert "alpha-secret-job" in listing
    assert "beta-secret-job" not in listing
    # A tenant filter in the query cannot reach beta either.
    assert "beta-secret-job" not in client.get(reverse("frontend:jobs"),
                                               {"tenant": "beta"}).content.decode()

    detail = reverse("frontend:job", args=[beta_job.pk])
    assert client.get(detail).status_code == 404
    assert client.get(detail, {"part": "logs"}, **HTMX).status_code == 404
    assert client.get(detail, {"part": "status"}, **HTMX).status_code == 404
    assert client.post(reverse("frontend:job-cancel", args=[beta_job.pk])).status_code == 404
    assert client.post(reverse("frontend:job-rerun", args=[beta_job.pk])).status_code == 404
    assert client.get(reverse("frontend:queue", args=[farm.queues["beta"].pk])).status_code \
        == 404
    assert client.get(reverse("frontend:job-submit"), {"from": beta_job.pk}).status_code == 404
    queue_page = client.get(reverse("frontend:queue", args=[farm.queues["alpha"].pk]))
    assert "beta-secret-job" not in queue_page.content.decode()
    beta_job.refresh_from_db()
    assert beta_job.state == JobState.RUNNING


def test_queues_page_shows_only_the_current_tenants_queues(signed_in, farm):
    queue_create(actor=farm.world.operator, tenant=farm.world.beta, name="beta-only",
                 cluster=farm.cluster)
    response = signed_in(farm.world.alpha_member).get(reverse("frontend:queues"))
    assert [queue.tenant.name for queue in response.context["table"].data] == ["alpha"]
    assert b"beta-only" not in response.content


def test_another_tenants_private_cluster_is_hidden(signed_in, farm):
    Cluster.objects.create(name="beta-private", driver="fake", tenant=farm.world.beta)
    client = signed_in(farm.world.alpha_member)
    assert b"beta-private" not in client.get(reverse("frontend:clusters")).content
    assert client.get(reverse("frontend:cluster", args=["beta-private"])).status_code == 404
    assert b"farm" in client.get(reverse("frontend:clusters")).content


# The jobs list -----------------------------------------------------------------------------

def test_jobs_list_shows_state_gpus_and_reason(signed_in, farm):
    job = farm.submit(name="gang", gpus=2, replicas=3)
    content = signed_in(farm.world.alpha_member).get(reverse("frontend:jobs")).content.decode()
    row = content.split(f'data-job="{job.pk}"')[1].split("</tr>")[0]
    assert 'class="badge badge-info" data-state="queued"' in row
    assert "6 <span" in row and "(2\N{MULTIPLICATION SIGN}3)" in row
    assert "submitted; waiting for the scheduler" in row
    assert "alpha-member" in row
    assert f'href="/jobs/{job.pk}/"' in row


def test_jobs_list_filters_by_state(signed_in, farm):
    farm.submit(name="stays-queued", gpus=8, replicas=2)
    farm.cycle()
    cancelled = farm.submit(name="was-cancelled")
    job_cancel(actor=farm.world.alpha_member, job=cancelled)
    client = signed_in(farm.world.alpha_member)
    content = client.get(reverse("frontend:jobs"), {"state": "cancelled"}, **HTMX).content
    assert b"was-cancelled" in content
    assert b"stays-queued" not in content
    page = client.get(reverse("frontend:jobs")).content.decode()
    filter_bar = page.split('class="filter-bar"')[1].split("</form>")[0]
    assert 'name="state"' in filter_bar
    assert "multiple" not in filter_bar  # one drop-down, not a list box
    assert 'name="tenant"' not in filter_bar


def test_the_table_polls_while_a_job_is_active_and_stops_after(signed_in, farm):
    job = farm.submit()
    client = signed_in(farm.world.alpha_member)
    poller = 'hx-trigger="every 3s"'
    assert poller in client.get(reverse("frontend:jobs")).content.decode()
    partial = client.get(reverse("frontend:jobs"), **HTMX).content.decode()
    assert partial.lstrip().startswith('<div id="table-area"')
    assert poller in partial
    job_cancel(actor=farm.world.alpha_member, job=job)
    assert poller not in client.get(reverse("frontend:jobs"), **HTMX).content.decode()


def test_submit_button_only_for_members_and_admins(signed_in, farm, client):
    submit = reverse("frontend:job-submit")
    assert submit.encode() in signed_in(farm.world.alpha_member).get(
        reverse("frontend:jobs")).content
    client.logout()
    assert submit.encode() not in signed_in(farm.world.alpha_viewer).get(
        reverse("frontend:jobs")).content


def test_jobs_list_pins_its_query_count(signed_in, farm, django_assert_max_num_queries):
    for number in range(30):
        farm.submit(name=f"crowd-{number}", gpus=1)
    farm.cycle()
    client = signed_in(farm.world.alpha_member)
    with django_assert_max_num_queries(7):
        response = client.get(reverse("frontend:jobs"))
    assert response.content.decode().count('data-job="') == 25
    with django_assert_max_num_queries(5):
        client.get(reverse("frontend:jobs"), {"sort": "-gpus", "page": "2"}, **HTMX)


# The cluster page: one query more for its CPU and memory allocation, one for its environments
# (whether the caller's tenants run there); neither grows with the nodes.
@pytest.mark.parametrize(("page", "most"), [
    ("queues", 7), ("queue", 10), ("clusters", 9), ("cluster", 10), ("job", 8),
    ("job-logs", 6), ("job-status", 7),
])
def test_other_pages_pin_their_query_counts(signed_in, farm, django_assert_max_num_queries,
                                            page, most):
    jobs = [farm.submit(name=f"crowd-{number}", gpus=1) for number in range(30)]
    farm.cycle()
    for job in jobs[:5]:
        job_cancel(actor=farm.world.alpha_member, job=job)
    job = jobs[-1]
    urls = {
        "queues": (reverse("frontend:queues"), {}),
        "queue": (reverse("frontend:queue", args=[farm.queues["alpha"].pk]), {}),
        "clusters": (reverse("frontend:clusters"), {}),
        "cluster": (reverse("frontend:cluster", args=["farm"]), {}),
        "job": (reverse("frontend:job", args=[job.pk]), {}),
        "job-logs": (reverse("frontend:job", args=[job.pk]), {"part": "logs"}),
        "job-status": (reverse("frontend:job", args=[job.pk]), {"part": "status"}),
    }
    url, params = urls[page]
    client = signed_in(farm.world.alpha_member)
    with django_assert_max_num_queries(most):
        response = client.get(url, params)
    assert response.status_code == 200


# Submitting --------------------------------------------------------------------------------

SPEC = {
    "name": "train-small", "command": "python train.py --lr 3e-4 --note 'two words'",
    "env": "SEED=1\nHF_HOME=/data/hf", "image": "", "gpus_per_replica": "2", "gpu_model": "",
    "cpu_per_replica": "4", "memory_mib_per_replica": "8192", "replicas": "1", "priority": "",
    "max_restarts": "1", "time_limit_s": "3600",
}


def test_submitting_the_form_creates_a_queued_job(signed_in, farm):
    client = signed_in(farm.world.alpha_member)
    page = client.get(reverse("frontend:job-submit")).content.decode()
    assert "without a shell" in page
    assert "default (cluster farm)" in page
    response = client.post(reverse("frontend:job-submit"),
                           {**SPEC, "queue": farm.queues["alpha"].pk})
    job = Job.objects.get()
    assert response.status_code == 302
    assert response.url == reverse("frontend:job", args=[job.pk])
    assert job.state == JobState.QUEUED
    assert job.tenant == farm.world.alpha
    assert job.owner == farm.world.alpha_member
    assert job.command == ["python", "train.py", "--lr", "3e-4", "--note", "two words"]
    assert job.env == {"SEED": "1", "HF_HOME": "/data/hf"}
    assert (job.gpus_per_replica, job.cpu_per_replica, job.memory_mib_per_replica) == (2, 4, 8192)
    assert (job.max_restarts, job.time_limit_s, job.priority) == (1, 3600, 0)
    assert f"Job {job.pk} (train-small) submitted" in client.get(response.url).content.decode()


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"gpus_per_replica": "99"}, "gpus_per_replica", "the largest node of cluster farm has 8"),
    ({"gpus_per_replica": "8", "replicas": "3"}, "replicas", "cluster farm has 16"),
    ({"gpu_model": "B200"}, "gpu_model", "GPU model 'B200'"),
    ({"command": "python -c 'unclosed"}, "command", "No closing quotation"),
    ({"command": "   "}, "command", "required"),
    ({"env": "not a pair"}, "env", "KEY=VALUE"),
    ({"env": "1BAD=x"}, "env", "KEY=VALUE"),
    ({"cpu_per_replica": "0"}, "cpu_per_replica", "greater than or equal to 0.01"),
])
def test_a_bad_form_shows_field_errors_and_creates_nothing(signed_in, farm, change, field,
                                                           message):
    client = signed_in(farm.world.alpha_member)
    response = client.post(reverse("frontend:job-submit"),
                           {**SPEC, "queue": farm.queues["alpha"].pk, **change})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors, errors
    assert message in " ".join(errors[field])
    assert 'class="field-error"' in response.content.decode()
    assert not Job.objects.exists()


def test_submit_offers_only_the_current_tenants_open_queues(signed_in, farm):
    closed = queue_create(actor=farm.world.operator, tenant=farm.world.alpha, name="closed",
                          cluster=farm.cluster)
    Queue.objects.filter(pk=closed.pk).update(is_active=False)
    client = signed_in(farm.world.alpha_member)
    form = client.get(reverse("frontend:job-submit")).context["form"]
    assert list(form.fields["queue"].queryset) == [farm.queues["alpha"]]
    response = client.post(reverse("frontend:job-submit"),
                           {**SPEC, "queue": farm.queues["beta"].pk})
    assert "queue" in response.context["form"].errors
    assert not Job.objects.exists()


def test_a_viewer_cannot_submit(signed_in, farm):
    response = signed_in(farm.world.alpha_viewer).post(
        reverse("frontend:job-submit"), {**SPEC, "queue": farm.queues["alpha"].pk})
    assert response.status_code == 403
    assert not Job.objects.exists()


def test_submit_a_copy_prefills_the_form(signed_in, farm):
    job = farm.submit(name="original", gpus=2, env={"A": "1"})
    form = signed_in(farm.world.alpha_member).get(
        reverse("frontend:job-submit"), {"from": job.pk}).context["form"]
    assert form.initial["name"] == "original"
    assert form.initial["command"] == "python train.py"
    assert form.initial["env"] == "A=1"
    assert form.initial["gpus_per_replica"] == 2


def test_the_queue_page_submits_to_its_queue(signed_in, farm):
    urgent = queue_create(actor=farm.world.operator, tenant=farm.world.alpha, name="urgent",
                          cluster=farm.cluster)
    client = signed_in(farm.world.alpha_member)
    link = f"/jobs/new/?queue={urgent.pk}"
    assert link in client.get(reverse("frontend:queue", args=[urgent.pk])).content.decode()
    assert client.get(link).context["form"].initial == {"queue": urgent.pk}


# The job page ------------------------------------------------------------------------------

def test_job_page_shows_spec_attempts_and_history(signed_in, farm):
    job = farm.submit(name="shown", gpus=4, env={"SEED": "7"})
    farm.cycle()
    content = signed_in(farm.world.alpha_member).get(
        reverse("frontend:job", args=[job.pk])).content.decode()
    assert 'data-state="running"' in content
    assert "python train.py" in content
    assert "SEED=7" in content
    assert 'data-attempt="1"' in content
    assert "fake-node-00" in content
    history = content.split('id="job-history"')[1]
    assert history.count("→") >= 2  # queued → admitted → running
    assert "Cancel job" in content
    assert "Rerun" not in content
    # The page follows the job while it lives.
    assert f'hx-get="/jobs/{job.pk}/?part=status"' in content
    assert 'hx-select-oob="#job-state,#job-reason,#job-actions,#job-history"' in content


def test_job_page_shows_the_service_the_job_has_had(signed_in, farm):
    job = farm.submit(gpus=4)
    farm.cycle()
    Job.objects.filter(pk=job.pk).update(attained_gpu_s=5040)  # earlier attempts: 1.4 h
    content = signed_in(farm.world.alpha_member).get(
        reverse("frontend:job", args=[job.pk])).content.decode()
    assert "<dt>Service</dt>" in content
    assert "1.4 GPU-hours" in content


def test_a_waiting_job_says_why_and_where_it_stands(signed_in, farm):
    farm.submit(name="big", gpus=8, replicas=2)
    farm.cycle()
    waiting = farm.submit(name="behind", gpus=8)
    farm.cycle()
    waiting.refresh_from_db()
    assert waiting.state == JobState.QUEUED
    content = signed_in(farm.world.alpha_member).get(
        reverse("frontend:job", args=[waiting.pk])).content.decode()
    reason = content.split('id="job-reason"')[1].split("</p>")[0]
    assert waiting.reason and waiting.reason[1:] in reason
    if waiting.position:
        assert f"Position {waiting.position} in queue default" in reason


def test_status_part_is_a_fragment_that_stops_polling_once_final(signed_in, farm):
    job = farm.submit()
    client = signed_in(farm.world.alpha_member)
    url = reverse("frontend:job", args=[job.pk])
    live = client.get(url, {"part": "status"}, **HTMX).content.decode()
    assert "<html" not in live
    for piece in ("job-state", "job-reason", "job-actions", "job-status", "job-history"):
        assert f'id="{piece}"' in live
    assert 'hx-trigger="every 3s"' in live
    job_cancel(actor=farm.world.alpha_member, job=job)
    final = client.get(url, {"part": "status"}, **HTMX).content.decode()
    assert 'hx-trigger="every 3s"' not in final
    assert 'data-state="cancelled"' in final
    assert "Rerun" in final


def test_log_part_returns_the_running_jobs_log(signed_in, farm):
    job = farm.submit(name="chatty", replicas=2)
    farm.cycle()
    attempt = job.attempts.get()
    farm.fake.append_log(attempt.workload_id, "step 10 loss 2.345", replica=0)
    farm.fake.append_log(attempt.workload_id, "replica one speaks", replica=1)
    client = signed_in(farm.world.alpha_member)
    url = reverse("frontend:job", args=[job.pk])

    page = client.get(url).content.decode()
    assert 'id="job-log-text"' in page
    assert "step 10 loss 2.345" in page

    part = client.get(url, {"part": "logs"}, **HTMX)
    content = part.content.decode()
    assert content.lstrip().startswith('<div id="job-logs"')
    assert "<html" not in content
    assert "replica 0 started on fake-node-" in content
    assert "step 10 loss 2.345" in content
    assert 'hx-trigger="every 2s"' in content
    assert "HX-Request" in part["Vary"]

    other = client.get(url, {"part": "logs", "replica": "1", "attempt": "1"}, **HTMX)
    assert "replica one speaks" in other.content.decode()
    assert "step 10" not in other.content.decode()


def test_log_part_of_a_job_not_started_yet_or_finished(signed_in, farm):
    farm.submit(name="holder", gpus=8, replicas=2)
    farm.cycle()
    job = farm.submit(gpus=8)  # the cluster is full: it waits
    farm.cycle()
    client = signed_in(farm.world.alpha_member)
    url = reverse("frontend:job", args=[job.pk])
    waiting = client.get(url, {"part": "logs"}, **HTMX).content.decode()
    assert "No attempt yet" in waiting
    assert 'hx-trigger="every 2s"' in waiting
    job_cancel(actor=farm.world.alpha_member, job=job)
    final = client.get(url, {"part": "logs"}, **HTMX).content.decode()
    assert 'hx-trigger="every 2s"' not in final


def test_cancel_through_the_console(signed_in, farm):
    job = farm.submit()
    farm.cycle()
    client = signed_in(farm.world.alpha_member)
    url = reverse("frontend:job-cancel", args=[job.pk])
    assert client.get(url).status_code == 405
    response = client.post(url)
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert "cancelled by alpha-member" in job.reason
    assert AuditEvent.objects.filter(action="job.cancel").exists()
    page = client.get(response.url).content.decode()
    assert f"Job {job.pk} (work) cancelled" in page
    again = client.post(url)  # already final: said, not crashed
    assert f"already {JobState.CANCELLED}" in client.get(again.url).content.decode()


def test_a_viewer_cannot_cancel(signed_in, farm):
    job = farm.submit()
    client = signed_in(farm.world.alpha_viewer)
    assert b"Cancel job" not in client.get(reverse("frontend:job", args=[job.pk])).content
    response = client.post(reverse("frontend:job-cancel", args=[job.pk]))
    assert response.status_code == 403
    assert b"viewer" in response.content
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_rerun_a_finished_job(signed_in, farm):
    job = farm.submit(name="again")
    job_cancel(actor=farm.world.alpha_member, job=job)
    client = signed_in(farm.world.alpha_member)
    response = client.post(reverse("frontend:job-rerun", args=[job.pk]))
    rerun = Job.objects.exclude(pk=job.pk).get()
    assert response.url == reverse("frontend:job", args=[rerun.pk])
    assert rerun.rerun_of == job
    assert rerun.state == JobState.QUEUED
    assert f"a rerun of job {job.pk}" in client.get(response.url).content.decode()


# Queues ------------------------------------------------------------------------------------

def test_queue_page_lists_the_backlog_in_order_and_the_running(signed_in, farm):
    running = farm.submit(name="holder", gpus=8, replicas=2)
    farm.cycle()
    first = farm.submit(name="first-in-line", gpus=4)
    second = farm.submit(name="second-in-line", gpus=4)
    farm.cycle()
    client = signed_in(farm.world.alpha_member)
    url = reverse("frontend:queue", args=[farm.queues["alpha"].pk])
    content = client.get(url).content.decode()
    backlog = content.split("<h2>Backlog</h2>")[1].split("<h2>Running</h2>")[0]
    assert backlog.index("first-in-line") < backlog.index("second-in-line")
    first.refresh_from_db()
    assert first.reason in backlog
    running_part = content.split("<h2>Running</h2>")[1]
    assert "holder" in running_part and "first-in-line" not in running_part
    assert f'data-job="{running.pk}"' in running_part
    assert second.pk

    partial = client.get(url, **HTMX).content.decode()
    assert partial.lstrip().startswith('<div id="queue-jobs"')
    assert 'hx-trigger="every 5s"' in partial


def test_queues_list_shows_counts(signed_in, farm):
    farm.submit(gpus=2)
    farm.cycle()
    farm.submit(gpus=8, replicas=2)
    content = signed_in(farm.world.alpha_member).get(reverse("frontend:queues")).content
    row = content.decode().split("<tbody")[1].split("</tr>")[0]
    cells = re.findall(r'<td class="num">\s*(.*?)\s*</td>', row)
    assert cells == ["Quota", "0", "1", "1", "2"]  # limit, priority, waiting, running, GPUs


def test_tenant_admins_create_and_edit_queues(signed_in, farm):
    client = signed_in(farm.world.alpha_admin)
    response = client.post(reverse("frontend:queue-create"), {
        "name": "urgent", "cluster": farm.cluster.pk, "description": "Deadlines",
        "default_priority": "10", "gpu_limit": "4", "policy": "fifo"})
    queue = Queue.objects.get(tenant=farm.world.alpha, name="urgent")
    assert response.url == reverse("frontend:queue", args=[queue.pk])
    assert (queue.gpu_limit, queue.policy, queue.default_priority) == (4, "fifo", 10)
    response = client.post(reverse("frontend:queue-edit", args=[queue.pk]), {
        "description": "", "default_priority": "5", "gpu_limit": "", "policy": "fair"})
    queue.refresh_from_db()
    assert (queue.gpu_limit, queue.is_active, queue.default_priority) == (None, False, 5)
    duplicate = client.post(reverse("frontend:queue-create"), {
        "name": "default", "cluster": farm.cluster.pk, "default_priority": "0",
        "policy": "fair"})
    assert "already has a queue" in " ".join(duplicate.context["form"].errors["name"])


def test_members_cannot_create_queues(signed_in, farm):
    client = signed_in(farm.world.alpha_member)
    assert client.get(reverse("frontend:queue-create")).status_code == 403
    response = client.post(reverse("frontend:queue-create"), {
        "name": "mine", "cluster": farm.cluster.pk, "default_priority": "0", "policy": "fair"})
    assert response.status_code == 403
    assert b"New queue" not in client.get(reverse("frontend:queues")).content


# Clusters ----------------------------------------------------------------------------------

def _squares(content: str) -> tuple[int, int]:
    used = len(re.findall(r'class="gpu gpu-used"', content))
    free = len(re.findall(r'class="gpu"', content))
    return used, free


def test_cluster_page_draws_allocated_gpus(signed_in, farm):
    farm.submit(name="a", gpus=3)
    farm.submit(name="b", gpus=2, replicas=2)
    farm.submit("beta", name="theirs", gpus=1)  # beta's GPUs count: the cluster is shared
    farm.cycle()
    assert Job.objects.filter(state=JobState.RUNNING).count() == 3
    client = signed_in(farm.world.alpha_member)
    content = client.get(reverse("frontend:cluster", args=["farm"])).content.decode()
    nodes = content.split('class="node-grid"')[1]
    used, free = _squares(nodes)
    assert (used, free) == (8, 8)
    assert 'data-gpus-allocated="8"' in content
    assert "of 16 GPUs allocated" in content
    assert "H100" in content
    assert "theirs" not in content  # counts, never other tenants' job names
    partial = client.get(reverse("frontend:cluster", args=["farm"]), **HTMX).content.decode()
    assert partial.lstrip().startswith('<div id="cluster-nodes"')
    assert _squares(partial.split('class="node-grid"')[1]) == (8, 8)


@pytest.fixture
def cpus(farm):
    """A shared cluster of one node without GPUs (2 cores, 8 GiB), alpha's queue on it and a
    running job holding 1.5 cores and 2 GiB there."""
    cluster = Cluster.objects.create(name="cpus", driver="fake", options={
        "nodes": 1, "gpus_per_node": 0, "cpu_cores": 2, "memory_mib": 8192})
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=farm.world.operator, tenant=farm.world.alpha, name="cpu",
                         cluster=cluster)
    job = job_submit(actor=farm.world.alpha_member, tenant=farm.world.alpha, queue=queue,
                     name="on-cpu", command=["python", "train.py"], cpu_per_replica=1.5,
                     memory_mib_per_replica=2048)
    schedule_cluster(cluster_id=cluster.pk)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return SimpleNamespace(cluster=cluster, node=cluster.nodes.get(), job=job, world=farm.world)


def _resource(content: str, resource: str) -> tuple[str, str]:
    found = re.search(rf'data-resource="{resource}" data-allocated="([\d.]+)" '
                      rf'data-total="([\d.]+)"', content)
    assert found, resource
    return found.groups()


def test_cluster_page_draws_cpu_and_memory_beside_gpus(signed_in, farm):
    farm.submit(name="a", gpus=2, cpu_per_replica=4, memory_mib_per_replica=4096)
    farm.cycle()
    content = signed_in(farm.world.alpha_member).get(
        reverse("frontend:cluster", args=["farm"])).content.decode()
    summary = content.split("data-resources")[1].split("</section>")[0]
    # Two fake nodes of 64 cores and 512 GiB each.
    assert _resource(summary, "cpu") == ("4", "128")
    assert _resource(summary, "memory") == ("4096", str(2 * 524288))
    assert "4 <span class=\"stat-unit\">of 128 CPU cores allocated" in summary
    node = Job.objects.get(name="a").placement[0]
    card = content.split(f'data-node="{node}"')[1].split("</article>")[0]
    assert _resource(card, "cpu") == ("4", "64") and "<strong>4</strong> / 64 cores" in card
    assert "<strong>4</strong> / 512 GiB" in card
    assert 'data-gpus-allocated="2"' in content  # the GPUs as before


def test_a_cluster_without_gpus_draws_cpu_and_memory_only(signed_in, cpus):
    content = signed_in(cpus.world.alpha_member).get(
        reverse("frontend:cluster", args=["cpus"])).content.decode()
    assert "data-gpus-allocated" not in content and "GPUs allocated" not in content
    assert 'class="gpu' not in content.split('id="cluster-nodes"')[1]
    assert "no GPUs: jobs here are held by CPU cores and memory" in content
    assert _resource(content.split("data-resources")[1], "cpu") == ("1.5", "2")
    card = content.split(f'data-node="{cpus.node.name}"')[1].split("</article>")[0]
    assert "No GPUs" in card
    assert "<strong>1.5</strong> / 2 cores" in card and "<strong>2</strong> / 8 GiB" in card
    assert 'aria-label="75% of CPU cores allocated"' in card


def test_the_node_page_of_a_cpu_node_has_no_gpu_charts(signed_in, cpus):
    page = signed_in(cpus.world.operator).get(
        reverse("frontend:node", args=["cpus", cpus.node.pk])).content.decode()
    assert "<strong>1.5</strong> / 2 cores" in page and "<strong>2</strong> / 8 GiB" in page
    charts = re.findall(r'data-chart="([^"]+)"', page)
    assert charts and not [name for name in charts if name.startswith("DCGM_")]
    assert "node_load1" in charts and "node_memory_MemAvailable_bytes" in charts
    assert "data-no-gpu-metrics" in page


def test_cluster_page_shows_health_and_cordons(signed_in, farm):
    Node.objects.filter(cluster=farm.cluster, name="fake-node-001").update(schedulable=False)
    content = signed_in(farm.world.alpha_member).get(
        reverse("frontend:cluster", args=["farm"])).content.decode()
    assert "Cordoned" in content
    assert "Healthy" in content
    assert "Sync nodes" not in content
    assert "Uncordon" not in content


def test_clusters_list_shows_allocation(signed_in, farm):
    farm.submit(gpus=5)
    farm.cycle()
    response = signed_in(farm.world.alpha_member).get(reverse("frontend:clusters"))
    row = response.content.decode().split("<tbody")[1]
    assert "5 <span" in row and "/ 16" in row
    assert "All tenants" in row


def test_platform_admin_syncs_nodes(signed_in, farm):
    farm.fake.add_nodes(1)
    client = signed_in(farm.world.operator, farm.world.alpha)
    page = client.get(reverse("frontend:cluster", args=["farm"])).content.decode()
    assert "Sync nodes" in page
    response = client.post(reverse("frontend:cluster-sync", args=["farm"]))
    assert response.url == reverse("frontend:cluster", args=["farm"])
    assert farm.cluster.nodes.count() == 3
    assert "Synced farm: 3 nodes, 24 GPUs." in client.get(response.url).content.decode()


def test_members_cannot_sync_nodes_or_cordon(signed_in, farm):
    client = signed_in(farm.world.alpha_admin)
    assert client.post(reverse("frontend:cluster-sync", args=["farm"])).status_code == 403
    node = farm.cluster.nodes.first()
    response = client.post(reverse("frontend:node-schedulable", args=["farm", node.pk]),
                           {"schedulable": "0"})
    assert response.status_code == 403
    node.refresh_from_db()
    assert node.schedulable


def test_platform_admin_cordons_and_uncordons(signed_in, farm):
    client = signed_in(farm.world.operator, farm.world.alpha)
    node = farm.cluster.nodes.get(name="fake-node-000")
    url = reverse("frontend:node-schedulable", args=["farm", node.pk])
    client.post(url, {"schedulable": "0"})
    node.refresh_from_db()
    assert not node.schedulable
    assert "Uncordon" in client.get(reverse("frontend:cluster", args=["farm"])).content.decode()
    client.post(url, {"schedulable": "1"})
    node.refresh_from_db()
    assert node.schedulable


def test_platform_admin_adds_a_cluster(signed_in, world):
    client = signed_in(world.operator, world.alpha)
    response = client.post(reverse("frontend:cluster-create"), {
        "name": "lab", "display_name": "Lab", "driver": "fake", "tenant": "alpha",
        "options": '{"nodes": 1, "gpus_per_node": 4}'})
    cluster = Cluster.objects.get(name="lab")
    assert response.url == reverse("frontend:cluster", args=["lab"])
    assert cluster.tenant == world.alpha
    assert cluster.options == {"nodes": 1, "gpus_per_node": 4}
    bad = client.post(reverse("frontend:cluster-create"), {
        "name": "lab2", "driver": "fake", "options": "[1, 2]"})
    assert "options" in bad.context["form"].errors
    assert signed_in(world.alpha_admin).get(reverse("frontend:cluster-create")).status_code \
        == 403


# The dashboard -----------------------------------------------------------------------------

def test_dashboard_counts_the_tenants_jobs(signed_in, farm):
    farm.submit(gpus=1)
    farm.cycle()
    farm.submit(gpus=8, replicas=2)
    farm.submit("beta", gpus=1)
    response = signed_in(farm.world.alpha_member).get(reverse("frontend:dashboard"))
    assert response.context["jobs"] == {"running": 1, "queued": 1, "gpus": 1}
    assert b"/jobs/?state=running" in response.content
