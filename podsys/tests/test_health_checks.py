"""Health checks as classes: the registry, what each tells the node and how it judges, what a
node is expected to have, the API, and one check run for real on the local driver."""

from __future__ import annotations

import time

import pytest
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.utils import timezone

from podsys.choices import CheckSeverity, CheckState, DeploymentKind, DeploymentState
from podsys.health.checks import (
    DcgmDiag,
    GpuPresence,
    HealthCheck,
    NcclAllReduce,
    NetworkReachability,
)
from podsys.health.registry import health_checks
from podsys.models import DeploymentRun, HealthCheckRun, Node, StackProfile
from podsys.runtime import driver_for
from podsys.services.health import (
    expected_driver,
    expected_gpus,
    health_check_run_now,
    health_checks_tick,
    node_facts,
)

CHECKS_URL = "/api/v1/podsys/health-checks/"
TYPES_URL = "/api/v1/podsys/health-check-types/"


class LongDcgm(DcgmDiag):
    name = "dcgm-long"
    level = 3
    timeout_s = 3600


def test_the_registry_loads_every_configured_check_in_order():
    checks = health_checks()
    assert list(checks) == ["gpu-presence", "driver-version", "remapped-rows", "power-slowdown",
                            "pcie-bandwidth", "dcgm-diag", "nccl-allreduce", "network"]
    fatal = {name for name, check in checks.items() if check.severity == CheckSeverity.FATAL}
    assert fatal == {"gpu-presence", "remapped-rows", "dcgm-diag", "network"}
    assert {name for name, check in checks.items() if check.exclusive} == {
        "pcie-bandwidth", "nccl-allreduce"}
    assert [name for name, check in checks.items() if check.multi_node] == ["nccl-allreduce"]


def test_an_unknown_or_wrong_path_is_a_clear_configuration_error(settings):
    settings.OGAI_HEALTH_CHECKS = {"gpu": "podsys.health.checks.NoSuchCheck"}
    with pytest.raises(ImproperlyConfigured, match=r"OGAI_HEALTH_CHECKS\['gpu'\]: cannot "):
        health_checks()
    settings.OGAI_HEALTH_CHECKS = {"gpu": "podsys.health.checks.Verdict"}
    with pytest.raises(ImproperlyConfigured, match="is not a HealthCheck class"):
        health_checks()
    settings.OGAI_HEALTH_CHECKS = {"GPU check": "podsys.health.checks.GpuPresence"}
    with pytest.raises(ImproperlyConfigured, match="not a valid check name"):
        health_checks()


def test_a_subclass_configures_a_deeper_diagnostic(settings):
    settings.OGAI_HEALTH_CHECKS = {"dcgm-long": f"{__name__}.LongDcgm"}
    check = health_checks()["dcgm-long"]
    assert check.exclusive, "level 3 loads the GPUs"
    assert check.command({"python": "python", "gpus": 8}) == [
        "python", "-m", "podsys.health.run", "dcgm-diag", "--expect-gpus", "8", "--level", "3",
        "--timeout-s", "3540"]


def test_commands_tell_the_probe_what_the_node_must_have():
    checks = health_checks()
    facts = {"python": "/venv/bin/python", "gpus": 8, "expected_driver": "550.127.05",
             "driver": "kubernetes", "internal_url": "https://ogai.example.org",
             "peers": ["10.0.0.2", "fd00::3"]}
    assert checks["driver-version"].command(facts) == [
        "/venv/bin/python", "-m", "podsys.health.run", "driver-version", "--expect-gpus", "8",
        "--expect-driver", "550.127.05"]
    assert checks["network"].arguments(facts) == [
        "--platform", "ogai.example.org:443", "--target", "10.0.0.2:10250",
        "--target", "[fd00::3]:10250"]
    # Seen from a remote node, a loopback platform URL is the node itself: not tried.
    assert NetworkReachability().arguments({**facts, "internal_url": "http://127.0.0.1:8000",
                                            "driver": "fake", "peers": ["n2"]}) == [
        "--target", "n2:22"]
    assert NetworkReachability().arguments({"internal_url": "http://[::1]:8000",
                                            "driver": "local"}) == []
    assert NetworkReachability().arguments({"internal_url": "http://ogai:8000",
                                            "driver": "local"}) == ["--platform", "ogai:8000"]
    assert NcclAllReduce().arguments({"gpus": 0})[:4] == ["--size-mib", "16",
                                                         "--min-busbw-gbps", "0"]


def test_judging_a_result():
    check = HealthCheck("anything")
    facts = {"gpus": 8}
    assert check.judge(0, {"check": "x", "ok": False, "summary": "bad", "details": {"a": 1}},
                       facts) == check.judge(0, {"ok": False, "summary": "bad",
                                                 "details": {"a": 1}}, facts)
    failed = check.judge(0, {"ok": False, "summary": "bad", "details": {"a": 1}}, facts)
    assert (failed.passed, failed.error, failed.summary, failed.details) == (
        False, False, "bad", {"a": 1})
    silent = check.judge(-9, None, facts)
    assert silent.error and silent.summary == "the probe printed no result (killed by signal " \
                                              "SIGKILL)"
    refused = check.judge(2, {"check": "x", "error": "dcgmi is not installed"}, facts)
    assert refused.error and refused.summary == "could not run: dcgmi is not installed"
    assert check.judge(0, {"summary": "?"}, facts).error
    # gpu-presence holds the probe to what the platform expects now.
    stale = GpuPresence().judge(0, {"ok": True, "summary": "all 7 GPUs present",
                                    "details": {"found": 7}}, facts)
    assert not stale.passed and stale.summary == "7 of 8 GPUs found"


@pytest.fixture
def gpu_cluster(farm):
    return farm


def test_expected_gpus_come_from_the_label_else_the_most_seen(gpu_cluster):
    node = Node.objects.get(cluster=gpu_cluster.cluster, name="fake-node-000")
    assert expected_gpus(node, gpu_cluster.cluster) == 8
    HealthCheckRun.objects.create(node=node, check_name="gpu-presence", state=CheckState.PASSED,
                                  severity=CheckSeverity.FATAL, details={"found": 8})
    node.gpus = 7  # the cluster stopped reporting a GPU that fell off the bus
    assert expected_gpus(node, gpu_cluster.cluster) == 8
    node.labels = {"ogai.io/expected-gpus": "4"}  # the operator says so
    assert expected_gpus(node, gpu_cluster.cluster) == 4


def _stack_run(cluster, profile, version: str, stats: dict, **fields) -> DeploymentRun:
    return DeploymentRun.objects.create(
        cluster=cluster, kind=DeploymentKind.STACK, profile=profile, hosts=sorted(stats),
        extra_vars={"stack_driver_version": version}, stats=stats,
        finished_at=timezone.now(), **{"state": DeploymentState.SUCCEEDED, **fields})


CLEAN = {"ok": 12, "changed": 3, "failures": 0, "unreachable": 0}
FAILED = {"ok": 4, "changed": 1, "failures": 1, "unreachable": 0}


def test_expected_driver_comes_from_the_label_else_the_deployed_profile(gpu_cluster):
    cluster = gpu_cluster.cluster
    node = Node.objects.get(cluster=cluster, name="fake-node-001")
    other = Node.objects.get(cluster=cluster, name="fake-node-000")
    assert expected_driver(node, cluster) == ""
    profile = StackProfile.objects.create(name="h100", driver_version="550.127.05",
                                          cuda_version="12.4")
    _stack_run(cluster, profile, "550.127.05", {"fake-node-001": CLEAN})
    _stack_run(cluster, profile, "550.127.05", {"fake-node-000": FAILED},
               state=DeploymentState.FAILED)
    assert expected_driver(node, cluster) == "550.127.05"
    assert expected_driver(other, cluster) == ""
    node.labels = {"ogai.io/expected-driver": "535"}
    assert expected_driver(node, cluster) == "535"


def test_expected_driver_is_what_reached_each_node(gpu_cluster):
    """The driver a run deployed, not the profile's now; per node, the newest run that
    finished cleanly there, even when it failed elsewhere."""
    cluster = gpu_cluster.cluster
    node, other = (Node.objects.get(cluster=cluster, name=name)
                   for name in ("fake-node-001", "fake-node-000"))
    profile = StackProfile.objects.create(name="h100", driver_version="535.183.01",
                                          cuda_version="12.2")
    _stack_run(cluster, profile, "535.183.01", {"fake-node-000": CLEAN, "fake-node-001": CLEAN})
    # An upgrade reaches one node and fails on the other.
    _stack_run(cluster, profile, "550.127.05", {"fake-node-000": FAILED, "fake-node-001": CLEAN},
               state=DeploymentState.FAILED)
    # A rehearsal changes nothing.
    _stack_run(cluster, profile, "560.35.03", {"fake-node-000": CLEAN, "fake-node-001": CLEAN},
               check_mode=True)
    # The profile edited since: the nodes still run what was deployed.
    StackProfile.objects.filter(pk=profile.pk).update(driver_version="570.86.15")
    assert expected_driver(node, cluster) == "550.127.05"
    assert expected_driver(other, cluster) == "535.183.01"


def test_the_local_drivers_invented_gpus_are_not_expected(world, tmp_path):
    from podsys.drivers.local import read_gpus
    from podsys.models import Cluster
    from podsys.services.clusters import cluster_sync_nodes

    cluster = Cluster.objects.create(name="slots", driver="local",
                                     options={"root": str(tmp_path), "gpus": 4})
    node = cluster_sync_nodes(cluster=cluster)[0]
    assert node.gpus == 4
    facts = node_facts(node, cluster=cluster, driver=driver_for(cluster))
    assert facts["gpus"] == read_gpus().devices
    assert facts["python"].endswith("python") and facts["python"] != "python"


# The API --------------------------------------------------------------------------------------


def test_types_list_the_configured_checks(api, world):
    response = api.as_user(world.alpha_viewer).get(TYPES_URL)
    assert response.status_code == 200
    first = response.json()[0]
    assert first == {"name": "gpu-presence", "label": "GPUs present", "severity": "fatal",
                     "interval_s": 300.0, "timeout_s": 120.0, "exclusive": False,
                     "multi_node": False}


def test_an_operator_runs_a_check_on_a_node_over_the_api(api, world, farm, monkeypatch,
                                                         django_assert_num_queries):
    monkeypatch.setattr("podsys.services.health._enqueue_tick", lambda cluster_id: None)
    node = Node.objects.get(cluster=farm.cluster, name="fake-node-000")
    url = f"/api/v1/podsys/nodes/{node.pk}/check/"
    assert api.as_user(world.alpha_admin).post(url, {}, format="json").status_code == 403
    bad = api.as_user(world.operator).post(url, {"check": "nope"}, format="json")
    assert bad.status_code == 400
    assert "Unknown health check 'nope'" in bad.json()["fields"]["check"][0]

    response = api.as_user(world.operator).post(url, {"check": "gpu-presence"}, format="json")
    assert response.status_code == 202
    [run] = response.json()
    assert (run["check_name"], run["state"], run["trigger"], run["node_name"]) == (
        "gpu-presence", "pending", "manual", "fake-node-000")
    health_checks_tick(cluster_id=farm.cluster.pk)
    health_checks_tick(cluster_id=farm.cluster.pk)

    client = api.as_user(world.alpha_member)  # shared cluster: tenants see its nodes' checks
    with django_assert_num_queries(2):
        listed = client.get(CHECKS_URL, {"node": node.pk, "check_name": "gpu-presence"}).json()
    assert listed["count"] == 1
    assert listed["results"][0]["state"] == "passed"
    assert listed["results"][0]["summary"] == "all 8 GPUs present (H100)"
    assert client.get(CHECKS_URL, {"state": "failed"}).json()["count"] == 0


def test_checks_of_another_tenants_cluster_are_hidden(api, world):
    from podsys.models import Cluster
    from podsys.services.clusters import cluster_sync_nodes

    cluster = Cluster.objects.create(name="beta-only", driver="fake", tenant=world.beta,
                                     options={"nodes": 1})
    node = cluster_sync_nodes(cluster=cluster)[0]
    run = HealthCheckRun.objects.create(node=node, check_name="gpu-presence",
                                        severity=CheckSeverity.FATAL)
    assert api.as_user(world.alpha_member).get(CHECKS_URL).json()["count"] == 0
    assert api.as_user(world.alpha_member).get(f"{CHECKS_URL}{run.pk}/").status_code == 404
    assert api.as_user(world.beta_viewer).get(f"{CHECKS_URL}{run.pk}/").status_code == 200


def test_a_check_is_refused_on_a_node_not_ready(world, farm):
    farm.fake.lose_node("fake-node-001")
    from podsys.services.clusters import cluster_sync_nodes

    cluster_sync_nodes(cluster=farm.cluster)
    node = Node.objects.get(cluster=farm.cluster, name="fake-node-001")
    with pytest.raises(ValidationError) as raised:
        health_check_run_now(actor=world.operator, node=node)
    assert "is not ready (node lost)" in raised.value.message_dict["node"][0]


# One check for real -----------------------------------------------------------------------


def test_gpu_presence_runs_as_a_real_process_on_the_local_driver(world, local_queue, settings,
                                                                 monkeypatch):
    settings.OGAI_HEALTH_CHECKS = {"gpu-presence": "podsys.health.checks.GpuPresence"}
    monkeypatch.setattr("podsys.services.health._enqueue_tick", lambda cluster_id: None)
    node = local_queue.cluster.nodes.get()
    [run] = health_check_run_now(actor=world.operator, node=node, check_name="gpu-presence")
    health_checks_tick(cluster_id=local_queue.cluster.pk)
    deadline = time.monotonic() + 20
    while True:
        run.refresh_from_db()
        if run.state not in (CheckState.PENDING, CheckState.RUNNING) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.1)
        health_checks_tick(cluster_id=local_queue.cluster.pk)
    assert run.state == CheckState.PASSED, run.summary
    expected = node.gpus
    assert run.summary == ("no GPUs expected" if not expected
                           else f"all {expected} GPUs present ({node.gpu_model})")
    log = driver_for(local_queue.cluster).logs(run.workload_id)
    assert "OGAI-HEALTH-RESULT" in log


def test_a_nodes_health_at_a_glance(farm, settings):
    from podsys.selectors import health_check_history, node_health_summary

    settings.OGAI_HEALTH_CHECKS = {"gpu-presence": "podsys.health.checks.GpuPresence",
                                   "pcie-bandwidth": "podsys.health.checks.PcieBandwidth"}
    node = Node.objects.get(cluster=farm.cluster, name="fake-node-000")
    for state in (CheckState.PASSED, CheckState.FAILED, CheckState.ERROR, CheckState.FAILED):
        HealthCheckRun.objects.create(node=node, check_name="gpu-presence", state=state,
                                      severity=CheckSeverity.FATAL, summary=state)
    HealthCheckRun.objects.create(node=node, check_name="pcie-bandwidth",
                                  severity=CheckSeverity.WARNING,
                                  summary="deferred: node busy (8 GPUs in use)")
    node.labels = {"ogai.io/health-gpu-presence": "failed"}
    presence, pcie = node_health_summary(node=node)
    assert (presence["name"], presence["severity"], presence["latest"].state,
            presence["consecutive_failures"], presence["failing"]) == (
        "gpu-presence", "fatal", CheckState.FAILED, 2, True)
    assert pcie["deferred"] == "deferred: node busy (8 GPUs in use)"
    assert pcie["consecutive_failures"] == 0 and not pcie["failing"]
    assert [run.state for run in health_check_history(node=node, check_name="gpu-presence",
                                                      limit=3)] == [
        CheckState.FAILED, CheckState.ERROR, CheckState.FAILED]
    assert health_check_history(node=node).count() == 5


def test_all_reduce_gangs_are_small_and_never_alone():
    from podsys.services.health import _gangs

    assert [len(g) for g in _gangs(list(range(17)), 8)] == [8, 9]
    assert [len(g) for g in _gangs(list(range(18)), 8)] == [8, 8, 2]
    assert [len(g) for g in _gangs(list(range(3)), 8)] == [3]


def test_an_all_reduce_asked_for_without_a_driver_is_a_clear_error(api, world, farm,
                                                                   monkeypatch):
    from podsys.drivers.base import DriverError

    def no_driver(cluster):
        raise DriverError("kubeconfig rejected")

    monkeypatch.setattr("podsys.services.health.driver_for", no_driver)
    node = Node.objects.get(cluster=farm.cluster, name="fake-node-000")
    response = api.as_user(world.operator).post(f"/api/v1/podsys/nodes/{node.pk}/check/",
                                                {"check": "nccl-allreduce"}, format="json")
    assert response.status_code == 400
    assert "kubeconfig rejected" in response.json()["fields"]["check"][0]
    assert not HealthCheckRun.objects.exists()


def test_the_platform_stopping_stops_checks_running_on_this_machine(world, tmp_path):
    from podsys.drivers.base import Phase, Resources, Workload
    from podsys.models import Cluster
    from podsys.services.clusters import cluster_sync_nodes
    from podsys.services.health import health_checks_stop_local

    cluster = Cluster.objects.create(name="here", driver="local",
                                     options={"root": str(tmp_path), "grace_s": 1})
    node = cluster_sync_nodes(cluster=cluster)[0]
    run = HealthCheckRun.objects.create(node=node, check_name="gpu-presence",
                                        severity="fatal", state=CheckState.RUNNING)
    run.workload_id = f"hc-{run.pk}"
    run.save()
    driver = driver_for(cluster)
    driver.launch(Workload(id=run.workload_id, resources=Resources(),
                           command=("sleep", "600")))
    assert driver.status([run.workload_id])[run.workload_id].phase == Phase.RUNNING
    started = time.monotonic()

    assert health_checks_stop_local(reason="the platform stopped while it ran") == 1

    assert time.monotonic() - started < 10
    assert driver.status([run.workload_id])[run.workload_id].phase == Phase.FAILED
    run.refresh_from_db()
    assert (run.state, run.summary) == (CheckState.ERROR, "the platform stopped while it ran")
    node.refresh_from_db()
    assert node.schedulable, "an error says nothing about the node"
