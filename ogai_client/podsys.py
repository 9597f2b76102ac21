"""`ogai cluster`, `ogai node` and `ogai stack`: PODsys, the cluster system, on the command line.

`ogai cluster environments CLUSTER` lists what jobs there may name as their environment.

A node is named by its name (with `--cluster` when several clusters have one). Cordoning,
health checks on demand, stack profiles and deployment runs are platform admins' work: anyone
else is told so in one line. `-f` follows health checks until every one is judged (exit 1 if a
fatal one failed) and deployment runs until they end (exit 0 only if the run succeeded).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.text import Text

from ogai_client import cli
from ogai_client.cli import (
    STATE_STYLES,
    Context,
    _age,
    _interval,
    _one_line,
    _positive_int,
    _print_json,
    _table,
)
from ogai_client.client import OgaiClient, OgaiError
from ogai_client.models import (
    DeploymentGrid,
    DeploymentRun,
    GridHost,
    HealthCheckRun,
    Node,
)
from ogai_client.spec import SpecError
from ogai_client.ylink import _about, _when, read_run_spec

STYLES = {
    **STATE_STYLES,
    # nodes
    "healthy": "green", "not_ready": "bold yellow", "lost": "bold red",
    # health check runs
    "pending": "yellow", "passed": "green", "error": "magenta",
    # a node in a deployment run
    "ok": "green", "unreachable": "bold magenta",
    # severities
    "fatal": "bold", "warning": "",
}
CORDONED_BY = {"operator": "an operator", "health_check": "a health check",
               "check_running": "an exclusive health check while it runs"}
# The fields of POST /api/v1/podsys/stack-profiles/; anything else the API would drop.
PROFILE_FIELDS = (
    "name", "description", "os_family", "driver_version", "cuda_version", "cudnn_version",
    "nccl_version", "ofed_version", "container_runtime", "container_toolkit_version",
    "dcgm_version", "orchestrator", "orchestrator_version", "offline_mirror",
)
# A node's task counts in a run, in this order.
TASK_STATUSES = ("ok", "changed", "skipped", "failed", "unreachable", "running")
OUTPUT_TAIL_LINES = 5
DEPLOYMENT_STATES = ("queued", "running", "succeeded", "failed", "cancelled")


def _state(state: str) -> Text:
    return Text(state or "-", style=STYLES.get(state, ""))


# -- nodes --------------------------------------------------------------------------------------

def _service(node: Node) -> Text:
    """In service, or cordoned: by whom and why."""
    if node.schedulable:
        return Text("in service", style="green")
    who = CORDONED_BY.get(node.cordon_source, "")
    text = "cordoned" + (f" by {who}" if who else "")
    if node.health_reason:
        text += f": {_one_line(node.health_reason)}"
    return Text(text, style="yellow")


def _health(node: Node) -> Text:
    text = _state(node.health)
    # A cordoned node's reason is the cordon's, shown with it.
    if node.health != "healthy" and node.schedulable and node.health_reason:
        text.append(f" ({_one_line(node.health_reason)})")
    return text


def _gpus(node: Node) -> str:
    return f"{node.gpus_used}/{node.gpus}"


def _node(client: OgaiClient, args: argparse.Namespace) -> Node:
    return client.find_node(args.node, cluster=args.cluster)


def _where(node: Node) -> str:
    return f"node {node.name} (cluster {node.cluster})"


def cmd_node_list(args: argparse.Namespace, ctx: Context) -> int:
    nodes = ctx.client().nodes(cluster=args.cluster)
    if args.json:
        _print_json(ctx, [node.raw for node in nodes])
        return 0
    if not nodes:
        ctx.note("no nodes" + (f" in cluster {args.cluster} (or it is not visible to you)"
                               if args.cluster else ""))
        return 0
    table = _table()
    for column in ("CLUSTER", "NODE", "GPUS", "MODEL", "HEALTH", "SERVICE"):
        table.add_column(column, justify="right" if column == "GPUS" else "left",
                         overflow="fold")
    for node in nodes:
        table.add_row(node.cluster, node.name, _gpus(node), node.gpu_model or "-",
                      _health(node), _service(node))
    ctx.out.print(table)
    cordoned = sum(1 for node in nodes if not node.schedulable)
    ctx.note(f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}, "
             f"{sum(n.gpus_used for n in nodes)} of {sum(n.gpus for n in nodes)} GPUs in use"
             + (f", {cordoned} cordoned" if cordoned else ""))
    return 0


def cmd_node_cordon(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    node = client.cordon_node(_node(client, args).id, reason=args.reason or "")
    ctx.out.print(Text.assemble(f"{_where(node)} ", _service(node),
                                "; its running work stays, nothing new is placed there"))
    return 0


def cmd_node_uncordon(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    node = client.uncordon_node(_node(client, args).id)
    ctx.out.print(Text.assemble(f"{_where(node)} ", _service(node), ", health ",
                                _health(node)))
    return 0


def _runs_table(runs: list[tuple[str, HealthCheckRun | None]], *, with_node: bool) -> Any:
    table = _table()
    columns = ["CHECK", *(["NODE"] if with_node else []), "SEVERITY", "STATE", "SUMMARY",
               "WHEN"]
    for column in columns:
        table.add_column(column, overflow="fold")
    for name, run in runs:
        if run is None:
            table.add_row(name, *(["-"] if with_node else []), "-", Text("never run",
                                                                          style="dim"), "", "-")
            continue
        when = run.finished_at or run.started_at or run.created_at
        table.add_row(name, *([run.node_name] if with_node else []),
                      Text(run.severity or "-", style=STYLES.get(run.severity, "")),
                      _state(run.state), _one_line(run.summary), _when(when))
    return table


def cmd_node_health(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    node = _node(client, args)
    latest = client.node_health(node.id)
    if args.json:
        _print_json(ctx, {"node": node.raw,
                          "checks": {name: run.raw if run else None
                                     for name, run in latest.items()}})
        return 0
    ctx.out.print(Text.assemble((_where(node), "bold"), "  ", _health(node), ", ",
                                _service(node), f", {_gpus(node)} GPUs in use"))
    if not latest:
        ctx.note("the platform runs no health checks (OGAI_HEALTH_CHECKS is empty)")
        return 0
    ctx.out.print(_runs_table(list(latest.items()), with_node=False))
    return 0


def _verdicts_failed(runs: list[HealthCheckRun]) -> list[HealthCheckRun]:
    return [run for run in runs if run.severity == "fatal" and run.state == "failed"]


def cmd_node_check(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    node = _node(client, args)
    runs = client.check_node(node.id, args.check)
    several_nodes = len({run.node for run in runs}) > 1
    if not args.follow:
        for run in runs:
            on = f" on {run.node_name}" if several_nodes else ""
            ctx.out.print(Text.assemble(f"{run.check_name} ({run.severity}){on}: ",
                                        _state(run.state),
                                        f" ({_one_line(run.summary)})" if run.summary else ""))
        ctx.note(f"started on {_where(node)}; `ogai node health {node.name}` shows the "
                 "verdicts, -f waits for them")
        return 0
    ctx.note(f"{len(runs)} check{'s' if len(runs) != 1 else ''} on {_where(node)}: "
             + ", ".join(run.check_name for run in runs))
    seen = {run.id: (run.state, run.summary) for run in runs}
    while not all(run.is_final for run in runs):
        cli._pause(args.interval)
        runs = [run if run.is_final else client.health_check_run(run.id) for run in runs]
        for run in runs:
            if (run.state, run.summary) != seen.get(run.id):
                seen[run.id] = (run.state, run.summary)
                on = f" on {run.node_name}" if several_nodes else ""
                ctx.note(f"{run.check_name}{on}: {run.state}"
                         + (f" ({_one_line(run.summary)})" if run.summary else ""))
    ctx.out.print(_runs_table([(run.check_name, run) for run in runs],
                              with_node=several_nodes))
    failed = _verdicts_failed(runs)
    if failed:
        first = failed[0]
        names = ", ".join(run.check_name for run in failed)
        raise OgaiError("check_failed", f"fatal check{'s' if len(failed) > 1 else ''} "
                        f"{names} failed on {first.node_name or node.name}: "
                        f"{_one_line(first.summary) or 'no summary'}")
    return 0


# -- stack profiles -----------------------------------------------------------------------------

def _or_dash(value: str) -> str:
    return value or "-"


def cmd_stack_profiles(args: argparse.Namespace, ctx: Context) -> int:
    profiles = ctx.client().stack_profiles()
    if args.json:
        _print_json(ctx, [profile.raw for profile in profiles])
        return 0
    if not profiles:
        ctx.note("no stack profiles (they are shown to platform admins only); create one with "
                 "`ogai stack create FILE.yaml`")
        return 0
    table = _table()
    for column in ("NAME", "OS", "DRIVER", "CUDA", "CUDNN", "NCCL", "OFED", "RUNTIME", "DCGM",
                   "ORCHESTRATOR", "MIRROR", "DEPLOYED"):
        table.add_column(column, justify="right" if column == "DEPLOYED" else "left",
                         overflow="fold")
    for p in profiles:
        runtime = p.container_runtime + (f" (toolkit {p.container_toolkit_version})"
                                         if p.container_toolkit_version else "")
        orchestrator = " ".join(part for part in (p.orchestrator, p.orchestrator_version)
                                if part)
        table.add_row(p.name, _or_dash(p.os_family), _or_dash(p.driver_version),
                      _or_dash(p.cuda_version), _or_dash(p.cudnn_version),
                      _or_dash(p.nccl_version), _or_dash(p.ofed_version), _or_dash(runtime),
                      _or_dash(p.dcgm_version), _or_dash(orchestrator),
                      "offline" if p.offline_mirror else "-", str(p.deployment_count))
    ctx.out.print(table)
    return 0


def _each_field_line(ctx: Context, exc: OgaiError) -> OgaiError:
    """A 400 names every field it refuses: each is printed as a line of its own, and the
    error is the first (the one line that says what to fix)."""
    if exc.status != 400 or not exc.fields:
        return exc
    main = _one_line(exc.message)
    for name, messages in exc.fields.items():
        for message in messages:
            line = _one_line(message if name in {"non_field_errors", "__all__"}
                             else f"{name}: {message}")
            if line != main:
                ctx.note(line, style="red")
    return OgaiError(exc.code, exc.message, status=exc.status)


def cmd_stack_create(args: argparse.Namespace, ctx: Context) -> int:
    hint = "name, driver_version, cuda_version, …"
    spec = read_run_spec(args.file, what="stack profile", hint=hint)
    source = "stdin" if args.file == "-" else args.file
    unknown = [str(key) for key in spec if key not in PROFILE_FIELDS]
    if unknown:
        raise SpecError(f"{source}: {unknown[0]!r} is not a stack profile field; the fields: "
                        f"{', '.join(PROFILE_FIELDS)}")
    if args.name:
        spec["name"] = args.name
    try:
        profile = ctx.client().create_stack_profile(spec)
    except OgaiError as exc:
        raise _each_field_line(ctx, exc) from None
    if args.json:
        _print_json(ctx, profile.raw)
        return 0
    ctx.out.print(Text.assemble("stack profile ", (profile.name, "bold"), " created: "
                                f"driver {profile.driver_version}, CUDA {profile.cuda_version}"
                                f" on {profile.os_family}; deploy it with `ogai stack deploy "
                                f"{profile.name} --cluster CLUSTER`"))
    return 0


# -- deployment runs ----------------------------------------------------------------------------

def _what(run: DeploymentRun) -> str:
    what = run.profile or run.kind or "-"
    if run.check_mode:
        what += " (check mode)"
    if run.rerun_of:
        what += f", rerun of {run.rerun_of}"
    return what


def _tail(output: str, lines: int = OUTPUT_TAIL_LINES) -> list[str]:
    kept = [line.rstrip() for line in output.splitlines() if line.strip()]
    return kept[-lines:]


def _counts(host: GridHost) -> str:
    return ", ".join(f"{count} {status}" for status in TASK_STATUSES
                     if (count := host.count(status))) or "no tasks yet"


def _current_task(grid: DeploymentGrid, host: GridHost) -> str:
    for index in range(len(host.cells) - 1, -1, -1):
        cell = host.cells[index]
        if cell is not None and cell.status == "running":
            return grid.task_name(index)
    return ""


def _grid_lines(run: DeploymentRun, grid: DeploymentGrid) -> list[Text]:
    """The run as text: a headline, then a line per node with its state, its task counts and
    the task it failed at, followed by the end of that task's output."""
    lines = [Text.assemble((f"deployment run {run.id}", "bold"),
                           f"  {_what(run)} on {run.cluster}  ", _state(run.state))]
    if run.message:
        lines.append(Text(f"  {_one_line(run.message)}",
                          style="red" if run.state == "failed" else "dim"))
    tasks = f"{len(grid.tasks)} task{'s' if len(grid.tasks) != 1 else ''}"
    facts = [f"{len(run.hosts)} node{'s' if len(run.hosts) != 1 else ''}",
             tasks if run.is_final else f"{tasks} so far"]
    if run.created_by:
        facts.append(f"by {run.created_by}")
    if run.started_at:
        facts.append(f"started {_when(run.started_at)}")
    if run.finished_at:
        facts.append(f"finished {_when(run.finished_at)}")
    lines.append(Text(f"  {', '.join(facts)}", style="dim"))
    width = max((len(host.host) for host in grid.hosts), default=0)
    for host in grid.hosts:
        line = Text.assemble(f"{host.host:<{width}}  ",
                             (f"{host.state:<11}", STYLES.get(host.state, "")),
                             f"  {_counts(host)}")
        if host.failed_task:
            line.append(f"  at {host.failed_task!r}", style="bold")
        elif host.state == "running" and (task := _current_task(grid, host)):
            line.append(f"  now {task!r}", style="dim")
        lines.append(line)
        lines.extend(Text(f"    | {text}", style="dim") for text in _tail(host.output))
    return lines


def _ended_badly(run: DeploymentRun, grid: DeploymentGrid) -> OgaiError:
    bad = [host.host for host in grid.hosts if host.state in {"failed", "unreachable"}]
    if run.state == "failed" and bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        return OgaiError("failed", f"deployment run {run.id} failed on {len(bad)} of "
                         f"{len(grid.hosts)} nodes ({shown}); `ogai stack rerun {run.id}` "
                         "runs them again")
    why = _one_line(run.message) or "no reason given"
    return OgaiError(run.state, f"deployment run {run.id} {run.state}: {why}")


def _follow_deployment(ctx: Context, client: OgaiClient, run_id: int, *,
                       interval: float) -> int:
    """Refresh the run's grid every `interval` s until it ends: redrawn in place on a
    terminal, else its changes noted on stderr and the grid printed at the end. 0 if it
    succeeded, else an error saying where it failed."""
    live = Live(console=ctx.out, auto_refresh=False) if ctx.out.is_terminal else None
    seen_state = ""
    seen_hosts: dict[str, str] = {}
    if live is not None:
        live.start()
    try:
        while True:
            run = client.deployment_run(run_id)
            grid = client.deployment_run_results(run_id)
            if live is not None:
                live.update(Group(*_grid_lines(run, grid)), refresh=True)
            else:
                if run.state != seen_state:
                    seen_state = run.state
                    ctx.note(f"deployment run {run.id}: {run.state}")
                for host in grid.hosts:
                    if seen_hosts.get(host.host, "pending") != host.state:
                        seen_hosts[host.host] = host.state
                        at = f" at {host.failed_task!r}" if host.failed_task else ""
                        ctx.note(f"{host.host}: {host.state}{at}")
            if run.is_final:
                break
            cli._pause(interval)
    finally:
        if live is not None:
            live.stop()
    if live is None:
        ctx.out.print(Group(*_grid_lines(run, grid)))
    if run.state != "succeeded":
        raise _ended_badly(run, grid)
    return 0


def _not_found_names(exc: OgaiError) -> OgaiError:
    """"profile: Object with name=x does not exist." as a sentence that says what to do."""
    hints = {"profile": "stack profile {} not found; `ogai stack profiles` lists them",
             "cluster": "cluster {} not found (or not visible to you); `ogai node list` shows "
                        "the clusters' nodes"}
    for name, hint in hints.items():
        for message in exc.fields.get(name, []):
            if "does not exist" in message and "=" in message:
                value = message.split("=", 1)[1].rsplit(" does not exist", 1)[0]
                return OgaiError("not_found", hint.format(value), status=exc.status)
    return exc


def cmd_stack_deploy(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    if args.nodes:
        hosts = [name.strip() for value in args.nodes for name in value.split(",")
                 if name.strip()]
        if not hosts:
            raise OgaiError("usage", "--nodes: name at least one node")
    else:
        nodes = client.nodes(cluster=args.cluster)
        if not nodes:
            raise OgaiError("not_found", f"cluster {args.cluster} has no nodes (or is not "
                            "visible to you); `ogai node list` shows the nodes")
        # A lost or not-ready node would only come back unreachable: named, never implied.
        hosts = [node.name for node in nodes if node.health == "healthy"]
        skipped = [f"{node.name} ({node.health or 'health unknown'})" for node in nodes
                   if node.health != "healthy"]
        shown = ", ".join(skipped[:10]) + (f" and {len(skipped) - 10} more"
                                           if len(skipped) > 10 else "")
        if not hosts:
            raise OgaiError("not_found", f"no node of cluster {args.cluster} is healthy: "
                            f"{shown}; name them with --nodes to deploy to them anyway")
        if skipped:
            ctx.note(f"skipping {len(skipped)} node{'s' if len(skipped) != 1 else ''} that "
                     f"{'are' if len(skipped) != 1 else 'is'} not healthy: {shown} "
                     "(name them with --nodes to deploy to them anyway)")
    try:
        run = client.deploy_stack(args.profile, cluster=args.cluster, hosts=hosts,
                                  check_mode=args.check_mode)
    except OgaiError as exc:
        if exc.status == 400:
            raise _not_found_names(exc) from None
        raise
    if args.json:
        _print_json(ctx, run.raw)
    elif args.quiet:
        ctx.out.print(str(run.id))
    else:
        mode = " in check mode (nothing is changed)" if run.check_mode else ""
        ctx.out.print(Text.assemble("deployment run ", (str(run.id), "bold"),
                                    f" of {run.profile} to {len(run.hosts)} "
                                    f"node{'s' if len(run.hosts) != 1 else ''} of "
                                    f"{run.cluster}{mode}: ", _state(run.state)))
    if args.follow:
        return _follow_deployment(ctx, client, run.id, interval=args.interval)
    if not args.json and not args.quiet:
        ctx.note(f"`ogai stack show {run.id} -f` follows it")
    return 0


def cmd_stack_runs(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    if args.all:
        runs = client.deployment_runs(cluster=args.cluster, state=args.state)
        total = len(runs)
    else:
        page = client.deployment_run_page(cluster=args.cluster, state=args.state,
                                          limit=args.limit)
        runs, total = page.results, page.count
    if args.json:
        _print_json(ctx, [run.raw for run in runs])
        return 0
    if not runs:
        ctx.note("no deployment runs" + (f" on cluster {args.cluster}" if args.cluster else "")
                 + " (they are shown to platform admins only)")
        return 0
    table = _table()
    for column in ("ID", "CLUSTER", "WHAT", "NODES", "STATE", "FAILED", "BY", "AGE"):
        table.add_column(column, justify="right" if column in {"ID", "NODES", "FAILED"}
                         else "left", overflow="fold")
    now = datetime.now(UTC)
    for run in runs:
        table.add_row(str(run.id), run.cluster, _what(run), str(len(run.hosts)),
                      _state(run.state), str(run.failed_tasks) if run.failed_tasks else "-",
                      run.created_by or "-", _age(run.created_at, now))
    ctx.out.print(table)
    if total > len(runs):
        ctx.note(f"{len(runs)} of {total} runs, newest first; --all lists every one")
    return 0


def cmd_stack_show(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    with _about("deployment run", args.id):
        if args.follow:
            return _follow_deployment(ctx, client, args.id, interval=args.interval)
        run = client.deployment_run(args.id)
        grid = client.deployment_run_results(args.id)
    if args.json:
        _print_json(ctx, {"run": run.raw, "results": grid.raw})
        return 0
    ctx.out.print(Group(*_grid_lines(run, grid)))
    return 0


def cmd_stack_rerun(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    with _about("deployment run", args.id):
        run = client.rerun_failed_deployment_run(args.id)
    ctx.out.print(Text.assemble("deployment run ", (str(run.id), "bold"),
                                f" re-runs run {args.id} on {len(run.hosts)} "
                                f"node{'s' if len(run.hosts) != 1 else ''} "
                                f"({', '.join(run.hosts)}): ", _state(run.state)))
    if args.follow:
        return _follow_deployment(ctx, client, run.id, interval=args.interval)
    return 0


def cmd_stack_cancel(args: argparse.Namespace, ctx: Context) -> int:
    with _about("deployment run", args.id):
        run = ctx.client().cancel_deployment_run(args.id)
    ctx.out.print(Text.assemble(f"deployment run {run.id} ", _state(run.state),
                                f" ({_one_line(run.message)})" if run.message else ""))
    return 0


# -- clusters -----------------------------------------------------------------------------------

def cmd_cluster_environments(args: argparse.Namespace, ctx: Context) -> int:
    with _about("cluster", args.cluster):
        offered = ctx.client().cluster_environments(args.cluster)
    if args.json:
        _print_json(ctx, [dataclasses.asdict(env) for env in offered])
        return 0
    if not offered:
        ctx.note(f"cluster {args.cluster} offers no named environments: jobs name an image "
                 "(`image:`) or run in its default")
        return 0
    table = _table()
    for column in ("NAME", "PYTHON", "TORCH", "WHERE", "DEFAULT"):
        table.add_column(column, overflow="fold")
    for env in offered:
        python: Text | str = env.python or "-"
        if env.problem:
            python = Text(f"unusable: {env.problem}", style="bold red")
        table.add_row(env.name, python, env.torch or "-", env.where or "-",
                      "yes" if env.default else "")
    ctx.out.print(table)
    ctx.note("a job names one with `environment: NAME` in its spec; without, it runs in the "
             "default")
    return 0


# -- the parser ---------------------------------------------------------------------------------

def add_commands(commands: Any, command: Callable[..., Any]) -> None:
    """Add `cluster`, `node` and `stack` to the CLI's parser."""
    _run_id = cli._id_of("deployment run")

    def group(name: str, help: str, description: str) -> Any:
        parser = commands.add_parser(name, help=help, description=description)
        parser.set_defaults(handler=None, group=parser)
        return parser.add_subparsers(dest=f"{name}_command", metavar="ACTION")

    def json_flag(parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print the API's JSON")

    def node_arg(parser: Any) -> None:
        parser.add_argument("node", metavar="NODE", help="the node's name")
        parser.add_argument("--cluster", "-c",
                            help="its cluster (needed when several have a node of that name)")

    def follow(parser: Any, text: str) -> None:
        parser.add_argument("--follow", "-f", action="store_true", help=text)
        parser.add_argument("--interval", type=_interval, default=2.0,
                            help="seconds between polls with -f (default 2)")

    clusters = group("cluster", "clusters: the environments their jobs may ask for",
                     "Clusters you run on.")
    c_envs = command(clusters, "environments", cmd_cluster_environments,
                     "the named environments a cluster offers jobs, with Python and torch")
    c_envs.add_argument("cluster", metavar="CLUSTER", help="the cluster's name")
    json_flag(c_envs)

    nodes = group("node", "cluster nodes: GPUs, health, cordon (operators)",
                  "Nodes of the clusters. Cordoning and checks on demand are for platform "
                  "admins.")
    n_list = command(nodes, "list", cmd_node_list,
                     "nodes with their GPUs in use, health and whether they take work")
    n_list.add_argument("--cluster", "-c", help="only this cluster's nodes")
    json_flag(n_list)
    cordon = command(nodes, "cordon", cmd_node_cordon,
                     "take a node out of service: its work stays, nothing new is placed")
    node_arg(cordon)
    cordon.add_argument("--reason", "-r", help="why, shown with the node")
    uncordon = command(nodes, "uncordon", cmd_node_uncordon, "put a node back in service")
    node_arg(uncordon)
    health = command(nodes, "health", cmd_node_health,
                     "each health check's newest verdict on a node")
    node_arg(health)
    json_flag(health)
    check = command(nodes, "check", cmd_node_check,
                    "run health checks on a node now (default: every single-node check)")
    node_arg(check)
    check.add_argument("--check", metavar="NAME",
                       help="only this check (see `ogai node health NODE`)")
    follow(check, "wait until every check is judged and print the verdicts; exit 1 if a "
           "fatal one failed")

    stack = group("stack", "software-stack profiles and their deployment to nodes (operators)",
                  "Stack profiles (driver, CUDA, NCCL, … checked against the compatibility "
                  "matrix) and Ansible deployment runs. Platform admins only.")
    s_profiles = command(stack, "profiles", cmd_stack_profiles, "list the stack profiles")
    json_flag(s_profiles)
    s_create = command(stack, "create", cmd_stack_create,
                       "create a stack profile from a YAML (or JSON) file")
    s_create.add_argument("file", metavar="FILE", help="the profile's fields; - reads stdin")
    s_create.add_argument("--name", help="the profile's name, overriding the file's")
    json_flag(s_create)
    deploy = command(stack, "deploy", cmd_stack_deploy,
                     "deploy a stack profile to nodes of a cluster")
    deploy.add_argument("profile", metavar="PROFILE", help="the stack profile's name")
    deploy.add_argument("--cluster", "-c", required=True, help="the cluster")
    deploy.add_argument("--nodes", "-n", action="append", metavar="NAMES",
                        help="only these nodes (separate with commas, or repeat; default: "
                        "every healthy node of the cluster)")
    deploy.add_argument("--check-mode", action="store_true",
                        help="report what would change and change nothing")
    deploy.add_argument("--quiet", "-q", action="store_true", help="print only the run id")
    follow(deploy, "follow it until it ends; exit 0 only if it succeeded")
    json_flag(deploy)
    runs = command(stack, "runs", cmd_stack_runs, "list deployment runs, newest first")
    runs.add_argument("--cluster", "-c", help="only runs on this cluster")
    runs.add_argument("--state", "-s", choices=DEPLOYMENT_STATES, help="only runs in this state")
    runs.add_argument("--all", "-a", action="store_true",
                      help="every matching run, not only the newest page")
    runs.add_argument("--limit", type=_positive_int, default=50, help=argparse.SUPPRESS)
    json_flag(runs)
    show = command(stack, "show", cmd_stack_show,
                   "a deployment run: each node's state, task counts and where it failed")
    show.add_argument("id", type=_run_id, metavar="RUN")
    follow(show, "refresh it until it ends; exit 0 only if it succeeded")
    json_flag(show)
    rerun = command(stack, "rerun", cmd_stack_rerun,
                    "run an ended deployment again on only its failed or unreachable nodes")
    rerun.add_argument("id", type=_run_id, metavar="RUN")
    follow(rerun, "follow the new run until it ends; exit 0 only if it succeeded")
    cancel = command(stack, "cancel", cmd_stack_cancel, "cancel a queued or running run")
    cancel.add_argument("id", type=_run_id, metavar="RUN")
