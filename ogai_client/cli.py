"""`ogai`: the command line of OGAI.

Every failure exits 1 (2 for a usage error) with one line on stderr that says what to fix; no
traceback ever reaches the user.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ogai_client import __version__
from ogai_client.client import OgaiClient, OgaiError
from ogai_client.config import (
    TOKEN_ENV,
    URL_ENV,
    Config,
    ConfigError,
    load_config,
    read_file_config,
    save_config,
)
from ogai_client.logs import LogFollower
from ogai_client.models import ACTIVE_STATES, FINAL_STATES, Job, Notebook, RayAddresses, Workdir
from ogai_client.spec import SpecError, parse_memory, parse_spec, workdir_target
from ogai_client.workdir import display_folder, human_size

STATE_STYLES = {
    "queued": "yellow", "admitted": "cyan", "running": "bold blue", "succeeded": "green",
    "failed": "bold red", "cancelled": "dim", "preempted": "magenta", "restarting": "yellow",
    # notebooks
    "waiting": "yellow", "starting": "cyan", "stopped": "dim",
    # YLink runs: their job ended well, their result is being recorded
    "finishing": "cyan",
}
DEFAULT_TAIL = 500


class UsageError(Exception):
    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.prog = prog


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so a usage error is one
    line like every other error."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.prog)


class Context:
    def __init__(self) -> None:
        self.out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        self._client: OgaiClient | None = None

    def client(self) -> OgaiClient:
        """A client for the configured URL and token, or an error saying how to log in."""
        if self._client is None:
            config = load_config()
            if not config.url:
                raise OgaiError("not_logged_in", "not logged in: run `ogai login --url URL` "
                                f"(or set {URL_ENV} and {TOKEN_ENV})")
            if not config.token:
                raise OgaiError("not_logged_in", f"no API token for {config.url}: run "
                                f"`ogai login` (or set {TOKEN_ENV})")
            self._client = OgaiClient(config.url, config.token)
        return self._client

    def note(self, message: str, style: str = "dim") -> None:
        """Progress for people, on stderr, so stdout stays clean for pipes."""
        self.err.print(Text(message, style=style), soft_wrap=True)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error_line(exc: OgaiError) -> str:
    message = _one_line(exc.message)
    if exc.status == 401 or exc.code in {"not_authenticated", "authentication_failed"}:
        return f"{message.rstrip('.')}. Run `ogai login` to sign in again."
    others = [name for name in list(exc.fields)[1:] if name not in message]
    if others:
        message += f" (also: {', '.join(others)})"
    return message


@contextmanager
def _about_job(job_id: int) -> Iterator[None]:
    """An unknown job is "not found", whether it does not exist or belongs to another tenant."""
    try:
        yield
    except OgaiError as exc:
        if exc.code == "not_found" and exc.status == 404:
            raise OgaiError("not_found", f"job {job_id} not found (or not visible to you)",
                            status=exc.status) from None
        raise


@contextmanager
def _about_notebook(notebook_id: int) -> Iterator[None]:
    """An unknown notebook is "not found", whether it does not exist or is someone else's."""
    try:
        yield
    except OgaiError as exc:
        if exc.code == "not_found" and exc.status == 404:
            raise OgaiError("not_found", f"notebook {notebook_id} not found (or not visible to "
                            "you)", status=exc.status) from None
        raise


# -- formatting ---------------------------------------------------------------------------------

def _state(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def _age(moment: datetime | None, now: datetime | None = None) -> str:
    if moment is None:
        return "-"
    seconds = max(0, int(((now or datetime.now(UTC)) - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _when(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def _gpus(job: Job) -> str:
    if not job.resources.gpus:
        return "0"
    model = f" {job.resources.gpu_model}" if job.resources.gpu_model else ""
    if job.replicas == 1:
        return f"{job.resources.gpus}{model}"
    return f"{job.replicas}x{job.resources.gpus}{model}"


def _memory(mib: int) -> str:
    return f"{mib / 1024:g}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def _table(title: str | None = None) -> Table:
    return Table(title=title, title_justify="left", title_style="bold", box=None,
                 pad_edge=False, header_style="bold")


def _print_json(ctx: Context, data: Any) -> None:
    ctx.out.file.write(json.dumps(data, indent=2, default=str) + "\n")


# -- login and identity -------------------------------------------------------------------------

def cmd_login(args: argparse.Namespace, ctx: Context) -> int:
    stored = read_file_config()
    url = args.url or os.environ.get(URL_ENV) or stored.url
    if not url:
        raise OgaiError("bad_url", "give the platform's URL: ogai login --url "
                        "http://127.0.0.1:8000")
    client = OgaiClient(url)
    ctx._client = client
    if args.token:
        client.token = args.token
        how = "with the given token"
    else:
        username = args.username
        if not username:
            if not sys.stdin.isatty():
                raise OgaiError("usage", "give --username (or --token): no terminal to ask on")
            username = input("Username: ").strip()
        if args.password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
        else:
            password = getpass.getpass(f"Password for {username} at {client.url}: ")
        if not password:
            raise OgaiError("usage", "no password given")
        with ctx.err.status("Signing in…") if ctx.err.is_terminal else _nothing():
            try:
                client.login(username, password, token_name=f"cli on {socket.gethostname()}",
                             expires_in_days=args.expires_in_days)
            except OgaiError as exc:
                if exc.code != "permission_denied":
                    raise
                raise OgaiError(exc.code, f"{exc.message.rstrip('.')}: {username} cannot "
                                "create the API token the CLI needs", status=exc.status) from None
        how = "with a new API token"
    user = client.me()
    path = save_config(Config(url=client.url, token=client.token))
    ctx.out.print(Text.assemble(f"Logged in to {client.url} as ", (user.username, "bold"),
                                f" {how}, stored in {path}."))
    if os.environ.get(TOKEN_ENV):
        ctx.note(f"note: {TOKEN_ENV} is set in the environment and overrides the stored token")
    return 0


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def cmd_whoami(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    user = client.me()
    if args.json:
        _print_json(ctx, user.raw)
        return 0
    name = " ".join(part for part in (user.first_name, user.last_name) if part)
    line = Text.assemble((user.username, "bold"), f" ({name})" if name else "",
                         f" <{user.email}>" if user.email else "", f" at {client.url}")
    ctx.out.print(line)
    if user.is_platform_admin:
        ctx.out.print("platform admin")
    tenants = ", ".join(f"{m.tenant} ({m.role})" for m in user.memberships) or "none"
    ctx.out.print(f"tenants: {tenants}")
    return 0


# -- jobs ---------------------------------------------------------------------------------------

def _read_spec(path: str) -> tuple[dict, str]:
    if path == "-":
        return parse_spec(sys.stdin.read(), source="stdin"), "stdin"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path} is not UTF-8 text") from None
    return parse_spec(text, source=path), path


def cmd_job_submit(args: argparse.Namespace, ctx: Context) -> int:
    spec, _source = _read_spec(args.file)
    if args.tenant:
        spec["tenant"] = args.tenant
    if args.queue:
        spec["queue"] = args.queue
    if args.name:
        spec["name"] = args.name
    # A spec file's folder is what it ships by default; a spec on stdin has none.
    target = workdir_target(spec, spec_dir=None if args.file == "-" else Path(args.file).parent,
                            override=False if args.no_workdir else args.workdir)
    client = ctx.client()
    workdir: Workdir | int | bool = False
    if isinstance(target, str):
        with ctx.err.status("Packing the working folder…") if ctx.err.is_terminal \
                else _nothing():
            workdir = client.upload_workdir(spec.get("tenant"), target)
    elif target is not None:
        workdir = target
    job = client.submit_job(spec, workdir=workdir)
    # Said once the job is accepted: a refused spec prints only its error (and the archive
    # stays on the platform, so the corrected spec reuses it).
    if isinstance(workdir, Workdir):
        _say_shipped(ctx, str(target), workdir)
    if args.quiet:
        ctx.out.print(str(job.id))
    else:
        ctx.out.print(Text.assemble("job ", (str(job.id), "bold"), f" submitted: {job.name} in "
                                    f"{job.tenant}/{job.queue}, ", _state(job.state),
                                    f" ({job.reason})" if job.reason else ""))
    if args.follow:
        return _follow(ctx, client, job.id, tail=DEFAULT_TAIL, attempt=None, replica=None,
                       interval=args.interval)
    return 0


def _say_shipped(ctx: Context, folder: str, workdir: Workdir) -> None:
    for line in workdir.left_out:
        ctx.note(f"left out: {line}", style="yellow")
    ctx.note(f"shipped working folder {display_folder(folder)} ({_files(workdir.file_count)}, "
             f"{human_size(workdir.size_bytes)}, sha256 {workdir.sha256[:12]}…; "
             f"{'reused' if workdir.reused else 'uploaded'})")


def _files(count: int) -> str:
    return f"{count} file{'' if count == 1 else 's'}"


def cmd_job_list(args: argparse.Namespace, ctx: Context) -> int:
    states = [s.strip() for value in args.state or [] for s in value.split(",") if s.strip()]
    client = ctx.client()
    filters = {"tenant": args.tenant, "queue": args.queue, "owner": args.owner}
    if args.all:
        jobs = client.jobs(states, **filters)
        total = len(jobs)
    else:
        page = client.job_page(states, limit=args.limit, **filters)
        jobs, total = page.results, page.count
    if args.json:
        _print_json(ctx, [job.raw for job in jobs])
        return 0
    if not jobs:
        ctx.note("no jobs" + (f" in state {', '.join(states)}" if states else ""))
        return 0
    several_tenants = len({job.tenant for job in jobs}) > 1
    table = _table()
    for column in ("ID", "NAME", "QUEUE", "STATE", "GPUS", "REASON", "AGE"):
        table.add_column(column, justify="right" if column in {"ID", "GPUS"} else "left",
                         overflow="fold")
    now = datetime.now(UTC)
    for job in jobs:
        queue = f"{job.tenant}/{job.queue}" if several_tenants else job.queue
        table.add_row(str(job.id), job.name, queue, _state(job.state), _gpus(job),
                      job.reason or "", _age(job.created_at, now))
    ctx.out.print(table)
    if total > len(jobs):
        ctx.note(f"{len(jobs)} of {total} jobs, newest first; --all lists every one")
    return 0


def _ray_node(node: dict) -> str:
    gpus = node.get("gpus") or 0
    model = f" {node['gpu_model']}" if node.get("gpu_model") else ""
    return (f"{gpus} GPU{model}, {float(node.get('cpu') or 0):g} CPU, "
            f"{_memory(int(node.get('memory_mib') or 0))}")


def _ray_rows(job: Job, found: RayAddresses | None) -> list[tuple[str, str]]:
    """What `job show` says of a Ray job: its cluster and, once it runs, where it is."""
    ray = job.ray or {}
    workers = int(ray.get("workers") or 0)
    worker, head = ray.get("worker") or {}, ray.get("head") or ray.get("worker") or {}
    rows = [("ray", f"head ({_ray_node(head)}) + {workers} worker"
                    f"{'' if workers == 1 else 's'} ({_ray_node(worker)}); dashboard "
                    f"{'on' if ray.get('dashboard') else 'off'}")]
    if found is None:
        return rows
    if not found.ready:
        return [*rows, ("ray address", f"not ready: {found.reason}")]
    rows.append(("ray address", f"{found.address} (ray.init(address=...) from beside it)"))
    if found.gcs_address != found.address:
        rows.append(("ray gcs", found.gcs_address))
    if found.dashboard_url:
        rows.append(("ray dashboard", found.dashboard_url))
    return rows


def cmd_job_show(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    with _about_job(args.id):
        job = client.job(args.id)
    found = client.ray_addresses(job.id) if job.kind == "ray" and not job.is_final else None
    if args.json:
        raw = dict(job.raw)
        if found is not None:
            raw["ray_cluster"] = {"ready": found.ready, "address": found.address,
                                  "gcs_address": found.gcs_address,
                                  "dashboard_url": found.dashboard_url,
                                  "reason": found.reason}
        _print_json(ctx, raw)
        return 0
    out = ctx.out
    out.print(Text.assemble(("job ", "bold"), (str(job.id), "bold"), f"  {job.name}  ",
                            _state(job.state)))
    if job.reason:
        out.print(f"  reason: {job.reason}")
    if job.dispatch:
        out.print(f"  dispatch: {job.dispatch}")
    details = Table.grid(padding=(0, 2))
    details.add_column(style="bold")
    details.add_column(overflow="fold")
    resources = job.resources
    rows = [
        ("kind", job.kind),
        ("tenant / queue", f"{job.tenant} / {job.queue} (cluster {job.cluster or '-'})"),
        ("owner", job.owner),
        ("command", shlex.join(job.command)),
        ("image", job.image or "(local environment)"),
        ("environment", job.environment or "(the cluster's default)"),
        ("working folder", f"sha256 {job.workdir.sha256[:12]}…, "
                           f"{human_size(job.workdir.size_bytes)}, "
                           f"{_files(job.workdir.file_count)} (`ogai job files {job.id}`)"
         if job.workdir else "none shipped"),
        ("resources", f"{job.replicas} x ({resources.gpus} GPU"
                      f"{' ' + resources.gpu_model if resources.gpu_model else ''}, "
                      f"{resources.cpu:g} CPU, {_memory(resources.memory_mib)})"),
        ("network", str(job.network)),
        ("priority", str(job.priority)),
        ("restarts", f"{job.restarts} of {job.max_restarts}"),
        ("time limit", f"{job.time_limit_s} s" if job.time_limit_s else "none"),
    ]
    if job.kind == "ray":
        rows += _ray_rows(job, found)
    if job.env:
        rows.append(("env", " ".join(f"{k}={shlex.quote(v)}" for k, v in job.env.items())))
    if job.position is not None:
        rows.append(("queue position", str(job.position)))
    if job.placement:
        rows.append(("placement", ", ".join(job.placement)))
    if job.exit_code is not None:
        rows.append(("exit code", str(job.exit_code)))
    if job.rerun_of:
        rows.append(("rerun of", f"job {job.rerun_of}"))
    rows += [("submitted", _when(job.created_at)), ("started", _when(job.started_at)),
             ("finished", _when(job.finished_at))]
    for key, value in rows:
        details.add_row(key, value)
    out.print(details)
    if job.attempts:
        out.print()
        table = _table("attempts")
        for column in ("#", "STATE", "PLACEMENT", "STARTED", "FINISHED", "EXIT", "REASON"):
            table.add_column(column, overflow="fold")
        for attempt in job.attempts:
            table.add_row(str(attempt.number), _state(attempt.state),
                          ", ".join(attempt.placement) or "-", _when(attempt.started_at),
                          _when(attempt.finished_at),
                          "-" if attempt.exit_code is None else str(attempt.exit_code),
                          attempt.reason)
        out.print(table)
    out.print()
    events = _table("events")
    for column in ("WHEN", "FROM", "TO", "ATTEMPT", "REASON"):
        events.add_column(column, overflow="fold")
    for event in job.events:
        events.add_row(_when(event.created_at), event.from_state or "-",
                       _state(event.to_state), "-" if event.attempt is None else str(event.attempt),
                       event.reason)
    out.print(events)
    return 0


def cmd_job_files(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    with _about_job(args.id):
        job = client.job(args.id)
    workdir = client.workdir(job.workdir.id) if job.workdir else None
    if args.json:
        _print_json(ctx, workdir.raw if workdir else None)
        return 0
    if workdir is None:
        ctx.note(f"job {job.id} ships no working folder")
        return 0
    table = _table()
    table.add_column("SIZE", justify="right")
    table.add_column("PATH", overflow="fold")
    for item in workdir.files:
        table.add_row(human_size(int(item.get("size") or 0)), str(item.get("path", "")))
    ctx.out.print(table)
    ctx.note(f"{_files(workdir.file_count)}, {human_size(workdir.unpacked_bytes)} unpacked, "
             f"{human_size(workdir.size_bytes)} packed, sha256 {workdir.sha256}")
    return 0


def cmd_job_logs(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    if args.follow:
        with _about_job(args.id):
            return _follow(ctx, client, args.id, tail=DEFAULT_TAIL if args.tail is None
                           else args.tail, attempt=args.attempt, replica=args.replica,
                           interval=args.interval)
    with _about_job(args.id):
        logs = client.job_logs(args.id, tail=args.tail, attempt=args.attempt,
                               replica=args.replica)
    if args.attempt is not None and logs.attempt != args.attempt:
        # The API answers an unknown attempt with empty logs rather than a 404.
        raise OgaiError("not_found", f"job {args.id} has no attempt {args.attempt}")
    if logs.attempt is None:
        ctx.note(f"job {args.id} has not started yet: no logs")
        return 0
    stream = ctx.out.file
    stream.write(logs.text if not logs.text or logs.text.endswith("\n") else logs.text + "\n")
    stream.flush()
    return 0


def _pause(seconds: float) -> None:
    """Between two polls of `-f` (tests replace it to move a simulated cluster on)."""
    time.sleep(seconds)


def _follow(ctx: Context, client: OgaiClient, job_id: int, *, tail: int | None,
            attempt: int | None, replica: int | None, interval: float) -> int:
    """Print new log lines every `interval` s until the job ends: 0 if it succeeded, else 1."""
    follower = LogFollower(client, job_id, attempt=attempt, replica=replica, tail=tail)
    stream = ctx.out.file
    seen_state: tuple[str, str] | None = None
    printed_attempt: int | None = None
    spinner = ctx.err.status("") if ctx.err.is_terminal else None
    spinning = False
    try:
        while True:
            job = client.job(job_id)
            if (job.state, job.reason) != seen_state:
                seen_state = (job.state, job.reason)
                message = f"job {job_id}: {job.state}" + (f" ({job.reason})" if job.reason else "")
                if spinner is not None and job.state in {"queued", "admitted", "restarting"}:
                    spinner.update(message)
                    if not spinning:
                        spinner.start()
                        spinning = True
                else:
                    if spinning and spinner is not None:
                        spinner.stop()
                        spinning = False
                    ctx.note(message)
            chunk = follower.poll()
            if chunk.lines or chunk.gap:
                if spinning and spinner is not None:
                    spinner.stop()
                    spinning = False
                if chunk.attempt != printed_attempt and printed_attempt is not None:
                    ctx.note(f"--- attempt {chunk.attempt} ---")
                printed_attempt = chunk.attempt
                if chunk.gap:
                    ctx.note(f"… lines skipped: more than {follower.window} arrived "
                             f"within {interval:g} s")
                stream.write("".join(f"{line}\n" for line in chunk.lines))
                stream.flush()
            if job.state in FINAL_STATES:
                rest = follower.flush()
                if rest:
                    stream.write("".join(f"{line}\n" for line in rest))
                    stream.flush()
                break
            _pause(interval)
    finally:
        if spinning and spinner is not None:
            spinner.stop()
    if attempt is not None and attempt not in {a.number for a in job.attempts}:
        raise OgaiError("not_found", f"job {job_id} ended without an attempt {attempt}")
    return 0 if job.state == "succeeded" else 1


def cmd_job_cancel(args: argparse.Namespace, ctx: Context) -> int:
    with _about_job(args.id):
        job = ctx.client().cancel_job(args.id)
    ctx.out.print(Text.assemble(f"job {job.id} ", _state(job.state),
                                f" ({job.reason})" if job.reason else ""))
    return 0


def cmd_job_rerun(args: argparse.Namespace, ctx: Context) -> int:
    with _about_job(args.id):
        job = ctx.client().rerun_job(args.id)
    ctx.out.print(Text.assemble("job ", (str(job.id), "bold"),
                                f" submitted as a rerun of job {args.id}: ", _state(job.state)))
    return 0


def cmd_job_render(args: argparse.Namespace, ctx: Context) -> int:
    with _about_job(args.id):
        text = ctx.client().job_manifests(args.id)
    stream = ctx.out.file
    stream.write(text if not text or text.endswith("\n") else text + "\n")
    stream.flush()
    return 0


# -- notebooks ----------------------------------------------------------------------------------

def _notebook_gpus(notebook: Notebook) -> str:
    model = f" {notebook.resources.gpu_model}" if notebook.resources.gpu_model else ""
    return f"{notebook.resources.gpus}{model}" if notebook.resources.gpus else "0"


def _where(ctx: Context, notebook: Notebook) -> str:
    """The address it opens at, while it runs (in a browser signed in to the platform)."""
    return f"{ctx.client().url}{notebook.url}" if notebook.url else ""


def cmd_notebook_list(args: argparse.Namespace, ctx: Context) -> int:
    states = [s.strip() for value in args.state or [] for s in value.split(",") if s.strip()]
    client = ctx.client()
    notebooks = client.list_notebooks(tenant=args.tenant, state=states)
    if args.json:
        _print_json(ctx, [notebook.raw for notebook in notebooks])
        return 0
    if not notebooks:
        ctx.note("no notebooks" + (f" in state {', '.join(states)}" if states else ""))
        return 0
    several_tenants = len({notebook.tenant for notebook in notebooks}) > 1
    table = _table()
    for column in ("ID", "NAME", "QUEUE", "OWNER", "STATE", "GPUS", "GPU-H", "URL", "AGE"):
        table.add_column(column, justify="right" if column in {"ID", "GPUS", "GPU-H"}
                         else "left", overflow="fold")
    now = datetime.now(UTC)
    for notebook in notebooks:
        queue = f"{notebook.tenant}/{notebook.queue}" if several_tenants else notebook.queue
        state = Text.assemble(_state(notebook.state),
                              f" ({notebook.reason})" if notebook.reason else "")
        table.add_row(str(notebook.id), notebook.name, queue, notebook.owner, state,
                      _notebook_gpus(notebook), f"{notebook.gpu_hours:.2f}",
                      _where(ctx, notebook) or "-",
                      _age(notebook.created_at, now))
    ctx.out.print(table)
    return 0


def cmd_notebook_start(args: argparse.Namespace, ctx: Context) -> int:
    notebook = ctx.client().start_notebook(
        args.name, tenant=args.tenant, queue=args.queue, image=args.image, gpus=args.gpus,
        gpu_model=args.gpu_model, cpu=args.cpu, memory_mib=args.memory_mib)
    if args.quiet:
        ctx.out.print(str(notebook.id))
        return 0
    ctx.out.print(Text.assemble("notebook ", (str(notebook.id), "bold"),
                                f" started: {notebook.name} in {notebook.tenant}/"
                                f"{notebook.queue}, ", _state(notebook.state),
                                f" ({notebook.reason})" if notebook.reason else ""))
    return 0


def cmd_notebook_stop(args: argparse.Namespace, ctx: Context) -> int:
    with _about_notebook(args.id):
        notebook = ctx.client().stop_notebook(args.id)
    ctx.out.print(Text.assemble(f"notebook {notebook.id} ", _state(notebook.state),
                                "; its home folder is kept"))
    return 0


def cmd_notebook_resume(args: argparse.Namespace, ctx: Context) -> int:
    with _about_notebook(args.id):
        notebook = ctx.client().resume_notebook(args.id)
    where = _where(ctx, notebook)
    ctx.out.print(Text.assemble(f"notebook {notebook.id} resumed: ", _state(notebook.state),
                                f" ({notebook.reason})" if notebook.reason else "",
                                f" at {where}" if where else ""))
    return 0


def cmd_notebook_delete(args: argparse.Namespace, ctx: Context) -> int:
    with _about_notebook(args.id):
        ctx.client().delete_notebook(args.id)
    ctx.out.print(f"notebook {args.id} deleted")
    return 0


# -- queues -------------------------------------------------------------------------------------

def cmd_queue_status(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    queues = client.queues(tenant=args.tenant)
    quotas = [q for q in client.quotas() if not args.tenant or q.tenant == args.tenant]
    if args.json:
        _print_json(ctx, {"queues": [q.raw for q in queues], "quotas": [q.raw for q in quotas]})
        return 0
    if queues:
        table = _table("queues")
        for column in ("TENANT", "QUEUE", "CLUSTER", "POLICY", "PENDING", "RUNNING", "GPUS"):
            table.add_column(column, justify="right" if column in {"PENDING", "RUNNING", "GPUS"}
                             else "left")
        for queue in queues:
            limit = "∞" if queue.gpu_limit is None else str(queue.gpu_limit)
            style = "bold red" if queue.gpu_limit is not None and \
                queue.gpus_in_use >= queue.gpu_limit else ""
            table.add_row(queue.tenant, queue.name + ("" if queue.is_active else " (inactive)"),
                          queue.cluster, queue.policy, str(queue.pending), str(queue.running),
                          Text(f"{queue.gpus_in_use} / {limit}", style=style))
        ctx.out.print(table)
    else:
        ctx.note("no queues" + (f" in tenant {args.tenant}" if args.tenant else ""))
    if quotas:
        # The quota counts GPUs of admitted and running jobs on every cluster, except what is
        # borrowed from idle capacity (the queues' gpus_in_use include both).
        in_quota: dict[str, int] = {}
        borrowed: dict[str, int] = {}
        for job in client.jobs(sorted(ACTIVE_STATES)):
            usage = borrowed if job.borrowed else in_quota
            usage[job.tenant] = usage.get(job.tenant, 0) + job.gpus
        ctx.out.print()
        table = _table("tenant quotas")
        for column in ("TENANT", "GPUS IN USE / QUOTA", "BORROWED", "CPU CORES", "MEMORY",
                       "GPU MODELS"):
            table.add_column(column, justify="left")
        for quota in quotas:
            used = in_quota.get(quota.tenant, 0)
            style = "bold red" if used >= quota.gpus else ""
            models = ", ".join(f"{name}: {count}" for name, count in
                               sorted(quota.gpu_model_limits.items())) or "-"
            table.add_row(quota.tenant, Text(f"{used} / {quota.gpus}", style=style),
                          str(borrowed.get(quota.tenant, 0)), str(quota.cpu_cores),
                          f"{quota.memory_gib} GiB", models)
        ctx.out.print(table)
    return 0


# -- the parser ---------------------------------------------------------------------------------

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _id_of(kind: str):
    """An argparse type for the id of a `kind` ("job", "notebook"): a positive whole number."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{kind} id {text!r} is not a number") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{kind} id {text!r} is not a {kind} id")
        return value

    return parse


_job_id = _id_of("job")
_notebook_id = _id_of("notebook")


def _cores(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of CPU cores") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of CPU cores")
    return value


def _memory_arg(text: str) -> int:
    try:
        return parse_memory(text)
    except SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("resources.memory: ")) from None


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("give 0 to 3600 seconds")
    return value


# The helpers the command groups' own modules build on, by their public names (a module does not
# reach for another's underscored names; ylink, mmodel and podsys still do, until they move).
about_job = _about_job
job_id = _job_id
positive_int = _positive_int
print_json = _print_json
when = _when


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="ogai", description="The command line of OGAI.")
    parser.add_argument("--version", action="version", version=f"ogai {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(parent: Any, name: str, handler: Callable[..., int], help: str) -> Any:
        sub = parent.add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        return sub

    login = command(commands, "login", cmd_login,
                    "sign in and store the URL and an API token")
    login.add_argument("--url", help=f"the platform, e.g. http://127.0.0.1:8000 (default: "
                       f"${URL_ENV} or the stored one)")
    how = login.add_mutually_exclusive_group()
    how.add_argument("--username", "-u", help="sign in with this user's password")
    how.add_argument("--token", help="store this API token instead of signing in")
    login.add_argument("--password-stdin", action="store_true",
                       help="read the password from stdin instead of asking")
    login.add_argument("--expires-in-days", type=_positive_int, default=90,
                       help="lifetime of the token created (default 90 days)")

    whoami = command(commands, "whoami", cmd_whoami, "who the stored token belongs to")
    whoami.add_argument("--json", action="store_true", help="print the API's JSON")

    job = commands.add_parser("job", help="submit and follow jobs", description="Jobs.")
    job.set_defaults(handler=None, group=job)
    jobs = job.add_subparsers(dest="job_command", metavar="ACTION")

    submit = command(jobs, "submit", cmd_job_submit, "submit a job spec (YAML or JSON)")
    submit.add_argument("file", metavar="FILE", help="the spec file; - reads stdin")
    submit.add_argument("--tenant", help="the tenant (needed when you are in several)")
    submit.add_argument("--queue", help="the queue (default: the spec's, or 'default')")
    submit.add_argument("--name", help="the job's name, overriding the spec's")
    submit.add_argument("--follow", "-f", action="store_true",
                        help="follow its logs until it ends; exit 0 only if it succeeded")
    submit.add_argument("--quiet", "-q", action="store_true", help="print only the job id")
    submit.add_argument("--interval", type=_interval, default=1.0, help=argparse.SUPPRESS)
    shipped = submit.add_mutually_exclusive_group()
    shipped.add_argument("--workdir", metavar="DIR",
                         help="ship this folder as the job's working folder (default: the "
                         "spec's workdir:, or the spec file's folder)")
    shipped.add_argument("--no-workdir", action="store_true",
                         help="ship no working folder")

    listing = command(jobs, "list", cmd_job_list, "list jobs, newest first")
    listing.add_argument("--state", "-s", action="append", metavar="STATE",
                         help="only jobs in this state (repeat, or separate with commas)")
    listing.add_argument("--tenant", help="only this tenant's jobs")
    listing.add_argument("--queue", help="only this queue's jobs")
    listing.add_argument("--owner", help="only jobs of this user")
    listing.add_argument("--all", "-a", action="store_true",
                         help="every matching job, not only the newest page")
    listing.add_argument("--limit", type=_positive_int, default=50, help=argparse.SUPPRESS)
    listing.add_argument("--json", action="store_true", help="print the API's JSON")

    show = command(jobs, "show", cmd_job_show, "a job's spec, attempts and event history")
    show.add_argument("id", type=_job_id, metavar="ID")
    show.add_argument("--json", action="store_true", help="print the API's JSON")

    files = command(jobs, "files", cmd_job_files,
                    "list the files of the working folder a job shipped")
    files.add_argument("id", type=_job_id, metavar="ID")
    files.add_argument("--json", action="store_true", help="print the API's JSON")

    logs = command(jobs, "logs", cmd_job_logs, "print a job's logs")
    logs.add_argument("id", type=_job_id, metavar="ID")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing new lines until the job ends; exit 0 only if it "
                      "succeeded")
    logs.add_argument("--tail", "-n", type=_positive_int, help=f"the last N lines (default "
                      f"{DEFAULT_TAIL})")
    logs.add_argument("--attempt", type=_positive_int, help="this attempt (default: newest)")
    logs.add_argument("--replica", type=_positive_int, help="this replica (default 0)")
    logs.add_argument("--interval", type=_interval, default=1.0,
                      help="seconds between polls with -f (default 1)")

    cancel = command(jobs, "cancel", cmd_job_cancel, "cancel a job")
    cancel.add_argument("id", type=_job_id, metavar="ID")
    rerun = command(jobs, "rerun", cmd_job_rerun, "submit a finished job again")
    rerun.add_argument("id", type=_job_id, metavar="ID")

    render = command(jobs, "render", cmd_job_render,
                     "print, as YAML, what a job runs on its cluster (Kubernetes objects, "
                     "or the local environment, command and sandbox)")
    render.add_argument("id", type=_job_id, metavar="ID")

    notebook = commands.add_parser("notebook", help="JupyterLab notebooks",
                                   description="Notebooks.")
    notebook.set_defaults(handler=None, group=notebook)
    notebooks = notebook.add_subparsers(dest="notebook_command", metavar="ACTION")

    nb_list = command(notebooks, "list", cmd_notebook_list, "list your notebooks, newest first")
    nb_list.add_argument("--state", "-s", action="append", metavar="STATE",
                         help="only notebooks in this state: stopped, waiting, starting, "
                         "running, failed (repeat, or separate with commas)")
    nb_list.add_argument("--tenant", help="only this tenant's notebooks")
    nb_list.add_argument("--json", action="store_true", help="print the API's JSON")

    nb_start = command(notebooks, "start", cmd_notebook_start,
                       "create a notebook and start it (it waits in its queue like any job)")
    nb_start.add_argument("name", metavar="NAME")
    nb_start.add_argument("--tenant", help="the tenant (needed when you are in several)")
    nb_start.add_argument("--queue", help="the queue (default 'default')")
    nb_start.add_argument("--image", help="a container image with JupyterLab")
    nb_start.add_argument("--gpus", type=_positive_int, help="GPUs (default 0)")
    nb_start.add_argument("--gpu-model", help="pin a GPU model, e.g. H100")
    nb_start.add_argument("--cpu", type=_cores, help="CPU cores (default 2)")
    nb_start.add_argument("--memory", dest="memory_mib", type=_memory_arg, metavar="QUANTITY",
                          help="memory, e.g. 16Gi (default 8Gi)")
    nb_start.add_argument("--quiet", "-q", action="store_true",
                          help="print only the notebook id")

    for name, handler, text in (
        ("stop", cmd_notebook_stop, "stop a notebook: its GPUs are freed, its home folder "
         "stays"),
        ("resume", cmd_notebook_resume, "start a stopped notebook again"),
        ("delete", cmd_notebook_delete, "stop a notebook if it runs, and delete it"),
    ):
        sub = command(notebooks, name, handler, text)
        sub.add_argument("id", type=_notebook_id, metavar="ID")

    queue = commands.add_parser("queue", help="queues and quotas", description="Queues.")
    queue.set_defaults(handler=None, group=queue)
    queues = queue.add_subparsers(dest="queue_command", metavar="ACTION")
    status = command(queues, "status", cmd_queue_status,
                     "backlog, running jobs and GPUs of each queue, and tenant quotas")
    status.add_argument("--tenant", help="only this tenant")
    status.add_argument("--json", action="store_true", help="print the API's JSON")

    # YLink (`dataset`, `pipeline`, `train`), MModel (`model`, `benchmark`, `eval`, `deploy`,
    # `chat`), PODsys (`node`, `stack`) and the log search (`logs`) live in their own modules,
    # which build on this one.
    from ogai_client import logs_cli, mmodel, podsys, ylink

    ylink.add_commands(commands, command)
    mmodel.add_commands(commands, command)
    podsys.add_commands(commands, command)
    logs_cli.add_commands(commands, command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The SDK's HTTP library logs each request at INFO; a command line shows only what matters.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = build_parser()
    err = Console(stderr=True, highlight=False, soft_wrap=True)

    def fail(message: str, code: int) -> int:
        err.print(Text.assemble(("error: ", "bold red"), _one_line(message)), soft_wrap=True)
        return code

    from ogai_client.ylink import train_argv

    try:
        args = parser.parse_args(train_argv(list(sys.argv[1:] if argv is None else argv)))
    except UsageError as exc:
        return fail(f"{exc} (see `{exc.prog} --help`)", 2)
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    handler = getattr(args, "handler", None)
    if handler is None:
        group = getattr(args, "group", parser)
        return fail(f"say what to do (see `{group.prog} --help`)", 2)
    ctx = Context()
    try:
        return handler(args, ctx)
    except OgaiError as exc:
        return fail(_error_line(exc), 2 if exc.code == "usage" else 1)
    except (SpecError, ConfigError) as exc:
        return fail(str(exc), 1)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except EOFError:
        return fail("no input: the terminal closed while asking", 1)
    except BrokenPipeError:
        # `ogai job logs 3 | head`: the reader left; say nothing, and keep Python from
        # complaining when it flushes stdout at exit.
        with suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # a bug of ours: still one line, never a traceback
        if os.environ.get("OGAI_DEBUG"):
            raise
        return fail(f"unexpected {type(exc).__name__}: {exc} (set OGAI_DEBUG=1 for the "
                    "traceback, and please report it)", 1)
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
