"""Working-folder archives for tests: good ones as the client makes them, and evil ones."""

import gzip
import io
import tarfile
import zipfile


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, **attrs) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid = 0, 0, 0
    if data is not None:
        info.size = len(data)
        info.mode = 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def tar_gz(files: dict[str, bytes], *, extra=None) -> bytes:
    """A gzip tar of `files` (sorted, no times or owners); `extra(tar)` adds more members."""
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed, \
            tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar:
        folders = sorted({"/".join(name.split("/")[:i]) for name in files
                          for i in range(1, name.count("/") + 1)})
        for folder in folders:
            _add(tar, folder, type=tarfile.DIRTYPE, mode=0o755)
        for name in sorted(files):
            _add(tar, name, files[name])
        if extra is not None:
            extra(tar)
    return raw.getvalue()


def with_member(name: str, **attrs):
    """An `extra` adding one member: `with_member("x", type=tarfile.SYMTYPE, linkname="/")`."""
    def extra(tar):
        rest = dict(attrs)
        _add(tar, name, rest.pop("data", None), **rest)
    return extra


def zip_bytes(files: dict[str, bytes], *, date=(2020, 1, 1, 0, 0, 0), modes=None) -> bytes:
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=date)
            info.external_attr = ((modes or {}).get(name, 0o100644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return raw.getvalue()


TRAIN = {"train.py": b"import torch\nprint('training')\n", "conf/model.yaml": b"layers: 2\n"}
