"""The working folder a job ships: which files the archive holds, that the same files give the
same bytes, links, the size limit; the SDK and the CLI against a fake API (httpx.MockTransport)
that keeps uploaded archives by tenant and sha256 as the platform does."""

import email.parser
import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import httpx
import pytest
import yaml

from ogai_client import OgaiClient, OgaiError, Workdir, cli
from ogai_client.spec import SpecError, workdir_target
from ogai_client.workdir import MIB, WorkdirError, build_archive, collect, human_size

# -- the archive ------------------------------------------------------------------------------


def make(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def shipped(folder: Path) -> list[str]:
    return [item["path"] for item in build_files(folder)]


def build_files(folder: Path) -> list[dict]:
    with build_archive(folder) as archive:
        return archive.files


def members(archive_path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(archive_path, "r:gz") as tar:
        return tar.getmembers()


def test_nested_gitignores_apply_to_their_own_folder_and_the_nearest_wins(tmp_path):
    make(tmp_path, {
        ".gitignore": "*.log\nbuild/\n/notes.txt\n",
        "train.py": "print('hi')\n", "run.log": "x", "notes.txt": "mine",
        "build/out.o": "o", "src/build/gen.py": "g", "src/notes.txt": "kept: /notes is rooted",
        "src/.gitignore": "!keep.log\n*.tmp\n", "src/keep.log": "k", "src/other.log": "o",
        "src/a.tmp": "t", "a.tmp": "kept: src's rules stay in src",
    })
    assert shipped(tmp_path) == [".gitignore", "a.tmp", "src/.gitignore", "src/keep.log",
                                 "src/notes.txt", "train.py"]


def test_a_negation_cannot_reach_into_an_excluded_folder_as_in_git(tmp_path):
    make(tmp_path, {".gitignore": "data/\n!data/keep.txt\n", "data/keep.txt": "k",
                    "data/big.bin": "b", "x.py": ""})
    assert shipped(tmp_path) == [".gitignore", "x.py"]


def test_ogaiignore_wins_over_gitignore_and_may_re_include(tmp_path):
    make(tmp_path, {
        ".gitignore": "data/\n*.csv\n",
        ".ogaiignore": "!data/\ncheckpoints/\n!needed.csv\n",
        "data/train.jsonl": "{}", "checkpoints/step-1.pt": "w", "needed.csv": "a,b",
        "other.csv": "c", "train.py": "",
        "sub/.ogaiignore": "secret.txt\n", "sub/secret.txt": "s", "sub/ok.txt": "o",
    })
    assert shipped(tmp_path) == [".gitignore", ".ogaiignore", "data/train.jsonl",
                                 "needed.csv", "sub/.ogaiignore", "sub/ok.txt", "train.py"]


def test_git_folders_are_always_left_out(tmp_path):
    make(tmp_path, {".git/HEAD": "ref", ".ogaiignore": "!.git/\n!.git\n",
                    "vendor/lib/.git": "gitdir: ../../.git/modules/lib", "vendor/lib/a.py": "",
                    "train.py": ""})
    assert shipped(tmp_path) == [".ogaiignore", "train.py", "vendor/lib/a.py"]


def test_the_same_files_give_the_same_bytes_anywhere_any_time(tmp_path):
    files = {"train.py": "import torch\n", "run.sh": "#!/bin/sh\n", "data/a.txt": "a" * 5000,
             "données/é.txt": "unicode names", "empty/.keep": ""}
    first = make(tmp_path / "one", files)
    (first / "run.sh").chmod(0o755)
    (first / "train.py").chmod(0o600)
    with build_archive(first) as archive:
        sha, size = archive.sha256, archive.size_bytes
        assert hashlib.sha256(archive.path.read_bytes()).hexdigest() == sha
        assert archive.path.stat().st_size == size
        assert archive.path.read_bytes()[4:8] == b"\0\0\0\0"  # gzip mtime 0
        tar = members(archive.path)
        assert [m.name for m in tar] == ["data", "data/a.txt", "données", "données/é.txt",
                                         "empty", "empty/.keep", "run.sh", "train.py"]
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in tar} == {(0, 0, 0, "", "")}
        modes = {m.name: m.mode for m in tar}
        assert (modes["run.sh"], modes["train.py"], modes["data"]) == (0o755, 0o644, 0o755)
        assert all(m.isfile() or m.isdir() for m in tar)
        assert archive.unpacked_bytes == sum(len(v.encode()) for v in files.values())
    assert build_archive(first).sha256 == sha  # twice
    for path in first.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    (first / "train.py").chmod(0o644)
    assert build_archive(first).sha256 == sha  # times and non-executable modes do not count
    second = tmp_path / "elsewhere" / "two"
    shutil.copytree(first, second)
    assert build_archive(second).sha256 == sha  # nor where the folder is
    (second / "data" / "a.txt").write_text("a" * 4999 + "b")
    assert build_archive(second).sha256 != sha  # one byte does
    (second / "data" / "a.txt").write_text("a" * 5000)
    (second / "train.py").chmod(0o755)
    assert build_archive(second).sha256 != sha  # and so does the executable bit


def test_the_temporary_archive_is_removed_when_done(tmp_path):
    make(tmp_path / "src", {"a.py": ""})
    with build_archive(tmp_path / "src") as archive:
        path = archive.path
        assert path.exists()
    assert not path.exists()


def test_links_inside_are_stored_as_content_others_are_left_out(tmp_path):
    outside = make(tmp_path / "outside", {"secret.txt": "not yours"})
    folder = make(tmp_path / "project", {"train.py": "print(1)\n", "conf/base.yaml": "lr: 1\n"})
    (folder / "current.yaml").symlink_to("conf/base.yaml")
    (folder / "data").symlink_to(outside)
    (folder / "secret").symlink_to(outside / "secret.txt")
    (folder / "sneaky").symlink_to("../outside/secret.txt")
    (folder / "configs").symlink_to("conf")
    (folder / "gone").symlink_to("nowhere.txt")
    os.mkfifo(folder / "pipe")
    (folder / ".gitignore").write_text("ignored-link\n")
    (folder / "ignored-link").symlink_to(outside)
    with build_archive(folder) as archive:
        assert [f["path"] for f in archive.files] == [".gitignore", "conf/base.yaml",
                                                       "current.yaml", "train.py"]
        assert archive.left_out == [
            "configs -> conf (a link to a folder; the archive holds no links)",
            f"data -> {outside} (a link out of the folder)",
            "gone -> nowhere.txt (a broken link)",
            "pipe (a named pipe)",
            f"secret -> {outside / 'secret.txt'} (a link out of the folder)",
            "sneaky -> ../outside/secret.txt (a link out of the folder)",
        ]
        with tarfile.open(archive.path, "r:gz") as tar:
            member = tar.getmember("current.yaml")
            assert member.isfile() and tar.extractfile(member).read() == b"lr: 1\n"


def test_a_link_does_not_carry_out_a_file_the_ignore_rules_leave_out(tmp_path):
    folder = make(tmp_path / "project", {"train.py": "print(1)\n", "secret.env": "KEY=1\n",
                                         ".gitignore": "secret.env\n",
                                         "sub/.ogaiignore": "local.yaml\n",
                                         "sub/local.yaml": "token: x\n"})
    (folder / "alias.env").symlink_to("secret.env")
    (folder / "conf.yaml").symlink_to("sub/local.yaml")
    (folder / "git-config").symlink_to(".git/config")
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[remote]\n")
    with build_archive(folder) as archive:
        assert [f["path"] for f in archive.files] == [".gitignore", "sub/.ogaiignore",
                                                       "train.py"]
        assert archive.left_out == [
            "alias.env -> secret.env (a link to a file the ignore rules leave out)",
            "conf.yaml -> sub/local.yaml (a link to a file the ignore rules leave out)",
            "git-config -> .git/config (a link to a file the ignore rules leave out)",
        ]


def test_over_the_limit_stops_before_reading_anything(tmp_path, monkeypatch):
    folder = make(tmp_path / "project", {"train.py": "x" * 1000,
                                         "data/a.bin": b"\0" * (3 * MIB),
                                         "data/b.bin": b"\0" * MIB, "w.pt": b"\0" * (2 * MIB)})
    monkeypatch.chdir(tmp_path)

    def no_temporary_file(*args, **kwargs):
        raise AssertionError("nothing is packed past the limit")

    monkeypatch.setattr("tempfile.mkstemp", no_temporary_file)
    with pytest.raises(WorkdirError) as raised:
        build_archive(folder, max_bytes=2 * MIB)
    assert str(raised.value) == (
        "the working folder ./project/ is 6 MiB, over the platform's limit of 2 MiB; list what "
        "it need not ship in .ogaiignore (biggest: data/ 4 MiB, w.pt 2 MiB, train.py 1000 B)")
    (folder / ".ogaiignore").write_text("data/\n")
    monkeypatch.undo()
    with build_archive(folder, max_bytes=3 * MIB) as archive:
        assert archive.file_count == 3


def test_a_folder_that_is_not_there_or_not_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WorkdirError, match=r"^the working folder ./nope/ does not exist$"):
        collect("nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(WorkdirError, match="is not a folder"):
        collect(tmp_path / "file")


@pytest.mark.parametrize(("size", "text"), [(0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"),
                                            (23 * 1024 + 100, "23 KiB"), (1536, "1.5 KiB"),
                                            (612 * MIB, "612 MiB"), (3 * 1024 * MIB, "3 GiB")])
def test_sizes_read_as_people_write_them(size, text):
    assert human_size(size) == text


def test_the_spec_names_its_working_folder(tmp_path):
    spec = {"name": "a", "workdir": "src"}
    assert workdir_target(spec, spec_dir=tmp_path) == str(tmp_path / "src")
    assert "workdir" not in spec
    assert workdir_target({"name": "a"}, spec_dir=tmp_path) == str(tmp_path)
    assert workdir_target({"name": "a"}) is None  # a dict spec ships only when told
    assert workdir_target({"workdir": None}, spec_dir=tmp_path) is None
    assert workdir_target({"workdir": False}, spec_dir=tmp_path) is None
    assert workdir_target({"workdir": 7}, spec_dir=tmp_path) == 7
    assert workdir_target({"workdir": "src"}, spec_dir=tmp_path, override=False) is None
    assert workdir_target({}, spec_dir=tmp_path, override="other") == os.path.abspath("other")
    for bad in (True, "", ["a"], 0):
        with pytest.raises(SpecError, match=r"^workdir: "):
            workdir_target({"workdir": bad}, spec_dir=tmp_path)


# -- the SDK and the CLI against a fake API ---------------------------------------------------

TENANTS = ["alpha"]
LIMIT = 4 * MIB


class FakeApi:
    """The workdir and job endpoints of the contract: archives kept per (tenant, sha256)."""

    def __init__(self, tenants=TENANTS, limit=LIMIT):
        self.tenants = tenants
        self.limit = limit
        self.workdirs: dict[tuple[str, str], dict] = {}
        self.uploads: list[dict] = []  # the multipart fields of each POST
        self.jobs: list[dict] = []  # the body of each job POST
        self.calls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/v1")
        self.calls.append(f"{request.method} {path}")
        params = request.url.params
        if path == "/infra-os/me/":
            return httpx.Response(200, json={"id": 1, "username": "ann", "memberships": [
                {"tenant": name, "role": "member"} for name in self.tenants]})
        if path == "/aistation/workdirs/limits/":
            return httpx.Response(200, json={"max_bytes": self.limit})
        if path == "/aistation/workdirs/" and request.method == "GET":
            found = self.workdirs.get((params.get("tenant"), params.get("sha256")))
            return httpx.Response(200, json={"count": int(bool(found)), "next": None,
                                             "previous": None,
                                             "results": [found] if found else []})
        if path == "/aistation/workdirs/" and request.method == "POST":
            return self.upload(request)
        if path.startswith("/aistation/workdirs/"):
            workdir_id = int(path.split("/")[3])
            for workdir in self.workdirs.values():
                if workdir["id"] == workdir_id:
                    return httpx.Response(200, json=workdir)
            return httpx.Response(404, json={"code": "not_found", "message": "Not found.",
                                             "fields": {}})
        if path == "/aistation/jobs/" and request.method == "POST":
            body = json.loads(request.content)
            if body.get("queue") == "nope":
                return httpx.Response(400, json={
                    "code": "invalid", "message": "queue: No queue 'nope' in tenant alpha.",
                    "fields": {"queue": ["No queue 'nope' in tenant alpha."]}})
            self.jobs.append(body)
            return httpx.Response(201, json=self.job(len(self.jobs), body))
        if path.startswith("/aistation/jobs/"):
            job_id = int(path.split("/")[3])
            return httpx.Response(200, json=self.job(job_id, self.jobs[job_id - 1]))
        return httpx.Response(404, json={"code": "not_found", "message": "Not found.",
                                         "fields": {}})

    def upload(self, request: httpx.Request) -> httpx.Response:
        head = f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode()
        message = email.parser.BytesParser().parsebytes(head + request.read())
        fields = {part.get_param("name", header="content-disposition"):
                  part.get_payload(decode=True) for part in message.get_payload()}
        self.uploads.append(fields)
        archive = fields["archive"]
        sha = hashlib.sha256(archive).hexdigest()
        if fields["sha256"].decode() != sha:
            return httpx.Response(400, json={"code": "invalid", "message": "sha256 differs",
                                             "fields": {"sha256": ["differs"]}})
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            files = [{"path": m.name, "size": m.size} for m in tar.getmembers() if m.isfile()]
        key = (fields["tenant"].decode(), sha)
        self.workdirs[key] = {
            "id": len(self.workdirs) + 1, "tenant": key[0], "sha256": sha,
            "size_bytes": len(archive), "unpacked_bytes": sum(f["size"] for f in files),
            "file_count": len(files), "files": files, "created_at": "2026-12-01T10:00:00Z"}
        return httpx.Response(201, json=self.workdirs[key])

    def job(self, job_id: int, body: dict) -> dict:
        workdir = next((w for w in self.workdirs.values() if w["id"] == body.get("workdir")),
                       None)
        return {"id": job_id, "name": body.get("name", ""), "state": "queued",
                "tenant": "alpha", "queue": "default", "command": body.get("command", []),
                "environment": body.get("environment", ""),
                "workdir": {key: workdir[key] for key in ("id", "sha256", "size_bytes",
                                                          "file_count")} if workdir else None}


def client_of(api: FakeApi) -> OgaiClient:
    return OgaiClient("http://ogai.test", "tok", transport=httpx.MockTransport(api))


@pytest.fixture
def project(tmp_path):
    return make(tmp_path / "project", {
        "train.py": "import torch\nprint(torch.__version__)\n", "lib/util.py": "X = 1\n",
        ".gitignore": "__pycache__/\n", "__pycache__/train.cpython-311.pyc": "pyc",
        "train.yaml": yaml.safe_dump({"name": "train", "command": ["python", "train.py"],
                                      "environment": "torch-cpu"}),
    })


def test_an_upload_is_sent_once_then_reused(project):
    api = FakeApi()
    client = client_of(api)
    first = client.upload_workdir("alpha", project)
    assert isinstance(first, Workdir) and not first.reused
    assert (first.id, first.tenant, first.file_count) == (1, "alpha", 4)
    assert [f["path"] for f in first.files] == [".gitignore", "lib/util.py", "train.py",
                                                "train.yaml"]
    [upload] = api.uploads
    assert upload["tenant"] == b"alpha" and len(upload["sha256"]) == 64
    again = client.upload_workdir("alpha", project)
    assert again.reused and again.id == first.id and again.sha256 == first.sha256
    assert len(api.uploads) == 1  # nothing sent the second time
    (project / "train.py").write_text("print('changed')\n")
    changed = client.upload_workdir("alpha", project)
    assert not changed.reused and changed.id == 2 and len(api.uploads) == 2
    assert client.workdir(1).files == first.files


def test_the_only_tenant_is_taken_and_several_must_be_named(project):
    api = FakeApi()
    assert client_of(api).upload_workdir(None, project).tenant == "alpha"
    several = FakeApi(tenants=["alpha", "beta"])
    with pytest.raises(OgaiError, match=r"several tenants \(alpha, beta\): name the tenant"):
        client_of(several).upload_workdir(None, project)
    assert several.uploads == []


def test_over_the_limit_sends_nothing(project):
    api = FakeApi(limit=20)
    with pytest.raises(OgaiError) as raised:
        client_of(api).upload_workdir("alpha", project)
    assert raised.value.code == "workdir" and "over the platform's limit of 20 B" in str(
        raised.value)
    assert api.uploads == [] and "GET /aistation/workdirs/" not in api.calls


def test_submit_ships_the_folder_the_spec_names_and_sends_its_id(project):
    api = FakeApi()
    client = client_of(api)
    spec = yaml.safe_load((project / "train.yaml").read_text())
    job = client.submit_job(spec, spec_dir=project)  # as from a file: the spec's folder
    assert api.jobs[-1] == {"name": "train", "command": ["python", "train.py"],
                            "environment": "torch-cpu", "workdir": 1}
    assert job.environment == "torch-cpu"
    assert (job.workdir.id, job.workdir.sha256) == (1, api.uploads[0]["sha256"].decode())
    client.submit_job({**spec, "workdir": "lib"}, spec_dir=project)
    assert api.jobs[-1]["workdir"] == 2
    assert [f["path"] for f in client.workdir(2).files] == ["util.py"]
    client.submit_job(spec, spec_dir=project)
    assert api.jobs[-1]["workdir"] == 1 and len(api.uploads) == 2  # reused
    client.submit_job({**spec, "workdir": "lib"}, spec_dir=project, workdir=False)
    assert "workdir" not in api.jobs[-1]
    client.submit_job(spec, workdir=client.workdir(2))
    assert api.jobs[-1]["workdir"] == 2


def test_a_dict_spec_ships_nothing_unless_told(project, monkeypatch):
    api = FakeApi()
    client = client_of(api)
    monkeypatch.chdir(project)
    client.submit_job({"name": "a", "command": ["true"]})
    assert api.calls == ["POST /aistation/jobs/"] and "workdir" not in api.jobs[-1]
    client.submit_job({"name": "a", "command": ["true"], "workdir": "lib"})  # from cwd
    assert api.jobs[-1]["workdir"] == 1
    client.submit_job({"name": "a", "command": ["true"]}, workdir=project)
    assert api.jobs[-1]["workdir"] == 2
    with pytest.raises(OgaiError, match=r"^the working folder \./missing/ does not exist$"):
        client.submit_job({"name": "a", "workdir": "missing"})


def ogai(capsys, *argv):
    code = cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    if code != 0:
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, \
            captured.err
    return code, captured.out, captured.err


@pytest.fixture
def api(monkeypatch):
    api = FakeApi()
    client = client_of(api)
    monkeypatch.setattr(cli.Context, "client", lambda self: client)
    return api


def test_the_cli_ships_the_spec_folder_in_one_line(api, project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    code, out, err = ogai(capsys, "job", "submit", "train.yaml")
    assert code == 0, err
    sha = api.uploads[0]["sha256"].decode()
    size = human_size(len(api.uploads[0]["archive"]))
    assert err == f"shipped working folder ./ (4 files, {size}, sha256 {sha[:12]}…; uploaded)\n"
    assert out == "job 1 submitted: train in alpha/default, queued\n"
    assert api.jobs[-1]["workdir"] == 1 and api.jobs[-1]["environment"] == "torch-cpu"
    code, out, err = ogai(capsys, "job", "submit", "train.yaml", "-q")
    assert (code, out) == (0, "2\n") and err.endswith("; reused)\n")
    assert len(api.uploads) == 1

    monkeypatch.chdir(project.parent)
    code, _, err = ogai(capsys, "job", "submit", "project/train.yaml", "--workdir", "project/lib")
    assert code == 0 and err.startswith("shipped working folder ./project/lib/ (1 file, ")
    code, _, err = ogai(capsys, "job", "submit", "project/train.yaml", "--no-workdir")
    assert (code, err) == (0, "") and "workdir" not in api.jobs[-1]


def test_a_spec_from_stdin_ships_only_what_it_names(api, project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    monkeypatch.setattr("sys.stdin", io.StringIO("name: a\ncommand: [x]\n"))
    assert ogai(capsys, "job", "submit", "-")[0] == 0
    assert api.uploads == [] and "workdir" not in api.jobs[-1]
    monkeypatch.setattr("sys.stdin", io.StringIO("name: a\ncommand: [x]\nworkdir: lib\n"))
    code, _, err = ogai(capsys, "job", "submit", "-")
    assert code == 0 and err.startswith("shipped working folder ./lib/ (1 file, ")


def test_the_cli_says_what_it_left_out(api, project, capsys, monkeypatch, tmp_path):
    (project / "data").symlink_to("/mnt/x")
    monkeypatch.chdir(project)
    code, _, err = ogai(capsys, "job", "submit", "train.yaml")
    assert code == 0
    assert err.splitlines()[0] == "left out: data -> /mnt/x (a link out of the folder)"
    assert err.splitlines()[1].startswith("shipped working folder ./ (4 files")


def test_cli_errors_about_the_working_folder_are_one_line(api, project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    (project / "weights.bin").write_bytes(b"\0" * (5 * MIB))
    code, _, err = ogai(capsys, "job", "submit", "train.yaml")
    assert code == 1
    assert err.startswith("error: the working folder ./ is 5 MiB, over the platform's limit "
                          "of 4 MiB; list what it need not ship in .ogaiignore (biggest: "
                          "weights.bin 5 MiB")
    assert api.uploads == [] and api.jobs == []
    (project / ".ogaiignore").write_text("*.bin\n")
    assert ogai(capsys, "job", "submit", "train.yaml")[0] == 0

    code, _, err = ogai(capsys, "job", "submit", "train.yaml", "--workdir", "nope")
    assert (code, err) == (1, "error: the working folder ./nope/ does not exist\n")
    (project / "bad.yaml").write_text("name: a\nworkdir: true\n")
    code, _, err = ogai(capsys, "job", "submit", "bad.yaml")
    assert code == 1 and err.startswith("error: workdir: give a folder")
    code, _, err = ogai(capsys, "job", "submit", "train.yaml", "--workdir", "lib",
                        "--no-workdir")
    assert code == 2 and "not allowed with argument" in err


def test_show_and_files_print_the_working_folder(api, project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    ogai(capsys, "job", "submit", "train.yaml")
    ogai(capsys, "job", "submit", "train.yaml", "--no-workdir")
    sha = api.uploads[0]["sha256"].decode()
    code, out, _ = ogai(capsys, "job", "show", "1")
    assert code == 0
    assert "environment     torch-cpu" in out
    assert f"working folder  sha256 {sha[:12]}…, " in out and ", 4 files (`ogai job files 1`)" \
        in out
    code, out, _ = ogai(capsys, "job", "show", "2")
    assert "working folder  none shipped" in out
    code, out, err = ogai(capsys, "job", "files", "1")
    assert code == 0
    assert [line.split()[-1] for line in out.splitlines()[1:]] == [
        ".gitignore", "lib/util.py", "train.py", "train.yaml"]
    assert err.startswith("4 files, ") and err.rstrip().endswith(f"sha256 {sha}")
    code, out, _ = ogai(capsys, "job", "files", "1", "--json")
    assert json.loads(out)["sha256"] == sha
    code, out, err = ogai(capsys, "job", "files", "2")
    assert (code, out, err) == (0, "", "job 2 ships no working folder\n")


def test_a_server_without_working_folders_says_how_to_go_on(project, capsys, monkeypatch):
    def handler(request):
        return httpx.Response(404, json={"code": "not_found", "message": "Not found.",
                                         "fields": {}})

    client = OgaiClient("http://old.test", "tok", transport=httpx.MockTransport(handler))
    monkeypatch.setattr(cli.Context, "client", lambda self: client)
    code, _, err = ogai(capsys, "job", "submit", project / "train.yaml")
    assert code == 1
    assert err == ("error: http://old.test takes no working folders (an older OGAI?): submit "
                   "with --no-workdir (workdir=False)\n")
    code, _, err = ogai(capsys, "job", "files", "3")
    assert (code, err) == (1, "error: job 3 not found (or not visible to you)\n")


def test_a_refused_spec_prints_only_its_error_and_its_fix_reuses_the_upload(api, project,
                                                                           capsys, monkeypatch):
    monkeypatch.chdir(project)
    code, out, err = ogai(capsys, "job", "submit", "train.yaml", "--queue", "nope")
    assert (code, out, err) == (1, "", "error: queue: No queue 'nope' in tenant alpha.\n")
    assert len(api.uploads) == 1
    code, _, err = ogai(capsys, "job", "submit", "train.yaml")
    assert code == 0 and err.endswith("; reused)\n") and len(api.uploads) == 1
