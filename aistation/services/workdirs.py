"""Working folders shipped with jobs: receiving a tenant's archive, checked and kept once.

The archive is streamed to a file under the data directory while it is hashed (never held in
memory), refused past `OGAI_WORKDIR_MAX_MB`, checked member by member
(`aistation.workdir_archives`), then moved into place under its SHA-256: the same bytes of one
tenant are one Workdir, whoever sends them again. A zip (from the console) is first made into
the canonical tar, with the same checks.
"""

import hashlib
import os
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from aistation.models import Workdir
from aistation.services.workloads import workdir_archive_path
from aistation.workdir_archives import (
    BLOCK,
    ArchiveError,
    inspect_tar,
    is_zip,
    too_large,
    zip_to_tar,
)
from infra_os.access import require_role
from infra_os.choices import WRITE_ROLES
from infra_os.models import Tenant
from infra_os.services.audit import audit_record


def workdir_max_bytes() -> int:
    return settings.OGAI_WORKDIR_MAX_MB * 2**20


# What a multipart request carries besides the archive (boundaries, headers, the other
# fields): a request this much over the limit may still hold an archive within it, which the
# exact check while it is read then measures.
FORM_OVERHEAD_BYTES = 64 * 1024


def check_workdir_size(size: int | None) -> None:
    """Refuse an upload by its declared size (a whole request's) before any of it is read."""
    if size is not None and size > workdir_max_bytes() + FORM_OVERHEAD_BYTES:
        raise ValidationError({"archive": str(too_large(
            f"The upload ({size / 2**20:.1f} MiB)", workdir_max_bytes()))})


def _private_folder(path: Path) -> Path:
    # The platform's alone: jobs get the folder unpacked by their driver, never the archive.
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _staging() -> Path:
    _private_folder(Path(settings.DATA_DIR) / "workdirs")
    return _private_folder(Path(settings.DATA_DIR) / "workdirs" / ".staging")


def _staged_file(folder: Path) -> Path:
    handle, name = tempfile.mkstemp(dir=folder, suffix=".part")  # created 0600
    os.close(handle)
    return Path(name)


def _chunks(archive):
    if hasattr(archive, "chunks"):  # a Django upload or File
        yield from archive.chunks(BLOCK)
        return
    while chunk := archive.read(BLOCK):
        yield chunk


def _receive(archive, target: Path, max_bytes: int) -> tuple[str, int, bytes]:
    """Stream `archive` into `target`: its SHA-256, size and first bytes."""
    digest, size, head = hashlib.sha256(), 0, b""
    with target.open("wb") as out:
        for chunk in _chunks(archive):
            size += len(chunk)
            if size > max_bytes:
                raise too_large("The archive", max_bytes)
            if len(head) < 4:
                head += chunk[:4]
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest(), size, head


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(BLOCK):
            digest.update(chunk)
    return digest.hexdigest()


def _keep(staged: Path, tenant_id: int, sha256: str) -> None:
    """Move the checked archive into place at once: a reader sees all of it or none."""
    target = workdir_archive_path(tenant_id, sha256)
    _private_folder(target.parent)
    # Readable by all inside folders only the platform enters: on this machine sandboxes never
    # see the data directory, and on Kubernetes only the pods of a job that ships this folder
    # mount it (the file alone, by subPath) for their init container, which runs as the
    # tenant's unprivileged user.
    staged.chmod(0o644)
    os.replace(staged, target)


@transaction.atomic
def workdir_upload(*, actor, tenant: Tenant, archive, sha256: str = "") -> tuple[Workdir, bool]:
    """The tenant's Workdir of `archive` (a file-like object: a gzip tar, or a zip made into
    one), and whether it is new. `sha256`, when given, is what the sender computed of the bytes
    it sent: a different one means they changed on the way. Bad archives are a ValidationError
    on `archive` saying what is wrong; nothing of them is kept."""
    require_role(actor, tenant, WRITE_ROLES)
    max_bytes = workdir_max_bytes()
    staging = _staging()
    received = _staged_file(staging)
    converted: Path | None = None
    try:
        try:
            digest, size, head = _receive(archive, received, max_bytes)
            if sha256 and sha256.lower() != digest:
                raise ValidationError({"sha256": (
                    f"The archive's SHA-256 is {digest}, not {sha256}: it changed on the way; "
                    "send it again.")})
            path = received
            if is_zip(head):
                converted = _staged_file(staging)
                zip_to_tar(received, converted, max_bytes=max_bytes)
                path, digest, size = converted, _hash_file(converted), converted.stat().st_size
                if size > max_bytes:  # files that compress worse in gzip than in the zip
                    raise too_large("As a tar, the archive", max_bytes)
            existing = Workdir.objects.filter(tenant=tenant, sha256=digest).first()
            if existing is not None and workdir_archive_path(tenant.pk, digest).exists():
                return existing, False
            listing = inspect_tar(path, max_bytes=max_bytes)
        except ArchiveError as error:
            raise ValidationError({"archive": str(error)}) from None
        _keep(path, tenant.pk, digest)
        if existing is not None:  # its file had gone: it is back
            return existing, False
        try:
            with transaction.atomic():
                workdir = Workdir.objects.create(
                    tenant=tenant, sha256=digest, size_bytes=size,
                    unpacked_bytes=listing.unpacked_bytes, file_count=len(listing.files),
                    files=listing.files, created_by=actor if actor.is_authenticated else None,
                )
        except IntegrityError:  # the same bytes arrived twice at once: one row
            return Workdir.objects.get(tenant=tenant, sha256=digest), False
        audit_record(actor=actor, action="workdir.upload", obj=workdir, tenant=tenant,
                     changes={"sha256": digest, "size_bytes": size,
                              "file_count": workdir.file_count})
        return workdir, True
    finally:
        for path_ in (received, converted):
            if path_ is not None:
                path_.unlink(missing_ok=True)
