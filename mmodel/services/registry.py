"""The model registry: models, imports of model folders, versions registered from training
runs, deleting versions. A version's files are checked (nothing that runs code, weights that
fit their config, a tokenizer that loads) and copied under DATA_DIR before it is ready."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from infra_os.access import require_role
from infra_os.choices import WRITE_ROLES
from infra_os.models import Tenant
from infra_os.services.audit import audit_record
from mmodel import importing, storage
from mmodel.choices import ImportState, VersionSource, VersionStatus, WeightsFormat
from mmodel.importing import Description, ImportRefused
from mmodel.models import Model, ModelImport, ModelVersion
from ylink import storage as ylink_storage
from ylink.choices import TrainingKind
from ylink.models import TrainingRun

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _check_name(name: str) -> None:
    probe = Model(name=name)
    probe.full_clean(exclude=["tenant", "created_by", "description"],
                     validate_constraints=False)


def _model_named(*, actor, tenant: Tenant, name: str, description: str) -> Model:
    """The tenant's model of that name, created when missing (row locked either way, so
    version numbers are handed out one at a time)."""
    found = Model.objects.select_for_update().filter(tenant=tenant, name=name).first()
    if found is not None:
        return found
    return model_create(actor=actor, tenant=tenant, name=name, description=description)


@transaction.atomic
def model_create(*, actor, tenant: Tenant, name: str, description: str = "") -> Model:
    require_role(actor, tenant, WRITE_ROLES)
    _check_name(name)
    if Model.objects.filter(tenant=tenant, name=name).exists():
        raise ValidationError({"name": f"{tenant.name} already has a model {name!r}."})
    model = Model.objects.create(tenant=tenant, name=name, description=description,
                                 created_by=actor)
    audit_record(actor=actor, action="model.create", obj=model, tenant=tenant,
                 changes={"name": name})
    return model


def _new_version(model: Model, **fields) -> ModelVersion:
    """The model's next version (the caller holds the model's row lock)."""
    number = (model.versions.aggregate(n=Max("number"))["n"] or 0) + 1
    return ModelVersion.objects.create(model=model, number=number, **fields)


def _refused(field: str, error: ImportRefused) -> ValidationError:
    return ValidationError({field: str(error)})


def _quick_checks(source_path: str, allow_pickle: bool) -> importing.Source:
    real = importing.locate(source_path, list(settings.OGAI_MODEL_IMPORT_ROOTS))
    return importing.inspect(real, roots=list(settings.OGAI_MODEL_IMPORT_ROOTS),
                             allow_pickle=allow_pickle,
                             pickle_allowed=settings.OGAI_MODEL_ALLOW_PICKLE)


@transaction.atomic
def model_import_create(*, actor, tenant: Tenant, model_name: str, source_path: str,
                        allow_pickle: bool = False, description: str = "") -> ModelImport:
    """The import and its version (importing), once the quick checks pass; nothing runs it
    (`model_import_start` enqueues it, the import_model command runs it at once)."""
    require_role(actor, tenant, WRITE_ROLES)
    _check_name(model_name)
    try:
        source = _quick_checks(source_path, allow_pickle)
    except ImportRefused as error:
        raise _refused("source_path", error) from None
    model = _model_named(actor=actor, tenant=tenant, name=model_name, description=description)
    version = _new_version(model, source=VersionSource.IMPORT, source_path=source_path,
                           format=source.format, created_by=actor)
    job = ModelImport.objects.create(tenant=tenant, model=model, version=version,
                                     source_path=source_path, allow_pickle=allow_pickle,
                                     created_by=actor)
    audit_record(actor=actor, action="model.import", obj=job, tenant=tenant,
                 changes={"model": model.name, "version": version.number,
                          "source_path": source_path, "allow_pickle": allow_pickle})
    return job


def _enqueue_import(import_id: int) -> None:
    from mmodel.tasks.registry import import_model

    import_model.delay(import_id=import_id)


@transaction.atomic
def model_import_start(*, actor, tenant: Tenant, model_name: str, source_path: str,
                       allow_pickle: bool = False, description: str = "") -> ModelImport:
    """Check the folder at once (refusals name `source_path`); copy and check it in a task."""
    job = model_import_create(actor=actor, tenant=tenant, model_name=model_name,
                              source_path=source_path, allow_pickle=allow_pickle,
                              description=description)
    transaction.on_commit(lambda: _enqueue_import(job.pk))
    return job


def _fill(version: ModelVersion, description: Description, folder: Path) -> None:
    version.architecture = description.architecture[:100]
    version.model_type = description.model_type[:64]
    version.parameters = description.parameters
    version.context_length = description.context_length
    version.dtype = description.dtype[:16]
    version.tokenizer = description.tokenizer[:100]
    version.files = storage.file_list(folder)
    version.bytes = sum(entry["bytes"] for entry in version.files)
    version.content_hash = storage.content_hash(folder)


def _place(version: ModelVersion, staging: Path) -> None:
    """Move the checked files to the version's own folder (last, inside the caller's
    transaction: a failure before it leaves no version folder)."""
    final = storage.version_folder(tenant=version.model.tenant.name, model_id=version.model_id,
                                   model=version.model.name, number=version.number,
                                   content_hash=version.content_hash)
    for path in storage.version_files(staging):
        # Readable by model servers running as another user (save_pretrained writes 0600).
        path.chmod(0o644)
    final.parent.mkdir(parents=True, exist_ok=True)
    # A folder left there by a crash between an earlier move and its commit is no version.
    storage.remove(final)
    staging.rename(final)
    version.artifact_path = storage.relative(final)


def _import_failed(job: ModelImport, reason: str) -> ModelImport:
    with transaction.atomic():
        job.state, job.message, job.finished_at = ImportState.FAILED, reason, timezone.now()
        job.save(update_fields=["state", "message", "finished_at", "updated_at"])
        if job.version is not None:
            job.version.status, job.version.message = VersionStatus.FAILED, reason
            job.version.save(update_fields=["status", "message", "updated_at"])
    return job


def model_import_run(*, import_id: int, progress: Progress = _quiet) -> ModelImport:
    """Copy, convert and check an import's files into its version's folder; the version ends
    ready or failed with the reason. Run again after a lost worker, it starts afresh."""
    with transaction.atomic():
        job = ModelImport.objects.select_for_update(of=("self",)).select_related(
            "version", "model", "model__tenant").get(pk=import_id)
        if job.state not in (ImportState.QUEUED, ImportState.RUNNING) or job.version is None:
            return job
        job.state, job.started_at = ImportState.RUNNING, timezone.now()
        job.save(update_fields=["state", "started_at", "updated_at"])
    version = job.version
    staging = storage.staging_folder()
    try:
        progress(f"checking {job.source_path}")
        source = _quick_checks(job.source_path, job.allow_pickle)
        description = importing.prepare_model(source, staging, progress)
        _fill(version, description, staging)
    except ImportRefused as error:
        storage.remove(staging)
        return _import_failed(job, str(error))
    except Exception as error:
        storage.remove(staging)
        _import_failed(job, f"The import failed unexpectedly: {error}")
        raise
    progress("recording the version")
    try:
        with transaction.atomic():
            version.status = VersionStatus.READY
            version.format = source.format
            version.message = " ".join(description.notes)
            _place(version, staging)
            version.save()
            job.state, job.finished_at = ImportState.SUCCEEDED, timezone.now()
            job.message = f"Imported as {version.label}."
            job.save(update_fields=["state", "message", "finished_at", "updated_at"])
            audit_record(actor=job.created_by, action="model.import_done", obj=version,
                         tenant=job.tenant, changes={"content_hash": version.content_hash,
                                                     "bytes": version.bytes})
    except BaseException:
        storage.remove(staging)
        raise
    return job


# Versions from training runs -------------------------------------------------------------------

def _tokenizer_present(folder: Path) -> bool:
    return any((folder / name).is_file() for name in importing.TOKENIZER_FILES)


def _copy_tokenizer(source: Path, target: Path) -> bool:
    names = [*importing.TOKENIZER_FILES, "tokenizer_config.json", "special_tokens_map.json",
             "merges.txt", "chat_template.jinja", "added_tokens.json"]
    copied = False
    for name in names:
        if (source / name).is_file() and not (target / name).exists():
            shutil.copyfile(source / name, target / name)
            copied = True
    return copied


def _complete_tokenizer(run: TrainingRun, staging: Path,
                        base: ModelVersion | None) -> list[str]:
    """A run's output without tokenizer files gets its tokenizer's: the base version's for a
    fine-tune, the token dataset's for pretraining (the runners save one beside the model;
    this covers outputs written without)."""
    if _tokenizer_present(staging):
        return []
    if base is not None and _copy_tokenizer(storage.absolute(base.artifact_path), staging):
        return [f"The run saved no tokenizer: copied {base.label}'s."]
    data = ylink_storage.absolute(run.dataset_version.path)
    if (data / "tokenizer.json").is_file():
        shutil.copyfile(data / "tokenizer.json", staging / "tokenizer.json")
        return [f"The run saved no tokenizer: copied the one of {run.dataset_version}."]
    return []


def _check_run(run: TrainingRun) -> None:
    if run.kind == TrainingKind.TOKENIZER or run.artifact == "tokenizer":
        raise ValidationError({"training_run": f"Training run {run.pk} trained a tokenizer, "
                               "not a model: there are no weights to register."})
    if not run.succeeded:
        raise ValidationError({"training_run": f"Training run {run.pk} is {run.state}: only "
                               "a finished run's model can be registered."})
    if run.artifact not in ("model", "adapter") or not run.output_path:
        raise ValidationError({"training_run": f"Training run {run.pk} reported no model."})
    if Path(run.output_path).is_symlink():
        # The job made it, and a link would have the platform read, as this run's, wherever
        # it points (another tenant's model).
        raise ValidationError({"training_run": f"The output folder of training run {run.pk} "
                               "is a link, not a folder the run wrote: it is not registered."})
    if not Path(run.output_path).is_dir():
        raise ValidationError({"training_run": f"The output folder of training run {run.pk} "
                               f"({run.output_path}) is gone."})


def _base_version(*, actor, run: TrainingRun, model_name: str) -> tuple[ModelVersion | None,
                                                                          list[str]]:
    if run.base_run is None:
        return None, []
    found = ModelVersion.objects.filter(
        training_run=run.base_run, model__tenant=run.tenant, status=VersionStatus.READY,
    ).select_related("model").order_by("-created_at").first()
    if found is not None:
        return found, []
    base = version_register_from_run(actor=actor, run=run.base_run, model_name=model_name)
    return base, [f"Its base run {run.base_run.pk} had no version: registered it first as "
                  f"{base.label}."]


def _prepare_adapter(staging: Path, base: ModelVersion) -> Description:
    base_folder = storage.absolute(base.artifact_path)
    config_path = staging / "adapter_config.json"
    if config_path.is_file():
        # Point the adapter at the base version's own copy (the run's folder is not kept).
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = str(base_folder)
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = importing.check_adapter(staging, base_folder)
    tokenizer, notes = importing.check_tokenizer(staging)
    return Description(architecture=base.architecture, model_type=base.model_type,
                       parameters=importing.parameter_count(tensors),
                       context_length=base.context_length,
                       dtype=importing.weights_dtype(tensors), tokenizer=tokenizer, notes=notes)


def _stage_run_output(run: TrainingRun, base: ModelVersion | None) -> tuple[Path, Description]:
    staging = storage.staging_folder()
    try:
        source = Path(run.output_path)
        for path in sorted(source.rglob("*")):
            name = path.relative_to(source)
            if path.is_symlink() or any(part.startswith(".") for part in name.parts):
                continue
            if path.is_dir():
                (staging / name).mkdir(parents=True, exist_ok=True)
            else:
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, staging / name)
        notes = _complete_tokenizer(run, staging, base)
        if run.artifact == "adapter":
            if base is None:
                raise ImportRefused("A LoRA adapter needs its base model, and the run names "
                                    "no base run.")
            description = _prepare_adapter(staging, base)
        else:
            checked = importing.inspect(staging, roots=[str(staging)], allow_pickle=False,
                                        pickle_allowed=False)
            description = importing.prepare_model(checked, staging, _quiet)
        description.notes = notes + description.notes
    except ImportRefused as error:
        storage.remove(staging)
        raise ValidationError({"training_run": f"The output of training run {run.pk}: "
                               f"{error}"}) from None
    except BaseException:
        storage.remove(staging)
        raise
    return staging, description


def version_register_from_run(*, actor, run: TrainingRun, model_name: str,
                              description: str = "") -> ModelVersion:
    """A finished training run's model or adapter as a new version of the tenant's model
    `model_name` (created when missing), with its lineage; a fine-tune's base run is
    registered first when it has no version. Checked and copied here, in the request."""
    require_role(actor, run.tenant, WRITE_ROLES)
    _check_name(model_name)
    _check_run(run)
    already = ModelVersion.objects.filter(training_run=run, model__tenant=run.tenant,
                                          model__name=model_name).first()
    if already is not None:
        raise ValidationError({"training_run": f"Training run {run.pk} is already registered "
                               f"as {already.label}."})
    base, notes = _base_version(actor=actor, run=run, model_name=model_name)
    staging, found = _stage_run_output(run, base)
    try:
        with transaction.atomic():
            model = _model_named(actor=actor, tenant=run.tenant, name=model_name,
                                 description=description)
            fmt = WeightsFormat.ADAPTER if run.artifact == "adapter" else WeightsFormat.SAFETENSORS
            version = _new_version(model, source=VersionSource.TRAINING, format=fmt,
                                   source_path=run.output_path, training_run=run,
                                   base_version=base, created_by=actor)
            _fill(version, found, staging)
            version.status = VersionStatus.READY
            version.message = " ".join(notes + found.notes)
            _place(version, staging)
            version.save()
            version.dataset_versions.set([run.dataset_version])
            audit_record(actor=actor, action="model.register_run", obj=version,
                         tenant=run.tenant, changes={"training_run": run.pk,
                                                     "base_version": base.pk if base else None,
                                                     "content_hash": version.content_hash})
    except BaseException:
        storage.remove(staging)
        raise
    return version


@transaction.atomic
def version_delete(*, actor, version: ModelVersion) -> None:
    """Forget a version and remove its files (after commit). Refused while a deployment uses
    it (as its version or in its pool), an evaluation scored it, another version is built on
    it, or it is still importing."""
    require_role(actor, version.model.tenant, WRITE_ROLES)
    deployments = sorted({*version.deployments.values_list("name", flat=True),
                          *version.pool_memberships.values_list("deployment__name", flat=True)})
    if deployments:
        raise ValidationError({"version": f"{version.label} is deployed as "
                               f"{', '.join(deployments)}: delete those deployments first."})
    derived = [v.label for v in version.derived_versions.select_related("model")]
    if derived:
        raise ValidationError({"version": f"{version.label} is the base of "
                               f"{', '.join(derived)}: delete those versions first."})
    if version.evaluation_runs.exists():
        raise ValidationError({"version": f"{version.label} has evaluation runs: it stays "
                               "for the leaderboard."})
    if version.status == VersionStatus.IMPORTING:
        raise ValidationError({"version": f"{version.label} is still importing."})
    folder = storage.absolute(version.artifact_path) if version.artifact_path else None
    audit_record(actor=actor, action="model_version.delete", obj=version,
                 tenant=version.model.tenant,
                 changes={"version": version.label, "content_hash": version.content_hash})
    version.delete()
    if folder is not None:
        transaction.on_commit(lambda: storage.remove(folder))
