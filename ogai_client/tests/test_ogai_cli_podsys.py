"""`ogai node` and `ogai stack` against the real API, served by `live_server`.

The CLI runs in-process (`main([...])`) with its URL and token from the environment. No health
runner and no Ansible run: between two polls of `-f` the test plays them, writing the verdicts
and the task results the way they would, in the test's thread, so nothing races.
"""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from infra_os.services.tokens import api_token_create
from ogai_client import OgaiClient, OgaiError, cli
from podsys.choices import CheckState, DeploymentState, TaskStatus
from podsys.models import (
    Cluster,
    DeploymentRun,
    DeploymentTaskResult,
    HealthCheckRun,
    Node,
    NodeMetricSnapshot,
)
from podsys.models import StackProfile as Profile
from podsys.services.clusters import cluster_sync_nodes
from podsys.services.stack import stack_profile_create

pytestmark = pytest.mark.django_db(transaction=True)

PROFILE = {"name": "h100-cuda124", "os_family": "ubuntu22.04", "driver_version": "550.127.05",
           "cuda_version": "12.4", "cudnn_version": "9.5", "nccl_version": "2.21",
           "dcgm_version": "4.2", "orchestrator": "kubernetes", "orchestrator_version": "1.31"}
SHARED = "fake-node-000"  # a node of both clusters
ALONE = "fake-node-001"  # only gpu-a has it


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path, settings):
    """No real config or environment; the platform's files under tmp_path."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("OGAI_URL", raising=False)
    monkeypatch.delenv("OGAI_TOKEN", raising=False)
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()


@pytest.fixture
def clusters(db):
    """gpu-a (2 nodes of 8 GPUs) and gpu-b (1 node), shared: both have a fake-node-000."""
    made = {}
    for name, nodes in (("gpu-a", 2), ("gpu-b", 1)):
        made[name] = Cluster.objects.create(name=name, driver="fake",
                                            options={"nodes": nodes, "gpus_per_node": 8})
        cluster_sync_nodes(cluster=made[name])
    return made


def _signed_in(user, live_server, monkeypatch):
    monkeypatch.setenv("OGAI_URL", live_server.url)
    token = api_token_create(actor=user, name="test",
                             expires_at=timezone.now() + timedelta(days=1)).secret
    monkeypatch.setenv("OGAI_TOKEN", token)
    return user


@pytest.fixture
def as_operator(world, clusters, live_server, monkeypatch):
    return _signed_in(world.operator, live_server, monkeypatch)


@pytest.fixture
def as_member(world, clusters, live_server, monkeypatch):
    return _signed_in(world.alpha_admin, live_server, monkeypatch)


def ogai(capsys, *argv, failure_is_an_error=True):
    """Run the CLI; returns (exit code, stdout, stderr). Every error is one stderr line."""
    code = cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    if code != 0 and failure_is_an_error:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1, captured.err
        assert lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def words(text):
    return " ".join(text.split())


def row(out, *starts):
    """The words of the first output line that starts with these words."""
    return next(line.split() for line in out.splitlines() if line.split()[:len(starts)]
                == list(starts))


# -- nodes --------------------------------------------------------------------------------------

def test_nodes_are_listed_cordoned_and_put_back(as_operator, clusters, capsys):
    Node.objects.filter(cluster__name="gpu-a", name=ALONE).update(gpus_in_use=3)
    code, out, err = ogai(capsys, "node", "list")
    assert code == 0, err
    assert row(out, "gpu-a", ALONE)[2:] == ["3/8", "H100", "healthy", "in", "service"]
    assert row(out, "gpu-b", SHARED)[2] == "0/8"
    assert "3 nodes, 3 of 24 GPUs in use" in err

    code, _, err = ogai(capsys, "node", "cordon", SHARED, "--reason", "fan")
    assert code == 1
    assert err == (f"error: several clusters have a node '{SHARED}' (gpu-a, gpu-b): name the "
                   "cluster (--cluster)\n")
    code, _, err = ogai(capsys, "node", "cordon", "fake-node-404")
    assert (code, err) == (1, "error: node fake-node-404 not found (or not visible to you); "
                              "`ogai node list` shows the nodes\n")

    code, out, err = ogai(capsys, "node", "cordon", SHARED, "-c", "gpu-a", "-r", "fan noise")
    assert code == 0, err
    assert words(out) == (f"node {SHARED} (cluster gpu-a) cordoned by an operator: fan noise; "
                          "its running work stays, nothing new is placed there")
    node = Node.objects.get(cluster__name="gpu-a", name=SHARED)
    assert (node.schedulable, node.cordon_source, node.health_reason) == (False, "operator",
                                                                          "fan noise")
    code, out, err = ogai(capsys, "node", "list", "--cluster", "gpu-a")
    assert code == 0, err
    assert words(" ".join(row(out, "gpu-a", SHARED))).endswith(
        "healthy cordoned by an operator: fan noise")
    assert "gpu-b" not in out and "1 cordoned" in err

    code, out, err = ogai(capsys, "node", "uncordon", SHARED, "--cluster", "gpu-a")
    assert code == 0, err
    assert words(out) == f"node {SHARED} (cluster gpu-a) in service, health healthy"
    assert Node.objects.get(pk=node.pk).schedulable

    code, out, _ = ogai(capsys, "node", "list", "-c", "gpu-b", "--json")
    assert [n["name"] for n in json.loads(out)] == [SHARED]


class Verdicts:
    """Plays the health runner: at each pause, the next step of every live run."""

    def __init__(self, state, summary):
        self.state, self.summary, self.pauses = state, summary, 0

    def pause(self, seconds):
        self.pauses += 1
        live = HealthCheckRun.objects.filter(state__in=[CheckState.PENDING, CheckState.RUNNING])
        if self.pauses == 1:
            live.update(state=CheckState.RUNNING, started_at=timezone.now())
        else:
            live.update(state=self.state, summary=self.summary, finished_at=timezone.now())


def test_checks_run_on_demand_and_are_followed_to_their_verdicts(as_operator, capsys,
                                                                 monkeypatch):
    code, out, err = ogai(capsys, "node", "check", ALONE)
    assert code == 0, err
    runs = HealthCheckRun.objects.filter(node__name=ALONE).order_by("id")
    assert len(out.splitlines()) == runs.count() == 7  # every single-node check
    assert "gpu-presence (fatal): pending" in out and "driver-version (warning)" in out
    assert f"`ogai node health {ALONE}` shows the verdicts" in err
    runs.delete()

    monkeypatch.setattr(cli, "_pause", Verdicts(CheckState.PASSED, "8 GPUs, as expected").pause)
    code, out, err = ogai(capsys, "node", "check", ALONE, "--check", "gpu-presence", "-f")
    assert code == 0, err
    assert "gpu-presence: running" in err and "gpu-presence: passed (8 GPUs, as expected)" in err
    assert row(out, "gpu-presence")[1:3] == ["fatal", "passed"]

    code, out, err = ogai(capsys, "node", "health", ALONE)
    assert code == 0, err
    assert out.splitlines()[0].split()[:5] == ["node", ALONE, "(cluster", "gpu-a)", "healthy,"]
    assert words(" ".join(row(out, "gpu-presence"))).startswith(
        "gpu-presence fatal passed 8 GPUs, as expected")
    assert row(out, "dcgm-diag")[1:] == ["-", "never", "run", "-"]

    monkeypatch.setattr(cli, "_pause", Verdicts(
        CheckState.FAILED, "2 GPUs have uncorrectable remapped rows: 3, 5").pause)
    code, out, err = ogai(capsys, "node", "check", ALONE, "--check", "remapped-rows", "-f",
                          failure_is_an_error=False)
    assert code == 1
    assert row(out, "remapped-rows")[1:3] == ["fatal", "failed"]
    assert err.splitlines()[-1] == (f"error: fatal check remapped-rows failed on {ALONE}: 2 "
                                    "GPUs have uncorrectable remapped rows: 3, 5")
    # A warning that fails is a verdict to read, not a failure of the command.
    monkeypatch.setattr(cli, "_pause", Verdicts(CheckState.FAILED, "thermal slowdown").pause)
    code, out, err = ogai(capsys, "node", "check", ALONE, "--check", "power-slowdown", "-f")
    assert code == 0, err
    assert row(out, "power-slowdown")[1:3] == ["warning", "failed"]

    code, _, err = ogai(capsys, "node", "check", ALONE, "--check", "gpu-prescence")
    assert code == 1 and err.startswith("error: check: Unknown health check 'gpu-prescence'")


def test_operator_commands_are_refused_to_others_in_one_line(as_member, tmp_path, capsys):
    code, out, err = ogai(capsys, "node", "list")
    assert code == 0, err  # shared clusters: everyone sees their nodes
    assert row(out, "gpu-a", ALONE)
    for argv in (("node", "cordon", ALONE), ("node", "uncordon", ALONE),
                 ("node", "check", ALONE), ("stack", "deploy", "h100-cuda124", "-c", "gpu-a")):
        code, _, err = ogai(capsys, *argv)
        assert (code, err) == (1, "error: Only a platform admin can do this.\n"), argv
    assert Node.objects.filter(schedulable=True).count() == 3
    profile = tmp_path / "p.yaml"
    profile.write_text(json.dumps(PROFILE))
    code, _, err = ogai(capsys, "stack", "create", profile)
    assert (code, err) == (1, "error: Only a platform admin can do this.\n")
    code, out, err = ogai(capsys, "stack", "runs")
    assert code == 0 and not out and "shown to platform admins only" in err
    code, _, err = ogai(capsys, "stack", "show", 1)
    assert (code, err) == (1, "error: deployment run 1 not found (or not visible to you)\n")


# -- stack profiles -----------------------------------------------------------------------------

def as_yaml(fields):
    return "".join(f"{key}: '{value}'\n" for key, value in fields.items())


def test_profiles_are_created_from_yaml_and_refused_with_the_reason(as_operator, tmp_path,
                                                                   capsys):
    path = tmp_path / "h100.yaml"
    path.write_text(as_yaml(PROFILE))
    code, out, err = ogai(capsys, "stack", "create", path)
    assert code == 0, err
    assert Profile.objects.get().driver_version == "550.127.05"
    assert words(out).startswith("stack profile h100-cuda124 created: driver 550.127.05, CUDA "
                                 "12.4 on ubuntu22.04")
    code, out, err = ogai(capsys, "stack", "profiles")
    assert code == 0, err
    assert row(out, "h100-cuda124")[1:] == ["ubuntu22.04", "550.127.05", "12.4", "9.5", "2.21",
                                            "-", "containerd", "4.2", "kubernetes", "1.31", "-",
                                            "0"]

    path.write_text(as_yaml({**PROFILE, "name": "old-driver", "driver_version": "535.54.03"}))
    code, out, err = ogai(capsys, "stack", "create", path)
    assert code == 1 and not out
    assert err == ("error: driver_version: Driver 535.54.03 is too old for CUDA 12.4: CUDA "
                   "12.4 needs driver 550.54.14 or newer.\n")

    # Every field refused is a line; the error is the first.
    path.write_text("name: bare\nos_family: windows\n")
    code, _, err = ogai(capsys, "stack", "create", path, failure_is_an_error=False)
    assert code == 1
    lines = err.splitlines()
    assert lines[-1].startswith("error: os_family: ") and "windows" in lines[-1]
    assert "driver_version: This field is required." in lines[:-1]
    assert "cuda_version: This field is required." in lines[:-1]

    path.write_text("name: typo\ndriver: '550.127.05'\n")
    code, _, err = ogai(capsys, "stack", "create", path)
    assert code == 1 and f"{path}: 'driver' is not a stack profile field" in err
    assert Profile.objects.count() == 1


# -- deployment runs ----------------------------------------------------------------------------

TASKS = ["Gathering Facts", "Install the NVIDIA driver", "Install CUDA"]


class Ansible:
    """Plays a deployment run between the CLI's polls: `steps` are, per pause, {host: [its
    task statuses so far]}; after the last, the run ends as `end` says (state, recap)."""

    def __init__(self, steps, *, end, output=""):
        self.steps, self.end, self.output, self.pauses = steps, end, output, 0

    def pause(self, seconds):
        run = DeploymentRun.objects.order_by("-id").first()
        step = self.steps[min(self.pauses, len(self.steps) - 1)]
        self.pauses += 1
        DeploymentRun.objects.filter(pk=run.pk).update(
            state=DeploymentState.RUNNING, started_at=run.started_at or timezone.now())
        for host, statuses in step.items():
            for position, status in enumerate(statuses):
                DeploymentTaskResult.objects.update_or_create(
                    run=run, host=host, position=position,
                    defaults={"task": TASKS[position], "status": status,
                              "changed": status == TaskStatus.CHANGED,
                              "output": self.output if status == TaskStatus.FAILED else ""})
        if self.pauses >= len(self.steps):
            state, stats = self.end
            DeploymentRun.objects.filter(pk=run.pk).update(
                state=state, stats=stats, finished_at=timezone.now(),
                message="" if state == DeploymentState.SUCCEEDED else "1 node failed.")


def clean(*hosts):
    return {host: {"ok": 3, "changed": 1, "failures": 0, "unreachable": 0} for host in hosts}


def test_a_deployment_is_followed_shown_rerun_and_cancelled(as_operator, world, capsys,
                                                           monkeypatch):
    stack_profile_create(actor=world.operator, **PROFILE)
    ok, changed, failed, running = (TaskStatus.OK, TaskStatus.CHANGED, TaskStatus.FAILED,
                                    TaskStatus.RUNNING)
    output = "fatal: E: Unable to locate package nvidia-driver-550\n" + "".join(
        f"line {i}\n" for i in range(10))
    ansible = Ansible([{SHARED: [ok, running], ALONE: [ok]},
                       {SHARED: [ok, changed, ok], ALONE: [ok, failed]}],
                      end=(DeploymentState.FAILED, {**clean(SHARED),
                                                    ALONE: {"ok": 1, "failures": 1}}),
                      output=output)
    monkeypatch.setattr(cli, "_pause", ansible.pause)
    code, out, err = ogai(capsys, "stack", "deploy", "h100-cuda124", "--cluster", "gpu-a", "-f",
                          failure_is_an_error=False)
    assert code == 1
    run = DeploymentRun.objects.get()
    assert run.hosts == [SHARED, ALONE] and not run.check_mode  # every node of the cluster
    assert out.splitlines()[0] == (f"deployment run {run.pk} of h100-cuda124 to 2 nodes of "
                                   "gpu-a: queued")
    assert f"deployment run {run.pk}: running" in err and f"{SHARED}: running" in err
    assert f"{ALONE}: failed at 'Install the NVIDIA driver'" in err
    assert err.splitlines()[-1] == (f"error: deployment run {run.pk} failed on 1 of 2 nodes "
                                    f"({ALONE}); `ogai stack rerun {run.pk}` runs them again")
    grid = out.split(f"deployment run {run.pk}  ", 1)[1]
    assert words(grid.splitlines()[0]) == "h100-cuda124 on gpu-a failed"
    assert row(grid, SHARED)[1:] == ["ok", "2", "ok,", "1", "changed"]
    assert words(" ".join(row(grid, ALONE))) == (f"{ALONE} failed 1 ok, 1 failed at 'Install "
                                                 "the NVIDIA driver'")
    tail = [line.strip() for line in grid.splitlines() if line.strip().startswith("|")]
    assert tail == [f"| line {i}" for i in range(5, 10)]  # the end of the output

    code, out2, err = ogai(capsys, "stack", "show", run.pk)
    assert code == 0, err
    assert row(out2, ALONE) == row(grid, ALONE) and "| line 9" in out2
    code, out, _ = ogai(capsys, "stack", "show", run.pk, "--json")
    assert json.loads(out)["results"]["hosts"][1]["failed_task"] == TASKS[1]

    code, out, err = ogai(capsys, "stack", "runs")
    assert code == 0, err
    assert row(out, str(run.pk))[1:] == ["gpu-a", "h100-cuda124", "2", "failed", "1",
                                         "operator", row(out, str(run.pk))[-1]]

    code, out, err = ogai(capsys, "stack", "rerun", run.pk)
    assert code == 0, err
    rerun = DeploymentRun.objects.get(rerun_of=run)
    assert rerun.hosts == [ALONE]
    assert words(out) == (f"deployment run {rerun.pk} re-runs run {run.pk} on 1 node ({ALONE}): "
                          "queued")
    code, out, err = ogai(capsys, "stack", "cancel", rerun.pk)
    assert code == 0, err
    assert words(out) == f"deployment run {rerun.pk} cancelled (Cancelled by operator.)"
    code, _, err = ogai(capsys, "stack", "cancel", rerun.pk)
    assert code == 1 and "already ended (cancelled)" in err

    # A rehearsal on one node, followed to its success.
    code, out, err = ogai(capsys, "stack", "deploy", "h100-cuda124", "-c", "gpu-a", "--nodes",
                          SHARED, "--check-mode", "-q")
    assert code == 0, err
    check = DeploymentRun.objects.get(pk=int(out))
    assert (check.hosts, check.check_mode) == ([SHARED], True)
    monkeypatch.setattr(cli, "_pause", Ansible([{SHARED: [ok, ok, changed]}],
                                               end=(DeploymentState.SUCCEEDED,
                                                    clean(SHARED))).pause)
    code, out, err = ogai(capsys, "stack", "show", check.pk, "-f")
    assert code == 0, err
    assert "h100-cuda124 (check mode) on gpu-a succeeded" in words(out)
    assert row(out, SHARED)[1:] == ["ok", "2", "ok,", "1", "changed"]


def test_a_deployment_names_what_is_wrong(as_operator, world, capsys):
    stack_profile_create(actor=world.operator, **PROFILE)
    code, _, err = ogai(capsys, "stack", "deploy", "h200", "-c", "gpu-a")
    assert err == "error: stack profile h200 not found; `ogai stack profiles` lists them\n"
    code, _, err = ogai(capsys, "stack", "deploy", "h100-cuda124", "-c", "gpu-z")
    assert err == ("error: cluster gpu-z has no nodes (or is not visible to you); `ogai node "
                   "list` shows the nodes\n")
    code, _, err = ogai(capsys, "stack", "deploy", "h100-cuda124", "-c", "gpu-a", "--nodes",
                        "gpu-9")
    assert err == "error: hosts: Not nodes of cluster gpu-a: gpu-9.\n"
    code, _, err = ogai(capsys, "stack", "show", 404)
    assert (code, err) == (1, "error: deployment run 404 not found (or not visible to you)\n")
    code, _, err = ogai(capsys, "stack", "show", "x")
    assert code == 2 and "deployment run id 'x' is not a number" in err
    assert not DeploymentRun.objects.exists()


def test_a_deployment_to_every_node_leaves_out_the_unhealthy_and_says_so(
        as_operator, world, clusters, capsys):
    stack_profile_create(actor=world.operator, **PROFILE)
    Node.objects.create(cluster=clusters["gpu-a"], name="gpu-gone", health="lost",
                        health_reason="No heartbeat for 10 minutes.")
    Node.objects.create(cluster=clusters["gpu-a"], name="gpu-boot", health="not_ready")
    code, out, err = ogai(capsys, "stack", "deploy", "h100-cuda124", "-c", "gpu-a", "-q")
    assert code == 0, err
    assert DeploymentRun.objects.get(pk=int(out)).hosts == [SHARED, ALONE]
    assert err == ("skipping 2 nodes that are not healthy: gpu-boot (not_ready), gpu-gone "
                   "(lost) (name them with --nodes to deploy to them anyway)\n")
    # Named, they are deployed to.
    code, out, err = ogai(capsys, "stack", "deploy", "h100-cuda124", "-c", "gpu-a", "-q",
                          "--nodes", "gpu-gone")
    assert (code, err) == (0, "")
    assert DeploymentRun.objects.get(pk=int(out)).hosts == ["gpu-gone"]

    Node.objects.filter(cluster=clusters["gpu-b"]).update(health="lost")
    code, _, err = ogai(capsys, "stack", "deploy", "h100-cuda124", "-c", "gpu-b")
    assert (code, err) == (1, f"error: no node of cluster gpu-b is healthy: {SHARED} (lost); "
                              "name them with --nodes to deploy to them anyway\n")


def test_the_sdk_reads_nodes_checks_and_runs(as_operator, world):
    with OgaiClient.from_config() as client:
        node = client.find_node(ALONE)
        assert (node.cluster, node.gpus, node.gpus_used) == ("gpu-a", 8, 0)
        with pytest.raises(OgaiError) as raised:
            client.find_node(SHARED)
        assert raised.value.code == "ambiguous"
        assert client.find_node(SHARED, cluster="gpu-b").cluster == "gpu-b"
        types = client.health_check_types()
        assert types[0].name == "gpu-presence" and types[0].severity == "fatal"
        runs = client.check_node(node.id, "network")
        assert [run.check_name for run in runs] == ["network"] and runs[0].state == "pending"
        assert client.health_check_runs(node=node.id)[0].id == runs[0].id
        assert client.node_health(node.id)["network"].id == runs[0].id
        at = timezone.now() - timedelta(seconds=90)
        NodeMetricSnapshot.objects.create(node_id=node.id, at=at,
                                          values={"DCGM_FI_DEV_GPU_UTIL": {"0": 97}})
        assert client.node_metrics(node.id, names=["DCGM_FI_DEV_GPU_UTIL"], since_s=600) == {
            "DCGM_FI_DEV_GPU_UTIL": {"0": [(at.timestamp(), 97.0)]}}
        profile = client.create_stack_profile(PROFILE)
        assert client.stack_profile(profile.name).cuda_version == "12.4"
        run = client.deploy_stack(profile.name, cluster="gpu-a", hosts=[ALONE], check_mode=True)
        assert (run.state, run.hosts, run.check_mode) == ("queued", [ALONE], True)
        assert [r.id for r in client.deployment_runs(cluster="gpu-a")] == [run.id]
        assert client.deployment_run_results(run.id).hosts[0].state == "pending"
        assert client.cancel_deployment_run(run.id).is_final


# -- clusters -----------------------------------------------------------------------------------

def test_a_clusters_environments_are_listed_for_those_with_a_queue_there(
        world, live_server, monkeypatch, tmp_path, capsys):
    from aistation.services.queues import queue_create

    cluster = Cluster.objects.create(name="here", driver="local", options={
        "root": str(tmp_path / "cluster"), "environments": {"old": str(tmp_path / "gone")}})
    cluster_sync_nodes(cluster=cluster)
    queue_create(actor=world.operator, tenant=world.alpha, name="default", cluster=cluster)
    _signed_in(world.alpha_viewer, live_server, monkeypatch)
    code, out, err = ogai(capsys, "cluster", "environments", "here")
    assert code == 0, err
    assert out.split("\n")[0].split() == ["NAME", "PYTHON", "TORCH", "WHERE", "DEFAULT"]
    platform = row(out, "platform")
    assert platform[1].startswith("3.11.") and platform[2].startswith("2.13.0")
    assert platform[-1] == "yes"
    # The table folds long paths wherever the width falls: the whole problem is in --json.
    assert "unusable:" in row(out, "old")
    assert "environment: NAME" in err
    code, out, _ = ogai(capsys, "cluster", "environments", "here", "--json")
    offered = json.loads(out)
    assert [env["name"] for env in offered] == ["platform", "old"]
    assert offered[1]["problem"] == f"{tmp_path / 'gone'} is not a folder on this machine"
    _signed_in(world.beta_admin, live_server, monkeypatch)  # beta has no queue there
    code, _, err = ogai(capsys, "cluster", "environments", "here")
    assert (code, err) == (1, "error: cluster here not found (or not visible to you)\n")
