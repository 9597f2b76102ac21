"""Deployment runs: a shipped playbook run through `ansible-runner` against nodes of a cluster,
its event stream recorded per node and task as it arrives, so the console shows progress live.

A node stops at its first failed task (Ansible's default) while the others go on; the run
succeeds only when every node's recap is clean, and its failed nodes can be run again alone.
"""

import json
import logging
import os
import re
import shutil
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from infra_os.access import require_platform_admin
from infra_os.services.audit import audit_record
from podsys import compat
from podsys.choices import (
    DEPLOYMENT_FINAL_STATES,
    DeploymentKind,
    DeploymentState,
    TaskStatus,
)
from podsys.models import Cluster, DeploymentRun, DeploymentTaskResult, StackProfile
from podsys.selectors_stack import IGNORED_NOTE
from podsys.services.slurm_stack import slurm_stack_finished
from podsys.services.stack import stack_profile_vars

logger = logging.getLogger(__name__)

PLAYBOOKS_DIR = Path(__file__).resolve().parent.parent / "playbooks"
PLAYBOOKS = {DeploymentKind.STACK: "stack.yml", DeploymentKind.ACCOUNTS: "accounts.yml"}
# ansible-runner stops a run after this long; the Celery task's limit is above it, so a run
# that hangs ends as a timed-out run rather than a killed worker.
RUN_TIMEOUT_S = 3 * 3600
LOCAL_ADDRESSES = ("localhost", "127.0.0.1", "::1")
# What a task's output keeps: the end, where the error is.
OUTPUT_LIMIT = 8000
_VAR_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_EXTRA_VARS_LIMIT = 2_000_000
# Variables naming a file on OGAI's own host (a `copy src:`): filled in from a setting when the
# run starts, never taken from a run, or any file OGAI can read could be copied onto a node.
SERVICE_PATH_VARS = {"stack_munge_key_file": "OGAI_SLURM_MUNGE_KEY_FILE"}
# The worker running a run touches it this often (`_Recorder.cancelled`); a run untouched for
# LOST_AFTER_S has lost its worker.
HEARTBEAT_S = 30
LOST_AFTER_S = 3 * HEARTBEAT_S
LOST_MESSAGE = "The worker running it was lost; re-run the failed nodes."
# The periodic sweep is more patient than a redelivery: nothing else speaks for these runs.
SWEEP_AFTER_S = 10 * HEARTBEAT_S


# Starting ----------------------------------------------------------------------------------


def _check_hosts(cluster: Cluster, hosts) -> list[str]:
    if not isinstance(hosts, list | tuple) or not all(isinstance(h, str) for h in hosts):
        raise ValidationError({"hosts": "Give the nodes as a list of node names."})
    hosts = list(dict.fromkeys(host.strip() for host in hosts if host.strip()))
    if not hosts:
        raise ValidationError({"hosts": "Give at least one node."})
    known = set(cluster.nodes.filter(name__in=hosts).values_list("name", flat=True))
    unknown = [host for host in hosts if host not in known]
    if unknown:
        raise ValidationError({"hosts": f"Not nodes of cluster {cluster.name}: "
                               f"{', '.join(unknown[:10])}."})
    return hosts


def _check_extra_vars(extra_vars, reserved: dict, check_mode: bool) -> dict:
    extra_vars = dict(extra_vars or {})
    for key in extra_vars:
        if not isinstance(key, str) or not _VAR_NAME.match(key):
            raise ValidationError({"extra_vars": f"{key!r} is not a variable name (lower case "
                                   "letters, digits and _)."})
        if key.startswith("ansible_"):
            raise ValidationError({"extra_vars": f"{key}: connection settings come from the "
                                   "cluster's nodes and OGAI's settings, not from a run."})
        if key in reserved:
            raise ValidationError({"extra_vars": f"{key} comes from the stack profile; change "
                                   "the profile instead."})
        if key in SERVICE_PATH_VARS:
            raise ValidationError({"extra_vars": f"{key} names a file on OGAI's host: it comes "
                                   f"from the setting {SERVICE_PATH_VARS[key]}, never from a "
                                   "run."})
    try:
        size = len(json.dumps(extra_vars))
    except (TypeError, ValueError):
        raise ValidationError({"extra_vars": "Give plain JSON values."}) from None
    if size > _EXTRA_VARS_LIMIT:
        raise ValidationError({"extra_vars": "The variables are too large."})
    if extra_vars.get("stack_allow_os_mismatch") and not check_mode:
        raise ValidationError({"extra_vars": "stack_allow_os_mismatch rehearses a deployment "
                               "on another OS: check mode only."})
    return extra_vars


def _check_not_busy(cluster: Cluster, kind: str, hosts: list[str]) -> None:
    """Two stack runs on one node would fight over its package manager's lock; accounts runs of
    a cluster go one at a time, so an older push can never land after a newer one. The caller
    holds the cluster's row lock, so two starts cannot both pass."""
    busy = DeploymentRun.objects.filter(
        cluster=cluster, kind=kind,
        state__in=[DeploymentState.QUEUED, DeploymentState.RUNNING]).order_by("pk")
    if kind == DeploymentKind.ACCOUNTS:
        other = busy.first()
        if other is not None:
            raise ValidationError({"cluster": f"Accounts run {other.pk} of cluster "
                                   f"{cluster.name} is still "
                                   f"{other.get_state_display().lower()}; wait for it or "
                                   "cancel it."})
        return
    for other in busy:
        shared = [host for host in hosts if host in other.hosts]
        if shared:
            raise ValidationError({"hosts": f"{', '.join(shared[:5])} "
                                   f"{'is' if len(shared) == 1 else 'are'} being deployed by run "
                                   f"{other.pk}; wait for it or cancel it."})


def _enqueue(run_id: int) -> None:
    from podsys.tasks.deployments import deploy_run

    deploy_run.delay(run_id)


def _create_run(*, actor, cluster: Cluster, kind: str, hosts: list[str],
                profile: StackProfile | None, check_mode: bool, extra_vars: dict,
                rerun_of: DeploymentRun | None = None) -> DeploymentRun:
    run = DeploymentRun.objects.create(
        cluster=cluster, kind=kind, profile=profile, playbook=PLAYBOOKS[DeploymentKind(kind)],
        hosts=hosts, check_mode=check_mode, extra_vars=extra_vars, rerun_of=rerun_of,
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
    transaction.on_commit(lambda: _enqueue(run.pk))
    return run


@transaction.atomic
def deployment_start(*, actor, cluster: Cluster, kind: str, hosts: list[str],
                     profile: StackProfile | None = None, check_mode: bool = False,
                     extra_vars: dict | None = None) -> DeploymentRun:
    """Queue a run of the playbook of `kind` against `hosts` (node names of `cluster`). A stack
    run deploys `profile` (checked against the matrix again: it may have changed); its
    variables are stored with the run, so a re-run repeats exactly this one. An accounts run
    sends the accounts as they are when it starts, and one runs at a time per cluster."""
    require_platform_admin(actor)
    if kind not in DeploymentKind.values:
        raise ValidationError({"kind": f"Unknown deployment kind {kind!r}; use one of "
                               f"{', '.join(DeploymentKind.values)}."})
    # Held to the end of the transaction: the busy check below and the new run are one step.
    cluster = Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
    if not cluster.is_active:
        raise ValidationError({"cluster": f"Cluster {cluster.name} is inactive."})
    reserved: dict[str, Any] = {}
    if kind == DeploymentKind.STACK:
        if profile is None:
            raise ValidationError({"profile": "A stack deployment needs a stack profile."})
        problems = compat.profile_problems(profile)
        if problems:
            field, reason = next(iter(problems.items()))
            raise ValidationError({"profile": f"Profile {profile.name} no longer passes the "
                                   f"compatibility matrix ({field}): {reason}"})
        reserved = stack_profile_vars(profile)
    elif profile is not None:
        raise ValidationError({"profile": f"A {kind} run takes no stack profile."})
    hosts = _check_hosts(cluster, hosts)
    extra = _check_extra_vars(extra_vars, reserved, check_mode)
    _check_not_busy(cluster, kind, hosts)
    run = _create_run(actor=actor, cluster=cluster, kind=kind, hosts=hosts, profile=profile,
                      check_mode=check_mode, extra_vars={**reserved, **extra})
    audit_record(actor=actor, action="deployment.start", obj=run, tenant=cluster.tenant,
                 changes={"kind": kind, "profile": profile.name if profile else None,
                          "hosts": hosts, "check_mode": check_mode,
                          "extra_vars": sorted(extra)})
    return run


def deployment_failed_hosts(run: DeploymentRun) -> list[str]:
    """The run's nodes that did not finish cleanly, judged by their play recap: failures or
    unreachable there. A task that failed and was rescued (block/rescue) or ignored
    (ignore_errors, ignore_unreachable) keeps its failed or unreachable cell but is not counted
    in the recap, nor here. A node without a recap (the run stopped, timed out or lost its
    worker before the end) did not finish."""
    stats = run.stats or {}
    return [host for host in run.hosts
            if (recap := stats.get(host)) is None or recap.get("failures")
            or recap.get("unreachable")]


@transaction.atomic
def deployment_rerun_failed(*, actor, run: DeploymentRun) -> DeploymentRun:
    """A new run of the same playbook, variables and mode on only the nodes of `run` that
    failed or could not be reached (an accounts run pushes the accounts as they are when it
    starts)."""
    require_platform_admin(actor)
    run = DeploymentRun.objects.select_for_update().select_related("cluster").get(pk=run.pk)
    if run.state not in DEPLOYMENT_FINAL_STATES:
        raise ValidationError({"run": f"Run {run.pk} is still {run.get_state_display().lower()}; "
                               "re-run its failed nodes once it ends."})
    failed = deployment_failed_hosts(run)
    if not failed:
        raise ValidationError({"run": f"Nothing failed in run {run.pk}: every node finished "
                               "cleanly."})
    if not run.cluster.is_active:
        raise ValidationError({"cluster": f"Cluster {run.cluster.name} is inactive."})
    hosts = _check_hosts(run.cluster, failed)
    Cluster.objects.select_for_update(no_key=True).get(pk=run.cluster_id)
    _check_not_busy(run.cluster, run.kind, hosts)
    new = _create_run(actor=actor, cluster=run.cluster, kind=run.kind, hosts=hosts,
                      profile=run.profile, check_mode=run.check_mode,
                      extra_vars=run.extra_vars, rerun_of=run)
    audit_record(actor=actor, action="deployment.rerun_failed", obj=new,
                 tenant=run.cluster.tenant, changes={"rerun_of": run.pk, "hosts": hosts})
    return new


@transaction.atomic
def deployment_cancel(*, actor, run: DeploymentRun) -> DeploymentRun:
    """Stop a run: a queued one never starts; a running one is stopped within seconds (tasks
    under way on the nodes are interrupted where they are)."""
    require_platform_admin(actor)
    run = DeploymentRun.objects.select_for_update().get(pk=run.pk)
    if run.state in DEPLOYMENT_FINAL_STATES:
        raise ValidationError({"state": f"Run {run.pk} already ended "
                               f"({run.get_state_display().lower()})."})
    was = run.state
    run.state = DeploymentState.CANCELLED
    # The worker running it notices the state (see `_Recorder.cancelled`), stops Ansible and
    # sets the time it really ended.
    run.finished_at = timezone.now()
    run.message = f"Cancelled by {actor.get_username()}."
    run.save(update_fields=["state", "finished_at", "message", "updated_at"])
    audit_record(actor=actor, action="deployment.cancel", obj=run, tenant=run.cluster.tenant,
                 changes={"state": {"from": was, "to": run.state}})
    return run


# Running -----------------------------------------------------------------------------------


class _Unsafe(str):
    """A string Ansible must never template (`!unsafe`): the run's variables are data, and a
    template in them (`{{ lookup('pipe', ...) }}`) would run on OGAI's host."""


def _unsafe_representer(dumper: yaml.SafeDumper, value: _Unsafe) -> yaml.Node:
    return dumper.represent_scalar("!unsafe", str(value), style="'")


class _VarsDumper(yaml.SafeDumper):
    pass


_VarsDumper.add_representer(_Unsafe, _unsafe_representer)


def _mark_unsafe(value):
    # Only strings that could hold a template: ansible-core reads every `!unsafe` scalar by
    # its plain YAML type, so "9.5" would come back a float.
    if isinstance(value, str):
        return _Unsafe(value) if "{" in value else value
    if isinstance(value, dict):
        return {key: _mark_unsafe(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [_mark_unsafe(inner) for inner in value]
    return value


def _service_vars(run: DeploymentRun) -> dict:
    """Variables given to the playbook but never stored with the run: secrets, and paths on
    OGAI's host from its settings (see SERVICE_PATH_VARS)."""
    if run.kind == DeploymentKind.ACCOUNTS:
        from podsys.services.accounts import accounts_secret_vars

        return accounts_secret_vars(cluster=run.cluster)
    # Empty: the slurm_node role expects munge already keyed on the node, and says so.
    return {"stack_munge_key_file": settings.OGAI_SLURM_MUNGE_KEY_FILE}


def _inventory(run: DeploymentRun, folder: Path) -> dict:
    nodes = {node.name: node for node in run.cluster.nodes.filter(name__in=run.hosts)}
    known_hosts = Path(settings.DATA_DIR) / "ansible" / "known_hosts"
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts = {}
    for name in run.hosts:
        node = nodes.get(name)
        address = (node.address if node else "") or name
        if run.cluster.driver == "local" or address in LOCAL_ADDRESSES:
            # This machine: no SSH, and OGAI's own Python runs the modules.
            host = {"ansible_connection": "local", "ansible_host": address,
                    "ansible_python_interpreter": sys.executable,
                    # Not ~/.ansible: OGAI's service user may have no home to write in.
                    "ansible_remote_tmp": str(folder / "tmp" / "remote")}
            # Root needs no sudo; nor does a check-mode run, which only reads (and OGAI's
            # user may have no sudo at all).
            if os.geteuid() == 0 or run.check_mode:
                host["ansible_become"] = False
        else:
            host = {"ansible_host": address, "ansible_user": settings.OGAI_ANSIBLE_SSH_USER,
                    "ansible_python_interpreter": "auto_silent",
                    # Trust a node's host key the first time, and hold it to it afterwards.
                    "ansible_ssh_common_args": "-o StrictHostKeyChecking=accept-new "
                                               f"-o UserKnownHostsFile={known_hosts}"}
            if settings.OGAI_ANSIBLE_SSH_KEY_FILE:
                host["ansible_ssh_private_key_file"] = settings.OGAI_ANSIBLE_SSH_KEY_FILE
        hosts[name] = host
    return {"all": {"hosts": hosts}}


def _envvars(folder: Path) -> dict:
    # `ansible-playbook` comes with OGAI's environment, which may not be on the worker's PATH.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {
        "PATH": path,
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
        "ANSIBLE_LOCAL_TEMP": str(folder / "tmp"),
        "ANSIBLE_TIMEOUT": "30",
    }


def _tail(text: Any, limit: int = OUTPUT_LIMIT) -> str:
    text = text if isinstance(text, str) else json.dumps(text, default=str)
    return text if len(text) <= limit else "…" + text[-limit:]


def _task_output(res: dict, action: str) -> str:
    """What a person reads of a task's result: its message, the failing loop items, the end
    of its stdout and stderr, its return code."""
    if res.get("censored"):
        return str(res["censored"])
    parts = []
    if res.get("msg"):
        parts.append(str(res["msg"]))
    for item in res.get("results") or []:
        if isinstance(item, dict) and item.get("failed"):
            label = item.get("_ansible_item_label", item.get("item"))
            parts.append(f"{label}: {item.get('msg') or item.get('stderr') or 'failed'}")
    for stream in ("stdout", "stderr"):
        if res.get(stream) and (res.get("failed") or res.get("rc")):
            parts.append(f"{stream}: {_tail(res[stream], OUTPUT_LIMIT // 2)}")
    if res.get("rc") not in (None, 0):
        parts.append(f"rc: {res['rc']}")
    if action.endswith("set_fact") and res.get("ansible_facts"):
        parts.extend(f"{key}: {_tail(value, 300)}" for key, value in res["ansible_facts"].items())
    return _tail("\n".join(parts))


def _file_tail(path: Path, limit: int) -> str:
    """The last `limit` characters of a text file, read from its end: a long run's Ansible
    output runs to hundreds of MB."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            # Up to 4 bytes a character in UTF-8; a character cut in two is dropped by _tail.
            handle.seek(max(0, size - 4 * limit - 4))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return _tail(text, limit)


def _event_time(value: str | None) -> datetime:
    parsed = parse_datetime(value) if value else None
    if parsed is None:
        return timezone.now()
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=UTC)


class _Recorder:
    """Turns ansible-runner's events into DeploymentTaskResult rows as they arrive."""

    RESULT_EVENTS = {
        "runner_on_ok": TaskStatus.OK,
        "runner_on_failed": TaskStatus.FAILED,
        "runner_on_skipped": TaskStatus.SKIPPED,
        "runner_on_unreachable": TaskStatus.UNREACHABLE,
    }

    def __init__(self, run: DeploymentRun) -> None:
        self.run = run
        # A task's column in the grid: the order of its first start in the run.
        self.positions: dict[str, int] = {}
        self.stats: dict[str, dict] | None = None
        self.was_cancelled = False
        self._checked_at = 0.0
        self._beat_at = time.monotonic()

    def _position(self, data: dict) -> int:
        key = str(data.get("task_uuid") or data.get("task") or "")
        if key not in self.positions:
            self.positions[key] = len(self.positions)
        return self.positions[key]

    def _row(self, data: dict, created: str | None) -> DeploymentTaskResult:
        position = self._position(data)
        row, _ = DeploymentTaskResult.objects.get_or_create(
            run=self.run, host=str(data.get("host", ""))[:253], position=position,
            defaults={"play": str(data.get("play") or "")[:200],
                      "role": str(data.get("role") or "")[:100],
                      "task": str(data.get("task") or data.get("task_action") or "")[:300],
                      "started_at": _event_time(created)},
        )
        return row

    def on_event(self, event: dict) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        try:
            if kind == "runner_on_start" and data.get("host"):
                self._row(data, event.get("created"))
            elif kind in self.RESULT_EVENTS and data.get("host"):
                self._result(kind, data, event.get("created"))
            elif kind == "playbook_on_stats":
                self._stats(data)
        except Exception:
            # A lost row must not kill the run on the nodes.
            logger.exception("Deployment run %s: could not record event %s", self.run.pk, kind)
        return False  # the database keeps the events; no need for ansible-runner's files

    def _result(self, kind: str, data: dict, created: str | None) -> None:
        row = self._row(data, data.get("start") or created)
        res = data.get("res") or {}
        status = self.RESULT_EVENTS[kind]
        if status == TaskStatus.OK and res.get("changed"):
            status = TaskStatus.CHANGED
        row.status = status
        row.changed = bool(res.get("changed"))
        row.output = _task_output(res, str(data.get("task_action") or ""))
        if status == TaskStatus.FAILED and data.get("ignore_errors"):
            # It failed, and the playbook says that is fine: shown failed, never counted.
            row.output = f"{IGNORED_NOTE}\n{row.output}".rstrip()
        row.finished_at = _event_time(data.get("end") or created)
        duration = data.get("duration")
        row.duration_s = (float(duration) if duration is not None else
                          max((row.finished_at - row.started_at).total_seconds(), 0)
                          if row.started_at else None)
        row.save(update_fields=["status", "changed", "output", "finished_at", "duration_s"])

    def _stats(self, data: dict) -> None:
        counts = {"ok": "ok", "changed": "changed", "failures": "failures",
                  "unreachable": "dark", "skipped": "skipped", "rescued": "rescued",
                  "ignored": "ignored"}
        hosts = set(data.get("processed") or {})
        for key in counts.values():
            hosts.update(data.get(key) or {})
        self.stats = {host: {name: int((data.get(key) or {}).get(host, 0))
                             for name, key in counts.items()} for host in sorted(hosts)}
        DeploymentRun.objects.filter(pk=self.run.pk).update(stats=self.stats)

    def cancelled(self) -> bool:
        """ansible-runner asks between reads of Ansible's output, at least once a second; the
        database is asked at most once a second. Also the run's heartbeat: a redelivered
        message finds the run touched and leaves it to this worker (see `_redelivered`)."""
        now = time.monotonic()
        if now - self._beat_at >= HEARTBEAT_S:
            self._beat_at = now
            DeploymentRun.objects.filter(pk=self.run.pk, state=DeploymentState.RUNNING).update(
                updated_at=timezone.now())
        if not self.was_cancelled and now - self._checked_at >= 1.0:
            self._checked_at = now
            self.was_cancelled = DeploymentRun.objects.filter(
                pk=self.run.pk, state=DeploymentState.CANCELLED).exists()
        return self.was_cancelled


def _write_vars(folder: Path, variables: dict) -> None:
    """ansible-runner reads env/extravars itself; a file (owner-only) keeps the variables off
    the command line, where other users of the machine could read them."""
    env = folder / "env"
    env.mkdir(parents=True, exist_ok=True)
    path = env / "extravars"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.dump(_mark_unsafe(variables), handle, Dumper=_VarsDumper, sort_keys=False)


def _summary(run: DeploymentRun, stats: dict, runner_status: str, stdout_tail: str) -> str:
    failed = deployment_failed_hosts(run)
    if not failed:
        return ""
    if not stats:
        why = "timed out" if runner_status == "timeout" else "failed before any task ran"
        return f"ansible-playbook {why}. {stdout_tail}".strip()
    # Each node's last failure that was not ignored: one before it was rescued.
    stopped_at: dict[str, tuple[str, str]] = {}
    for host, status, task in (run.results
                               .filter(host__in=failed[:10],
                                       status__in=[TaskStatus.FAILED, TaskStatus.UNREACHABLE])
                               .exclude(output__startswith=IGNORED_NOTE)
                               .order_by("position").values_list("host", "status", "task")):
        stopped_at[host] = (status, task)
    parts = []
    for host in failed[:10]:
        status, task = stopped_at.get(host, ("", ""))
        if not status:
            parts.append(f"{host} (did not finish)")
        elif status == TaskStatus.UNREACHABLE:
            parts.append(f"{host} (unreachable)")
        else:
            parts.append(f"{host} (failed at: {task})")
    more = f" and {len(failed) - 10} more" if len(failed) > 10 else ""
    prefix = "Timed out. " if runner_status == "timeout" else ""
    return (f"{prefix}{len(failed)} of {len(run.hosts)} node"
            f"{'s' if len(run.hosts) != 1 else ''} did not finish: {', '.join(parts)}{more}.")


def deployment_execute(*, run: DeploymentRun) -> DeploymentRun:
    """Run a queued deployment to its end (the Celery task calls this). Long: not one
    transaction; every event is its own write, so the console sees progress live."""
    import ansible_runner

    with transaction.atomic():
        run = DeploymentRun.objects.select_for_update().select_related("cluster").get(pk=run.pk)
        redelivered = run.state == DeploymentState.RUNNING
        if run.state != DeploymentState.QUEUED and not redelivered:
            logger.info("Deployment run %s is %s; not starting it.", run.pk, run.state)
            return run
        if not redelivered:
            run.state = DeploymentState.RUNNING
            run.started_at = timezone.now()
            if run.kind == DeploymentKind.ACCOUNTS:
                # The accounts as they are now, not as they were when the run was queued: a
                # re-run of an old push must not bring back an account removed since.
                from podsys.services.accounts import accounts_vars

                run.extra_vars = {**run.extra_vars, **accounts_vars(cluster=run.cluster)}
            run.save(update_fields=["state", "started_at", "extra_vars", "updated_at"])
    if redelivered:
        return _redelivered(run)

    folder = Path(settings.DATA_DIR) / "deployments" / str(run.pk)
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    recorder = _Recorder(run)
    runner_status, rc, stdout_tail = "failed", None, ""
    try:
        _write_vars(folder, {**run.extra_vars, **_service_vars(run)})
        runner = ansible_runner.run(
            private_data_dir=str(folder),
            project_dir=str(PLAYBOOKS_DIR),
            playbook=run.playbook,
            inventory=_inventory(run, folder),
            envvars=_envvars(folder),
            cmdline="--check" if run.check_mode else None,
            forks=max(1, min(settings.OGAI_ANSIBLE_FORKS, len(run.hosts))),
            ident="run",
            quiet=True,
            suppress_env_files=True,
            timeout=RUN_TIMEOUT_S,
            # How often ansible-runner looks up from Ansible's output, and so asks whether the
            # run was cancelled.
            settings={"pexpect_timeout": 1},
            event_handler=recorder.on_event,
            cancel_callback=recorder.cancelled,
        )
        runner_status, rc = runner.status, runner.rc
        if runner_status != "successful":
            stdout_tail = _file_tail(folder / "artifacts" / "run" / "stdout", 2000)
    except Exception as exc:
        logger.exception("Deployment run %s could not run", run.pk)
        stdout_tail = f"{type(exc).__name__}: {exc}"
    finally:
        # The variables may hold a secret (a bind password): gone once Ansible read them.
        shutil.rmtree(folder / "env", ignore_errors=True)
    return _finish(run, recorder, runner_status, rc, stdout_tail)


def _redelivered(run: DeploymentRun) -> DeploymentRun:
    """The message of a running run came again. acks_late redelivers it when the worker
    running it was lost (and a Redis broker when a run outlasts its visibility timeout, its
    worker well). A worker that still touches the run keeps it; otherwise the run ends failed,
    and its nodes without a recap are what a re-run of the failed nodes takes."""
    seen = run.updated_at
    age = (timezone.now() - seen).total_seconds()
    deadline = time.monotonic() + max(0.0, LOST_AFTER_S - age)
    while time.monotonic() < deadline:
        time.sleep(min(HEARTBEAT_S / 6, max(deadline - time.monotonic(), 0.0)))
        if not DeploymentRun.objects.filter(pk=run.pk, state=DeploymentState.RUNNING,
                                            updated_at=seen).exists():
            logger.info("Deployment run %s is still run by another worker, or ended.", run.pk)
            return DeploymentRun.objects.get(pk=run.pk)
    return _end_lost(run.pk, seen)


def _end_lost(run_id: int, seen) -> DeploymentRun:
    """End a running run failed, unless its worker touched it since `seen`."""
    now = timezone.now()
    with transaction.atomic():
        run = DeploymentRun.objects.select_for_update().get(pk=run_id)
        if run.state != DeploymentState.RUNNING or run.updated_at != seen:
            return run
        run.results.filter(status=TaskStatus.RUNNING).update(
            status=TaskStatus.FAILED, finished_at=now, output=LOST_MESSAGE)
        run.state = DeploymentState.FAILED
        run.finished_at = now
        run.message = LOST_MESSAGE
        run.save(update_fields=["state", "finished_at", "message", "updated_at"])
    logger.warning("Deployment run %s lost its worker; marked failed.", run.pk)
    return run


def deployment_runs_sweep(*, now=None) -> int:
    """End the running runs whose worker stopped beating long ago: a broker that never
    redelivers their message (the filesystem one of `make run`) would leave them running,
    holding their nodes against new runs. Returns how many ended."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=SWEEP_AFTER_S)
    ended = 0
    for run_id, seen in DeploymentRun.objects.filter(
            state=DeploymentState.RUNNING, updated_at__lt=stale).values_list("pk", "updated_at"):
        ended += _end_lost(run_id, seen).message == LOST_MESSAGE
    return ended


def deployment_artifacts_prune(*, now=None) -> int:
    """Delete the working folders of runs (`DATA_DIR/deployments/<id>/`: Ansible's output, its
    temporary files) that ended more than OGAI_DEPLOYMENT_ARTIFACTS_DAYS ago, and of runs
    deleted since; the runs and their task results stay. 0 days keeps them. Returns how many
    folders went."""
    days = settings.OGAI_DEPLOYMENT_ARTIFACTS_DAYS
    root = Path(settings.DATA_DIR) / "deployments"
    if days <= 0 or not root.is_dir():
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    folders = {int(path.name): path for path in root.iterdir()
               if path.name.isdigit() and path.is_dir()}
    runs = {pk: (state, finished_at) for pk, state, finished_at in DeploymentRun.objects.filter(
        pk__in=list(folders)).values_list("pk", "state", "finished_at")}
    pruned = 0
    for pk, path in folders.items():
        if pk in runs:
            state, finished_at = runs[pk]
            old = (state in DEPLOYMENT_FINAL_STATES and finished_at is not None
                   and finished_at < cutoff)
        else:
            old = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC) < cutoff
        if old:
            shutil.rmtree(path, ignore_errors=True)
            pruned += not path.exists()
    if pruned:
        logger.info("Deleted the working folders of %s ended deployment runs.", pruned)
    return pruned


def _finish(run: DeploymentRun, recorder: _Recorder, runner_status: str, rc: int | None,
            stdout_tail: str) -> DeploymentRun:
    now = timezone.now()
    with transaction.atomic():
        run = DeploymentRun.objects.select_for_update().get(pk=run.pk)
        # Tasks that never reported back (the run was stopped under them).
        run.results.filter(status=TaskStatus.RUNNING).update(
            status=TaskStatus.FAILED, finished_at=now,
            output="The run ended before this task reported back.")
        run.stats = recorder.stats or run.stats or {}
        run.rc = rc
        run.finished_at = now
        if run.state == DeploymentState.CANCELLED or recorder.was_cancelled:
            run.state = DeploymentState.CANCELLED
        elif (runner_status == "successful" and rc == 0
              and not deployment_failed_hosts(run)):
            run.state = DeploymentState.SUCCEEDED
            run.message = ""
        else:
            run.state = DeploymentState.FAILED
            run.message = (_summary(run, run.stats, runner_status, stdout_tail)
                           or f"ansible-playbook ended {runner_status} (rc {rc}).")
        run.save(update_fields=["state", "stats", "rc", "finished_at", "message", "updated_at"])
    if run.kind == DeploymentKind.ACCOUNTS:
        from podsys.services.accounts import cluster_accounts_mark_pushed

        cluster_accounts_mark_pushed(run=run)
    run = slurm_stack_finished(run)
    logger.info("Deployment run %s ended %s", run.pk, run.state)
    return run
