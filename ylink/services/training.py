"""Training runs (tokenizer, pretraining, SFT, LoRA, prompt tuning): the spec checked and sized
against the GPUs asked for before anything starts, then one job; progress comes from the runner.
A run may wait for another (`after_run`, a recipe's next stage): it gets its job once that one
succeeds."""

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Min
from django.http import Http404

from aistation.models import Queue
from aistation.services.jobs import job_cancel
from infra_os.access import require_role
from infra_os.choices import WRITE_ROLES
from infra_os.services.audit import audit_record
from podsys.models import Node
from ylink import storage
from ylink.choices import FINAL_RUN_STATES, DatasetKind, TrainingKind, VersionFormat
from ylink.models import DatasetVersion, TrainingRun
from ylink.presets import ADAPTER_KINDS, FitError, SpecError, check_fits, validate_train_spec
from ylink.services.launch import run_launch

MAX_REPLICAS = 1024


def _check_inputs(kind: str, version: DatasetVersion, base_run: TrainingRun | None,
                  tenant_id: int) -> None:
    if kind == TrainingKind.PRETRAIN and version.format != VersionFormat.TOKENS:
        raise ValidationError({"dataset_version": (
            f"Pretraining reads token shards; {version} holds documents. Run a pipeline "
            "ending with a tokenize step first.")})
    if kind != TrainingKind.PRETRAIN and version.format != VersionFormat.JSONL:
        raise ValidationError({"dataset_version": f"A {kind} run reads documents; {version} "
                               "holds token shards."})
    if kind in (TrainingKind.SFT, *ADAPTER_KINDS):
        if version.dataset.kind != DatasetKind.INSTRUCTION:
            raise ValidationError({"dataset_version": (
                f"Fine-tuning needs an instruction dataset (prompt and response); "
                f"{version.dataset.name} is a text corpus.")})
        if base_run is None:
            raise ValidationError({"base_run": "Name the training run whose model to "
                                   "fine-tune."})
    if base_run is not None and (
            base_run.tenant_id != tenant_id or base_run.artifact != "model"
            or not base_run.succeeded):
        raise ValidationError({"base_run": f"Training run {base_run.pk} has no finished model "
                               "of this tenant."})


def _gpu_memory_mib(queue: Queue, gpu_model: str) -> int | None:
    """The smallest GPU memory among the nodes that could run the job; None when the cluster
    does not say. A cluster without such GPUs is refused here, in those words."""
    nodes = Node.objects.filter(cluster=queue.cluster, gpus__gt=0)
    if gpu_model:
        nodes = nodes.filter(gpu_model=gpu_model)
    if not nodes.exists():
        model = f"{gpu_model} " if gpu_model else ""
        raise ValidationError({"resources.gpus": f"No node of cluster {queue.cluster.name} has "
                               f"{model}GPUs."})
    return nodes.aggregate(least=Min("gpu_memory_mib"))["least"] or None


def build_spec(*, kind: str, version: DatasetVersion, base_run: TrainingRun | None,
               output_dir: str, sections: dict) -> dict:
    spec = {
        "kind": kind,
        "data": {"path": str(storage.absolute(version.path)), "format": version.format},
        "output_dir": output_dir,
        **{key: value for key, value in sections.items() if value is not None},
    }
    if base_run is not None:
        spec["base_model_path"] = base_run.output_path
    if kind == TrainingKind.PRETRAIN:
        model = dict(spec.get("model") or {})
        model.setdefault("vocab_size", version.stats.get("vocab_size"))
        model.setdefault("context_length", version.stats.get("seq_len"))
        spec["model"] = model
    try:
        return validate_train_spec(spec)
    except SpecError as error:
        raise ValidationError(error.errors) from None


@transaction.atomic
def training_run_start(*, actor, dataset_version: DatasetVersion, queue: Queue, kind: str,
                       name: str = "", base_run: TrainingRun | None = None,
                       model: dict | None = None, tokenizer: dict | None = None,
                       lora: dict | None = None, training: dict | None = None,
                       prompt_tuning: dict | None = None,
                       gpus: int = 0, gpu_model: str = "", replicas: int = 1, cpu: float = 1.0,
                       memory_mib: int = 4096, max_restarts: int = 3,
                       after_run: TrainingRun | None = None) -> TrainingRun:
    """Start a run now, or (with `after_run`) create it waiting: its job is submitted when
    that run succeeds (`training_runs_after`)."""
    tenant = dataset_version.dataset.tenant
    require_role(actor, tenant, WRITE_ROLES)
    if kind not in TrainingKind.values:
        raise ValidationError({"kind": f"Unknown kind {kind!r}; use one of "
                               f"{', '.join(TrainingKind.values)}."})
    if queue.tenant_id != tenant.pk:
        raise ValidationError({"queue": f"Queue {queue.name} is not a queue of {tenant.name}."})
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValidationError({"replicas": f"Use 1 to {MAX_REPLICAS} replicas."})
    if gpus > 1:
        raise ValidationError({"resources.gpus": (
            f"Each replica is one training process on one GPU: ask for replicas: {gpus * replicas} "
            "with gpus: 1 (they become DDP or FSDP ranks).")})
    if kind == TrainingKind.TOKENIZER and (replicas > 1 or gpus):
        raise ValidationError({"resources.gpus" if gpus else "replicas":
                               "A tokenizer trains in one process on CPUs."})
    _check_inputs(kind, dataset_version, base_run, tenant.pk)
    sections = {"model": model, "tokenizer": tokenizer, "lora": lora, "training": training,
                "prompt_tuning": prompt_tuning}
    # Validated once before the run exists (a bad spec leaves nothing behind), then again with
    # the real output folder.
    spec = build_spec(kind=kind, version=dataset_version, base_run=base_run,
                      output_dir="/pending", sections=sections)
    if kind != TrainingKind.TOKENIZER:
        model_spec = spec.get("model") or (base_run.spec.get("model") if base_run else {})
        train_spec = spec.get("training") or {}
        lora_spec = spec.get("lora") or {}
        try:
            check_fits(
                architecture=model_spec.get("architecture", "gpt2"),
                preset=model_spec.get("preset") if base_run is None else None,
                vocab_size=model_spec.get("vocab_size") or 0,
                context_length=model_spec.get("context_length"),
                kind=kind, gpus=gpus * replicas,
                gpu_memory_mib=_gpu_memory_mib(queue, gpu_model) if gpus else None,
                cpu_memory_mib=memory_mib,
                distributed=train_spec.get("distributed", "auto"),
                batch_size=train_spec.get("batch_size", 8),
                precision=train_spec.get("precision", "auto"),
                parameters=base_run.parameters if base_run else None,
                lora_r=lora_spec.get("r", 8),
                lora_target_modules=lora_spec.get("target_modules"),
                prompt_tuning=spec.get("prompt_tuning"),
            )
        except FitError as error:
            raise ValidationError({error.field: error.message}) from None
    run = TrainingRun.objects.create(
        tenant=tenant, created_by=actor, name=name or f"{dataset_version.dataset.name}-{kind}",
        kind=kind, dataset_version=dataset_version, base_run=base_run, spec={}, gpus=gpus,
        replicas=replicas, after_run=after_run,
    )
    folder = storage.run_folder("training-runs", run.pk, run.created_at)
    run.spec = build_spec(kind=kind, version=dataset_version, base_run=base_run,
                          output_dir=str(folder / "output"), sections=sections)
    run.total_steps = (run.spec.get("training") or {}).get("max_steps", 0)
    launch: dict = {"queue": queue.pk, "gpu_model": gpu_model, "cpu": cpu,
                    "memory_mib": memory_mib, "max_restarts": max_restarts}
    if after_run is not None:
        if after_run.tenant_id != tenant.pk:
            raise ValidationError({"after_run": f"No training run {after_run.pk} in "
                                   f"{tenant.name}."})
        run.pending_launch = launch
        run.folder = storage.relative(folder)
    run.save(update_fields=["spec", "total_steps", "pending_launch", "folder"])
    if after_run is None:
        _launch(actor=actor, run=run, queue=queue, gpu_model=gpu_model, cpu=cpu,
                memory_mib=memory_mib, max_restarts=max_restarts)
    audit_record(actor=actor, action="training_run.start", obj=run, tenant=tenant,
                 changes={"kind": kind, "version": str(dataset_version), "gpus": gpus,
                          "replicas": replicas})
    return run


def _launch(*, actor, run: TrainingRun, queue: Queue, gpu_model: str, cpu: float,
            memory_mib: int, max_restarts: int) -> None:
    settings = run.spec.get("prompt_tuning") or {}
    run_launch(actor=actor, run=run, kind="training-runs", module="ylink.runners.train",
               spec=run.spec, queue=queue, replicas=run.replicas, gpus=run.gpus,
               gpu_model=gpu_model, cpu=cpu, memory_mib=memory_mib, max_restarts=max_restarts,
               reads=(run.spec["data"]["path"], run.spec.get("base_model_path"),
                      settings.get("source_adapter_path")))


def training_runs_after(*, run: TrainingRun) -> list[TrainingRun]:
    """Submit the jobs of the runs that waited for `run` (it has just succeeded), as their
    creator. Called inside the transaction that records the result; a run that cannot start
    (its creator's role is gone, its queue removed) says why instead of failing that one."""
    started = []
    for waiting in TrainingRun.objects.select_for_update().filter(after_run=run, job=None,
                                                                  succeeded=False):
        launch: dict = waiting.pending_launch or {}
        try:
            with transaction.atomic():
                actor = waiting.created_by
                if actor is None:
                    raise ValidationError("its creator is gone")
                require_role(actor, waiting.tenant, WRITE_ROLES)
                queue = Queue.objects.get(pk=int(launch.get("queue") or 0),
                                          tenant=waiting.tenant)
                _launch(actor=actor, run=waiting, queue=queue,
                        gpu_model=launch.get("gpu_model", ""), cpu=launch.get("cpu", 1.0),
                        memory_mib=launch.get("memory_mib", 4096),
                        max_restarts=launch.get("max_restarts", 3))
                audit_record(actor=actor, action="training_run.start", obj=waiting,
                             tenant=waiting.tenant,
                             changes={"kind": waiting.kind, "after_run": run.pk})
        except (ValidationError, PermissionDenied, Http404, Queue.DoesNotExist) as error:
            why = "; ".join(getattr(error, "messages", None) or [str(error)])
            waiting.message = f"not started after training run {run.pk}: {why}"[:2000]
            waiting.save(update_fields=["message", "updated_at"])
            continue
        started.append(waiting)
    return started


@transaction.atomic
def training_run_cancel(*, actor, run: TrainingRun) -> TrainingRun:
    require_role(actor, run.tenant, WRITE_ROLES)
    if run.waiting_for is not None and run.state not in FINAL_RUN_STATES:
        # No job yet: it will never get one.
        run.message = f"cancelled by {actor.get_username()} before it started"
        run.save(update_fields=["message", "updated_at"])
        return run
    if run.state in FINAL_RUN_STATES or run.job is None:
        raise ValidationError({"state": f"Training run {run.pk} already {run.state}."})
    job_cancel(actor=actor, job=run.job)
    return run


@transaction.atomic
def multitask_prompt_tuning_start(*, actor, source_version: DatasetVersion,
                                  target_version: DatasetVersion, base_run: TrainingRun,
                                  queue: Queue, name: str = "",
                                  prompt_tuning: dict | None = None,
                                  source_training: dict | None = None,
                                  target_training: dict | None = None,
                                  target_init: str = "average_source_tasks",
                                  source_task: str | None = None,
                                  **resources) -> tuple[TrainingRun, TrainingRun]:
    """The two-stage recipe of multi-task prompt tuning as one preset: stage 1 trains a shared
    prompt and per-task factors on the source tasks (the source dataset's task column); stage
    2, a run that waits for it, starts the target task's prompt from stage 1's adapter
    (`target_init`: average_source_tasks, exact_source_task with `source_task`, or
    only_source_shared) and trains it on the target dataset. Both share `prompt_tuning`
    (num_virtual_tokens, num_ranks, init and init_text for stage 1)."""
    shared = dict(prompt_tuning or {})
    name = name or f"{target_version.dataset.name}-mpt"
    source = training_run_start(
        actor=actor, dataset_version=source_version, queue=queue, name=f"{name}-source"[:100],
        kind=TrainingKind.MULTITASK_PROMPT_TUNING, base_run=base_run, prompt_tuning=shared,
        training=source_training, **resources)
    target_settings = {key: value for key, value in shared.items()
                       if key in ("num_virtual_tokens", "num_ranks")}
    target_settings |= {"init": target_init, "source_adapter_path": source.spec["output_dir"],
                        **({"source_task": source_task} if source_task else {})}
    target = training_run_start(
        actor=actor, dataset_version=target_version, queue=queue, name=f"{name}-target"[:100],
        kind=TrainingKind.MULTITASK_PROMPT_TUNING, base_run=base_run,
        prompt_tuning=target_settings, training=target_training or source_training,
        after_run=source, **resources)
    return source, target
