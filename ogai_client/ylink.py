"""`ogai dataset`, `ogai pipeline` and `ogai train`: the YLink model toolchain on the command line.

Datasets are uploaded with a progress bar; pipeline and training runs are started from a spec
file (YAML or JSON, the body of the API's POST) and followed with `-f`, which exits 0 only when
the run succeeded, like `ogai job submit -f`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from ogai_client import cli
from ogai_client.cli import Context, _age, _interval, _positive_int, _print_json, _state, _table
from ogai_client.client import OgaiClient, OgaiError
from ogai_client.models import (
    Dataset,
    DatasetVersion,
    PipelineRun,
    StepResult,
    TrainingRun,
)
from ogai_client.spec import SpecError, load_mapping

DATASET_KINDS = ("text", "instruction")
TRAINING_KINDS = ("tokenizer", "pretrain", "sft", "lora", "prompt_tuning",
                  "multitask_prompt_tuning")
TRAIN_ACTIONS = frozenset({"run", "list", "show", "cancel", "metrics", "mpt"})
# Options of `ogai train run` that take a value (to find SPEC in `ogai train [options] SPEC`).
TRAIN_VALUE_OPTIONS = frozenset({"--tenant", "--queue", "--name", "--dataset", "--version",
                                 "--interval"})
# A run whose job ended well but whose runner's result has not arrived ("finishing") is given
# this long (of the follower's polling) before `-f` gives up on it.
FINISHING_GRACE_S = 120.0
_NAME_CHARS = re.compile(r"[^a-z0-9._-]+")


# -- formatting ---------------------------------------------------------------------------------

def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"  # pragma: no cover


def _duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    whole = round(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"


def _number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _when(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def _details(rows: list[tuple[str, str | Text]]) -> Table:
    details = Table.grid(padding=(0, 2))
    details.add_column(style="bold")
    details.add_column(overflow="fold")
    for key, value in rows:
        details.add_row(key, value)
    return details


def _headline(kind: str, ident: int, name: str, state: str) -> Text:
    return Text.assemble((f"{kind} {ident}", "bold"), f"  {name}  ", _state(state))


@contextmanager
def _about(kind: str, ident: int | str) -> Iterator[None]:
    """An unknown run or version is "not found", whether it does not exist or belongs to
    another tenant."""
    try:
        yield
    except OgaiError as exc:
        if exc.code == "not_found" and exc.status == 404:
            raise OgaiError("not_found", f"{kind} {ident} not found (or not visible to you)",
                            status=exc.status) from None
        raise


# -- specs --------------------------------------------------------------------------------------

def read_run_spec(path: str, *, what: str, hint: str) -> dict:
    """A pipeline or training spec from a YAML or JSON file (- for stdin): a mapping of the
    API's fields. A problem is a SpecError naming the file and what to fix."""
    if path == "-":
        text, source = sys.stdin.read(), "stdin"
    else:
        source = path
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise SpecError(f"{path} is not UTF-8 text; write the {what} spec as YAML or "
                            "JSON") from None
    return load_mapping(text, source=source, what=what, hint=hint)


def _apply_overrides(spec: dict, args: argparse.Namespace) -> dict:
    spec = dict(spec)
    for name in ("tenant", "queue", "name"):
        value = getattr(args, name, None)
        if value:
            spec[name] = value
    if getattr(args, "dataset", None):
        spec.pop("dataset_version", None)
        spec.pop("version", None)
        spec["dataset"] = args.dataset
    if getattr(args, "version", None) is not None:
        spec["version"] = args.version
    return spec


# -- following a run ----------------------------------------------------------------------------

def _follow_run(ctx: Context, fetch: Callable[[], Any], label: str, *, interval: float,
                on_poll: Callable[[Any], None]) -> Any:
    """Poll a run every `interval` s until it ends, noting its state changes on stderr and
    calling `on_poll(run)` after each poll; returns the run as it ended."""
    seen: tuple[str, str] | None = None
    finishing_for = 0.0
    while True:
        run = fetch()
        if (run.state, run.reason) != seen:
            seen = (run.state, run.reason)
            # The job's reason; once the run succeeded its job may still say "running".
            reason = {"finishing": "recording its result", "succeeded": ""}.get(run.state,
                                                                                run.reason)
            ctx.note(f"{label}: {run.state}" + (f" ({reason})" if reason else ""))
        on_poll(run)
        if run.is_final:
            return run
        if run.state == "finishing":
            finishing_for += interval
            if finishing_for >= FINISHING_GRACE_S:
                raise OgaiError("no_result", f"{label}: its job ended but the runner "
                                f"reported no result within {FINISHING_GRACE_S:g} s; see "
                                f"`ogai job logs {run.job}`")
        else:
            finishing_for = 0.0
        cli._pause(interval)


def _ended_badly(label: str, run: PipelineRun | TrainingRun) -> OgaiError:
    why = run.message or run.reason or "no reason given"
    return OgaiError(run.state, f"{label} {run.state}: {why}")


# -- datasets -----------------------------------------------------------------------------------

def _name_from_file(path: Path) -> str:
    """A dataset name from a file name: "My Corpus.jsonl" -> "my-corpus"."""
    name = _NAME_CHARS.sub("-", path.stem.lower()).strip("-._")
    return name[:100] or "dataset"


def _dataset(client: OgaiClient, ref: str, tenant: str | None) -> Dataset:
    """A dataset by id or by name."""
    if ref.isdigit():
        try:
            return client.dataset(int(ref))
        except OgaiError as exc:
            if exc.status != 404:
                raise
    found = client.find_dataset(ref, tenant=tenant)
    if found is None:
        where = f" in tenant {tenant}" if tenant else ""
        raise OgaiError("not_found", f"dataset {ref}{where} not found (or not visible to "
                        "you); `ogai dataset list` shows yours")
    return found


def cmd_dataset_create(args: argparse.Namespace, ctx: Context) -> int:
    dataset = ctx.client().create_dataset(args.name, kind=args.kind,
                                          description=args.description or "",
                                          tenant=args.tenant)
    if args.json:
        _print_json(ctx, dataset.raw)
        return 0
    ctx.out.print(Text.assemble("dataset ", (str(dataset.id), "bold"),
                                f" created: {dataset.name} in {dataset.tenant} "
                                f"({dataset.kind}); add data with `ogai dataset upload FILE "
                                f"--dataset {dataset.name}`"))
    return 0


def cmd_dataset_list(args: argparse.Namespace, ctx: Context) -> int:
    datasets = ctx.client().datasets(tenant=args.tenant, kind=args.kind)
    if args.json:
        _print_json(ctx, [dataset.raw for dataset in datasets])
        return 0
    if not datasets:
        ctx.note("no datasets; make one with `ogai dataset upload FILE --create`")
        return 0
    several_tenants = len({dataset.tenant for dataset in datasets}) > 1
    table = _table()
    columns = ["ID", "NAME", *(["TENANT"] if several_tenants else []), "KIND", "VERSIONS",
               "LATEST", "DESCRIPTION", "AGE"]
    for column in columns:
        table.add_column(column, justify="right" if column in {"ID", "VERSIONS"} else "left",
                         overflow="fold")
    now = datetime.now(UTC)
    for dataset in datasets:
        latest = f"v{dataset.latest_version}" if dataset.latest_version else "-"
        description = " ".join(dataset.description.split())
        table.add_row(str(dataset.id), dataset.name,
                      *([dataset.tenant] if several_tenants else []), dataset.kind,
                      str(dataset.versions), latest,
                      description[:60] + ("…" if len(description) > 60 else ""),
                      _age(dataset.created_at, now))
    ctx.out.print(table)
    return 0


@contextmanager
def _upload_progress(ctx: Context, name: str, show: bool) -> Iterator[Callable[[int, int],
                                                                                None] | None]:
    """A progress bar of bytes sent on stderr (only on a terminal); yields the callback."""
    if not show:
        yield None
        return
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TimeRemainingColumn(), console=ctx.err,
                        transient=True)
    task = progress.add_task(f"uploading {name}", total=None)

    def update(sent: int, total: int) -> None:
        done = total and sent >= total
        progress.update(task, completed=sent, total=total or None,
                        description=f"checking {name} on the server" if done
                        else f"uploading {name}")

    with progress:
        yield update


def cmd_dataset_upload(args: argparse.Namespace, ctx: Context) -> int:
    path = Path(args.file)
    # The file first: a typo in its name should not create a dataset.
    if not path.exists():
        raise OgaiError("bad_file", f"cannot read {path}: no such file")
    if not path.is_file():
        raise OgaiError("bad_file", f"{path} is not a file; upload a .jsonl, .txt or .md "
                        "file, or a .zip of them")
    client = ctx.client()
    name = args.dataset or _name_from_file(path)
    dataset = client.find_dataset(name, tenant=args.tenant)
    if dataset is None and not args.create:
        where = f" in tenant {args.tenant}" if args.tenant else ""
        raise OgaiError("not_found", f"no dataset {name}{where}: add --create to make "
                        f"it, or name another with --dataset")
    if dataset is not None and args.kind and args.kind != dataset.kind:
        raise OgaiError("invalid", f"dataset {dataset.name} holds {dataset.kind} data, not "
                        f"{args.kind}; --kind applies to a dataset --create makes")
    show = ctx.err.is_terminal and not args.json and not args.quiet
    with _upload_progress(ctx, path.name, show) as on_progress:
        if dataset is None:
            # One request: a file the server refuses leaves no empty dataset behind.
            version = client.create_dataset_from_upload(
                name, path, kind=args.kind or "text", tenant=args.tenant,
                on_progress=on_progress)
        else:
            version = client.upload_dataset(dataset.id, path, on_progress=on_progress)
    if dataset is None and not args.json and not args.quiet:
        ctx.note(f"created dataset {version.dataset} in {version.tenant} "
                 f"({args.kind or 'text'})")
    if args.json:
        _print_json(ctx, version.raw)
    elif args.quiet:
        ctx.out.print(str(version.id))
    else:
        ctx.out.print(Text.assemble(
            "uploaded ", (version.label, "bold"), f" (version {version.id}): "
            f"{_count(version.documents)} documents, {_size(version.bytes)} from "
            f"{version.source or path.name}"))
    return 0


def _lineage(version: DatasetVersion) -> str:
    if version.pipeline_run:
        parent = f" on version {version.parent}" if version.parent else ""
        return f"pipeline run {version.pipeline_run}{parent}"
    return f"upload {version.source}" if version.source else "-"


def _histogram(version: DatasetVersion, width: int = 40) -> Table | None:
    bins = [b for b in version.length_histogram if isinstance(b, dict)]
    if not any(b.get("documents") for b in bins):
        return None
    while not bins[0].get("documents"):  # no empty rows above the shortest documents
        bins.pop(0)
    most = max(int(b.get("documents") or 0) for b in bins)
    table = _table(f"document lengths of {version.label} (characters)")
    for column in ("CHARS", "DOCUMENTS", ""):
        table.add_column(column, justify="right" if column == "DOCUMENTS" else "left")
    for b in bins:
        count = int(b.get("documents") or 0)
        low, high = b.get("from", 0), b.get("to", 0)
        span = str(low) if low == high else f"{low}-{high}"
        table.add_row(span, _count(count), "█" * max(1 if count else 0,
                                                     round(width * count / most)))
    return table


def cmd_dataset_show(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    dataset = _dataset(client, args.dataset, args.tenant)
    versions = sorted(client.dataset_versions(dataset=dataset.id), key=lambda v: -v.number)
    if args.json:
        _print_json(ctx, {"dataset": dataset.raw, "versions": [v.raw for v in versions]})
        return 0
    out = ctx.out
    out.print(Text.assemble((f"dataset {dataset.id}", "bold"), f"  {dataset.name}  ",
                            f"({dataset.kind}) in {dataset.tenant}"))
    if dataset.description:
        out.print(f"  {dataset.description}")
    out.print(_details([("created", f"{_when(dataset.created_at)} by "
                                     f"{dataset.created_by or '-'}")]))
    out.print()
    if not versions:
        ctx.note(f"no versions yet: `ogai dataset upload FILE --dataset {dataset.name}`")
        return 0
    table = _table("versions")
    for column in ("VERSION", "ID", "FORMAT", "DOCUMENTS", "BYTES", "TOKENS", "FROM", "HASH",
                   "CREATED"):
        table.add_column(column, justify="right" if column in {"ID", "DOCUMENTS", "BYTES",
                                                               "TOKENS"} else "left",
                         overflow="fold")
    for version in versions:
        table.add_row(f"v{version.number}", str(version.id), version.format,
                      _count(version.documents), _size(version.bytes), _count(version.tokens),
                      _lineage(version), version.content_hash[:12] or "-",
                      _when(version.created_at))
    out.print(table)
    histogram = _histogram(versions[0])
    if histogram is not None:
        out.print()
        out.print(histogram)
    return 0


def cmd_dataset_samples(args: argparse.Namespace, ctx: Context) -> int:
    with _about("dataset version", args.version):
        page = ctx.client().dataset_samples(args.version, offset=args.offset, limit=args.limit)
    if args.json:
        _print_json(ctx, {"count": page.count, "offset": page.offset,
                          "results": [vars(sample) for sample in page.results]})
        return 0
    if not page.results:
        ctx.note(f"no documents from {args.offset} on (the version has "
                 f"{_count(page.count)})")
        return 0
    for sample in page.results:
        cut = ", cut" if sample.truncated else ""
        ctx.out.print(Text.assemble((f"#{sample.index}", "bold"), f"  {sample.id}  ",
                                    (f"({_count(sample.chars)} characters{cut})", "dim")))
        ctx.out.print(Text(sample.text))
        ctx.out.print()
    last = page.offset + len(page.results)
    more = f"; --offset {last} for more" if last < page.count else ""
    ctx.note(f"documents {page.offset} to {last - 1} of {_count(page.count)}{more}")
    return 0


# -- pipelines ----------------------------------------------------------------------------------

def _bound(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _param_range(param: dict) -> str:
    if param.get("choices"):
        return " | ".join(str(choice) for choice in param["choices"])
    low, high = param.get("min"), param.get("max")
    if low is not None and high is not None:
        return f"{_bound(low)} to {_bound(high)}"
    if low is not None:
        return f"≥ {_bound(low)}"
    if high is not None:
        return f"≤ {_bound(high)}"
    return ""


def cmd_pipeline_steps(args: argparse.Namespace, ctx: Context) -> int:
    steps = ctx.client().pipeline_steps()
    if args.json:
        _print_json(ctx, steps)
        return 0
    for index, step in enumerate(steps):
        if index:
            ctx.out.print()
        ctx.out.print(Text.assemble((str(step.get("type", "")), "bold"),
                                    f"  {step.get('title', '')}"))
        if step.get("description"):
            ctx.out.print(Text(f"  {step['description']}"))
        params = step.get("params") or {}
        if not params:
            continue
        table = _table()
        for column in ("  PARAMETER", "TYPE", "DEFAULT", "RANGE", "HELP"):
            table.add_column(column, overflow="fold")
        for name, param in params.items():
            table.add_row(f"  {name}", str(param.get("type", "")),
                          json.dumps(param.get("default")), _param_range(param),
                          str(param.get("help", "")))
        ctx.out.print(table)
    return 0


def _step_table(run: PipelineRun) -> Table:
    results = {result.index: result for result in run.step_results}
    planned = [StepResult(index=i, type=str(step.get("type", "")))
               for i, step in enumerate(run.steps) if i not in results]
    table = _table("steps")
    for column in ("#", "STEP", "DOCS IN", "DOCS OUT", "KEPT", "BYTES IN", "BYTES OUT",
                   "DROPPED", "SECONDS"):
        table.add_column(column, justify="left" if column in {"STEP", "DROPPED"} else "right",
                         overflow="fold")
    for result in sorted([*results.values(), *planned], key=lambda r: r.index):
        if result.index not in results:
            table.add_row(str(result.index), result.type, *["-"] * 7)
            continue
        kept = f"{100 * result.docs_out / result.docs_in:.1f}%" if result.docs_in else "-"
        dropped = ", ".join(f"{reason} {_count(count)}" for reason, count in
                            sorted(result.dropped.items(), key=lambda item: -item[1]))
        table.add_row(str(result.index), result.type, _count(result.docs_in),
                      _count(result.docs_out), kept, _size(result.bytes_in),
                      _size(result.bytes_out), dropped or "-",
                      "-" if result.seconds is None else f"{result.seconds:.1f}")
    return table


def _pipeline_summary(run: PipelineRun) -> str:
    version = run.input_version
    source = version.label if version else "?"
    types = [str(step.get("type", "")) for step in run.steps]
    replicas = f" on {run.replicas} replicas" if run.replicas > 1 else ""
    return (f"{source} through {len(types)} step{'s' if len(types) != 1 else ''} "
            f"({', '.join(types)}){replicas}")


def _print_output(ctx: Context, run: PipelineRun) -> None:
    version = run.output_version
    if version is None:
        return
    tokens = f", {_count(version.tokens)} tokens" if version.tokens is not None else ""
    ctx.out.print(Text.assemble("output: ", (version.label, "bold"),
                                f" (version {version.id}, {version.format}): "
                                f"{_count(version.documents)} documents, "
                                f"{_size(version.bytes)}{tokens}"))


def _start_run(args: argparse.Namespace, ctx: Context, *, what: str, hint: str, start,
               summary, follow) -> int:
    """Start a pipeline or training run from a spec file; follow it with -f."""
    spec = _apply_overrides(read_run_spec(args.spec, what=what, hint=hint), args)
    client = ctx.client()
    run = start(client, spec)
    if args.quiet:
        ctx.out.print(str(run.id))
    else:
        ctx.out.print(Text.assemble(f"{what} run ", (str(run.id), "bold"),
                                    f" started: {summary(run)}, job {run.job}, ",
                                    _state(run.state),
                                    f" ({run.reason})" if run.reason else ""))
    if not args.follow:
        return 0
    return follow(ctx, client, run.id, interval=args.interval)


def cmd_pipeline_run(args: argparse.Namespace, ctx: Context) -> int:
    return _start_run(args, ctx, what="pipeline",
                      hint="dataset or dataset_version, steps, replicas, …",
                      start=OgaiClient.start_pipeline, summary=_pipeline_summary,
                      follow=_follow_pipeline)


def _follow_pipeline(ctx: Context, client: OgaiClient, run_id: int, *,
                     interval: float) -> int:
    label = f"pipeline run {run_id}"
    run = _follow_run(ctx, lambda: client.pipeline_run(run_id), label, interval=interval,
                      on_poll=lambda run: None)
    if run.step_results or run.state == "succeeded":
        ctx.out.print(_step_table(run))
    if run.state != "succeeded":
        raise _ended_badly(label, run)
    _print_output(ctx, run)
    return 0


def cmd_pipeline_list(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    dataset = _dataset(client, args.dataset, args.tenant).id if args.dataset else None
    runs = client.pipeline_runs(tenant=args.tenant, dataset=dataset)
    if args.json:
        _print_json(ctx, [run.raw for run in runs])
        return 0
    if not runs:
        ctx.note("no pipeline runs; start one with `ogai pipeline run SPEC`")
        return 0
    table = _table()
    for column in ("ID", "NAME", "INPUT", "STEPS", "STATE", "OUTPUT", "AGE"):
        table.add_column(column, justify="right" if column == "ID" else "left",
                         overflow="fold")
    now = datetime.now(UTC)
    for run in runs:
        state = Text.assemble(_state(run.state), f" ({run.reason})"
                              if run.reason and not run.is_final else "")
        table.add_row(str(run.id), run.name,
                      run.input_version.label if run.input_version else "-",
                      ", ".join(str(step.get("type", "")) for step in run.steps), state,
                      run.output_version.label if run.output_version else "-",
                      _age(run.created_at, now))
    ctx.out.print(table)
    return 0


def cmd_pipeline_show(args: argparse.Namespace, ctx: Context) -> int:
    with _about("pipeline run", args.id):
        run = ctx.client().pipeline_run(args.id)
    if args.json:
        _print_json(ctx, run.raw)
        return 0
    out = ctx.out
    out.print(_headline("pipeline run", run.id, run.name, run.state))
    if run.reason and run.state != "succeeded":
        out.print(f"  reason: {run.reason}")
    if run.message:
        out.print(Text(f"  message: {run.message}", style="red"))
    rows: list[tuple[str, str | Text]] = [
        ("tenant", run.tenant),
        ("input", f"{run.input_version.label} (version {run.input_version.id})"
         if run.input_version else "-"),
        ("output", f"{run.output_version.label} (version {run.output_version.id})"
         if run.output_version else "-"),
        ("replicas", str(run.replicas)),
        ("job", f"{run.job} (`ogai job logs {run.job}`)" if run.job else "-"),
    ]
    if run.tokenizer_run:
        rows.append(("tokenizer", f"training run {run.tokenizer_run}"))
    rows += [("started", f"{_when(run.created_at)} by {run.created_by or '-'}"),
             ("finished", _when(run.finished_at))]
    out.print(_details(rows))
    out.print()
    out.print(_step_table(run))
    params = [(i, step) for i, step in enumerate(run.steps) if step.get("params")]
    if params:
        out.print()
        table = _table("parameters")
        for column in ("#", "STEP", "PARAMETERS"):
            table.add_column(column, overflow="fold")
        for index, step in params:
            table.add_row(str(index), str(step.get("type", "")),
                          " ".join(f"{k}={json.dumps(v)}" for k, v in step["params"].items()))
        out.print(table)
    for result in run.step_results:
        for sample in result.samples[:2]:
            text = " ".join(str(sample.get("text", "")).split())
            out.print(Text.assemble((f"  {result.type}", "bold"),
                                    f" dropped ({sample.get('reason', '?')}): ",
                                    (text[:120] + ("…" if len(text) > 120 else ""), "dim")))
    return 0


def cmd_pipeline_cancel(args: argparse.Namespace, ctx: Context) -> int:
    with _about("pipeline run", args.id):
        run = ctx.client().cancel_pipeline_run(args.id)
    ctx.out.print(Text.assemble(f"pipeline run {run.id} ", _state(run.state),
                                f" ({run.reason})" if run.reason else ""))
    return 0


# -- training -----------------------------------------------------------------------------------

def _progress_line(run: TrainingRun) -> str:
    total = run.total_steps
    parts = [f"step {_count(run.step)}/{_count(total)}"
             + (f" ({100 * run.step / total:.0f}%)" if total else "")]
    if run.loss is not None:
        parts.append(f"loss {_number(run.loss)}")
    if run.lr is not None:
        parts.append(f"lr {run.lr:.2e}")
    if run.tokens:
        parts.append(f"{_count(run.tokens)} tokens")
    if run.tokens_per_s is not None:
        parts.append(f"{_count(round(run.tokens_per_s))} tokens/s")
    if run.eta_s is not None and run.state == "running":
        parts.append(f"ETA {_duration(run.eta_s)}")
    return "  ".join(parts)


def _training_summary(run: TrainingRun) -> str:
    data = run.dataset_version.label if run.dataset_version else "?"
    steps = f", {_count(run.total_steps)} steps" if run.total_steps else ""
    gpus = f", {run.replicas} x {run.gpus} GPU" if run.gpus else ""
    if run.replicas > 1 and not run.gpus:
        gpus = f", {run.replicas} replicas"
    base = f" from training run {run.base_run}" if run.base_run else ""
    return f"{run.kind}{base} on {data}{steps}{gpus}"


def _result_line(run: TrainingRun) -> Text:
    parameters = f" ({_count(run.parameters)} parameters)" if run.parameters else ""
    loss = f"; final loss {_number(run.loss)}" if run.loss is not None else ""
    steps = f" after {_count(run.step)} steps" if run.step else ""
    return Text.assemble(f"training run {run.id} ", _state(run.state),
                         f": {run.artifact or 'result'}{parameters} at "
                         f"{run.output_path or '-'}{loss}{steps}")


def cmd_train_run(args: argparse.Namespace, ctx: Context) -> int:
    return _start_run(args, ctx, what="training",
                      hint="kind, dataset or dataset_version, model, training, …",
                      start=OgaiClient.start_training, summary=_training_summary,
                      follow=_follow_training)


def cmd_train_mpt(args: argparse.Namespace, ctx: Context) -> int:
    """The two-stage recipe of multi-task prompt tuning: both runs at once; -f follows the
    target (it fails if the source does)."""
    spec = _apply_overrides(read_run_spec(args.spec, what="multi-task prompt tuning",
                                          hint="base_run, source, target, prompt_tuning, …"),
                            args)
    client = ctx.client()
    source, target = client.start_multitask_prompt_tuning(spec)
    if args.quiet:
        ctx.out.print(f"{source.id} {target.id}")
    else:
        for stage, run in (("source tasks", source), ("target task", target)):
            waits = f", starts after run {source.id}" if run is target else f", job {run.job}"
            ctx.out.print(Text.assemble(f"{stage}: training run ", (str(run.id), "bold"),
                                        f" {_training_summary(run)}{waits}, ",
                                        _state(run.state)))
    if not args.follow:
        return 0
    return _follow_training(ctx, client, target.id, interval=args.interval)


def _follow_training(ctx: Context, client: OgaiClient, run_id: int, *,
                     interval: float) -> int:
    label = f"training run {run_id}"
    shown: dict[str, Any] = {"progress": None, "resumed": None}

    def on_poll(run: TrainingRun) -> None:
        if run.resumed_from_step is not None and run.resumed_from_step != shown["resumed"]:
            shown["resumed"] = run.resumed_from_step
            ctx.note(f"{label}: resumed from the checkpoint of step {run.resumed_from_step}")
        progress = (run.step, run.progress_at, run.loss)
        if run.progress_at is not None and progress != shown["progress"] \
                and run.state != "succeeded":
            shown["progress"] = progress
            ctx.out.print(_progress_line(run))

    run = _follow_run(ctx, lambda: client.training_run(run_id), label, interval=interval,
                      on_poll=on_poll)
    if run.state != "succeeded":
        raise _ended_badly(label, run)
    ctx.out.print(_result_line(run))
    return 0


def cmd_train_list(args: argparse.Namespace, ctx: Context) -> int:
    runs = ctx.client().training_runs(tenant=args.tenant, kind=args.kind)
    if args.json:
        _print_json(ctx, [run.raw for run in runs])
        return 0
    if not runs:
        ctx.note("no training runs; start one with `ogai train SPEC`")
        return 0
    table = _table()
    for column in ("ID", "NAME", "KIND", "DATA", "STATE", "STEP", "LOSS", "RESULT", "AGE"):
        table.add_column(column, justify="right" if column in {"ID", "STEP", "LOSS"}
                         else "left", overflow="fold")
    now = datetime.now(UTC)
    for run in runs:
        state = Text.assemble(_state(run.state), f" ({run.reason})"
                              if run.reason and not run.is_final else "")
        table.add_row(str(run.id), run.name, run.kind,
                      run.dataset_version.label if run.dataset_version else "-", state,
                      f"{_count(run.step)}/{_count(run.total_steps)}", _number(run.loss),
                      run.artifact or "-", _age(run.created_at, now))
    ctx.out.print(table)
    return 0


def cmd_train_show(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    with _about("training run", args.id):
        run = client.training_run(args.id)
    if args.json:
        _print_json(ctx, run.raw)
        return 0
    checkpoints = client.training_checkpoints(run.id)
    out = ctx.out
    out.print(_headline("training run", run.id, run.name, run.state))
    if run.reason and run.state != "succeeded":
        out.print(f"  reason: {run.reason}")
    if run.message:
        out.print(Text(f"  message: {run.message}", style="red"))
    model = run.spec.get("model") or {}
    rows: list[tuple[str, str | Text]] = [
        ("tenant", run.tenant),
        ("kind", run.kind + (f" from training run {run.base_run}" if run.base_run else "")),
        ("data", f"{run.dataset_version.label} (version {run.dataset_version.id})"
         if run.dataset_version else "-"),
    ]
    if model:
        rows.append(("model", " ".join(f"{k}={v}" for k, v in model.items()
                                       if v is not None)))
    rows += [
        ("resources", f"{run.replicas} x {run.gpus} GPU" if run.gpus
         else f"{run.replicas} replica{'s' if run.replicas != 1 else ''}, CPU"),
        ("progress", _progress_line(run)),
    ]
    if run.resumed_from_step is not None:
        rows.append(("resumed from", f"step {run.resumed_from_step}"))
    if run.artifact:
        rows.append(("result", f"{run.artifact} at {run.output_path}"
                     + (f" ({_count(run.parameters)} parameters)" if run.parameters else "")))
    rows += [("job", f"{run.job} (`ogai job logs {run.job}`)" if run.job else "-"),
             ("started", f"{_when(run.created_at)} by {run.created_by or '-'}"),
             ("finished", _when(run.finished_at))]
    out.print(_details(rows))
    if checkpoints:
        out.print()
        table = _table("checkpoints")
        for column in ("STEP", "SIZE", "PATH", "CREATED"):
            table.add_column(column, justify="right" if column in {"STEP", "SIZE"} else "left",
                             overflow="fold")
        for checkpoint in checkpoints:
            table.add_row(_count(checkpoint.step), _size(checkpoint.bytes), checkpoint.path,
                          _when(checkpoint.created_at))
        out.print(table)
    return 0


def cmd_train_metrics(args: argparse.Namespace, ctx: Context) -> int:
    with _about("training run", args.id):
        metrics = ctx.client().training_metrics(args.id, after_step=args.after_step)
    if args.json:
        _print_json(ctx, [vars(metric) for metric in metrics])
        return 0
    if not metrics:
        ctx.note(f"training run {args.id} has reported no metrics yet")
        return 0
    table = _table()
    for column in ("STEP", "LOSS", "LR", "TOKENS", "TOKENS/S", "GRAD NORM"):
        table.add_column(column, justify="right")
    for m in metrics:
        table.add_row(_count(m.step), _number(m.loss), "-" if m.lr is None else f"{m.lr:.2e}",
                      _count(m.tokens), "-" if m.tokens_per_s is None
                      else _count(round(m.tokens_per_s)), _number(m.grad_norm, 3))
    ctx.out.print(table)
    return 0


def cmd_train_cancel(args: argparse.Namespace, ctx: Context) -> int:
    with _about("training run", args.id):
        run = ctx.client().cancel_training_run(args.id)
    ctx.out.print(Text.assemble(f"training run {run.id} ", _state(run.state),
                                f" ({run.reason})" if run.reason else ""))
    return 0


# -- the parser ---------------------------------------------------------------------------------

def train_argv(argv: list[str]) -> list[str]:
    """`ogai train [options] SPEC` is `ogai train run [options] SPEC`."""
    if not argv or argv[0] != "train":
        return argv
    rest = argv[1:]
    skip = False
    for token in rest:
        if skip:
            skip = False
            continue
        if token.startswith("-") and token != "-":
            skip = token in TRAIN_VALUE_OPTIONS
            continue
        if token in TRAIN_ACTIONS:
            return argv
        return ["train", "run", *rest]
    return argv


def add_commands(commands: Any, command: Callable[..., Any]) -> None:
    """Add `dataset`, `pipeline` and `train` to the CLI's parser."""
    _run_id = cli._id_of("run")
    _version_id = cli._id_of("version")

    def group(name: str, help: str, description: str) -> Any:
        parser = commands.add_parser(name, help=help, description=description)
        parser.set_defaults(handler=None, group=parser)
        return parser.add_subparsers(dest=f"{name}_command", metavar="ACTION")

    def json_flag(parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print the API's JSON")

    datasets = group("dataset", "upload and browse datasets", "Datasets.")
    create = command(datasets, "create", cmd_dataset_create, "create an empty dataset")
    create.add_argument("name", metavar="NAME", help="lower-case letters, digits, . _ -")
    create.add_argument("--kind", choices=DATASET_KINDS, default="text",
                        help="text (a corpus) or instruction (prompt and response pairs)")
    create.add_argument("--description", help="what it holds")
    create.add_argument("--tenant", help="the tenant (needed when you are in several)")
    json_flag(create)

    listing = command(datasets, "list", cmd_dataset_list, "list your datasets")
    listing.add_argument("--tenant", help="only this tenant's datasets")
    listing.add_argument("--kind", choices=DATASET_KINDS, help="only datasets of this kind")
    json_flag(listing)

    upload = command(datasets, "upload", cmd_dataset_upload,
                     "upload a corpus (.jsonl, .txt, .md or a .zip of them) as a new version")
    upload.add_argument("file", metavar="FILE")
    upload.add_argument("--dataset", "-d", metavar="NAME",
                        help="the dataset (default: named after the file)")
    upload.add_argument("--create", action="store_true",
                        help="create the dataset when there is none of that name")
    upload.add_argument("--kind", choices=DATASET_KINDS,
                        help="the kind of a dataset --create makes (default text)")
    upload.add_argument("--tenant", help="the tenant (needed when you are in several)")
    upload.add_argument("--quiet", "-q", action="store_true",
                        help="print only the new version's id")
    json_flag(upload)

    show = command(datasets, "show", cmd_dataset_show, "a dataset and its versions")
    show.add_argument("dataset", metavar="NAME|ID")
    show.add_argument("--tenant", help="the tenant (when several of yours have the name)")
    json_flag(show)

    samples = command(datasets, "samples", cmd_dataset_samples,
                      "print documents of a dataset version")
    samples.add_argument("version", type=_version_id, metavar="VERSION_ID",
                         help="the version's id (see `ogai dataset show`)")
    samples.add_argument("--offset", type=_positive_int, default=0,
                         help="the first document (default 0)")
    samples.add_argument("--limit", "-n", type=_positive_int, default=5,
                         help="how many (default 5, at most 100)")
    json_flag(samples)

    def run_options(parser: Any, *, dataset: bool = True) -> None:
        if dataset:
            parser.add_argument("--dataset", metavar="NAME",
                                help="run on this dataset instead of the spec's")
            parser.add_argument("--version", type=_positive_int, metavar="N",
                                help="its version number (default: the newest)")
        parser.add_argument("--tenant", help="the tenant (needed when you are in several)")
        parser.add_argument("--queue", help="the queue (default: the spec's, or 'default')")
        parser.add_argument("--name", help="the run's name, overriding the spec's")
        parser.add_argument("--quiet", "-q", action="store_true", help="print only the run id")
        parser.add_argument("--interval", type=_interval, default=2.0,
                            help="seconds between polls with -f (default 2)")

    pipelines = group("pipeline", "clean, filter, dedup and tokenize datasets",
                      "Data pipelines.")
    json_flag(command(pipelines, "steps", cmd_pipeline_steps,
                      "the step types and their parameters"))
    run = command(pipelines, "run", cmd_pipeline_run,
                  "start a pipeline from a spec (YAML or JSON)")
    run.add_argument("spec", metavar="SPEC", help="the spec file; - reads stdin")
    run.add_argument("--follow", "-f", action="store_true",
                     help="follow it until it ends; exit 0 only if it succeeded")
    run_options(run)
    p_list = command(pipelines, "list", cmd_pipeline_list, "list pipeline runs, newest first")
    p_list.add_argument("--tenant", help="only this tenant's runs")
    p_list.add_argument("--dataset", metavar="NAME|ID", help="only runs on this dataset")
    json_flag(p_list)
    p_show = command(pipelines, "show", cmd_pipeline_show,
                     "a pipeline run: its steps, per-step counts and output")
    p_show.add_argument("id", type=_run_id, metavar="ID")
    json_flag(p_show)
    p_cancel = command(pipelines, "cancel", cmd_pipeline_cancel, "cancel a pipeline run")
    p_cancel.add_argument("id", type=_run_id, metavar="ID")

    training = group("train", "train tokenizers and models",
                     "Training runs. `ogai train SPEC` is `ogai train run SPEC`.")
    t_run = command(training, "run", cmd_train_run,
                    "start a training run from a spec (YAML or JSON)")
    t_run.add_argument("spec", metavar="SPEC", help="the spec file; - reads stdin")
    t_run.add_argument("--follow", "-f", action="store_true",
                       help="follow its progress until it ends; exit 0 only if it succeeded")
    run_options(t_run)
    t_mpt = command(training, "mpt", cmd_train_mpt,
                    "multi-task prompt tuning in two stages (source tasks, then the target) "
                    "from one spec")
    t_mpt.add_argument("spec", metavar="SPEC", help="the spec file; - reads stdin")
    t_mpt.add_argument("--follow", "-f", action="store_true",
                       help="follow the target run until it ends; exit 0 only if it succeeded")
    run_options(t_mpt, dataset=False)
    t_list = command(training, "list", cmd_train_list, "list training runs, newest first")
    t_list.add_argument("--tenant", help="only this tenant's runs")
    t_list.add_argument("--kind", choices=TRAINING_KINDS, help="only runs of this kind")
    json_flag(t_list)
    t_show = command(training, "show", cmd_train_show,
                     "a training run: its progress, result and checkpoints")
    t_show.add_argument("id", type=_run_id, metavar="ID")
    json_flag(t_show)
    t_metrics = command(training, "metrics", cmd_train_metrics,
                        "the loss, learning rate and throughput a run logged")
    t_metrics.add_argument("id", type=_run_id, metavar="ID")
    t_metrics.add_argument("--after-step", type=_positive_int, help="only later steps")
    json_flag(t_metrics)
    t_cancel = command(training, "cancel", cmd_train_cancel, "cancel a training run")
    t_cancel.add_argument("id", type=_run_id, metavar="ID")
