"""Datasets and their versions: creating, uploading, recording a pipeline's output."""

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max

from infra_os.access import require_role
from infra_os.choices import WRITE_ROLES
from infra_os.models import Tenant
from infra_os.services.audit import audit_record
from ylink import storage
from ylink.choices import DatasetKind, VersionFormat
from ylink.models import Dataset, DatasetVersion, PipelineRun
from ylink.uploads import UploadError, read_upload


def max_upload_bytes() -> int:
    return settings.OGAI_DATASET_MAX_UPLOAD_MIB * 2**20


def check_upload_size(size: int | None) -> None:
    """Refuse an upload by its declared size before any of it is read."""
    if size is not None and size > max_upload_bytes():
        raise ValidationError({"file": (
            f"The file is {size / 2**20:.0f} MiB; uploads are limited to "
            f"{settings.OGAI_DATASET_MAX_UPLOAD_MIB} MiB (OGAI_DATASET_MAX_UPLOAD_MIB).")})


@transaction.atomic
def dataset_create(*, actor, tenant: Tenant, name: str, kind: str = DatasetKind.TEXT,
                   description: str = "") -> Dataset:
    require_role(actor, tenant, WRITE_ROLES)
    dataset = Dataset(tenant=tenant, name=name, kind=kind, description=description,
                      created_by=actor)
    dataset.full_clean(exclude=["tenant", "created_by"], validate_constraints=False)
    if Dataset.objects.filter(tenant=tenant, name=name).exists():
        raise ValidationError({"name": f"{tenant.name} already has a dataset {name!r}."})
    dataset.save()
    audit_record(actor=actor, action="dataset.create", obj=dataset, tenant=tenant,
                 changes={"name": name, "kind": kind})
    return dataset


def _next_number(dataset: Dataset) -> int:
    # The dataset row is locked by the caller, so two versions never get one number.
    return (dataset.versions.aggregate(n=Max("number"))["n"] or 0) + 1


def _record(*, dataset: Dataset, folder: Path, fmt: str, documents: int, size: int,
            content_hash: str, stats: dict, actor, action: str, changes: dict,
            parent: DatasetVersion | None = None, pipeline_run: PipelineRun | None = None,
            tokens: int | None = None, source: str = "") -> DatasetVersion:
    """The next version of the dataset, its audit event, then its files moved from `folder`
    to the version's own folder: the move comes last, so a failure before it leaves no
    version folder behind (the caller removes `folder`). Called inside a transaction."""
    Dataset.objects.select_for_update().get(pk=dataset.pk)
    number = _next_number(dataset)
    final = storage.version_folder(tenant=dataset.tenant.name, dataset_id=dataset.pk,
                                   dataset=dataset.name, number=number,
                                   content_hash=content_hash)
    version = DatasetVersion.objects.create(
        dataset=dataset, number=number, format=fmt, path=storage.relative(final),
        content_hash=content_hash, documents=documents, bytes=size, tokens=tokens,
        stats=stats, parent=parent, pipeline_run=pipeline_run, source=source,
        created_by=actor,
    )
    audit_record(actor=actor, action=action, obj=version, tenant=dataset.tenant,
                 changes=changes)
    final.parent.mkdir(parents=True, exist_ok=True)
    # A folder left there by a crash between an earlier move and its commit is no version.
    storage.remove(final)
    # A rename, or a copy where the folder is a Slurm run's on the cluster's shared path.
    shutil.move(folder, final)
    return version


def dataset_upload(*, actor, dataset: Dataset, upload) -> DatasetVersion:
    """A new version from an uploaded file (a Django UploadedFile or File: `name`, `size`,
    `chunks()`, `open()`), streamed to disk and checked on the way; nothing is kept when any
    check fails."""
    require_role(actor, dataset.tenant, WRITE_ROLES)
    with _staged(upload, dataset.kind) as staged, transaction.atomic():
        return _record_upload(actor=actor, dataset=dataset, staged=staged)


def dataset_create_from_upload(*, actor, tenant: Tenant, name: str, upload,
                               kind: str = DatasetKind.TEXT,
                               description: str = "") -> DatasetVersion:
    """A new dataset with the uploaded file as its first version, in one step: the file is
    read and checked first, and a dataset exists only with its version, so a refused upload
    leaves no empty dataset behind. Read outside the transaction, which a long upload would
    hold open."""
    require_role(actor, tenant, WRITE_ROLES)
    if Dataset.objects.filter(tenant=tenant, name=name).exists():
        raise ValidationError({"name": f"{tenant.name} already has a dataset {name!r}."})
    with _staged(upload, kind) as staged, transaction.atomic():
        dataset = dataset_create(actor=actor, tenant=tenant, name=name, kind=kind,
                                 description=description)
        return _record_upload(actor=actor, dataset=dataset, staged=staged)


class _Staged(NamedTuple):
    name: str
    folder: Path
    stats: Any
    digest: str


@contextlib.contextmanager
def _staged(upload, kind: str) -> Iterator[_Staged]:
    """The upload streamed into a staging folder and checked; the folder is removed unless
    its version took it."""
    check_upload_size(upload.size)
    name = Path(upload.name or "upload").name
    folder = storage.staging_folder()
    try:
        stats = read_upload(
            name=name, chunks=upload.chunks(), open_file=lambda: upload.open("rb"),
            folder=folder, dataset_kind=kind, max_bytes=max_upload_bytes(),
            max_files=settings.OGAI_DATASET_MAX_FILES,
        )
        files = storage.document_files(folder)
        yield _Staged(name, folder, stats, storage.content_hash(files, folder))
    except UploadError as error:
        storage.remove(folder)
        raise ValidationError({"file": str(error)}) from None
    except BaseException:
        storage.remove(folder)
        raise


def _record_upload(*, actor, dataset: Dataset, staged: _Staged) -> DatasetVersion:
    stats = staged.stats
    return _record(
        dataset=dataset, folder=staged.folder, fmt=VersionFormat.JSONL,
        documents=stats.documents, size=stats.bytes, content_hash=staged.digest,
        stats=stats.summary(), actor=actor, source=staged.name, action="dataset.upload",
        changes={"file": staged.name, "documents": stats.documents, "bytes": stats.bytes},
    )


def dataset_version_from_run(*, run: PipelineRun, output: dict) -> DatasetVersion:
    """Record a finished pipeline's output folder as the next version of its input's dataset,
    moved beside the dataset's other versions (so nothing of the run touches it again).
    Document outputs are scanned here (counts and hash the platform vouches for); token
    outputs are described by their meta.json."""
    folder = storage.absolute(run.folder) / "output"
    # The job made them: a link would have the platform take, as this run's output, wherever
    # it points (another tenant's dataset). (The run folder itself may be the platform's own
    # link, to a Slurm cluster's shared path; links below the output are never followed.)
    for made in (folder, folder / "meta.json"):
        if made.is_symlink():
            raise ValidationError({"output": f"The output of pipeline run {run.pk} is not "
                                   f"its own: {made.name} is a link. Nothing was recorded."})
    if output.get("format") == VersionFormat.TOKENS:
        fmt = VersionFormat.TOKENS
        digest = storage.content_hash(storage.token_files(folder), folder)
        meta = json.loads((folder / "meta.json").read_text())
        documents, tokens = int(meta.get("documents") or 0), int(meta.get("tokens") or 0)
        size = sum(path.stat().st_size for path in storage.token_files(folder))
        stats = {key: meta[key] for key in ("seq_len", "eos_id", "vocab_size", "token_size")
                 if key in meta}
        stats["tokenizer"] = (run.tokenizer_run.name if run.tokenizer_run else "bytes")
    else:
        fmt, tokens = VersionFormat.JSONL, None
        scanned, digest = storage.scan_documents(folder)
        documents, size, stats = scanned.documents, scanned.bytes, scanned.summary()
    return _record(
        dataset=run.input_version.dataset, folder=folder, fmt=fmt, documents=documents,
        size=size, content_hash=digest, stats=stats, actor=run.created_by,
        parent=run.input_version, pipeline_run=run, tokens=tokens,
        action="dataset.pipeline_output",
        changes={"pipeline_run": run.pk, "documents": documents},
    )
