"""The PODsys console pages: stack profiles, deployment runs and their task grid, cluster
accounts, and a node's health and metrics. No Ansible runs and no check is carried out: the
services enqueue their work on commit, which never comes inside a `db` test, and the rows a run
or a check would write are made here directly."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from infra_os.models import AuditEvent
from podsys.choices import (
    CheckSeverity,
    CheckState,
    CheckTrigger,
    CordonSource,
    DeploymentKind,
    DeploymentState,
    TaskStatus,
)
from podsys.models import (
    Cluster,
    ClusterGroup,
    ClusterUser,
    DeploymentRun,
    DeploymentTaskResult,
    HealthCheckRun,
    Node,
    NodeMetricSnapshot,
    StackProfile,
)

HTMX = {"HTTP_HX_REQUEST": "true"}
KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl "
       "alice@laptop")
SECRET = "Zq-ldap-bind-secret-5150"


def _profile(**fields) -> StackProfile:
    values = {"name": "h100-base", "driver_version": "550.127.05", "cuda_version": "12.4",
              "cudnn_version": "9.1.0", "nccl_version": "2.21.5", "dcgm_version": "3.3.9",
              "orchestrator_version": "1.31", "offline_mirror": "file:///srv/mirror", **fields}
    return StackProfile.objects.create(**values)


@pytest.fixture
def pod(world):
    """A cluster `pod` of three nodes (rows only: no driver is asked), a profile, and a finished
    stack run on two of them in which gpu-b failed at its second task."""
    cluster = Cluster.objects.create(name="pod", driver="fake")
    nodes = {name: Node.objects.create(cluster=cluster, name=name, gpus=8, gpu_model="H100",
                                       address=f"10.0.0.{index}")
             for index, name in enumerate(("gpu-a", "gpu-b", "gpu-c"), start=1)}
    profile = _profile()
    now = timezone.now()
    run = DeploymentRun.objects.create(
        cluster=cluster, kind=DeploymentKind.STACK, profile=profile, playbook="stack.yml",
        hosts=["gpu-a", "gpu-b"], state=DeploymentState.FAILED, created_by=world.operator,
        started_at=now - timedelta(minutes=3), finished_at=now, rc=2,
        stats={"gpu-a": {"ok": 3, "changed": 1, "failures": 0, "unreachable": 0},
               "gpu-b": {"ok": 1, "changed": 0, "failures": 1, "unreachable": 0}},
    )
    tasks = [("preflight", "Check the OS family"), ("nvidia_driver", "Install the driver"),
             ("verify", "Read nvidia-smi")]
    for position, (role, task) in enumerate(tasks):
        DeploymentTaskResult.objects.create(run=run, host="gpu-a", position=position, role=role,
                                            task=task, status=TaskStatus.OK,
                                            changed=position == 1, duration_s=1.5)
    DeploymentTaskResult.objects.create(run=run, host="gpu-b", position=0, role="preflight",
                                        task=tasks[0][1], status=TaskStatus.OK)
    DeploymentTaskResult.objects.create(
        run=run, host="gpu-b", position=1, role="nvidia_driver", task=tasks[1][1],
        status=TaskStatus.FAILED,
        output="E: Unable to locate package nvidia-driver-550 <script>alert(1)</script>")
    return SimpleNamespace(world=world, cluster=cluster, nodes=nodes, profile=profile, run=run)


@pytest.fixture
def ops(client, pod):
    client.force_login(pod.world.operator)
    return client


def _pages(pod) -> list[str]:
    node = pod.nodes["gpu-a"]
    return [
        reverse("frontend:stack-profiles"),
        reverse("frontend:stack-profile-create"),
        reverse("frontend:stack-profile-edit", args=[pod.profile.name]),
        reverse("frontend:deployment-runs"),
        reverse("frontend:deployment-run-create"),
        reverse("frontend:deployment-run", args=[pod.run.pk]),
        reverse("frontend:cluster-accounts", args=["pod"]),
        reverse("frontend:node", args=["pod", node.pk]),
    ]


def test_every_page_renders_for_a_platform_admin(ops, pod):
    for url in _pages(pod):
        response = ops.get(url)
        assert response.status_code == 200, url
        assert 'class="sidebar"' in response.content.decode()


def test_a_tenant_member_gets_none_of_it(client, pod):
    client.force_login(pod.world.alpha_admin)
    for url in _pages(pod):
        assert client.get(url).status_code in (403, 404), url
    group = ClusterGroup.objects.create(cluster=pod.cluster, name="staff", gid=20000)
    node = pod.nodes["gpu-a"]
    posts = [
        (reverse("frontend:stack-profile-create"), {"name": "x", "driver_version": "550.127.05",
                                                     "cuda_version": "12.4"}),
        (reverse("frontend:stack-profile-delete", args=[pod.profile.name]), {}),
        (reverse("frontend:deployment-run-create"), {"cluster": "pod", "profile": "h100-base",
                                                      "hosts": ["gpu-a"]}),
        (reverse("frontend:deployment-run-rerun", args=[pod.run.pk]), {}),
        (reverse("frontend:deployment-run-cancel", args=[pod.run.pk]), {}),
        (reverse("frontend:cluster-group-create", args=["pod"]), {"group-name": "evil"}),
        (reverse("frontend:cluster-group-remove", args=["pod", group.pk]), {}),
        (reverse("frontend:cluster-user-create", args=["pod"]), {"user-username": "evil"}),
        (reverse("frontend:cluster-accounts-push", args=["pod"]), {}),
        (reverse("frontend:cluster-ldap", args=["pod"]), {"ldap-uri": "ldap://evil"}),
        (reverse("frontend:node-check", args=["pod", node.pk]), {}),
    ]
    for url, data in posts:
        assert client.post(url, data).status_code in (403, 404), url
    assert StackProfile.objects.filter(name="h100-base").exists()
    assert DeploymentRun.objects.count() == 1
    assert not ClusterUser.objects.exists()
    assert ClusterGroup.objects.get(pk=group.pk).is_active
    assert not HealthCheckRun.objects.exists()


def test_navigation_offers_profiles_and_deployments_to_operators_only(signed_in, pod):
    def clusters_section(user, url):
        response = signed_in(user).get(url)
        return [(link.label, link.active) for section in response.context["nav_sections"]
                if section.label == "Clusters" for link in section.links]

    runs = reverse("frontend:deployment-run", args=[pod.run.pk])
    assert clusters_section(pod.world.operator, runs) == [
        ("Clusters", False), ("Fleets", False), ("Stack profiles", False), ("Stack runs", True)]
    assert clusters_section(pod.world.alpha_member, reverse("frontend:clusters")) == [
        ("Clusters", True)]


# Stack profiles ------------------------------------------------------------------------------

def test_the_profile_list_shows_versions_mirror_and_runs(ops, pod):
    _profile(name="bare", driver_version="570.86.15", cuda_version="12.8", offline_mirror="")
    page = ops.get(reverse("frontend:stack-profiles")).content.decode()
    row = page.split('data-profile="h100-base"')[1].split("</tr>")[0]
    assert "550.127.05" in row and "12.4" in row and "9.1.0" in row and "2.21.5" in row
    assert ">Yes<" in row  # offline mirror
    assert '<td class="num">1</td>' in row  # one run
    other = page.split('data-profile="bare"')[1].split("</tr>")[0]
    assert ">No<" in other and '<td class="num">0</td>' in other
    partial = ops.get(reverse("frontend:stack-profiles"), **HTMX).content.decode()
    assert partial.lstrip().startswith('<div id="table-area"')


def test_a_profile_is_created_through_the_service(ops, pod):
    response = ops.post(reverse("frontend:stack-profile-create"), {
        "name": "a100-lab", "os_family": "ubuntu22.04", "driver_version": "550.127.05",
        "cuda_version": "12.4", "container_runtime": "containerd",
        "orchestrator": "kubernetes", "orchestrator_version": "1.31"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert StackProfile.objects.filter(name="a100-lab", cuda_version="12.4").exists()
    assert AuditEvent.objects.filter(object_repr="a100-lab").exists()


def test_a_driver_too_old_for_cuda_is_refused_on_its_field(ops, pod):
    response = ops.post(reverse("frontend:stack-profile-create"), {
        "name": "too-old", "os_family": "ubuntu22.04", "driver_version": "535.54.03",
        "cuda_version": "12.4", "container_runtime": "containerd",
        "orchestrator": "kubernetes", "orchestrator_version": "1.31"})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == ["driver_version"], errors
    message = " ".join(errors["driver_version"])
    assert "535.54.03" in message and "12.4" in message
    assert message in response.content.decode().replace("&#x27;", "'")
    assert not StackProfile.objects.filter(name="too-old").exists()


def test_editing_a_profile_keeps_its_name_and_checks_again(ops, pod):
    url = reverse("frontend:stack-profile-edit", args=["h100-base"])
    fields = {"os_family": "ubuntu22.04", "container_runtime": "containerd",
              "orchestrator": "kubernetes", "orchestrator_version": "1.31"}
    saved = ops.post(url, {**fields, "name": "renamed", "driver_version": "560.35.03",
                           "cuda_version": "12.6"})
    assert saved.status_code == 302
    pod.profile.refresh_from_db()
    assert (pod.profile.name, pod.profile.driver_version) == ("h100-base", "560.35.03")
    refused = ops.post(url, {**fields, "driver_version": "535.54.03", "cuda_version": "12.6"})
    assert refused.status_code == 400
    assert list(refused.context["form"].errors) == ["driver_version"]
    pod.profile.refresh_from_db()
    assert pod.profile.driver_version == "560.35.03"


def test_deleting_a_profile(ops, pod):
    _profile(name="spare")
    ops.post(reverse("frontend:stack-profile-delete", args=["spare"]))
    assert not StackProfile.objects.filter(name="spare").exists()
    # A profile runs name stays, with the reason.
    response = ops.post(reverse("frontend:stack-profile-delete", args=["h100-base"]),
                        follow=True)
    assert StackProfile.objects.filter(name="h100-base").exists()
    assert 'class="alert alert-error"' in response.content.decode()


# Deployment runs -------------------------------------------------------------------------------

def test_the_run_list_shows_cluster_profile_hosts_state(ops, pod):
    page = ops.get(reverse("frontend:deployment-runs")).content.decode()
    row = page.split(f'data-run="{pod.run.pk}"')[1].split("</tr>")[0]
    assert "pod" in row and "h100-base" in row and "gpu-a" in row and "gpu-b" in row
    assert 'data-state="failed"' in row and "3m 00s" in row


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as context:
        assert client.get(url).status_code == 200
    return len(context.captured_queries)


def test_list_pages_ask_the_database_the_same_whatever_their_length(ops, pod):
    pages = [reverse("frontend:deployment-runs"), reverse("frontend:stack-profiles"),
             reverse("frontend:cluster-accounts", args=["pod"])]

    def add(number):
        profile = _profile(name=f"extra-{number}")
        DeploymentRun.objects.create(cluster=pod.cluster, kind=DeploymentKind.ACCOUNTS,
                                     profile=profile, playbook="accounts.yml", hosts=["gpu-c"],
                                     created_by=pod.world.operator, rerun_of=pod.run)
        group = ClusterGroup.objects.create(cluster=pod.cluster, name=f"g{number}",
                                            gid=21000 + number)
        account = ClusterUser.objects.create(cluster=pod.cluster, username=f"u{number}",
                                             uid=21000 + number, primary_group=group)
        account.groups.add(group)

    add(0)
    before = [_queries(ops, url) for url in pages]
    for number in range(1, 4):
        add(number)
    assert [_queries(ops, url) for url in pages] == before


def test_the_deploy_form_offers_the_chosen_clusters_nodes(ops, pod):
    url = reverse("frontend:deployment-run-create")
    blank = ops.get(url).content.decode()
    assert 'value="gpu-a"' not in blank and "Choose a cluster to pick its nodes" in blank
    page = ops.get(url, {"cluster": "pod", "profile": "h100-base"}).content.decode()
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        assert f'name="hosts" value="{name}"' in page
    partial = ops.get(url, {"cluster": "pod"}, **HTMX).content.decode()
    assert partial.lstrip().startswith('<div id="deploy-nodes"')
    assert 'value="gpu-c"' in partial and 'class="sidebar"' not in partial


def test_deploying_starts_a_run_through_the_service(ops, pod):
    response = ops.post(reverse("frontend:deployment-run-create"), {
        "cluster": "pod", "profile": "h100-base", "hosts": ["gpu-a", "gpu-c"],
        "check_mode": "on"})
    run = DeploymentRun.objects.exclude(pk=pod.run.pk).get()
    assert response.status_code == 302
    assert response.url == reverse("frontend:deployment-run", args=[run.pk])
    assert (run.kind, run.profile, run.check_mode) == (DeploymentKind.STACK, pod.profile, True)
    assert sorted(run.hosts) == ["gpu-a", "gpu-c"]
    missing = ops.post(reverse("frontend:deployment-run-create"),
                       {"cluster": "pod", "profile": "h100-base"})
    assert missing.status_code == 400 and "hosts" in missing.context["form"].errors


def test_the_grid_shows_each_task_per_node_and_the_failing_output(ops, pod):
    response = ops.get(reverse("frontend:deployment-run", args=[pod.run.pk]))
    page = response.content.decode()
    assert "Install the driver" in page and "nvidia_driver" in page
    row_a = page.split('<tr data-host="gpu-a"')[1].split("</tr>")[0]
    assert row_a.count('data-status="ok"') == 3
    assert 'class="task-cell task-changed"' in row_a  # ok and changed: shown as changed
    row_b = page.split('<tr data-host="gpu-b"')[1].split("</tr>")[0]
    assert 'data-status="ok"' in row_b and 'data-status="failed"' in row_b
    assert "task-none" in row_b  # stopped at its first failure: the last task never ran
    failure = page.split('data-failure="gpu-b"')[1].split("</tr>")[0]
    assert "Install the driver" in failure
    assert "Unable to locate package nvidia-driver-550" in failure
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in failure and "<script>alert" not in page
    assert 'data-failure="gpu-a"' not in page
    recap = page.split('data-recap-host="gpu-b"')[1].split("</tr>")[0]
    assert 'text-danger strong">1<' in recap
    assert "Re-run failed nodes (1)" in page
    # A finished run's grid does not poll.
    assert "hx-trigger" not in page.split('id="run-grid"')[1].split(">")[0]


def test_a_rescued_failure_shows_failed_on_a_node_that_finished_cleanly(ops, pod):
    """gpu-a's first task failed and a `rescue` took over: its recap is clean, so it is not a
    failed node and not re-run; gpu-b stopped at a task after an ignored failure."""
    DeploymentTaskResult.objects.filter(run=pod.run, host="gpu-a", position=0).update(
        status=TaskStatus.FAILED, output="no fast way here")
    DeploymentTaskResult.objects.filter(run=pod.run, host="gpu-b", position=0).update(
        status=TaskStatus.FAILED, output="Failed, ignored (ignore_errors).\nnot there")
    page = ops.get(reverse("frontend:deployment-run", args=[pod.run.pk])).content.decode()
    row_a = page.split('<tr data-host="gpu-a"')[1].split("</tr>")[0]
    assert 'data-state="ok"' in row_a and 'data-status="failed"' in row_a
    assert 'data-failure="gpu-a"' not in page and "no fast way here" not in page
    failure = page.split('data-failure="gpu-b"')[1].split("</tr>")[0]
    assert "Install the driver" in failure and "not there" not in failure
    assert "Re-run failed nodes (1)" in page


def test_the_grid_asks_the_database_the_same_whatever_its_size(ops, pod):
    url = reverse("frontend:deployment-run", args=[pod.run.pk])
    before = _queries(ops, url)
    hosts = [f"gpu-{number}" for number in range(10, 30)]
    DeploymentRun.objects.filter(pk=pod.run.pk).update(hosts=["gpu-a", "gpu-b", *hosts])
    DeploymentTaskResult.objects.bulk_create([
        DeploymentTaskResult(run=pod.run, host=host, position=position, task=f"Task {position}",
                             status=TaskStatus.OK, output="x" * 4000)
        for host in hosts for position in range(3, 23)])
    assert _queries(ops, url) == before


def test_a_running_run_polls_its_grid_and_the_partial_is_the_grid_alone(ops, pod):
    DeploymentRun.objects.filter(pk=pod.run.pk).update(state=DeploymentState.RUNNING,
                                                       finished_at=None)
    DeploymentTaskResult.objects.create(run=pod.run, host="gpu-a", position=3, role="verify",
                                        task="Report versions", status=TaskStatus.RUNNING)
    url = reverse("frontend:deployment-run", args=[pod.run.pk])
    page = ops.get(url).content.decode()
    head = page.split('id="run-grid"')[1].split(">")[0]
    assert 'hx-trigger="every 2s"' in head
    assert 'data-status="running"' in page and ">Cancel</button>" in page
    partial = ops.get(url, **HTMX)
    body = partial.content.decode()
    assert body.lstrip().startswith('<div id="run-grid"')
    assert 'class="sidebar"' not in body and "HX-Request" in partial["Vary"]


def test_rerunning_the_failed_nodes(ops, pod):
    response = ops.post(reverse("frontend:deployment-run-rerun", args=[pod.run.pk]))
    rerun = DeploymentRun.objects.get(rerun_of=pod.run)
    assert response.url == reverse("frontend:deployment-run", args=[rerun.pk])
    assert rerun.hosts == ["gpu-b"]


def test_cancelling_a_finished_run_is_refused_with_the_reason(ops, pod):
    response = ops.post(reverse("frontend:deployment-run-cancel", args=[pod.run.pk]),
                        follow=True)
    assert 'class="alert alert-error"' in response.content.decode()
    pod.run.refresh_from_db()
    assert pod.run.state == DeploymentState.FAILED


# Accounts --------------------------------------------------------------------------------------

def test_adding_groups_and_users_through_the_services(ops, pod):
    accounts = reverse("frontend:cluster-accounts", args=["pod"])
    made = ops.post(reverse("frontend:cluster-group-create", args=["pod"]),
                    {"group-name": "ml", "group-gid": ""})
    assert made.status_code == 302 and made.url == accounts
    group = ClusterGroup.objects.get(cluster=pod.cluster, name="ml")
    made = ops.post(reverse("frontend:cluster-user-create", args=["pod"]), {
        "user-username": "alice", "user-full_name": "Alice A.", "user-uid": "",
        "user-groups": [group.pk], "user-ssh_public_keys": KEY})
    assert made.status_code == 302
    account = ClusterUser.objects.get(cluster=pod.cluster, username="alice")
    assert list(account.groups.all()) == [group]
    page = ops.get(accounts).content.decode()
    row = page.split('data-account="alice"')[1].split("</tr>")[0]
    assert str(account.uid) in row and "ml" in row and '<td class="num">1</td>' in row
    assert "Active" in row and "Not yet" in row
    group_row = page.split('data-group="ml"')[1].split("</tr>")[0]
    assert "20000" in group_row and '<td class="num">1</td>' in group_row  # one member


def test_account_errors_show_on_their_fields(ops, pod):
    ClusterUser.objects.create(cluster=pod.cluster, username="bob", uid=20000)
    taken = ops.post(reverse("frontend:cluster-user-create", args=["pod"]),
                     {"user-username": "bob"})
    assert taken.status_code == 400
    assert "username" in taken.context["user_form"].errors
    private = ops.post(reverse("frontend:cluster-user-create", args=["pod"]), {
        "user-username": "carol",
        "user-ssh_public_keys": "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n"})
    assert private.status_code == 400
    assert "ssh_public_keys" in private.context["user_form"].errors
    assert "private key" in " ".join(private.context["user_form"].errors["ssh_public_keys"])
    bad_name = ops.post(reverse("frontend:cluster-group-create", args=["pod"]),
                        {"group-name": "Not POSIX"})
    assert bad_name.status_code == 400 and "name" in bad_name.context["group_form"].errors
    assert not ClusterUser.objects.filter(username="carol").exists()


def test_removing_an_account_and_a_group(ops, pod):
    group = ClusterGroup.objects.create(cluster=pod.cluster, name="ml", gid=20000)
    account = ClusterUser.objects.create(cluster=pod.cluster, username="dave", uid=20000)
    ops.post(reverse("frontend:cluster-user-remove", args=["pod", account.pk]))
    ops.post(reverse("frontend:cluster-group-remove", args=["pod", group.pk]))
    account.refresh_from_db()
    group.refresh_from_db()
    assert not account.is_active and not group.is_active
    row = ops.get(reverse("frontend:cluster-accounts", args=["pod"])).content.decode() \
        .split('data-account="dave"')[1].split("</tr>")[0]
    assert "Removed" in row and ">Remove</button>" not in row


def test_ldap_settings_keep_the_password_out_of_pages(ops, pod):
    url = reverse("frontend:cluster-ldap", args=["pod"])
    bad = ops.post(url, {"ldap-uri": "http://not-ldap", "ldap-base_dn": "dc=example,dc=org",
                         "ldap-bind_dn": "cn=ro,dc=example,dc=org",
                         "ldap-bind_password": SECRET})
    assert bad.status_code == 400 and "uri" in bad.context["ldap_form"].errors
    assert SECRET not in bad.content.decode()
    saved = ops.post(url, {"ldap-uri": "ldaps://ldap.example:636",
                           "ldap-base_dn": "dc=example,dc=org",
                           "ldap-bind_dn": "cn=ro,dc=example,dc=org",
                           "ldap-bind_password": SECRET})
    assert saved.status_code == 302
    pod.cluster.refresh_from_db()
    assert pod.cluster.options["ldap"]["uri"] == "ldaps://ldap.example:636"
    page = ops.get(reverse("frontend:cluster-accounts", args=["pod"])).content.decode()
    assert "data-ldap-active" in page and "ldaps://ldap.example:636" in page
    assert SECRET not in page


def test_pushing_accounts_opens_the_run(ops, pod):
    ClusterUser.objects.create(cluster=pod.cluster, username="erin", uid=20000)
    response = ops.post(reverse("frontend:cluster-accounts-push", args=["pod"]))
    run = DeploymentRun.objects.get(kind=DeploymentKind.ACCOUNTS)
    assert response.url == reverse("frontend:deployment-run", args=[run.pk])
    assert sorted(run.hosts) == ["gpu-a", "gpu-b", "gpu-c"]
    page = ops.get(reverse("frontend:cluster-accounts", args=["pod"])).content.decode()
    assert f'data-run="{run.pk}"' in page


# Nodes: health and metrics -----------------------------------------------------------------------

def _cordon_by_check(node):
    Node.objects.filter(pk=node.pk).update(
        schedulable=False, cordon_source=CordonSource.HEALTH_CHECK,
        health_reason="failed health check remapped-rows: GPU 3 has 2 uncorrectable remapped "
                      "rows")


def test_the_cluster_page_marks_a_health_check_cordon_and_links_nodes(signed_in, pod):
    node = pod.nodes["gpu-b"]
    _cordon_by_check(node)
    page = signed_in(pod.world.operator).get(
        reverse("frontend:cluster", args=["pod"])).content.decode()
    card = page.split('data-node="gpu-b"')[1].split("</article>")[0]
    assert "Cordoned · health check" in card and "GPU 3 has 2 uncorrectable" in card
    assert f'href="{reverse("frontend:node", args=["pod", node.pk])}"' in card
    assert 'href="/clusters/pod/accounts/"' in page
    member = signed_in(pod.world.alpha_member).get(
        reverse("frontend:cluster", args=["pod"])).content.decode()
    assert "Cordoned · health check" in member
    assert reverse("frontend:node", args=["pod", node.pk]) not in member


def test_the_node_page_says_who_cordoned_it_and_why(ops, pod):
    node = pod.nodes["gpu-b"]
    _cordon_by_check(node)
    page = ops.get(reverse("frontend:node", args=["pod", node.pk])).content.decode()
    alert = page.split('data-cordon="health_check"')[1].split("</div>")[0]
    assert "Cordoned by a health check" in alert
    assert "GPU 3 has 2 uncorrectable remapped rows" in alert
    Node.objects.filter(pk=node.pk).update(cordon_source=CordonSource.OPERATOR,
                                           health_reason="cordoned in the console by operator")
    page = ops.get(reverse("frontend:node", args=["pod", node.pk])).content.decode()
    assert "Cordoned by an operator" in page and 'data-cordon="operator"' in page


def test_a_node_held_for_a_check_says_so_and_cannot_be_uncordoned(ops, pod):
    node = pod.nodes["gpu-b"]
    HealthCheckRun.objects.create(node=node, check_name="pcie-bandwidth",
                                  severity=CheckSeverity.WARNING, state=CheckState.RUNNING,
                                  started_at=timezone.now())
    Node.objects.filter(pk=node.pk).update(
        schedulable=False, cordon_source=CordonSource.CHECK_RUNNING,
        health_reason="held while health check pcie-bandwidth runs")
    url = reverse("frontend:node", args=["pod", node.pk])
    page = ops.get(url).content.decode()
    alert = page.split('data-cordon="check_running"')[1].split("</div>")[0]
    assert "held while health check pcie-bandwidth runs" in alert
    assert "Uncordon" not in page
    assert ">Cordon</button>" in page, "an operator may still cordon it"
    cluster_page = ops.get(reverse("frontend:cluster", args=["pod"])).content.decode()
    card = cluster_page.split('data-node="gpu-b"')[1].split("</article>")[0]
    assert "held while health check pcie-bandwidth runs" in card and "Uncordon" not in card

    response = ops.post(reverse("frontend:node-schedulable", args=["pod", node.pk]),
                        {"schedulable": "1", "next": url}, follow=True)
    assert response.status_code == 200
    assert ("Node gpu-b is held while health check pcie-bandwidth runs; it returns by itself "
            "when the check ends.") in response.content.decode()
    node.refresh_from_db()
    assert node.cordon_source == CordonSource.CHECK_RUNNING
    # Cordoned by an operator meanwhile, then uncordoned: held again until the check ends.
    Node.objects.filter(pk=node.pk).update(cordon_source=CordonSource.OPERATOR)
    response = ops.post(reverse("frontend:node-schedulable", args=["pod", node.pk]),
                        {"schedulable": "1", "next": url}, follow=True)
    assert ("Node gpu-b uncordoned: held while health check pcie-bandwidth runs; it takes new "
            "work once that check ends.") in response.content.decode()
    node.refresh_from_db()
    assert node.cordon_source == CordonSource.CHECK_RUNNING and not node.schedulable


def test_the_node_page_lists_checks_with_their_latest_run_and_history(ops, pod):
    node = pod.nodes["gpu-a"]
    now = timezone.now()
    for minutes, state, summary in ((30, CheckState.PASSED, "8 GPUs present"),
                                    (10, CheckState.FAILED, "7 of 8 GPUs present"),
                                    (5, CheckState.FAILED, "7 of 8 GPUs present: GPU 5 gone")):
        run = HealthCheckRun.objects.create(
            node=node, check_name="gpu-presence", severity=CheckSeverity.FATAL, state=state,
            summary=summary, details={"found": 7}, trigger=CheckTrigger.SCHEDULE,
            started_at=now - timedelta(minutes=minutes),
            finished_at=now - timedelta(minutes=minutes) + timedelta(seconds=4))
        HealthCheckRun.objects.filter(pk=run.pk).update(
            created_at=now - timedelta(minutes=minutes))
    HealthCheckRun.objects.create(node=node, check_name="network",
                                  severity=CheckSeverity.FATAL, state=CheckState.PASSED,
                                  summary="every peer answers")
    url = reverse("frontend:node", args=["pod", node.pk])
    page = ops.get(url).content.decode()
    row = page.split('<tr data-check="gpu-presence"')[1].split("</tr>")[0]
    assert 'data-state="failed"' in row and "GPU 5 gone" in row
    assert 'text-danger strong">2<' in row  # failures in a row
    assert ">Run now</button>" in row and ">Run all</button>" in page
    assert 'data-check="remapped-rows" data-state="never"' in page
    history = ops.get(url, {"part": "history", "check": "gpu-presence"}, **HTMX)
    body = history.content.decode()
    assert body.lstrip().startswith('<div id="health-history"')
    assert body.count("<tr data-run=") == 3 and "every peer answers" not in body
    assert "8 GPUs present" in body and 'class="sidebar"' not in body
    health = ops.get(url, {"part": "health"}, **HTMX).content.decode()
    assert health.lstrip().startswith('<section class="card card-flush" id="node-health"')


def test_run_now_starts_checks_through_the_service(ops, pod):
    node = pod.nodes["gpu-a"]
    url = reverse("frontend:node-check", args=["pod", node.pk])
    response = ops.post(url, {"check": "gpu-presence"})
    assert response.url == reverse("frontend:node", args=["pod", node.pk])
    runs = HealthCheckRun.objects.filter(node=node)
    assert [run.check_name for run in runs] == ["gpu-presence"]
    assert runs[0].trigger == CheckTrigger.MANUAL


def test_the_node_page_charts_its_metrics_one_line_per_gpu(ops, pod):
    node = pod.nodes["gpu-a"]
    now = timezone.now()
    for minutes in range(0, 50, 5):
        NodeMetricSnapshot.objects.create(node=node, at=now - timedelta(minutes=minutes), values={
            "DCGM_FI_DEV_GPU_UTIL": {"0": 90.0, "1": 10.0 + minutes},
            "DCGM_FI_DEV_FB_USED": {"0": 40960.0, "1": 1024.0},
            "node_load1": {"": 3.5},
            "node_network_receive_bytes_total": {"eth0": 1e9 + (50 - minutes) * 60e6},
        })
    NodeMetricSnapshot.objects.create(node=node, at=now - timedelta(hours=5), values={
        "DCGM_FI_DEV_GPU_UTIL": {"0": 55.0}})
    url = reverse("frontend:node", args=["pod", node.pk])
    page = ops.get(url).content.decode()
    util = page.split('data-chart="DCGM_FI_DEV_GPU_UTIL"')[1].split("</section>")[0]
    assert "GPU utilisation" in util
    assert 'data-series="GPU 0"' in util and 'data-series="GPU 1"' in util
    memory = page.split('data-chart="DCGM_FI_DEV_FB_USED"')[1].split("</section>")[0]
    assert "GiB" in memory and 'data-series="GPU 0"' in memory
    load = page.split('data-chart="node_load1"')[1].split("</section>")[0]
    assert 'data-series="node"' in load
    network = page.split('data-chart="node_network_receive_bytes_total"')[1] \
        .split("</section>")[0]
    assert "MB/s" in network and 'data-series="eth0"' in network  # a counter: drawn as a rate
    temperature = page.split('data-chart="DCGM_FI_DEV_GPU_TEMP"')[1].split("</section>")[0]
    assert "No readings in this period" in temperature
    # The 1 h window leaves out the reading of 5 hours ago; 6 h takes it in.
    assert 'data-readings="20"' in page.split('data-chart="DCGM_FI_DEV_GPU_UTIL"')[1][:40]
    wide = ops.get(url, {"part": "metrics", "range": "6h"}, **HTMX)
    body = wide.content.decode()
    assert body.lstrip().startswith('<div id="node-metrics"') and 'data-range="6h"' in body
    assert 'data-readings="21"' in body.split('data-chart="DCGM_FI_DEV_GPU_UTIL"')[1][:40]
    assert 'class="sidebar"' not in body


def test_a_prometheus_that_does_not_answer_is_said_in_place_of_the_charts(ops, pod, settings):
    settings.OGAI_PROMETHEUS_URL = "http://127.0.0.1:9"  # discard: nothing listens
    node = pod.nodes["gpu-a"]
    response = ops.get(reverse("frontend:node", args=["pod", node.pk]))
    assert response.status_code == 200
    alert = response.content.decode().split("data-metrics-error>")[1].split("</div>")[0]
    assert "Prometheus at http://127.0.0.1:9 did not answer" in alert
    assert 'data-chart="DCGM_FI_DEV_GPU_UTIL"' not in response.content.decode()
