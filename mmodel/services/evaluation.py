"""Benchmarks (uploaded JSONL checked the way lm-eval will read it) and evaluation runs: one job
running `python -m mmodel.runners.evaluate` on a version's weights or on a deployment of it.
An embedding model (a sentence-transformers folder) is scored on retrieval benchmarks only, and
a text-generation model on every other kind."""

import json
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from aistation.choices import JobState
from aistation.labels import OWNER_LABEL
from aistation.models import Job, Queue
from aistation.services.job_tokens import job_token_bind, job_token_new
from aistation.services.jobs import job_cancel, job_submit
from infra_os.access import is_platform_admin, require_role
from infra_os.choices import WRITE_ROLES
from infra_os.models import Tenant
from infra_os.services.audit import audit_record
from mmodel import benchmarks as checks
from mmodel import storage
from mmodel.choices import BenchmarkKind, EvaluationTarget, Runtime, VersionStatus
from mmodel.models import Benchmark, Deployment, DeploymentReplica, EvaluationRun, ModelVersion
from mmodel.models.registry import model_name
from mmodel.runners.lm_tasks import write_tasks
from mmodel.runners.retrieval import retrieval_tasks
from mmodel.runtimes import is_embedding_model
from mmodel.services.adapters import is_adapter, single_task_prompt
from mmodel.services.deployments import deployment_api_key
from podsys.drivers.base import ROLE_LABEL, ROLE_MODEL_CLIENT
from ylink.choices import FINAL_RUN_STATES
from ylink.services.launch import runner_command

MAX_GPUS = 8
BUILTIN_DIR = Path(__file__).resolve().parent.parent / "benchmarks_builtin"
# Kinds scored by log-likelihood: a server must return the prompt's token log-probabilities.
LOGLIKELIHOOD_KINDS = {BenchmarkKind.MULTIPLE_CHOICE, BenchmarkKind.PERPLEXITY}


# -- files ---------------------------------------------------------------------------------------

def benchmark_file(tenant: Tenant | None, name: str, content_hash: str) -> Path:
    owner = tenant.name if tenant is not None else "shared"
    return storage.data_root() / "mmodel" / "benchmarks" / owner / \
        f"{name}-{content_hash[:12]}.jsonl"


def evaluation_folder(run: EvaluationRun) -> Path:
    # Named by id and creation time, so a database started afresh never reuses a folder.
    return storage.data_root() / "mmodel" / "evaluations" / \
        f"{run.pk}-{run.created_at:%Y%m%dT%H%M%S%f}"


def cache_prefix(version: ModelVersion, target: str, runtime: str = "") -> str | None:
    """Where lm-eval keeps the answers to this version's requests. Its keys are the requests
    alone, so the file is the model's: one per version content (and per server runtime, whose
    numbers differ from the weights'), and per tenant — it holds the tenant's prompts, and
    lm-eval reads it back with pickle."""
    if not version.content_hash:
        return None
    which = "weights" if target == EvaluationTarget.WEIGHTS else f"endpoint-{runtime}"
    return str(storage.data_root() / "mmodel" / "lm-eval-cache" / str(version.model.tenant_id)
               / version.content_hash / which / "requests")


# -- benchmarks ----------------------------------------------------------------------------------

def _as_lines(data: Any) -> bytes | Iterable[bytes]:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytes | bytearray):
        return bytes(data)
    if hasattr(data, "seek"):
        data.seek(0)
    return data  # a file in binary mode iterates by line


@transaction.atomic
def benchmark_create(*, actor, tenant: Tenant | None, name: str, kind: str,
                     data: bytes | IO[bytes], prompt_template: str = "",
                     target_template: str = "", choices_template: str = "",
                     text_field: str = "", few_shot: int = 0, description: str = "",
                     metrics: list[str] | None = None,
                     generation_kwargs: dict | None = None) -> Benchmark:
    """A benchmark of `tenant`, or shared with every tenant (`tenant=None`: platform admins and
    the platform itself). Every document is checked before anything is stored."""
    if tenant is None:
        if actor is not None and not is_platform_admin(actor):
            raise ValidationError({"tenant": "Only a platform admin can share a benchmark "
                                   "with every tenant."})
    else:
        require_role(actor, tenant, WRITE_ROLES)
    try:
        model_name(name)
    except ValidationError as error:
        raise ValidationError({"name": error.messages}) from None
    if Benchmark.objects.filter(tenant__isnull=True, name=name).exists():
        raise ValidationError({"name": f"A shared benchmark is named {name!r}; choose another "
                               "name."})
    if tenant is not None and Benchmark.objects.filter(tenant=tenant, name=name).exists():
        raise ValidationError({"name": f"{tenant.name} already has a benchmark {name!r}."})
    if tenant is None and Benchmark.objects.filter(name=name).exists():
        raise ValidationError({"name": f"A tenant has a benchmark {name!r}; a shared one "
                               "would hide it on the leaderboard."})
    try:
        definition = checks.Definition.build(
            kind=kind, prompt_template=prompt_template, target_template=target_template,
            choices_template=choices_template, text_field=text_field, few_shot=few_shot,
            metrics=metrics, generation_kwargs=generation_kwargs)
    except checks.BenchmarkError as error:
        raise ValidationError({error.field: error.message}) from None
    staging = storage.data_root() / "mmodel" / "benchmarks" / ".staging" / \
        f"{uuid.uuid4().hex}.jsonl"
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        with staging.open("wb") as out:
            found = checks.scan(definition, _as_lines(data), out)
        path = benchmark_file(tenant, name, found.content_hash)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging.replace(path)
    except checks.BenchmarkError as error:
        raise ValidationError({error.field: error.message}) from None
    finally:
        staging.unlink(missing_ok=True)
    benchmark = Benchmark.objects.create(
        tenant=tenant, name=name, description=description, kind=kind,
        data_path=storage.relative(path), documents=found.documents,
        content_hash=found.content_hash, prompt_template=definition.prompt_template,
        target_template=definition.target_template,
        choices_template=definition.choices_template, text_field=definition.text_field,
        few_shot=definition.few_shot, metrics=definition.metrics,
        generation_kwargs=definition.generation_kwargs,
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
    audit_record(actor=actor, action="benchmark.create", obj=benchmark, tenant=tenant,
                 changes={"kind": kind, "documents": found.documents,
                          "content_hash": found.content_hash})
    return benchmark


def benchmark_definition(benchmark: Benchmark) -> checks.Definition:
    return checks.Definition(
        kind=benchmark.kind, prompt_template=benchmark.prompt_template,
        target_template=benchmark.target_template,
        choices_template=benchmark.choices_template, text_field=benchmark.text_field,
        few_shot=benchmark.few_shot, metrics=list(benchmark.metrics),
        generation_kwargs=dict(benchmark.generation_kwargs))


def benchmark_preview(benchmark: Benchmark, count: int = checks.PREVIEW_DOCUMENTS) -> list[dict]:
    """The first documents as the model is asked them."""
    path = storage.absolute(benchmark.data_path)
    if not path.exists():
        return []
    with path.open("rb") as stream:
        return checks.preview(benchmark_definition(benchmark), stream, count)


def _python_docs_text() -> bytes:
    """Perplexity text from Python's own documentation topics, as shipped with Python."""
    from pydoc_data.topics import topics

    lines = []
    for key in sorted(topics)[:40]:
        # Prose only: code and grammar blocks are indented, lists start with a bullet.
        prose = [" ".join(p.split()) for p in topics[key].split("\n\n")
                 if len(p) > 200 and "::=" not in p and not p.startswith((" ", "*", "-"))]
        if prose:
            lines.append(json.dumps({"topic": key, "text": prose[0][:1500]}))
    return ("\n".join(lines) + "\n").encode()


def benchmarks_seed_builtin() -> list[Benchmark]:
    """Create the benchmarks shipped with the platform (shared with every tenant) that do not
    exist yet; the shipped ones, new or not."""
    manifest = json.loads((BUILTIN_DIR / "manifest.json").read_text())
    seeded = []
    for entry in manifest:
        existing = Benchmark.objects.filter(tenant__isnull=True, name=entry["name"]).first()
        if existing is not None:
            seeded.append(existing)
            continue
        data = _python_docs_text() if entry.get("source") == "pydoc_data" else \
            (BUILTIN_DIR / entry["file"]).read_bytes()
        seeded.append(benchmark_create(
            actor=None, tenant=None, name=entry["name"], kind=entry["kind"], data=data,
            description=entry.get("description", ""),
            prompt_template=entry.get("prompt_template", ""),
            target_template=entry.get("target_template", ""),
            choices_template=entry.get("choices_template", ""),
            text_field=entry.get("text_field", ""), few_shot=entry.get("few_shot", 0),
            generation_kwargs=entry.get("generation_kwargs")))
    return seeded


# -- evaluation runs -----------------------------------------------------------------------------

def _check_benchmarks(tenant: Tenant, benchmarks: list[Benchmark]) -> list[Benchmark]:
    if not benchmarks:
        raise ValidationError({"benchmarks": "Choose at least one benchmark."})
    unique = list({b.pk: b for b in benchmarks}.values())
    for benchmark in unique:
        if benchmark.tenant_id not in (None, tenant.pk):
            raise ValidationError({"benchmarks": f"No benchmark {benchmark.pk} in "
                                   f"{tenant.name}."})
        if not storage.absolute(benchmark.data_path).exists():
            raise ValidationError({"benchmarks": f"The data of {benchmark.name} is missing."})
    return unique


def _check_kinds(version: ModelVersion, embedding: bool, benchmarks: list[Benchmark]) -> None:
    """An embedding model is scored on retrieval benchmarks, a text-generation one on the
    others."""
    retrieval = sorted(b.name for b in benchmarks if b.kind == BenchmarkKind.RETRIEVAL)
    text = sorted(b.name for b in benchmarks if b.kind != BenchmarkKind.RETRIEVAL)
    if embedding and text:
        raise ValidationError({"benchmarks": (
            f"{version.label} is an embedding model (a sentence-transformers folder): it is "
            f"scored on retrieval benchmarks only, not on {', '.join(text)}, which score "
            "generated text.")})
    if not embedding and retrieval:
        raise ValidationError({"benchmarks": (
            f"{', '.join(retrieval)}: a retrieval benchmark scores an embedding model (a "
            f"sentence-transformers folder, modules.json); {version.label} generates text. "
            "Evaluate it on the other benchmarks.")})


def _check_deployment(deployment: Deployment, version: ModelVersion, tenant: Tenant) -> None:
    if deployment.tenant_id != tenant.pk:
        raise ValidationError({"deployment": f"No deployment {deployment.pk} in {tenant.name}."})
    if deployment.version_id != version.pk:
        raise ValidationError({"deployment": f"{deployment.name} serves another version; "
                               f"choose a deployment of {version.label}."})


def _ready_replica(deployment: Deployment) -> DeploymentReplica:
    replica = deployment.replica_set.filter(ready=True, job__state=JobState.RUNNING).exclude(
        upstream="").order_by("index").first()
    if replica is None:
        raise ValidationError({"deployment": f"{deployment.name} has no ready replica; start "
                               "it (or wait until it is ready) first."})
    return replica


def _embeddings_endpoint(deployment: Deployment, version: ModelVersion,
                         tenant: Tenant) -> dict:
    """mmodel.runners.retrieval's `openai-embeddings` arguments for a ready replica of the
    deployment (its key reaches the runner as OPENAI_API_KEY, as for lm-eval)."""
    _check_deployment(deployment, version, tenant)
    replica = _ready_replica(deployment)
    return {"model": replica.served_model, "base_url": f"{replica.upstream}/v1/embeddings",
            "max_retries": 3, "timeout": 300}


def _embedding_model(version: ModelVersion, folder: Path, tenant: Tenant,
                     deployment: Deployment | None, gpus: int) -> tuple[str, str, dict, int]:
    """How mmodel.runners.retrieval reaches an embedding model: (target, model type, model
    arguments, the job's memory in MiB)."""
    if deployment is not None:
        return (EvaluationTarget.ENDPOINT, "openai-embeddings",
                _embeddings_endpoint(deployment, version, tenant), 2048)
    if gpus > 1:
        raise ValidationError({"gpus": f"{version.label} is an embedding model, encoded on one "
                               "GPU: use 0 or 1."})
    # The weights in float32, once more while loading, and the vectors.
    return (EvaluationTarget.WEIGHTS, "sentence-transformers",
            {"folder": str(folder), "device": "cuda" if gpus else "cpu"},
            2048 + 3 * (version.bytes or 0) // 2**20)


def _endpoint_model(deployment: Deployment, version: ModelVersion, tenant: Tenant,
                    benchmarks: list[Benchmark]) -> tuple[dict, str]:
    """lm-eval's `local-completions` arguments for a ready replica of the deployment."""
    _check_deployment(deployment, version, tenant)
    if deployment.runtime == Runtime.TRANSFORMERS:
        scored = sorted(b.name for b in benchmarks if b.kind in LOGLIKELIHOOD_KINDS)
        if scored:
            raise ValidationError({"deployment": (
                f"{', '.join(scored)} score by log-likelihood, which needs the server to "
                "return the prompt's token log-probabilities; `transformers serve` ignores "
                "`echo` and `logprobs` on /v1/completions. Evaluate those on the version's "
                "weights, or on a vLLM deployment.")})
    replica = _ready_replica(deployment)
    args: dict[str, Any] = {
        "model": replica.served_model, "base_url": f"{replica.upstream}/v1/completions",
        "tokenizer_backend": "huggingface", "tokenizer": str(storage.artifact_folder(version)),
        "num_concurrent": 1, "max_retries": 3, "timeout": 300,
    }
    if deployment.runtime == Runtime.TRANSFORMERS:
        # It takes the prompt as text only (no token ids), one per request.
        args["tokenized_requests"] = False
    return args, deployment.runtime


def _launch(*, actor, run: EvaluationRun, spec: dict, queue: Queue, gpus: int,
            memory_mib: int, reads: list[str], endpoint_key: str = "") -> Job:
    """Like ylink's run_launch, with MModel's run folder: the spec on disk, the job token (and
    the key of the deployment it scores, which lm-eval's local-completions sends from
    OPENAI_API_KEY) in the job's secret environment, the job. It sees its run folder and its
    request cache (read-write) and the folders in `reads`, nothing else of the data
    directory."""
    folder = storage.absolute(run.folder)
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    cache = Path(spec["cache"]).parent if spec.get("cache") else None
    # A link is the cache's home on a Slurm cluster's shared path: the driver's to make.
    if cache is not None and not cache.is_symlink():
        cache.mkdir(parents=True, exist_ok=True)
    secret = job_token_new()
    job = job_submit(
        actor=actor, tenant=run.tenant, queue=queue, name=f"evaluation-{run.pk}",
        command=runner_command("mmodel.runners.evaluate", str(spec_path),
                               local=queue.cluster.driver == "local"),
        env={"OGAI_URL": settings.OGAI_INTERNAL_URL, "HF_HUB_OFFLINE": "1",
             "TOKENIZERS_PARALLELISM": "false",
             **({} if gpus else {"CUDA_VISIBLE_DEVICES": ""})},
        secret_env={"OGAI_RUN_TOKEN": secret,
                    **({"OPENAI_API_KEY": endpoint_key} if endpoint_key else {})},
        gpus_per_replica=gpus, cpu_per_replica=1.0, memory_mib_per_replica=memory_mib,
        max_restarts=1, mounts=storage.data_mounts(reads, write=[folder, cache]),
        # It calls a deployment's replica itself: the replica's pods must let it in.
        labels={OWNER_LABEL: f"evaluation run {run.pk}" + (f" {run.name}" if run.name else ""),
                **({ROLE_LABEL: ROLE_MODEL_CLIENT} if endpoint_key else {})},
    )
    job_token_bind(job=job, secret=secret)
    run.job = job
    run.save(update_fields=["job", "updated_at"])
    return job


@transaction.atomic
def evaluation_start(*, actor, tenant: Tenant, version: ModelVersion,
                     benchmarks: list[Benchmark], queue: Queue,
                     deployment: Deployment | None = None, limit: int | None = None,
                     gpus: int = 0, name: str = "") -> EvaluationRun:
    require_role(actor, tenant, WRITE_ROLES)
    if version.model.tenant_id != tenant.pk:
        raise ValidationError({"version": f"No version {version.pk} in {tenant.name}."})
    if version.status != VersionStatus.READY:
        raise ValidationError({"version": f"{version.label} is {version.status}; only a ready "
                               "version can be evaluated."})
    folder = storage.artifact_folder(version)
    embedding = is_embedding_model(folder)
    # A LoRA adapter is scored on its base model's weights with the adapter applied.
    base = storage.artifact_folder(version.base_version) \
        if is_adapter(version) and version.base_version is not None else None
    if not embedding and not ((base or folder) / "config.json").exists():
        raise ValidationError({"version": f"The files of {version.label} are missing."})
    if queue.tenant_id != tenant.pk:
        raise ValidationError({"queue": f"Queue {queue.name} is not a queue of {tenant.name}."})
    if limit is not None and limit < 1:
        raise ValidationError({"limit": "At least 1 document per benchmark (or no limit)."})
    if not 0 <= gpus <= MAX_GPUS:
        raise ValidationError({"gpus": f"Use 0 to {MAX_GPUS} GPUs."})
    if deployment is not None and gpus:
        raise ValidationError({"gpus": "An endpoint evaluation runs no model itself: the "
                               "deployment's replicas hold the GPUs."})
    chosen = _check_benchmarks(tenant, list(benchmarks))
    _check_kinds(version, embedding, chosen)
    runtime = ""
    if embedding:
        target, model_type, model_args, memory_mib = _embedding_model(
            version, folder, tenant, deployment, gpus)
    elif deployment is not None:
        model_args, runtime = _endpoint_model(deployment, version, tenant, chosen)
        target, model_type, memory_mib = EvaluationTarget.ENDPOINT, "local-completions", 2048
    else:
        model_args = {"pretrained": str(base or folder), "device": "cuda" if gpus else "cpu",
                      "dtype": "auto" if gpus else "float32"}
        if base is not None:
            # lm-eval passes no task ids: a multi-task prompt is scored as its first task's.
            model_args["peft"] = str(single_task_prompt(version))
        if gpus > 1:
            model_args["parallelize"] = True  # the layers spread over the GPUs
        target, model_type = EvaluationTarget.WEIGHTS, "hf"
        # The weights in float32, once more while loading, and lm-eval itself.
        memory_mib = 2048 + 3 * (version.bytes or 0) // 2**20
    run = EvaluationRun.objects.create(
        tenant=tenant, created_by=actor, name=(name or version.label)[:100], version=version,
        target=target, deployment=deployment, limit=limit)
    run.benchmarks.set(chosen)
    run_folder = evaluation_folder(run)
    compiled = [{
        "id": b.pk, "kind": b.kind, "data_file": str(storage.absolute(b.data_path)),
        "prompt_template": b.prompt_template, "target_template": b.target_template,
        "choices_template": b.choices_template, "text_field": b.text_field,
        "few_shot": b.few_shot, "metrics": b.metrics, "generation_kwargs": b.generation_kwargs,
    } for b in chosen]
    if embedding:
        run_folder.mkdir(parents=True, exist_ok=True)
        run.spec = {"run": run.pk, "model": model_type, "model_args": model_args,
                    "tasks": retrieval_tasks(compiled), "limit": limit}
    else:
        run.spec = {
            "run": run.pk, "model": model_type, "model_args": model_args,
            "tasks_dir": str(run_folder / "tasks"),
            "tasks": write_tasks(compiled, run_folder / "tasks"),
            "cache": cache_prefix(version, target, runtime), "limit": limit, "batch_size": 1,
            "bootstrap_iters": 1000,
        }
    run.folder = storage.relative(run_folder)
    run.save(update_fields=["spec", "folder", "updated_at"])
    # The weights (or the tokenizer an endpoint is scored with) and the benchmarks' files.
    reads = [str(folder), *([str(base)] if base is not None else []),
             *([model_args["peft"]] if model_args.get("peft") not in (None, str(folder))
               else []),
             *(str(storage.absolute(b.data_path).parent) for b in chosen)]
    _launch(actor=actor, run=run, spec=run.spec, queue=queue, gpus=gpus,
            memory_mib=memory_mib, reads=reads,
            endpoint_key=deployment_api_key(deployment) if deployment is not None else "")
    audit_record(actor=actor, action="evaluation_run.start", obj=run, tenant=tenant,
                 changes={"version": version.label, "target": target,
                          "benchmarks": [b.name for b in chosen], "limit": limit})
    return run


@transaction.atomic
def evaluation_cancel(*, actor, run: EvaluationRun) -> EvaluationRun:
    require_role(actor, run.tenant, WRITE_ROLES)
    if run.state in FINAL_RUN_STATES or run.job is None:
        raise ValidationError({"state": f"Evaluation run {run.pk} already {run.state}."})
    job_cancel(actor=actor, job=run.job)
    audit_record(actor=actor, action="evaluation_run.cancel", obj=run, tenant=run.tenant)
    return run
