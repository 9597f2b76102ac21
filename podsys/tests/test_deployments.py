"""Deployment runs: validation, the event stream recorded per node and task, re-running the
failed nodes, cancelling; and real `ansible-runner` runs of stack.yml against this machine in
check mode (nothing on it changes)."""

import os
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import ansible_runner
import pytest
import yaml
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from podsys.choices import DeploymentKind, DeploymentState, TaskStatus
from podsys.models import DeploymentRun, DeploymentTaskResult, Node, StackProfile
from podsys.selectors import deployment_grid, deployment_run_list
from podsys.services import deployments
from podsys.services.accounts import (
    cluster_accounts_push,
    cluster_user_create,
    cluster_user_remove,
)
from podsys.services.deployments import (
    LOST_MESSAGE,
    _finish,
    _Recorder,
    _write_vars,
    deployment_cancel,
    deployment_failed_hosts,
    deployment_rerun_failed,
    deployment_start,
)
from podsys.services.stack import stack_profile_create
from podsys.tasks.deployments import deploy_run, sweep_deployment_runs
from tests.factories import ClusterFactory


def _other_ubuntu() -> str:
    """An OS family this machine does not run (an apt one, so check mode can rehearse it)."""
    release = Path("/etc/os-release")
    text = release.read_text() if release.exists() else ""
    return "ubuntu24.04" if 'VERSION_ID="22.04"' in text and "ID=ubuntu" in text else "ubuntu22.04"


PROFILE = {
    "name": "rehearsal", "os_family": _other_ubuntu(), "driver_version": "570.86.15",
    "cuda_version": "12.8", "cudnn_version": "9.5", "nccl_version": "2.21",
    "ofed_version": "24.10-1.1.4.0", "container_toolkit_version": "1.17",
    "dcgm_version": "4.2", "orchestrator": "kubernetes", "orchestrator_version": "1.31",
}


@pytest.fixture
def lab(world, settings, tmp_path):
    """A cluster of two nodes: gpu-a is this machine, gpu-b an address nobody answers SSH on."""
    settings.DATA_DIR = tmp_path / "data"
    settings.OGAI_ANSIBLE_SSH_KEY_FILE = ""
    cluster = ClusterFactory(name="lab", options={"nodes": 0})
    Node.objects.create(cluster=cluster, name="gpu-a", address="127.0.0.1")
    Node.objects.create(cluster=cluster, name="gpu-b", address="127.0.0.2")
    profile = stack_profile_create(actor=world.operator, **PROFILE,
                                   offline_mirror=str(tmp_path / "mirror"))
    return cluster, profile


def start(world, cluster, profile, hosts, capture, **extra):
    with capture() as callbacks:
        run = deployment_start(actor=world.operator, cluster=cluster, kind=DeploymentKind.STACK,
                               hosts=hosts, profile=profile, **extra)
    assert len(callbacks) == 1  # the run is enqueued once the transaction commits
    return run


# Validation --------------------------------------------------------------------------------


def test_a_run_is_refused_with_the_field_at_fault(world, lab):
    cluster, profile = lab
    cases = [
        ({"hosts": ["gpu-a", "gpu-9"]}, "hosts", "Not nodes of cluster lab: gpu-9"),
        ({"hosts": []}, "hosts", "at least one node"),
        ({"kind": "firmware"}, "kind", "Unknown deployment kind"),
        ({"profile": None}, "profile", "needs a stack profile"),
        ({"extra_vars": {"stack_driver_version": "535.54.03"}}, "extra_vars",
         "comes from the stack profile"),
        ({"extra_vars": {"ansible_user": "root"}}, "extra_vars", "connection settings"),
        ({"extra_vars": {"Bad-Name": 1}}, "extra_vars", "not a variable name"),
        ({"extra_vars": {"stack_allow_os_mismatch": True}}, "extra_vars", "check mode only"),
        # A file on OGAI's host that a role copies to the nodes: never named by a run.
        ({"extra_vars": {"stack_munge_key_file": "/etc/shadow"}}, "extra_vars",
         "it comes from the setting OGAI_SLURM_MUNGE_KEY_FILE"),
    ]
    for changes, field, text in cases:
        arguments = {"actor": world.operator, "cluster": cluster, "kind": DeploymentKind.STACK,
                     "hosts": ["gpu-a"], "profile": profile, **changes}
        with pytest.raises(ValidationError) as refused:
            deployment_start(**arguments)
        assert text in refused.value.message_dict[field][0], (changes, refused.value)
    with pytest.raises(PermissionDenied):
        deployment_start(actor=world.alpha_admin, cluster=cluster, kind=DeploymentKind.STACK,
                         hosts=["gpu-a"], profile=profile)
    # The matrix may have changed since the profile was saved: checked again.
    StackProfile.objects.filter(pk=profile.pk).update(driver_version="550.54.14")
    profile.refresh_from_db()
    with pytest.raises(ValidationError) as refused:
        deployment_start(actor=world.operator, cluster=cluster, kind=DeploymentKind.STACK,
                         hosts=["gpu-a"], profile=profile)
    assert "too old for CUDA 12.8" in refused.value.message_dict["profile"][0]
    assert not DeploymentRun.objects.exists()


def test_a_node_being_deployed_is_not_deployed_twice(world, lab,
                                                      django_capture_on_commit_callbacks):
    cluster, profile = lab
    run = start(world, cluster, profile, ["gpu-a", "gpu-b"], django_capture_on_commit_callbacks)
    assert run.state == DeploymentState.QUEUED
    assert run.extra_vars["stack_driver_version"] == "570.86.15"
    with pytest.raises(ValidationError) as refused:
        deployment_start(actor=world.operator, cluster=cluster, kind=DeploymentKind.STACK,
                         hosts=["gpu-b"], profile=profile)
    assert f"gpu-b is being deployed by run {run.pk}" in refused.value.message_dict["hosts"][0]


def test_cancelling(world, lab, django_capture_on_commit_callbacks):
    cluster, profile = lab
    run = start(world, cluster, profile, ["gpu-a"], django_capture_on_commit_callbacks)
    with pytest.raises(ValidationError) as refused:
        deployment_rerun_failed(actor=world.operator, run=run)
    assert "still queued" in refused.value.message_dict["run"][0]

    run = deployment_cancel(actor=world.operator, run=run)
    assert run.state == DeploymentState.CANCELLED
    assert run.message == "Cancelled by operator."
    # The queued task finds it cancelled and runs nothing.
    assert deploy_run(run.pk) == DeploymentState.CANCELLED
    assert not run.results.exists()
    with pytest.raises(ValidationError) as refused:
        deployment_cancel(actor=world.operator, run=run)
    assert "already ended (cancelled)" in refused.value.message_dict["state"][0]


def test_runs_are_operator_things(world, lab, django_capture_on_commit_callbacks):
    cluster, profile = lab
    start(world, cluster, profile, ["gpu-a"], django_capture_on_commit_callbacks)
    assert deployment_run_list(user=world.operator).count() == 1
    assert deployment_run_list(user=world.alpha_admin).count() == 0


def test_variables_reach_ansible_as_data_never_as_templates(tmp_path):
    _write_vars(tmp_path, {"note": "{{ lookup('pipe', 'id') }}", "version": "9.5", "n": 2,
                           "users": [{"comment": "{% raw %}", "name": "alice"}]})
    path = tmp_path / "env" / "extravars"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    text = path.read_text()
    assert "note: !unsafe '{{ lookup(''pipe'', ''id'') }}'" in text
    assert "comment: !unsafe '{% raw %}'" in text
    assert "version: '9.5'" in text  # stays a string, not the float 9.5


# The event stream ---------------------------------------------------------------------------


def _event(kind, host, uuid, task, role="", **data):
    return {"event": kind, "created": "2026-01-01T00:00:00+00:00",
            "event_data": {"host": host, "task": task, "task_uuid": uuid, "role": role,
                           "task_action": data.pop("action", "ansible.builtin.command"),
                           **data}}


def test_events_become_a_grid_and_the_run_ends_failed(world, lab,
                                                       django_capture_on_commit_callbacks):
    cluster, profile = lab
    run = start(world, cluster, profile, ["gpu-a", "gpu-b"], django_capture_on_commit_callbacks)
    DeploymentRun.objects.filter(pk=run.pk).update(state=DeploymentState.RUNNING)
    recorder = _Recorder(run)
    events = [
        _event("runner_on_start", "gpu-a", "t1", "Gathering Facts"),
        _event("runner_on_start", "gpu-b", "t1", "Gathering Facts"),
        _event("runner_on_ok", "gpu-a", "t1", "Gathering Facts", res={}, duration=1.5),
        _event("runner_on_unreachable", "gpu-b", "t1", "Gathering Facts",
               res={"msg": "Failed to connect to the host via ssh: Connection refused"}),
        _event("runner_on_start", "gpu-a", "t2", "Install the driver", role="nvidia_driver"),
    ]
    for event in events:
        recorder.on_event(event)
    # Live: gpu-a is part way, its second task still running.
    grid = deployment_grid(run=DeploymentRun.objects.get(pk=run.pk))
    assert [t["task"] for t in grid["tasks"]] == ["Gathering Facts", "Install the driver"]
    a, b = grid["hosts"]
    assert (a["host"], a["state"]) == ("gpu-a", "running")
    assert [cell and cell["status"] for cell in a["cells"]] == ["ok", "running"]
    assert a["cells"][0]["duration_s"] == 1.5
    assert (b["state"], b["failed_task"]) == ("unreachable", "Gathering Facts")
    assert "Connection refused" in b["output"]
    assert b["cells"][1] is None

    recorder.on_event(_event("runner_on_failed", "gpu-a", "t2", "Install the driver",
                             role="nvidia_driver",
                             res={"failed": True, "msg": "No package matching 'cuda-drivers'",
                                  "stdout": "", "stderr": "E: Unable to locate", "rc": 100}))
    recorder.on_event({"event": "playbook_on_stats", "event_data": {
        "ok": {"gpu-a": 1}, "failures": {"gpu-a": 1}, "dark": {"gpu-b": 1},
        "processed": {"gpu-a": 1, "gpu-b": 1}}})
    run = _finish(run, recorder, "failed", 2, "")
    assert run.state == DeploymentState.FAILED
    assert run.stats["gpu-a"]["failures"] == 1 and run.stats["gpu-b"]["unreachable"] == 1
    assert run.message == ("2 of 2 nodes did not finish: gpu-a (failed at: Install the "
                           "driver), gpu-b (unreachable).")
    failed = run.results.get(host="gpu-a", status=TaskStatus.FAILED)
    assert "No package matching 'cuda-drivers'" in failed.output
    assert "stderr: E: Unable to locate" in failed.output and "rc: 100" in failed.output

    rerun = deployment_rerun_failed(actor=world.operator, run=run)
    assert rerun.hosts == ["gpu-a", "gpu-b"] and rerun.rerun_of == run


def test_a_clean_run_succeeds_and_has_nothing_to_rerun(world, lab,
                                                        django_capture_on_commit_callbacks):
    cluster, profile = lab
    run = start(world, cluster, profile, ["gpu-a"], django_capture_on_commit_callbacks)
    recorder = _Recorder(run)
    recorder.on_event(_event("runner_on_start", "gpu-a", "t1", "Probe"))
    recorder.on_event(_event("runner_on_failed", "gpu-a", "t1", "Probe", ignore_errors=True,
                             res={"failed": True, "msg": "tolerated"}))
    recorder.on_event({"event": "playbook_on_stats", "event_data": {
        "ok": {"gpu-a": 1}, "ignored": {"gpu-a": 1}, "processed": {"gpu-a": 1}}})
    run = _finish(run, recorder, "successful", 0, "")
    assert run.state == DeploymentState.SUCCEEDED
    # A failure the playbook tolerates: shown as it was, said so, not counted.
    row = run.results.get()
    assert row.status == TaskStatus.FAILED
    assert row.output == "Failed, ignored (ignore_errors).\ntolerated"
    host = deployment_grid(run=run)["hosts"][0]
    assert (host["state"], host["failed_task"]) == ("ok", "")
    with pytest.raises(ValidationError) as refused:
        deployment_rerun_failed(actor=world.operator, run=run)
    assert "Nothing failed" in refused.value.message_dict["run"][0]


def test_an_unreachable_node_the_playbook_tolerates_is_judged_by_its_recap(
        world, lab, django_capture_on_commit_callbacks):
    """`ignore_unreachable` does not show in the event: the recap says the node went on."""
    cluster, profile = lab
    run = start(world, cluster, profile, ["gpu-a", "gpu-b"], django_capture_on_commit_callbacks)
    recorder = _Recorder(run)
    for host in ("gpu-a", "gpu-b"):
        recorder.on_event(_event("runner_on_start", host, "t1", "Ask the BMC"))
    recorder.on_event(_event("runner_on_ok", "gpu-a", "t1", "Ask the BMC", res={}))
    recorder.on_event(_event("runner_on_unreachable", "gpu-b", "t1", "Ask the BMC",
                             res={"unreachable": True, "msg": "No route to host"}))
    recorder.on_event(_event("runner_on_start", "gpu-b", "t2", "Carry on"))
    recorder.on_event(_event("runner_on_ok", "gpu-b", "t2", "Carry on", res={}))
    # Live, before the recap: gpu-b went on past it, so it is running, not stopped.
    assert [h["state"] for h in deployment_grid(run=run)["hosts"]] == ["running", "running"]
    recorder.on_event({"event": "playbook_on_stats", "event_data": {
        "ok": {"gpu-a": 1, "gpu-b": 2}, "ignored": {"gpu-b": 1},
        "processed": {"gpu-a": 1, "gpu-b": 1}}})
    run = _finish(run, recorder, "successful", 0, "")
    assert (run.state, run.message) == (DeploymentState.SUCCEEDED, "")
    assert run.results.get(host="gpu-b", position=0).status == TaskStatus.UNREACHABLE
    assert deployment_failed_hosts(run) == []
    grid = deployment_grid(run=run)
    assert [(h["state"], h["failed_task"]) for h in grid["hosts"]] == [("ok", ""), ("ok", "")]


def test_the_grid_reads_the_output_of_failures_only(world, lab, django_assert_num_queries,
                                                    django_capture_on_commit_callbacks):
    """Read every 2 s by every viewer: the output of the tasks that went well stays in the
    database."""
    cluster, profile = lab
    run = start(world, cluster, profile, ["gpu-a", "gpu-b"], django_capture_on_commit_callbacks)
    DeploymentRun.objects.filter(pk=run.pk).update(state=DeploymentState.RUNNING)
    for position in range(3):
        DeploymentTaskResult.objects.create(run=run, host="gpu-a", position=position,
                                            task=f"Task {position}", status=TaskStatus.OK,
                                            output="x" * 8000)
    DeploymentTaskResult.objects.create(run=run, host="gpu-b", position=0, task="Task 0",
                                        status=TaskStatus.FAILED, output="E: no such package")
    run = DeploymentRun.objects.get(pk=run.pk)
    with django_assert_num_queries(1):
        grid = deployment_grid(run=run)
    a, b = grid["hosts"]
    assert [cell["output"] for cell in a["cells"]] == ["", "", ""]
    assert b["cells"][0]["output"] == "E: no such package"
    assert (b["state"], b["failed_task"], b["output"]) == ("failed", "Task 0",
                                                           "E: no such package")


# Runs with a stand-in for ansible-runner ----------------------------------------------------


class _VarsLoader(yaml.SafeLoader):
    pass


_VarsLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


@pytest.fixture
def fake_ansible(monkeypatch):
    """ansible-runner replaced: records the variables each run gave Ansible, and ends every
    host cleanly except those in `fail`."""
    state = SimpleNamespace(vars=[], fail=set())

    def run(**kwargs):
        path = Path(kwargs["private_data_dir"]) / "env" / "extravars"
        state.vars.append(yaml.load(path.read_text(), Loader=_VarsLoader))  # noqa: S506
        hosts = list(kwargs["inventory"]["all"]["hosts"])
        handler = kwargs["event_handler"]
        for host in hosts:
            handler(_event("runner_on_start", host, "t1", "Apply"))
            handler(_event("runner_on_failed" if host in state.fail else "runner_on_ok", host,
                           "t1", "Apply", res={"failed": host in state.fail}))
        handler({"event": "playbook_on_stats", "event_data": {
            "ok": {host: 1 for host in hosts},
            "failures": {host: 1 for host in hosts if host in state.fail},
            "processed": {host: 1 for host in hosts}}})
        failed = bool(state.fail & set(hosts))
        return SimpleNamespace(status="failed" if failed else "successful",
                               rc=2 if failed else 0, stdout=None)

    monkeypatch.setattr(ansible_runner, "run", run)
    return state


def test_the_munge_key_comes_from_the_setting_never_from_the_run(
        world, lab, settings, fake_ansible, django_capture_on_commit_callbacks):
    cluster, profile = lab
    settings.OGAI_SLURM_MUNGE_KEY_FILE = "/srv/ogai/munge.key"
    run = start(world, cluster, profile, ["gpu-a"], django_capture_on_commit_callbacks)
    assert deploy_run(run.pk) == DeploymentState.SUCCEEDED
    assert fake_ansible.vars[0]["stack_munge_key_file"] == "/srv/ogai/munge.key"
    assert "stack_munge_key_file" not in DeploymentRun.objects.get(pk=run.pk).extra_vars


def test_an_accounts_run_pushes_the_accounts_as_they_are_when_it_starts(
        world, lab, fake_ansible, django_capture_on_commit_callbacks):
    """A re-run of a failed push after a removal must not bring the account back, and two
    pushes of one cluster never run at once (an older one would land last)."""
    cluster, _ = lab
    alice = cluster_user_create(actor=world.operator, cluster=cluster, username="alice")

    def users(variables):
        return {user["name"]: user["state"] for user in variables["accounts_users"]}

    with django_capture_on_commit_callbacks(execute=False):
        first = cluster_accounts_push(actor=world.operator, cluster=cluster)
    with pytest.raises(ValidationError) as refused:
        cluster_accounts_push(actor=world.operator, cluster=cluster)
    assert (f"Accounts run {first.pk} of cluster lab is still queued"
            in refused.value.message_dict["cluster"][0])

    fake_ansible.fail = {"gpu-b"}
    assert deploy_run(first.pk) == DeploymentState.FAILED
    assert users(fake_ansible.vars[0]) == {"alice": "present"}

    cluster_user_remove(actor=world.operator, account=alice)
    with django_capture_on_commit_callbacks(execute=False):
        rerun = deployment_rerun_failed(actor=world.operator, run=first)
    assert rerun.hosts == ["gpu-b"]
    with pytest.raises(ValidationError) as refused:
        cluster_accounts_push(actor=world.operator, cluster=cluster)
    assert f"Accounts run {rerun.pk} of cluster lab" in refused.value.message_dict["cluster"][0]

    fake_ansible.fail = set()
    assert deploy_run(rerun.pk) == DeploymentState.SUCCEEDED
    assert users(fake_ansible.vars[1]) == {"alice": "absent"}
    # What was sent is what the run shows.
    assert users(DeploymentRun.objects.get(pk=rerun.pk).extra_vars) == {"alice": "absent"}
    with django_capture_on_commit_callbacks(execute=False):
        cluster_accounts_push(actor=world.operator, cluster=cluster)  # free again


def test_a_run_that_fails_early_says_the_end_of_ansibles_output_read_from_its_end(
        world, lab, monkeypatch, django_capture_on_commit_callbacks):
    """A long run's output runs to hundreds of MB: only its end is read."""
    cluster, profile = lab

    class Ended:
        status, rc = "failed", 4

        @property
        def stdout(self):  # ansible-runner's handle on the whole file
            raise AssertionError("the whole of Ansible's output was read")

    def run(**kwargs):
        artifacts = Path(kwargs["private_data_dir"]) / "artifacts" / kwargs["ident"]
        artifacts.mkdir(parents=True)
        with (artifacts / "stdout").open("w") as handle:
            for number in range(60_000):
                handle.write(f"line {number}: ok ✓\n")
            handle.write("ERROR! the playbook could not be parsed\n")
        return Ended()

    monkeypatch.setattr(ansible_runner, "run", run)
    run = start(world, cluster, profile, ["gpu-a"], django_capture_on_commit_callbacks)
    assert deploy_run(run.pk) == DeploymentState.FAILED
    run.refresh_from_db()
    assert run.message.startswith("ansible-playbook failed before any task ran. …")
    assert run.message.endswith("line 59999: ok ✓\nERROR! the playbook could not be parsed")
    assert len(run.message) < 2100


def test_old_runs_working_folders_are_pruned_and_their_results_kept(
        world, lab, settings, fake_ansible, django_capture_on_commit_callbacks):
    cluster, profile = lab
    settings.OGAI_DEPLOYMENT_ARTIFACTS_DAYS = 30
    root = Path(settings.DATA_DIR) / "deployments"
    old = start(world, cluster, profile, ["gpu-a"], django_capture_on_commit_callbacks)
    assert deploy_run(old.pk) == DeploymentState.SUCCEEDED
    recent = start(world, cluster, profile, ["gpu-b"], django_capture_on_commit_callbacks)
    assert deploy_run(recent.pk) == DeploymentState.SUCCEEDED
    running = start(world, cluster, profile, ["gpu-a"], django_capture_on_commit_callbacks)
    long_ago = timezone.now() - timedelta(days=31)
    DeploymentRun.objects.filter(pk=old.pk).update(finished_at=long_ago)
    DeploymentRun.objects.filter(pk=running.pk).update(state=DeploymentState.RUNNING,
                                                       updated_at=timezone.now())
    (root / str(running.pk)).mkdir()
    # Folders of runs deleted since: by their age.
    gone, fresh = root / "99998", root / "99999"
    gone.mkdir()
    fresh.mkdir()
    os.utime(gone, (long_ago.timestamp(), long_ago.timestamp()))
    (root / "notes").mkdir()
    assert (root / str(old.pk)).is_dir() and (root / str(recent.pk)).is_dir()

    assert sweep_deployment_runs() == {"ended": 0, "pruned": 2}
    assert sorted(path.name for path in root.iterdir()) == sorted(
        [str(recent.pk), str(running.pk), "99999", "notes"])
    old = DeploymentRun.objects.get(pk=old.pk)
    assert old.state == DeploymentState.SUCCEEDED and old.results.count() == 1
    assert sweep_deployment_runs()["pruned"] == 0

    settings.OGAI_DEPLOYMENT_ARTIFACTS_DAYS = 0  # kept for good
    DeploymentRun.objects.filter(pk=recent.pk).update(finished_at=long_ago)
    assert sweep_deployment_runs()["pruned"] == 0 and (root / str(recent.pk)).is_dir()


def _running(run, *, heartbeat_age_s: float) -> DeploymentRun:
    """The run as a worker left it mid-way: RUNNING, a task under way on gpu-a."""
    DeploymentRun.objects.filter(pk=run.pk).update(
        state=DeploymentState.RUNNING, started_at=timezone.now(),
        updated_at=timezone.now() - timedelta(seconds=heartbeat_age_s))
    DeploymentTaskResult.objects.create(run=run, host="gpu-a", position=0, task="Install",
                                        status=TaskStatus.RUNNING)
    return DeploymentRun.objects.get(pk=run.pk)


def test_a_run_whose_worker_was_lost_ends_failed_when_its_message_comes_again(
        world, lab, django_capture_on_commit_callbacks):
    cluster, profile = lab
    run = start(world, cluster, profile, ["gpu-a", "gpu-b"], django_capture_on_commit_callbacks)
    _running(run, heartbeat_age_s=deployments.LOST_AFTER_S + 60)
    # acks_late: the broker hands the message to another worker.
    assert deploy_run(run.pk) == DeploymentState.FAILED
    run.refresh_from_db()
    assert run.message == LOST_MESSAGE and run.finished_at is not None
    row = run.results.get()
    assert (row.status, row.output) == (TaskStatus.FAILED, LOST_MESSAGE)
    # No node got its recap: every one is re-run.
    assert deployment_failed_hosts(run) == ["gpu-a", "gpu-b"]
    assert deployment_rerun_failed(actor=world.operator, run=run).hosts == ["gpu-a", "gpu-b"]


def test_a_run_whose_worker_stopped_beating_long_ago_is_swept(
        world, lab, django_capture_on_commit_callbacks):
    cluster, profile = lab
    run = start(world, cluster, profile, ["gpu-a"], django_capture_on_commit_callbacks)
    _running(run, heartbeat_age_s=deployments.LOST_AFTER_S + 60)
    assert sweep_deployment_runs()["ended"] == 0, "a redelivery may still come: not yet"
    DeploymentRun.objects.filter(pk=run.pk).update(
        updated_at=timezone.now() - timedelta(seconds=deployments.SWEEP_AFTER_S + 60))
    assert sweep_deployment_runs()["ended"] == 1
    run.refresh_from_db()
    assert (run.state, run.message) == (DeploymentState.FAILED, LOST_MESSAGE)
    assert deployment_failed_hosts(run) == ["gpu-a"]


def test_a_run_whose_worker_still_beats_is_left_to_it(
        world, lab, monkeypatch, django_capture_on_commit_callbacks):
    cluster, profile = lab
    run = start(world, cluster, profile, ["gpu-a"], django_capture_on_commit_callbacks)
    _running(run, heartbeat_age_s=5)

    def beat(seconds):  # the first worker, still running it, touches it meanwhile
        DeploymentRun.objects.filter(pk=run.pk).update(updated_at=timezone.now())

    monkeypatch.setattr(deployments.time, "sleep", beat)
    assert deploy_run(run.pk) == DeploymentState.RUNNING
    monkeypatch.undo()

    # A heartbeat fresh when the message came, that then stops: lost after all.
    monkeypatch.setattr(deployments, "LOST_AFTER_S", 0.2)
    DeploymentRun.objects.filter(pk=run.pk).update(updated_at=timezone.now())
    assert deploy_run(run.pk) == DeploymentState.FAILED


# Real runs of stack.yml against this machine ------------------------------------------------


RESCUED_AND_IGNORED = """
- name: Failures that are rescued, ignored, and one that is not
  hosts: all
  gather_facts: false
  tasks:
    - name: Try the fast way
      block:
        - name: Fail on purpose
          ansible.builtin.fail:
            msg: no fast way here
      rescue:
        - name: Take the slow way
          ansible.builtin.debug:
            msg: rescued
    - name: Probe something optional
      ansible.builtin.fail:
        msg: not there
      ignore_errors: true
    - name: Fail for real on gpu-c
      ansible.builtin.fail:
        msg: gpu-c is broken
      when: inventory_hostname == "gpu-c"
    - name: Carry on
      ansible.builtin.debug:
        msg: done
"""


def test_a_rescued_or_ignored_failure_does_not_fail_its_node(
        world, lab, tmp_path, monkeypatch, django_capture_on_commit_callbacks):
    """A real ansible-runner run of a small playbook on this machine (two local nodes): the
    failures stay in the grid, each node is judged by its play recap."""
    cluster, profile = lab
    Node.objects.create(cluster=cluster, name="gpu-c", address="localhost")
    plays = tmp_path / "plays"
    plays.mkdir()
    (plays / "stack.yml").write_text(RESCUED_AND_IGNORED)
    monkeypatch.setattr(deployments, "PLAYBOOKS_DIR", plays)
    run = start(world, cluster, profile, ["gpu-a", "gpu-c"], django_capture_on_commit_callbacks)
    assert deploy_run(run.pk) == DeploymentState.FAILED
    run.refresh_from_db()
    assert run.stats["gpu-a"]["rescued"] == 1 and run.stats["gpu-a"]["ignored"] == 1
    assert run.message == "1 of 2 nodes did not finish: gpu-c (failed at: Fail for real on gpu-c)."
    a_rows = {row.task: row for row in run.results.filter(host="gpu-a")}
    assert a_rows["Fail on purpose"].status == TaskStatus.FAILED
    assert a_rows["Take the slow way"].status == TaskStatus.OK
    ignored = a_rows["Probe something optional"]
    assert (ignored.status, ignored.output) == (TaskStatus.FAILED,
                                                "Failed, ignored (ignore_errors).\nnot there")
    assert a_rows["Carry on"].status == TaskStatus.OK

    assert deployment_failed_hosts(run) == ["gpu-c"]
    grid = deployment_grid(run=run)
    a, c = grid["hosts"]
    assert (a["state"], a["failed_task"], a["output"]) == ("ok", "", "")
    assert (c["state"], c["failed_task"], c["output"]) == ("failed", "Fail for real on gpu-c",
                                                           "gpu-c is broken")
    assert deployment_rerun_failed(actor=world.operator, run=run).hosts == ["gpu-c"]


# Any user: a check-mode run on this machine needs no sudo (see `_inventory`).
@pytest.mark.slow
def test_stack_playbook_in_check_mode_against_this_machine(world, lab, tmp_path,
                                                            django_capture_on_commit_callbacks):
    cluster, profile = lab
    # 1. A rehearsal on this machine (another OS: waived in check mode) and a node that cannot
    #    be reached.
    run = start(world, cluster, profile, ["gpu-a", "gpu-b"], django_capture_on_commit_callbacks,
                check_mode=True, extra_vars={"stack_allow_os_mismatch": True})
    assert deploy_run(run.pk) == DeploymentState.FAILED
    run.refresh_from_db()
    assert run.stats["gpu-a"]["failures"] == 0 and run.stats["gpu-a"]["unreachable"] == 0, [
        (row.task, row.output) for row in run.results.filter(host="gpu-a", status__in=[
            TaskStatus.FAILED, TaskStatus.UNREACHABLE])]
    assert run.stats["gpu-a"]["ok"] > 10 and run.stats["gpu-a"]["changed"] > 0
    assert run.stats["gpu-b"]["unreachable"] == 1
    assert run.message == "1 of 2 nodes did not finish: gpu-b (unreachable)."

    rows = {row.task: row for row in run.results.filter(host="gpu-a")}
    assert not [row for row in rows.values() if row.status in (TaskStatus.FAILED,
                                                               TaskStatus.RUNNING)]
    assert rows["Gathering Facts"].status == TaskStatus.OK
    waived = rows["Say that the operating system check was waived"]
    assert waived.role == "preflight" and "Rehearsal: this node runs" in waived.output
    # Offline mode: the mirror is the only source, and in check mode nothing is written.
    assert rows["Point apt at the offline mirror"].status == TaskStatus.CHANGED
    assert rows["Make apt read the offline mirror and nothing else"].status == TaskStatus.CHANGED
    assert rows["Add the vendor apt repositories"].status == TaskStatus.SKIPPED
    assert not Path("/etc/apt/apt.conf.d/90ogai-offline").exists()
    # Package installs cannot be evaluated before their sources exist: skipped, and said so.
    assert rows["Install the NVIDIA driver (apt)"].status == TaskStatus.SKIPPED
    assert rows["Install the NVIDIA driver (dnf)"].status == TaskStatus.SKIPPED
    assert "cannot be evaluated" in rows[
        "Say why package installs are skipped in this check-mode run"].output
    assert rows["Install the node_exporter service"].status == TaskStatus.CHANGED
    assert "node_exporter-1.8.2.linux-amd64.tar.gz" in rows["Say what the download would do"].output
    assert rows["Check the free disk space"].status == TaskStatus.OK

    gpu_b = run.results.get(host="gpu-b")
    assert (gpu_b.task, gpu_b.status) == ("Gathering Facts", TaskStatus.UNREACHABLE)
    grid = deployment_grid(run=run)
    assert [host["state"] for host in grid["hosts"]] == ["ok", "unreachable"]
    assert len(grid["tasks"]) == len(rows)
    assert all(cell is not None for cell in grid["hosts"][0]["cells"])

    rerun = deployment_rerun_failed(actor=world.operator, run=run)
    assert (rerun.hosts, rerun.rerun_of_id, rerun.check_mode) == (["gpu-b"], run.pk, True)
    assert rerun.extra_vars == run.extra_vars
    deployment_cancel(actor=world.operator, run=rerun)

    # 2. Without the waiver the node stops at its first failure: the OS check.
    run = start(world, cluster, profile, ["gpu-a"], django_capture_on_commit_callbacks,
                check_mode=True)
    assert deploy_run(run.pk) == DeploymentState.FAILED
    run.refresh_from_db()
    failed = run.results.get(status=TaskStatus.FAILED)
    assert failed.task == "Refuse a node whose operating system is not the profile's"
    assert f"but the profile targets {PROFILE['os_family']}" in failed.output
    assert run.results.filter(position__gt=failed.position).count() == 0
    assert run.stats["gpu-a"]["failures"] == 1
    host = deployment_grid(run=run)["hosts"][0]
    assert (host["state"], host["failed_task"]) == ("failed", failed.task)
    rerun = deployment_rerun_failed(actor=world.operator, run=run)
    assert rerun.hosts == ["gpu-a"]
    # The variables were never left on disk.
    assert not (Path(str(tmp_path)) / "data" / "deployments" / str(run.pk) / "env").exists()
