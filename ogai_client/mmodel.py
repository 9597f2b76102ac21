"""`ogai model`, `ogai benchmark`, `ogai eval`, `ogai deploy` and `ogai chat`: MModel on the
command line.

A version is named `MODEL:vN`, or `MODEL` for its newest ready version; a deployment by its
name (the model name clients send to the gateway). `-f` follows an import or an evaluation and
exits 0 only when it succeeded; `deploy create -w` waits until the deployment answers. `ogai
chat` streams answers from the gateway (`/v1/chat/completions`) as they arrive.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ogai_client import cli
from ogai_client.cli import (
    STATE_STYLES,
    Context,
    _age,
    _cores,
    _interval,
    _memory,
    _memory_arg,
    _positive_int,
    _print_json,
    _table,
)
from ogai_client.client import GATEWAY, OgaiClient, OgaiError, parse_version_ref
from ogai_client.models import (
    Benchmark,
    Deployment,
    DeploymentStat,
    EvaluationRun,
    ModelImport,
    ModelVersion,
)
from ogai_client.ylink import (
    _about,
    _count,
    _details,
    _ended_badly,
    _follow_run,
    _size,
    _when,
)

BENCHMARK_KINDS = ("multiple_choice", "generation", "perplexity", "retrieval")
RUNTIMES = ("transformers", "vllm")
STYLES = {**STATE_STYLES, "ready": "green", "importing": "cyan", "degraded": "yellow",
          "scaled_to_zero": "dim"}
NODE_KINDS = {"dataset_version": "dataset version", "pipeline_run": "pipeline run",
              "training_run": "training run", "model_version": "model version"}


def _state(state: str) -> Text:
    return Text(state, style=STYLES.get(state, ""))


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


# -- models and versions ------------------------------------------------------------------------

def _version_summary(version: ModelVersion) -> str:
    kind = f" ({version.model_type})" if version.model_type else ""
    parts = [f"{version.architecture or 'unknown architecture'}{kind}",
             f"{_count(version.parameters)} parameters", version.format or "-",
             _size(version.bytes)]
    if version.context_length:
        parts.append(f"context {_count(version.context_length)}")
    return ", ".join(parts)


def _origin(version: ModelVersion) -> str:
    if version.training_run:
        base = f" on version {version.base_version}" if version.base_version else ""
        return f"training run {version.training_run}{base}"
    if version.source == "import":
        return f"import {version.source_path}" if version.source_path else "import"
    return version.source or "-"


def lineage_tree(version: ModelVersion) -> Tree:
    """What the version was made from, as a tree rooted at it (an edge goes from what was used
    to what it made), and under "built on it" the versions made from it."""
    nodes = {str(n.get("id")): n for n in version.lineage.get("nodes") or []
             if isinstance(n, dict)}
    edges = [(str(a), str(b)) for a, b in version.lineage.get("edges") or []]
    root_id = f"model_version:{version.id}"

    def label(node_id: str) -> Text:
        node = nodes.get(node_id, {})
        kind = NODE_KINDS.get(str(node.get("kind")), str(node.get("kind", "")))
        return Text.assemble((str(node.get("label", node_id)), "bold"),
                             (f"  {kind} {node.get('pk', '')}", "dim"))

    def grow(branch: Tree, node_id: str, seen: set[str]) -> None:
        for source, target in edges:
            if target == node_id and source not in seen:
                grow(branch.add(label(source)), source, seen | {source})

    tree = Tree(label(root_id))
    grow(tree, root_id, {root_id})
    derived = [b for a, b in edges if a == root_id]
    if derived:
        built = tree.add(Text("built on it", style="italic"))
        for node_id in derived:
            branch = built.add(label(node_id))
            for source, target in edges:
                if source == node_id and target != root_id:
                    branch.add(label(target))
    return tree


def cmd_model_list(args: argparse.Namespace, ctx: Context) -> int:
    models = ctx.client().models(tenant=args.tenant)
    if args.json:
        _print_json(ctx, [model.raw for model in models])
        return 0
    if not models:
        ctx.note("no models; import one with `ogai model import PATH --name NAME`, or register "
                 "a training run with `ogai model register --run ID --name NAME`")
        return 0
    several_tenants = len({model.tenant for model in models}) > 1
    table = _table()
    for column in ("ID", "NAME", *(["TENANT"] if several_tenants else []), "VERSIONS",
                   "LATEST", "DESCRIPTION", "AGE"):
        table.add_column(column, justify="right" if column in {"ID", "VERSIONS"} else "left",
                         overflow="fold")
    now = datetime.now(UTC)
    for model in models:
        latest = Text.assemble(f"v{model.latest_version} ", _state(model.latest_status)) \
            if model.latest_version else Text("-")
        description = " ".join(model.description.split())
        table.add_row(str(model.id), model.name, *([model.tenant] if several_tenants else []),
                      str(model.versions), latest,
                      description[:60] + ("…" if len(description) > 60 else ""),
                      _age(model.created_at, now))
    ctx.out.print(table)
    return 0


def _versions_table(versions: list[ModelVersion]) -> Table:
    table = _table("versions")
    for column in ("VERSION", "ID", "STATUS", "FORMAT", "ARCHITECTURE", "PARAMETERS",
                   "CONTEXT", "SIZE", "FROM", "CREATED"):
        table.add_column(column, justify="right" if column in {"ID", "PARAMETERS", "CONTEXT",
                                                               "SIZE"} else "left",
                         overflow="fold")
    for v in versions:
        table.add_row(f"v{v.number}", str(v.id), _state(v.status), v.format or "-",
                      v.architecture or "-", _count(v.parameters), _count(v.context_length),
                      _size(v.bytes), _origin(v), _when(v.created_at))
    return table


def _show_version(ctx: Context, version: ModelVersion) -> None:
    out = ctx.out
    out.print(Text.assemble((version.label, "bold"), f"  (version {version.id}) in "
                            f"{version.tenant}  ", _state(version.status)))
    if version.message:
        out.print(Text(f"  {version.message}",
                       style="red" if version.status == "failed" else "dim"))
    rows: list[tuple[str, str | Text]] = [
        ("from", _origin(version)),
        ("weights", _version_summary(version)),
        ("dtype", version.dtype or "-"),
        ("tokenizer", version.tokenizer or "-"),
        ("content hash", version.content_hash or "-"),
        ("stored at", version.artifact_path or "-"),
        ("created", f"{_when(version.created_at)} by {version.created_by or '-'}"),
    ]
    if version.dataset_versions:
        rows.insert(1, ("trained on", ", ".join(f"dataset version {v}"
                                                 for v in version.dataset_versions)))
    out.print(_details(rows))
    if version.files:
        out.print()
        files = _table("files")
        files.add_column("PATH", overflow="fold")
        files.add_column("SIZE", justify="right")
        for entry in version.files:
            files.add_row(str(entry.get("path", "")), _size(entry.get("bytes")))
        out.print(files)
    out.print()
    out.print(Text("lineage", style="bold"))
    out.print(lineage_tree(version))


def cmd_model_show(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    name, number = parse_version_ref(args.model)
    if number is not None:
        version = client.model_version(client.find_version(args.model, tenant=args.tenant).id)
        if args.json:
            _print_json(ctx, version.raw)
        else:
            _show_version(ctx, version)
        return 0
    model = client.find_model(name, tenant=args.tenant)
    if model is None:
        raise OgaiError("not_found", f"model {name} not found (or not visible to you); "
                        "`ogai model list` shows yours")
    versions = sorted(client.model_versions(model=model.id), key=lambda v: -v.number)
    if args.json:
        _print_json(ctx, {"model": model.raw, "versions": [v.raw for v in versions]})
        return 0
    out = ctx.out
    out.print(Text.assemble((f"model {model.id}", "bold"), f"  {model.name}  in {model.tenant}"))
    if model.description:
        out.print(f"  {model.description}")
    out.print(_details([("created", f"{_when(model.created_at)} by "
                                    f"{model.created_by or '-'}")]))
    out.print()
    if not versions:
        ctx.note(f"no versions yet: `ogai model import PATH --name {model.name}`")
        return 0
    out.print(_versions_table(versions))
    newest = client.model_version(versions[0].id)
    out.print()
    out.print(Text(f"lineage of {newest.label}", style="bold"))
    out.print(lineage_tree(newest))
    if newest.source == "import" and newest.source_path:
        out.print(Text(f"imported from {newest.source_path}", style="dim"))
    return 0


def cmd_model_import(args: argparse.Namespace, ctx: Context) -> int:
    # The path is the server's; one that exists here too (the same machine, a shared folder) is
    # made absolute, as the server wants it.
    source = os.path.abspath(args.path) if os.path.exists(args.path) else args.path
    client = ctx.client()
    created = client.find_model(args.name, tenant=args.tenant) is None
    # The model is created with the import, and only if the import is accepted.
    started = client.import_model(args.name, source, allow_pickle=args.allow_pickle,
                                  tenant=args.tenant, description=args.description or "")
    if created and not args.json:
        ctx.note(f"created model {args.name}")
    if not args.json:
        ctx.out.print(Text.assemble("import ", (str(started.id), "bold"),
                                    f" of {started.source_path} started: {started.label} "
                                    f"(version {started.version}), ", _state(started.state)))
    if not args.follow:
        if args.json:
            _print_json(ctx, started.raw)
        elif not started.is_final:
            ctx.note(f"`ogai model show {started.label}` shows how it goes; -f follows it")
        return 0
    done = _follow_import(ctx, client, started, interval=args.interval)
    if done.state != "succeeded":
        raise OgaiError("failed", f"import {done.id} of {done.source_path} failed: "
                        f"{done.message or 'no reason given'}")
    version = client.model_version(done.version) if done.version else None
    if args.json:
        _print_json(ctx, version.raw if version else done.raw)
    elif version is not None:
        ctx.out.print(Text.assemble((version.label, "bold"), " ", _state(version.status),
                                    f": {_version_summary(version)}"))
    return 0


def _follow_import(ctx: Context, client: OgaiClient, started: ModelImport, *,
                   interval: float) -> ModelImport:
    seen = started.state
    current = started
    while True:
        if current.is_final:
            return current
        cli._pause(interval)
        current = client.model_import(started.id)
        if current.state != seen:
            seen = current.state
            ctx.note(f"import {current.id}: {current.state}")


def cmd_model_register(args: argparse.Namespace, ctx: Context) -> int:
    version = ctx.client().register_version(args.run, args.name,
                                            description=args.description or "")
    if args.json:
        _print_json(ctx, version.raw)
        return 0
    ctx.out.print(Text.assemble(f"training run {args.run} registered as ",
                                (version.label, "bold"), f" (version {version.id}): "
                                f"{_version_summary(version)}"))
    return 0


def cmd_model_delete(args: argparse.Namespace, ctx: Context) -> int:
    name, number = parse_version_ref(args.version)
    if number is None:
        raise OgaiError("usage", f"name the version to delete: {name}:vN (`ogai model show "
                        f"{name}` lists them)")
    client = ctx.client()
    version = client.find_version(args.version, tenant=args.tenant)
    client.delete_version(version.id)
    ctx.out.print(f"deleted {version.label} (version {version.id})")
    return 0


# -- benchmarks ---------------------------------------------------------------------------------

def _find_benchmark(client: OgaiClient, ref: str, tenant: str | None) -> Benchmark:
    if ref.isdigit():
        with _about("benchmark", ref):
            return client.benchmark(int(ref))
    found = [b for b in client.benchmarks(tenant=tenant, search=ref) if b.name == ref]
    if not found:
        raise OgaiError("not_found", f"benchmark {ref} not found (or not visible to you); "
                        "`ogai benchmark list` shows yours")
    # A tenant's own benchmark before a shared one of the same name, as the API chooses.
    found.sort(key=lambda b: b.shared)
    return client.benchmark(found[0].id)


def _print_preview(ctx: Context, benchmark: Benchmark) -> None:
    if not benchmark.preview:
        return
    first = benchmark.preview[0]
    ctx.out.print(Text("the first document as the model is asked it:", style="bold"))
    ctx.out.print(Text(str(first.get("prompt", ""))))
    if first.get("choices"):
        ctx.out.print(Text(f"choices: {', '.join(map(str, first['choices']))}", style="dim"))
    if first.get("target"):
        ctx.out.print(Text(f"expected: {first['target']}", style="dim"))


def cmd_benchmark_list(args: argparse.Namespace, ctx: Context) -> int:
    benchmarks = ctx.client().benchmarks(tenant=args.tenant, kind=args.kind)
    if args.json:
        _print_json(ctx, [benchmark.raw for benchmark in benchmarks])
        return 0
    if not benchmarks:
        ctx.note("no benchmarks; upload one with `ogai benchmark upload FILE --name N --kind K`")
        return 0
    table = _table()
    for column in ("ID", "NAME", "TENANT", "KIND", "DOCUMENTS", "FEW-SHOT", "DESCRIPTION"):
        table.add_column(column, justify="right" if column in {"ID", "DOCUMENTS", "FEW-SHOT"}
                         else "left", overflow="fold")
    for b in benchmarks:
        description = " ".join(b.description.split())
        table.add_row(str(b.id), b.name, "(shared)" if b.shared else b.tenant, b.kind,
                      _count(b.documents), str(b.few_shot),
                      description[:60] + ("…" if len(description) > 60 else ""))
    ctx.out.print(table)
    return 0


def cmd_benchmark_upload(args: argparse.Namespace, ctx: Context) -> int:
    if not os.path.exists(args.file):
        raise OgaiError("bad_file", f"cannot read {args.file}: no such file")
    if not os.path.isfile(args.file):
        raise OgaiError("bad_file", f"{args.file} is not a file; upload a .jsonl file")
    benchmark = ctx.client().upload_benchmark(
        args.file, name=args.name, kind=args.kind, tenant=args.tenant,
        description=args.description or "", prompt_template=_template(args.prompt),
        target_template=_template(args.target), choices_template=_template(args.choices),
        text_field=args.text_field or "", few_shot=args.few_shot or 0,
        metrics=args.metric or None)
    if args.json:
        _print_json(ctx, benchmark.raw)
        return 0
    shots = f", {benchmark.few_shot}-shot" if benchmark.few_shot else ""
    ctx.out.print(Text.assemble("benchmark ", (str(benchmark.id), "bold"),
                                f" uploaded: {benchmark.name} ({benchmark.kind}) in "
                                f"{benchmark.tenant}, {_count(benchmark.documents)} documents"
                                f"{shots}"))
    _print_preview(ctx, benchmark)
    return 0


def cmd_benchmark_show(args: argparse.Namespace, ctx: Context) -> int:
    benchmark = _find_benchmark(ctx.client(), args.benchmark, args.tenant)
    if args.json:
        _print_json(ctx, benchmark.raw)
        return 0
    ctx.out.print(Text.assemble((f"benchmark {benchmark.id}", "bold"),
                                f"  {benchmark.name}  ({benchmark.kind}) ",
                                "shared" if benchmark.shared else f"in {benchmark.tenant}"))
    if benchmark.description:
        ctx.out.print(f"  {benchmark.description}")
    rows: list[tuple[str, str | Text]] = [("documents", _count(benchmark.documents)),
                                          ("few-shot", str(benchmark.few_shot)),
                                          ("metrics", ", ".join(benchmark.metrics) or "-")]
    for key, value in (("prompt", benchmark.prompt_template),
                       ("target", benchmark.target_template),
                       ("choices", benchmark.choices_template),
                       ("text field", benchmark.text_field)):
        if value:
            rows.append((key, repr(value)))
    ctx.out.print(_details(rows))
    ctx.out.print()
    _print_preview(ctx, benchmark)
    return 0


# -- evaluation ---------------------------------------------------------------------------------

def _template(text: str | None) -> str:
    """A template as typed in a shell, where a newline is written \\n (and a tab \\t)."""
    return (text or "").replace("\\n", "\n").replace("\\t", "\t")


def _benchmark_refs(values: list[str]) -> list[str]:
    return [ref.strip() for value in values for ref in value.split(",") if ref.strip()]


def _results_table(run: EvaluationRun) -> Table:
    table = _table("results")
    for column in ("BENCHMARK", "METRIC", "VALUE", "± STDERR", "SAMPLES"):
        table.add_column(column, justify="left" if column in {"BENCHMARK", "METRIC"}
                         else "right")
    for result in run.results:
        table.add_row(result.benchmark, result.metric, _score(result.value),
                      _score(result.stderr), _count(result.samples))
    return table


def _requests_line(run: EvaluationRun) -> str:
    if not run.total_requests:
        return ""
    return (f"{_count(run.total_requests)} requests, {_count(run.cached_requests)} answered "
            "from the cache of earlier runs")


def _evaluation_summary(run: EvaluationRun) -> str:
    target = "its deployment's endpoint" if run.target == "endpoint" else "its weights"
    limit = f", at most {run.limit} documents each" if run.limit else ""
    return f"{run.version_label} on {', '.join(run.benchmark_names)} ({target}{limit})"


def cmd_eval_run(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    version = client.find_version(args.version, tenant=args.tenant)
    deployment = client.find_deployment(args.deployment, tenant=args.tenant or version.tenant) \
        if args.deployment else None
    run = client.start_evaluation(version.id, _benchmark_refs(args.benchmark),
                                  tenant=args.tenant or version.tenant, queue=args.queue,
                                  name=args.name or "", limit=args.limit,
                                  deployment=deployment.id if deployment else None,
                                  gpus=args.gpus or 0)
    if args.quiet:
        ctx.out.print(str(run.id))
    else:
        ctx.out.print(Text.assemble("evaluation run ", (str(run.id), "bold"),
                                    f" started: {_evaluation_summary(run)}, job {run.job}, ",
                                    _state(run.state),
                                    f" ({run.reason})" if run.reason else ""))
    if not args.follow:
        return 0
    label = f"evaluation run {run.id}"
    run = _follow_run(ctx, lambda: client.evaluation_run(run.id), label,
                      interval=args.interval, on_poll=lambda run: None)
    if run.state != "succeeded":
        raise _ended_badly(label, run)
    ctx.out.print(_results_table(run))
    if _requests_line(run):
        ctx.note(_requests_line(run))
    return 0


def _scores_line(run: EvaluationRun) -> str:
    first: dict[str, str] = {}
    for result in run.results:
        first.setdefault(result.benchmark, f"{result.benchmark} {result.metric} "
                                           f"{result.value:.3f}")
    return ", ".join(first.values()) or "-"


def cmd_eval_list(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    model = None
    if args.model:
        found = client.find_model(args.model, tenant=args.tenant)
        if found is None:
            raise OgaiError("not_found", f"model {args.model} not found (or not visible to "
                            "you)")
        model = found.id
    runs = client.evaluation_runs(tenant=args.tenant, model=model)
    if args.json:
        _print_json(ctx, [run.raw for run in runs])
        return 0
    if not runs:
        ctx.note("no evaluation runs; start one with `ogai eval run MODEL --benchmark B`")
        return 0
    table = _table()
    for column in ("ID", "VERSION", "BENCHMARKS", "TARGET", "STATE", "SCORES", "AGE"):
        table.add_column(column, justify="right" if column == "ID" else "left",
                         overflow="fold")
    now = datetime.now(UTC)
    for run in runs:
        state = Text.assemble(_state(run.state), f" ({run.reason})"
                              if run.reason and not run.is_final else "")
        table.add_row(str(run.id), run.version_label, ", ".join(run.benchmark_names),
                      run.target, state, _scores_line(run), _age(run.created_at, now))
    ctx.out.print(table)
    return 0


def cmd_eval_show(args: argparse.Namespace, ctx: Context) -> int:
    with _about("evaluation run", args.id):
        run = ctx.client().evaluation_run(args.id)
    if args.json:
        _print_json(ctx, run.raw)
        return 0
    out = ctx.out
    out.print(Text.assemble((f"evaluation run {run.id}", "bold"),
                            f"  {run.name}  " if run.name else "  ", _state(run.state)))
    if run.reason and run.state != "succeeded":
        out.print(f"  reason: {run.reason}")
    if run.message:
        out.print(Text(f"  message: {run.message}", style="red"))
    rows: list[tuple[str, str | Text]] = [
        ("tenant", run.tenant),
        ("version", f"{run.version_label} (version {run.version})"),
        ("target", f"deployment {run.deployment}" if run.target == "endpoint"
         else "its weights"),
        ("benchmarks", ", ".join(f"{b.get('name')} ({b.get('kind')})" for b in run.benchmarks)),
        ("limit", f"{run.limit} documents per benchmark" if run.limit else "every document"),
        ("requests", _requests_line(run) or "-"),
        ("job", f"{run.job} (`ogai job logs {run.job}`)" if run.job else "-"),
        ("started", f"{_when(run.created_at)} by {run.created_by or '-'}"),
        ("finished", _when(run.finished_at)),
    ]
    out.print(_details(rows))
    if run.results:
        out.print()
        out.print(_results_table(run))
    return 0


def cmd_eval_samples(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    with _about("evaluation run", args.id):
        run = client.evaluation_run(args.id)
    chosen = [b for b in run.benchmarks
              if str(b.get("id")) == args.benchmark or b.get("name") == args.benchmark]
    if not chosen:
        raise OgaiError("not_found", f"evaluation run {run.id} did not evaluate benchmark "
                        f"{args.benchmark} (it evaluated {', '.join(run.benchmark_names)})")
    page = client.evaluation_samples(run.id, benchmark=int(chosen[0]["id"]),
                                     offset=args.offset, limit=args.limit)
    if args.json:
        _print_json(ctx, {"count": page.count, "offset": page.offset,
                          "results": [vars(sample) for sample in page.results]})
        return 0
    if not page.results:
        ctx.note(f"no samples from {args.offset} on ({_count(page.count)} in all)")
        return 0
    for sample in page.results:
        verdict = {True: ("right", "green"), False: ("wrong", "bold red"),
                   None: ("", "")}[sample.correct]
        scores = "  ".join(f"{k} {v:.4g}" if isinstance(v, int | float) else f"{k} {v}"
                           for k, v in sample.scores.items())
        ctx.out.print(Text.assemble((f"#{sample.index}", "bold"), "  ", verdict,
                                    (f"  {scores}" if scores else "", "dim")))
        ctx.out.print(Text(sample.prompt))
        if sample.target:
            ctx.out.print(Text.assemble(("expected: ", "bold"), sample.target))
        if sample.output:
            ctx.out.print(Text.assemble(("answer:   ", "bold"), sample.output))
        ctx.out.print()
    last = page.offset + len(page.results)
    more = f"; --offset {last} for more" if last < page.count else ""
    ctx.note(f"samples {page.offset} to {last - 1} of {_count(page.count)}{more}")
    return 0


def cmd_eval_leaderboard(args: argparse.Namespace, ctx: Context) -> int:
    rows = ctx.client().leaderboard(tenant=args.tenant)
    if args.json:
        _print_json(ctx, [vars(row) for row in rows])
        return 0
    if not rows:
        ctx.note("no scores yet: `ogai eval run MODEL --benchmark B -f`")
        return 0
    columns = sorted({(benchmark, metric) for row in rows
                      for benchmark, metrics in row.scores.items() for metric in metrics})
    table = _table()
    table.add_column("VERSION")
    for benchmark, metric in columns:
        # Named as the benchmarks and metrics are (lower case), not as the other headers.
        table.add_column(f"{benchmark} {metric}", justify="right")
    limited = False
    for row in rows:
        cells = []
        for benchmark, metric in columns:
            cell = _score(row.scores.get(benchmark, {}).get(metric))
            documents = row.limited_documents(benchmark)
            if documents is not None and cell != "-":
                cell, limited = f"{cell} ({documents} docs, limit)", True
            cells.append(cell)
        table.add_row(row.label, *cells)
    ctx.out.print(table)
    if limited:
        ctx.note("scores marked 'limit' are over fewer documents than their benchmark holds: "
                 "compare them only with runs on as many")
    return 0


def cmd_eval_cancel(args: argparse.Namespace, ctx: Context) -> int:
    with _about("evaluation run", args.id):
        run = ctx.client().cancel_evaluation_run(args.id)
    ctx.out.print(Text.assemble(f"evaluation run {run.id} ", _state(run.state),
                                f" ({run.reason})" if run.reason else ""))
    return 0


# -- deployments --------------------------------------------------------------------------------

def _endpoint(client: OgaiClient) -> str:
    return f"{client.url}{GATEWAY}/"


def _resources(d: Deployment) -> str:
    gpus = f"{d.gpus_per_replica} GPU{' ' + d.gpu_model if d.gpu_model else ''}"
    return (f"{d.replicas} x ({gpus}, {d.cpu_per_replica:g} CPU, "
            f"{_memory(d.memory_mib_per_replica)})" if d.memory_mib_per_replica
            else f"{d.replicas} x {gpus}")


def _ready_count(d: Deployment) -> str:
    return f"{d.ready_replicas}/{d.replicas}"


def _idle(d: Deployment) -> str:
    return f"{d.idle_timeout_s} s" if d.idle_timeout_s else "never"


def _pool_member(value: str) -> tuple[str, str]:
    name, sep, version = value.partition("=")
    if not sep or not name or not version:
        raise argparse.ArgumentTypeError(f"give NAME=MODEL[:vN], not {value!r}")
    return name, version


def cmd_deploy_create(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    version = client.find_version(args.version, tenant=args.tenant)
    tenant = args.tenant or version.tenant
    pool = {name: client.find_version(member, tenant=tenant).id
            for name, member in args.pool or []}
    deployment = client.create_deployment(
        args.name, version.id, tenant=tenant, queue=args.queue,
        runtime=args.runtime, replicas=args.replicas, gpus_per_replica=args.gpus,
        gpu_model=args.gpu_model, cpu_per_replica=args.cpu,
        memory_mib_per_replica=args.memory_mib, idle_timeout_s=args.idle_timeout,
        pool=pool or None, pool_memory_mib=args.pool_memory_mib, max_loras=args.max_loras)
    if args.json and not args.wait:
        _print_json(ctx, deployment.raw)
        return 0
    if not args.json:
        ctx.out.print(Text.assemble(
            "deployment ", (deployment.name, "bold"), f" created: {deployment.version_label} "
            f"on {deployment.runtime}, {_resources(deployment)} in {deployment.tenant}/"
            f"{deployment.queue}, ", _state(deployment.state)))
    if args.wait:
        deployment = _wait_ready(ctx, client, deployment, interval=args.interval,
                                 timeout=args.timeout)
        if args.json:
            _print_json(ctx, deployment.raw)
            return 0
    if not args.json:
        _print_call_hint(ctx, client, deployment)
    return 0


def _print_call_hint(ctx: Context, client: OgaiClient, deployment: Deployment) -> None:
    ctx.out.print(f"call it as model {deployment.name!r} at {_endpoint(client)} with your API "
                  f"token, e.g. `ogai chat {deployment.name} \"Hello\"`")


def _progress(deployment: Deployment) -> str:
    """"starting, 0/1 replicas ready — waiting: 2 CPU cores asked, 1 free on node local (...)"."""
    line = f"{deployment.state}, {_ready_count(deployment)} replicas ready"
    return line + (f" — {deployment.waiting_reason}" if deployment.waiting_reason else "")


def _wait_ready(ctx: Context, client: OgaiClient, deployment: Deployment, *, interval: float,
                timeout: float | None) -> Deployment:
    """Poll until every replica is ready; a deployment that failed or was stopped (or the
    timeout) is an error."""
    label = f"deployment {deployment.name}"
    seen: tuple[str, int, str] | None = None
    waited = 0.0
    while True:
        if (deployment.state, deployment.ready_replicas, deployment.waiting_reason) != seen:
            seen = (deployment.state, deployment.ready_replicas, deployment.waiting_reason)
            ctx.note(f"{label}: {_progress(deployment)}")
        if deployment.state == "ready":
            return deployment
        if deployment.state in {"failed", "stopped"}:
            why = "; ".join(f"replica {r.index}: {r.message}" for r in deployment.replica_set
                            if r.message) or "no reason given"
            raise OgaiError(deployment.state, f"{label} {deployment.state}: {why}")
        if timeout is not None and waited >= timeout:
            why = f" — {deployment.waiting_reason}" if deployment.waiting_reason else \
                f"; `ogai deploy show {deployment.name}` says why"
            raise OgaiError("timeout", f"{label} is still {deployment.state} after "
                            f"{timeout:g} s ({_ready_count(deployment)} replicas ready){why}")
        cli._pause(interval)
        waited += interval
        deployment = client.deployment(deployment.id)


def cmd_deploy_list(args: argparse.Namespace, ctx: Context) -> int:
    deployments = ctx.client().deployments(tenant=args.tenant)
    if args.json:
        _print_json(ctx, [d.raw for d in deployments])
        return 0
    if not deployments:
        ctx.note("no deployments; `ogai deploy create NAME --version MODEL` makes one")
        return 0
    several_tenants = len({d.tenant for d in deployments}) > 1
    table = _table()
    for column in ("NAME", *(["TENANT"] if several_tenants else []), "VERSION", "RUNTIME",
                   "STATE", "READY", "GPUS", "IDLE TIMEOUT", "LAST REQUEST", "AGE"):
        table.add_column(column, justify="right" if column in {"READY", "GPUS"} else "left",
                         overflow="fold")
    now = datetime.now(UTC)
    for d in deployments:
        table.add_row(d.name, *([d.tenant] if several_tenants else []), d.version_label,
                      d.runtime, _state(d.state), _ready_count(d),
                      f"{d.replicas}x{d.gpus_per_replica}", _idle(d),
                      _age(d.last_request_at, now) if d.last_request_at else "-",
                      _age(d.created_at, now))
    ctx.out.print(table)
    return 0


def _stats_table(stats: list[DeploymentStat], minutes: int) -> Table:
    table = _table(f"requests, the last {minutes} minutes")
    for column in ("MINUTE", "REQUESTS", "ERRORS", "PROMPT TOKENS", "COMPLETION TOKENS",
                   "P50 MS", "P99 MS"):
        table.add_column(column, justify="left" if column == "MINUTE" else "right")
    for row in stats:
        table.add_row(row.minute.astimezone().strftime("%H:%M") if row.minute else "-",
                      _count(row.requests), _count(row.errors), _count(row.prompt_tokens),
                      _count(row.completion_tokens),
                      "-" if row.latency_ms_p50 is None else f"{row.latency_ms_p50:.0f}",
                      "-" if row.latency_ms_p99 is None else f"{row.latency_ms_p99:.0f}")
    return table


def cmd_deploy_show(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    deployment = client.find_deployment(args.name, tenant=args.tenant)
    stats = [row for row in client.deployment_stats(deployment.id, minutes=args.minutes)
             if row.requests]
    if args.json:
        _print_json(ctx, {"deployment": deployment.raw, "stats": [vars(s) for s in stats]})
        return 0
    out = ctx.out
    d = deployment
    out.print(Text.assemble((f"deployment {d.name}", "bold"), f"  {d.version_label}  ",
                            _state(d.state)))
    rows: list[tuple[str, str | Text]] = [
        ("tenant / queue", f"{d.tenant} / {d.queue}"),
        ("runtime", d.runtime),
        ("replicas", f"{_resources(d)}; {_ready_count(d)} ready"),
        *([("scheduler", d.waiting_reason)] if d.waiting_reason else []),
        ("scale to zero", f"after {d.idle_timeout_s} s without requests"
         + (" (scaled to zero now)" if d.scaled_to_zero else "") if d.idle_timeout_s
         else "never"),
        ("endpoint", f"{_endpoint(client)} model {d.name!r}"),
        ("last request", _when(d.last_request_at)),
        ("created", f"{_when(d.created_at)} by {d.created_by or '-'}"),
    ]
    out.print(_details(rows))
    if d.replica_set:
        out.print()
        admin = any(r.upstream for r in d.replica_set)
        table = _table("replicas")
        for column in ("#", "JOB", "JOB STATE", "READY", "SINCE", "MESSAGE",
                       *(["UPSTREAM"] if admin else [])):
            table.add_column(column, overflow="fold")
        for r in d.replica_set:
            ready = Text("failed", style="bold red") if r.failed else \
                Text("yes", style="green") if r.ready else Text("no", style="yellow")
            table.add_row(str(r.index), str(r.job or "-"), _state(r.job_state or "-"), ready,
                          _when(r.ready_since), r.waiting_reason or r.message,
                          *([r.upstream or "-"] if admin else []))
        out.print(table)
    if d.pool:
        out.print()
        table = _table("models in this pool")
        for column in ("NAME", "KIND", "VERSION", "HELD BY"):
            table.add_column(column, overflow="fold")
        for member in d.pool:
            held = ", ".join(f"replica {index}" for index in member.get("held_by") or [])
            table.add_row(member.get("name", ""), member.get("kind", ""),
                          member.get("version_label", ""), held or "-")
        out.print(table)
    out.print()
    if stats:
        out.print(_stats_table(stats, args.minutes))
    else:
        ctx.note(f"no requests in the last {args.minutes} minutes")
    return 0


def cmd_deploy_pool(args: argparse.Namespace, ctx: Context) -> int:
    """Add a model to a pool (`NAME=MODEL[:vN]`) or remove one (`NAME`)."""
    client = ctx.client()
    deployment = client.find_deployment(args.name, tenant=args.tenant)
    if args.action == "add":
        member, version = args.member
        found = client.find_version(version, tenant=deployment.tenant)
        deployment = client.add_to_pool(deployment.id, member, found.id)
        done = f"serves {member} ({found.label})"
    else:
        member = args.member[0]
        deployment = client.remove_from_pool(deployment.id, member)
        done = f"no longer serves {member}"
    ctx.out.print(Text.assemble(f"pool {deployment.name} {done}; its running replicas start "
                                "again, ", _state(deployment.state)))
    return 0


def _pool_change(value: str) -> tuple[str, ...]:
    name, sep, version = value.partition("=")
    return (name, version) if sep else (name,)


def _deployment_action(action: str) -> Callable[[argparse.Namespace, Context], int]:
    def handler(args: argparse.Namespace, ctx: Context) -> int:
        client = ctx.client()
        deployment = client.find_deployment(args.name, tenant=args.tenant)
        if action == "delete":
            client.delete_deployment(deployment.id)
            ctx.out.print(f"deployment {deployment.name} deleted")
            return 0
        if action == "scale":
            before = deployment.replicas
            deployment = client.scale_deployment(deployment.id, args.replicas)
            ctx.out.print(Text.assemble(f"deployment {deployment.name}: {deployment.replicas} "
                                        f"replicas (was {before}), ", _state(deployment.state)))
        elif action == "stop":
            deployment = client.stop_deployment(deployment.id)
            ctx.out.print(Text.assemble(f"deployment {deployment.name} ",
                                        _state(deployment.state),
                                        f": its replicas' jobs are cancelled; `ogai deploy "
                                        f"start {deployment.name}` starts it again"))
            return 0
        else:
            deployment = client.start_deployment(deployment.id)
            ctx.out.print(Text.assemble(f"deployment {deployment.name} ",
                                        _state(deployment.state)))
        if args.wait:
            _wait_ready(ctx, client, deployment, interval=args.interval, timeout=args.timeout)
            _print_call_hint(ctx, client, deployment)
        return 0

    return handler


# -- chat ---------------------------------------------------------------------------------------

# An answer's length unless --max-tokens says otherwise, as in the playground: a small model
# that never says it is done would otherwise write until its context is full (a minute on a CPU).
CHAT_MAX_TOKENS = 256


def _answer(ctx: Context, client: OgaiClient, args: argparse.Namespace,
            messages: list[dict]) -> str:
    """Stream one answer to stdout as it arrives; returns it whole."""
    out = ctx.out.file
    parts: list[str] = []
    try:
        for piece in client.chat_stream(args.model, messages, temperature=args.temperature,
                                        max_tokens=args.max_tokens):
            out.write(piece)
            out.flush()
            parts.append(piece)
    except OgaiError as exc:
        if parts:  # end the half-written answer's line before the error's
            out.write("\n")
            out.flush()
        if exc.code == "model_not_found":
            raise OgaiError(exc.code, f"{exc.message.rstrip('.')}; `ogai deploy list` shows "
                            "your deployments", status=exc.status) from None
        raise
    out.write("\n")
    out.flush()
    return "".join(parts)


def cmd_chat(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    if args.prompt is not None:
        prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
        _answer(ctx, client, args, [*messages, {"role": "user", "content": prompt}])
        return 0
    # A conversation: each line of stdin is the next turn, the answers so far its context.
    interactive = sys.stdin.isatty()
    if interactive:
        ctx.note(f"chatting with {args.model}; Ctrl-D ends")
    while True:
        try:
            line = input("> ") if interactive else sys.stdin.readline()
        except EOFError:
            line = ""
        if not line:
            if interactive:
                ctx.err.print()
            return 0
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        messages.append({"role": "assistant", "content": _answer(ctx, client, args, messages)})


# -- the parser ---------------------------------------------------------------------------------

def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 2:
        raise argparse.ArgumentTypeError("give 0 to 2")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("give a positive number of seconds")
    return value


def add_commands(commands: Any, command: Callable[..., Any]) -> None:
    """Add `model`, `benchmark`, `eval`, `deploy` and `chat` to the CLI's parser."""
    _run_id = cli._id_of("run")
    _evaluation_id = cli._id_of("evaluation run")

    def group(name: str, help: str, description: str) -> Any:
        parser = commands.add_parser(name, help=help, description=description)
        parser.set_defaults(handler=None, group=parser)
        return parser.add_subparsers(dest=f"{name}_command", metavar="ACTION")

    def json_flag(parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print the API's JSON")

    def tenant(parser: Any, text: str = "the tenant (needed when you are in several)") -> None:
        parser.add_argument("--tenant", help=text)

    def interval(parser: Any, default: float) -> None:
        parser.add_argument("--interval", type=_interval, default=default,
                            help=f"seconds between polls (default {default:g})")

    models = group("model", "the model registry: import, register and browse models",
                   "Models and their versions. A version is MODEL:vN, or MODEL for its newest "
                   "ready one.")
    m_list = command(models, "list", cmd_model_list, "list your models")
    tenant(m_list, "only this tenant's models")
    json_flag(m_list)
    m_show = command(models, "show", cmd_model_show,
                     "a model's versions and the lineage of its newest, or one version "
                     "(MODEL:vN) with its files and lineage")
    m_show.add_argument("model", metavar="MODEL[:vN]")
    tenant(m_show)
    json_flag(m_show)
    m_import = command(models, "import", cmd_model_import,
                       "import a Hugging Face folder or a .gguf file below an import root of "
                       "the server as a new version")
    m_import.add_argument("path", metavar="PATH", help="the folder or file, as the server "
                          "sees it")
    m_import.add_argument("--name", required=True, metavar="MODEL",
                          help="the model (created when missing)")
    m_import.add_argument("--allow-pickle", action="store_true",
                          help="import .bin/.pt weights too (they run code when loaded; the "
                          "operator must allow them as well)")
    m_import.add_argument("--description", help="the model's, when it is created")
    m_import.add_argument("--follow", "-f", action="store_true",
                          help="follow it until it ends; exit 0 only if it succeeded")
    tenant(m_import)
    interval(m_import, 1.0)
    json_flag(m_import)
    m_register = command(models, "register", cmd_model_register,
                         "register a finished training run's output as a new version")
    m_register.add_argument("--run", required=True, type=_run_id, metavar="ID",
                            help="the training run's id (see `ogai train list`)")
    m_register.add_argument("--name", required=True, metavar="MODEL",
                            help="the model (created when missing)")
    m_register.add_argument("--description", help="the model's, when it is created")
    json_flag(m_register)
    m_delete = command(models, "delete", cmd_model_delete, "delete a version")
    m_delete.add_argument("version", metavar="MODEL:vN")
    tenant(m_delete)

    benchmarks = group("benchmark", "benchmark suites to evaluate models on", "Benchmarks.")
    b_list = command(benchmarks, "list", cmd_benchmark_list,
                     "your tenants' benchmarks and the shared ones")
    tenant(b_list, "only this tenant's (and the shared) benchmarks")
    b_list.add_argument("--kind", choices=BENCHMARK_KINDS)
    json_flag(b_list)
    b_show = command(benchmarks, "show", cmd_benchmark_show,
                     "a benchmark and its first document as the model is asked it")
    b_show.add_argument("benchmark", metavar="NAME|ID")
    tenant(b_show)
    json_flag(b_show)
    upload = command(benchmarks, "upload", cmd_benchmark_upload,
                     "upload a JSONL file (one document a line) as a benchmark")
    upload.add_argument("file", metavar="FILE")
    upload.add_argument("--name", required=True)
    upload.add_argument("--kind", required=True, choices=BENCHMARK_KINDS)
    upload.add_argument("--prompt", metavar="TEMPLATE",
                        help="Jinja over a document's fields; \\n is a newline (default "
                        "'Question: {{question}}\\nAnswer:')")
    upload.add_argument("--target", metavar="TEMPLATE",
                        help="the expected answer; multiple_choice: the right choice's index "
                        "(default '{{answer}}')")
    upload.add_argument("--choices", metavar="TEMPLATE",
                        help="multiple_choice: the list of choices (default '{{choices}}')")
    upload.add_argument("--text-field", metavar="FIELD",
                        help="perplexity: the field with the text (default 'text')")
    upload.add_argument("--few-shot", type=_positive_int, metavar="K",
                        help="examples shown before each question (default 0)")
    upload.add_argument("--metric", action="append", metavar="METRIC",
                        help="only this metric (repeat; default: every metric of the kind)")
    upload.add_argument("--description")
    tenant(upload)
    json_flag(upload)

    evals = group("eval", "evaluate model versions on benchmarks",
                  "Evaluation runs (lm-eval in a job) and the leaderboard.")
    e_run = command(evals, "run", cmd_eval_run, "score a version on benchmarks in a job")
    e_run.add_argument("version", metavar="MODEL[:vN]")
    e_run.add_argument("--benchmark", "-b", action="append", required=True, metavar="NAME",
                       help="a benchmark (repeat, or separate with commas)")
    e_run.add_argument("--queue", help="the queue (default 'default')")
    e_run.add_argument("--limit", type=_positive_int, metavar="N",
                       help="at most N documents per benchmark")
    e_run.add_argument("--deployment", metavar="NAME",
                       help="score this deployment's endpoint instead of the weights")
    e_run.add_argument("--gpus", type=_positive_int, help="GPUs for the job (default 0)")
    e_run.add_argument("--name", help="the run's name")
    e_run.add_argument("--follow", "-f", action="store_true",
                       help="follow it until it ends and print its results; exit 0 only if "
                       "it succeeded")
    e_run.add_argument("--quiet", "-q", action="store_true", help="print only the run id")
    tenant(e_run)
    interval(e_run, 2.0)
    e_list = command(evals, "list", cmd_eval_list, "list evaluation runs, newest first")
    tenant(e_list, "only this tenant's runs")
    e_list.add_argument("--model", metavar="MODEL", help="only runs of this model's versions")
    json_flag(e_list)
    e_show = command(evals, "show", cmd_eval_show, "an evaluation run and its results")
    e_show.add_argument("id", type=_evaluation_id, metavar="ID")
    json_flag(e_show)
    e_samples = command(evals, "samples", cmd_eval_samples,
                        "the documents of a run as the model answered them")
    e_samples.add_argument("id", type=_evaluation_id, metavar="ID")
    e_samples.add_argument("--benchmark", "-b", required=True, metavar="NAME|ID")
    e_samples.add_argument("--offset", type=_positive_int, default=0,
                           help="the first document (default 0)")
    e_samples.add_argument("--limit", "-n", type=_positive_int, default=10,
                           help="how many (default 10)")
    json_flag(e_samples)
    e_board = command(evals, "leaderboard", cmd_eval_leaderboard,
                      "each version's newest scores, per benchmark and metric")
    tenant(e_board)
    json_flag(e_board)
    e_cancel = command(evals, "cancel", cmd_eval_cancel, "cancel an evaluation run")
    e_cancel.add_argument("id", type=_evaluation_id, metavar="ID")

    deploys = group("deploy", "serve model versions behind the OpenAI-compatible gateway",
                    "Deployments: call them at <url>/v1/ by name with your API token.")

    def wait_options(parser: Any) -> None:
        parser.add_argument("--wait", "-w", action="store_true",
                            help="wait until every replica is ready")
        parser.add_argument("--timeout", type=_seconds, metavar="S",
                            help="with -w, give up after S seconds (default: never)")
        interval(parser, 2.0)

    d_create = command(deploys, "create", cmd_deploy_create, "deploy a version")
    d_create.add_argument("name", metavar="NAME", help="the model name clients send to /v1/")
    d_create.add_argument("--version", required=True, metavar="MODEL[:vN]")
    d_create.add_argument("--queue", help="the queue (default 'default')")
    d_create.add_argument("--runtime", choices=RUNTIMES, help="default transformers")
    d_create.add_argument("--replicas", type=_positive_int, help="default 1")
    d_create.add_argument("--gpus", type=_positive_int, help="GPUs per replica (default 0)")
    d_create.add_argument("--gpu-model", help="pin a GPU model, e.g. H100")
    d_create.add_argument("--cpu", type=_cores, help="CPU cores per replica (default 2)")
    d_create.add_argument("--memory", dest="memory_mib", type=_memory_arg, metavar="QUANTITY",
                          help="memory per replica, e.g. 8Gi (default 4Gi)")
    d_create.add_argument("--idle-timeout", type=_positive_int, metavar="S",
                          help="scale to zero after S seconds without requests; the next "
                          "request starts it again (default: never)")
    d_create.add_argument("--pool", action="append", type=_pool_member,
                          metavar="NAME=MODEL[:vN]",
                          help="make it a pool: each replica also serves this version as NAME "
                          "(a LoRA adapter of --version, or a whole model); repeat for more")
    d_create.add_argument("--pool-memory", dest="pool_memory_mib", type=_memory_arg,
                          metavar="QUANTITY", help="a pool's budget for whole models per "
                          "replica; the least recently used is evicted (default: half its "
                          "memory)")
    d_create.add_argument("--max-loras", type=_positive_int, metavar="N",
                          help="LoRA adapters a pool's replica holds at once (default 8)")
    tenant(d_create)
    wait_options(d_create)
    json_flag(d_create)
    d_list = command(deploys, "list", cmd_deploy_list, "list deployments")
    tenant(d_list, "only this tenant's deployments")
    json_flag(d_list)
    d_show = command(deploys, "show", cmd_deploy_show,
                     "a deployment: its replicas and its requests per minute")
    d_show.add_argument("name", metavar="NAME")
    d_show.add_argument("--minutes", type=_positive_int, default=60,
                        help="requests of the last this many minutes (default 60)")
    tenant(d_show)
    json_flag(d_show)
    d_scale = command(deploys, "scale", _deployment_action("scale"),
                      "change the number of replicas")
    d_scale.add_argument("name", metavar="NAME")
    d_scale.add_argument("replicas", type=_positive_int, metavar="N")
    tenant(d_scale)
    wait_options(d_scale)
    d_pool = command(deploys, "pool", cmd_deploy_pool,
                     "add a model to a pool (NAME=MODEL[:vN]) or remove one (NAME)")
    d_pool.add_argument("action", choices=("add", "remove"))
    d_pool.add_argument("name", metavar="DEPLOYMENT")
    d_pool.add_argument("member", type=_pool_change, metavar="NAME[=MODEL[:vN]]")
    tenant(d_pool)
    d_stop = command(deploys, "stop", _deployment_action("stop"),
                     "stop every replica (the deployment stays)")
    d_stop.add_argument("name", metavar="NAME")
    tenant(d_stop)
    d_start = command(deploys, "start", _deployment_action("start"), "start it again")
    d_start.add_argument("name", metavar="NAME")
    tenant(d_start)
    wait_options(d_start)
    d_delete = command(deploys, "delete", _deployment_action("delete"),
                       "stop and delete a deployment")
    d_delete.add_argument("name", metavar="NAME")
    tenant(d_delete)

    chat = command(commands, "chat", cmd_chat,
                   "chat with a deployed model through the gateway, answers streamed as they "
                   "arrive; without PROMPT each line of stdin is the next turn (Ctrl-D ends)")
    chat.add_argument("model", metavar="MODEL", help="the deployment's name")
    chat.add_argument("prompt", metavar="PROMPT", nargs="?",
                      help="one question (- reads it from stdin)")
    chat.add_argument("--system", "-s", metavar="TEXT", help="a system prompt")
    chat.add_argument("--temperature", "-t", type=_temperature, help="0 to 2")
    chat.add_argument("--max-tokens", "-n", type=_positive_int, metavar="N",
                      default=CHAT_MAX_TOKENS,
                      help=f"the most tokens of each answer (default {CHAT_MAX_TOKENS})")
