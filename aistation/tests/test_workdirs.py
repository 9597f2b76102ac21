"""Working folders: uploading (deduplicated, checked, limited), reading them back, and jobs that
ship them, across the tenant boundary and with job tokens."""

import gzip
import hashlib
import os
import stat
import tarfile

import pytest
import yaml
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command

from aistation.models import Job, Workdir
from aistation.services.job_tokens import job_token_bind, job_token_new
from aistation.services.reconcile import reconcile_cluster
from aistation.services.workdirs import workdir_upload
from aistation.services.workloads import attempt_workload, workdir_archive_path
from aistation.tests.archives import TRAIN, tar_gz, with_member, zip_bytes
from infra_os.models import AuditEvent
from podsys.models import Cluster

WORKDIRS = "/api/v1/aistation/workdirs/"
JOBS = "/api/v1/aistation/jobs/"


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


def upload(client, data: bytes, *, tenant="alpha", name="folder.tar.gz", **fields):
    return client.post(WORKDIRS, {"tenant": tenant, "archive": SimpleUploadedFile(name, data),
                                  **fields}, format="multipart")


def staged(data_dir):
    folder = data_dir / "workdirs" / ".staging"
    return sorted(folder.iterdir()) if folder.exists() else []


# Uploading ----------------------------------------------------------------------------------

def test_an_upload_is_kept_once_listed_and_private(api, world, data_dir):
    data = tar_gz(TRAIN)
    client = api.as_user(world.alpha_member)
    response = upload(client, data)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["sha256"] == hashlib.sha256(data).hexdigest()
    assert body["tenant"] == "alpha"
    assert body["size_bytes"] == len(data)
    assert body["file_count"] == 2
    assert body["unpacked_bytes"] == sum(len(v) for v in TRAIN.values())
    assert {(f["path"], f["size"]) for f in body["files"]} == {
        (path, len(content)) for path, content in TRAIN.items()}
    path = workdir_archive_path(world.alpha.pk, body["sha256"])
    assert path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / "workdirs").stat().st_mode) == 0o700
    assert AuditEvent.objects.filter(action="workdir.upload", tenant=world.alpha).count() == 1
    assert staged(data_dir) == []

    again = upload(client, data, sha256=body["sha256"].upper())
    assert again.status_code == 200, again.content
    assert again.json()["id"] == body["id"]
    assert Workdir.objects.count() == 1
    assert AuditEvent.objects.filter(action="workdir.upload").count() == 1

    found = client.get(WORKDIRS, {"tenant": "alpha", "sha256": body["sha256"]}).json()
    assert [row["id"] for row in found["results"]] == [body["id"]]
    assert client.get(WORKDIRS, {"sha256": "0" * 64}).json()["results"] == []
    assert client.get(f"{WORKDIRS}{body['id']}/").json()["sha256"] == body["sha256"]


def test_the_same_bytes_of_another_tenant_are_its_own(api, world):
    data = tar_gz(TRAIN)
    mine = upload(api.as_user(world.alpha_member), data).json()
    theirs = upload(api.as_user(world.beta_member), data, tenant="beta")
    assert theirs.status_code == 201
    assert theirs.json()["id"] != mine["id"]
    assert workdir_archive_path(world.beta.pk, mine["sha256"]).exists()


def test_a_lost_archive_file_is_put_back_by_the_next_upload(api, world):
    data = tar_gz(TRAIN)
    client = api.as_user(world.alpha_member)
    body = upload(client, data).json()
    path = workdir_archive_path(world.alpha.pk, body["sha256"])
    path.unlink()
    assert client.get(f"{WORKDIRS}{body['id']}/archive/").status_code == 404
    assert upload(client, data).status_code == 200
    assert path.read_bytes() == data


def test_a_sha256_that_does_not_match_is_refused(api, world, data_dir):
    response = upload(api.as_user(world.alpha_member), tar_gz(TRAIN), sha256="ab" * 32)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert "changed on the way" in body["fields"]["sha256"][0]
    assert not Workdir.objects.exists()
    assert staged(data_dir) == []


def _bomb():
    # 2 MiB of zeros: a few KiB compressed, past a 1 MiB limit once unpacked.
    return tar_gz({"zeros.bin": b"\0" * (2 * 2**20)})


EVIL = {
    "dotdot": (lambda: tar_gz(TRAIN, extra=with_member("../escape.py", data=b"x")), "outside"),
    "nested dotdot": (lambda: tar_gz({}, extra=with_member("a/../../x", data=b"x")),
                      "outside"),
    "absolute": (lambda: tar_gz(TRAIN, extra=with_member("/etc/cron.d/x", data=b"x")),
                 "absolute"),
    "symlink": (lambda: tar_gz(TRAIN, extra=with_member(
        "data", type=tarfile.SYMTYPE, linkname="/etc")), "link"),
    "hardlink": (lambda: tar_gz(TRAIN, extra=with_member(
        "copy.py", type=tarfile.LNKTYPE, linkname="train.py")), "link"),
    "device": (lambda: tar_gz(TRAIN, extra=with_member(
        "null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)), "device"),
    "fifo": (lambda: tar_gz(TRAIN, extra=with_member("pipe", type=tarfile.FIFOTYPE)),
             "pipe"),
    "twice": (lambda: tar_gz(TRAIN, extra=with_member("train.py", data=b"other")), "twice"),
    "file and folder": (lambda: tar_gz({"a": b"x"}, extra=with_member("a/b", data=b"y")),
                        "both a file and a folder"),
    "not gzip": (lambda: b"just some text, not an archive", "not gzip-compressed"),
    "gzip, not tar": (lambda: gzip.compress(b"hello " * 1000, mtime=0),
                      "damaged or not a tar"),
    "truncated": (lambda: tar_gz(TRAIN)[:-40], "damaged"),
    "zip bomb": (_bomb, "Unpacked, the folder is larger than the limit of 1 MiB "
                 "(OGAI_WORKDIR_MAX_MB)"),
    "zip with a link": (lambda: zip_bytes({"train.py": b"x", "link": b"/etc/passwd"},
                                          modes={"link": 0o120777}), "link"),
    "zip with dotdot": (lambda: zip_bytes({"../x.py": b"x"}), "outside"),
    "zip bomb zip": (lambda: zip_bytes({"zeros.bin": b"\0" * (2 * 2**20)}),
                     "larger than the limit of 1 MiB (OGAI_WORKDIR_MAX_MB)"),
    "damaged zip": (lambda: zip_bytes(TRAIN)[:60], "zip"),
}


@pytest.mark.parametrize("case", EVIL, ids=list(EVIL))
def test_evil_archives_are_refused_with_the_envelope(api, world, settings, data_dir, case):
    settings.OGAI_WORKDIR_MAX_MB = 1
    make, words = EVIL[case]
    response = upload(api.as_user(world.alpha_member), make())
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid"
    assert words in body["fields"]["archive"][0], body
    assert not Workdir.objects.exists()
    assert staged(data_dir) == []
    assert not any((data_dir / "workdirs").glob("*/*.tar.gz"))


def test_an_archive_past_the_limit_is_refused_naming_the_limit_and_its_setting(
        api, world, settings, data_dir):
    settings.OGAI_WORKDIR_MAX_MB = 1
    # Random bytes do not compress: the archive itself is past 1 MiB.
    data = tar_gz({"weights.bin": os.urandom(2**20 + 4096)})
    response = upload(api.as_user(world.alpha_member), data)
    assert response.status_code == 400
    message = response.json()["fields"]["archive"][0]
    assert "larger than the limit of 1 MiB (OGAI_WORKDIR_MAX_MB)" in message
    assert "datasets" in message
    assert staged(data_dir) == []


def test_an_archive_just_within_the_limit_is_taken_though_its_request_is_over_it(
        api, world, settings, data_dir):
    settings.OGAI_WORKDIR_MAX_MB = 1
    # Random bytes do not compress: the archive is its file and a little more, and the
    # file is sized so the archive ends 100 bytes short of the limit.
    size = 2**20 - 4096
    for _ in range(3):
        data = tar_gz({"weights.bin": os.urandom(size)})
        size += 2**20 - 100 - len(data)
    assert 2**20 - 200 < len(data) <= 2**20
    response = upload(api.as_user(world.alpha_member), data)
    assert response.status_code == 201, response.content
    assert int(response.wsgi_request.META["CONTENT_LENGTH"]) > 2**20


def test_the_service_stops_reading_at_the_limit(world, settings, data_dir):
    """Whatever size was declared (a stream has none), reading stops past the limit."""
    settings.OGAI_WORKDIR_MAX_MB = 1

    class Endless:
        read_bytes = 0

        def read(self, size):
            self.read_bytes += size
            return b"\1" * size

    stream = Endless()
    with pytest.raises(ValidationError) as refused:
        workdir_upload(actor=world.alpha_member, tenant=world.alpha, archive=stream)
    assert "The archive is larger than the limit of 1 MiB (OGAI_WORKDIR_MAX_MB)" in \
        refused.value.message_dict["archive"][0]
    assert stream.read_bytes <= 2 * 2**20
    assert staged(data_dir) == []


def test_the_limits_say_how_large_an_archive_may_be(api, world, settings):
    settings.OGAI_WORKDIR_MAX_MB = 7
    response = api.as_user(world.alpha_viewer).get(f"{WORKDIRS}limits/")
    assert response.status_code == 200
    assert response.json() == {"max_bytes": 7 * 2**20}


def test_a_zip_becomes_the_canonical_tar(world):
    older = zip_bytes(TRAIN, date=(2001, 1, 1, 0, 0, 0), modes={"train.py": 0o100755})
    newer = zip_bytes(dict(reversed(TRAIN.items())), date=(2025, 6, 1, 12, 0, 0),
                      modes={"train.py": 0o100755})
    first, created = workdir_upload(actor=world.alpha_member, tenant=world.alpha,
                                    archive=SimpleUploadedFile("a.zip", older))
    second, again = workdir_upload(actor=world.alpha_member, tenant=world.alpha,
                                   archive=SimpleUploadedFile("b.zip", newer))
    assert created and not again
    assert first.pk == second.pk  # same files: same archive, whatever the zip's times and order
    path = workdir_archive_path(world.alpha.pk, first.sha256)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == first.sha256
    with tarfile.open(path, "r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile("train.py").read() == TRAIN["train.py"]
    assert sorted(members) == ["conf", "conf/model.yaml", "train.py"]
    assert members["train.py"].mode == 0o755
    assert members["conf/model.yaml"].mode == 0o644
    assert {m.mtime for m in members.values()} == {0}
    assert {m.uid for m in members.values()} == {0}


# Who may ---------------------------------------------------------------------------------

def test_viewers_cannot_upload(api, world):
    response = upload(api.as_user(world.alpha_viewer), tar_gz(TRAIN))
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    # A member of alpha who only views beta cannot upload to beta either.
    response = upload(api.as_user(world.both), tar_gz(TRAIN), tenant="beta")
    assert response.status_code == 403
    assert not Workdir.objects.exists()


def test_another_tenant_cannot_list_see_download_or_use_it(api, world, farm):
    theirs = upload(api.as_user(world.beta_member), tar_gz(TRAIN), tenant="beta").json()
    client = api.as_user(world.alpha_member)
    assert client.get(WORKDIRS, {"sha256": theirs["sha256"]}).json()["results"] == []
    assert client.get(WORKDIRS, {"tenant": "beta"}).json()["results"] == []
    for url in (f"{WORKDIRS}{theirs['id']}/", f"{WORKDIRS}{theirs['id']}/archive/"):
        response = client.get(url)
        assert response.status_code == 404, url
        assert response.json()["code"] == "not_found"
    # Uploading into it is refused like an unknown tenant.
    assert upload(client, tar_gz(TRAIN), tenant="beta").status_code == 400
    # A job naming it is refused as if it did not exist.
    spec = {"tenant": "alpha", "queue": "default", "name": "steal",
            "command": ["python", "train.py"]}
    stolen = client.post(JOBS, {**spec, "workdir": theirs["id"]}, format="json")
    missing = client.post(JOBS, {**spec, "workdir": theirs["id"] + 1000}, format="json")
    assert stolen.status_code == missing.status_code == 400
    assert stolen.json()["fields"]["workdir"] == missing.json()["fields"]["workdir"]
    assert not Job.objects.exists()


def test_the_service_refuses_another_tenants_workdir_too(world, farm):
    theirs, _ = workdir_upload(actor=world.beta_member, tenant=world.beta,
                               archive=SimpleUploadedFile("w.tar.gz", tar_gz(TRAIN)))
    with pytest.raises(ValidationError) as refused:
        farm.submit("alpha", workdir=theirs)
    assert "workdir" in refused.value.message_dict
    assert not Job.objects.exists()


# Jobs that ship one --------------------------------------------------------------------------

def _job_with_workdir(api, world, files=TRAIN, **spec):
    # The fake cluster offers the environment these jobs name.
    Cluster.objects.filter(name="farm").update(options={
        "nodes": 2, "gpus_per_node": 8, "environments": {"torch-cpu": "fake"}})
    client = api.as_user(world.alpha_member)
    workdir = upload(client, tar_gz(files)).json()
    response = client.post(JOBS, {"tenant": "alpha", "queue": "default", "name": "train",
                                  "command": ["python", "train.py"], "workdir": workdir["id"],
                                  "environment": "torch-cpu", **spec}, format="json")
    assert response.status_code == 201, response.content
    return workdir, response.json()


def test_a_job_ships_its_workdir_and_names_its_environment(api, world, farm):
    workdir, job = _job_with_workdir(api, world)
    assert job["environment"] == "torch-cpu"
    assert job["workdir"] == {"id": workdir["id"], "sha256": workdir["sha256"],
                              "size_bytes": workdir["size_bytes"], "file_count": 2}
    listed = api.as_user(world.alpha_member).get(JOBS).json()["results"][0]
    assert listed["workdir"]["sha256"] == workdir["sha256"]
    plain = api.as_user(world.alpha_member).post(JOBS, {
        "tenant": "alpha", "queue": "default", "name": "bare", "command": ["true"]},
        format="json").json()
    assert plain["workdir"] is None and plain["environment"] == ""


def test_retries_and_reruns_ship_the_same_archive(api, world, farm):
    workdir, body = _job_with_workdir(api, world, env={"OGAI_FAKE_DURATION_S": "1",
                                                       "OGAI_FAKE_EXIT_CODE": "1"},
                                      max_restarts=1)
    job = Job.objects.get(pk=body["id"])
    expected = str(workdir_archive_path(world.alpha.pk, workdir["sha256"]))
    for _ in range(2):
        farm.cycle()
        farm.fake.advance(2)
        reconcile_cluster(cluster=farm.cluster)
    job.refresh_from_db()
    assert job.attempts.count() == 2
    for attempt in job.attempts.all():
        assert farm.fake._workloads[attempt.workload_id].spec.workdir_archive == expected
        assert attempt_workload(attempt).environment == "torch-cpu"
    rerun = api.as_user(world.alpha_member).post(f"{JOBS}{job.pk}/rerun/")
    assert rerun.status_code == 201, rerun.content
    assert rerun.json()["workdir"]["id"] == workdir["id"]
    assert rerun.json()["environment"] == "torch-cpu"


# Job tokens ---------------------------------------------------------------------------------

def test_a_job_token_fetches_its_own_jobs_archive_only(api, world, farm):
    workdir_a, job_a = _job_with_workdir(api, world, files={"a.py": b"print('a')\n"})
    workdir_b, _ = _job_with_workdir(api, world, files={"b.py": b"print('b')\n"})
    secret = job_token_new()
    job_token_bind(job=Job.objects.get(pk=job_a["id"]), secret=secret)
    api.force_authenticate(user=None)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    own = api.get(f"{WORKDIRS}{workdir_a['id']}/archive/", **headers)
    assert own.status_code == 200
    assert own["Content-Type"] == "application/gzip"
    body = b"".join(own.streaming_content)
    assert hashlib.sha256(body).hexdigest() == workdir_a["sha256"]
    other = api.get(f"{WORKDIRS}{workdir_b['id']}/archive/", **headers)
    assert other.status_code == 404
    # A job token opens nothing else about working folders.
    assert api.get(f"{WORKDIRS}{workdir_a['id']}/", **headers).status_code in (401, 403)
    assert api.get(WORKDIRS, **headers).status_code in (401, 403)
    # Once the job has ended its token is dead.
    Job.objects.filter(pk=job_a["id"]).update(state="succeeded")
    assert api.get(f"{WORKDIRS}{workdir_a['id']}/archive/", **headers).status_code == 401


def test_members_download_the_archive_as_uploaded(api, world):
    data = tar_gz(TRAIN)
    client = api.as_user(world.alpha_viewer)
    body = upload(api.as_user(world.alpha_member), data).json()
    response = api.as_user(world.alpha_viewer).get(f"{WORKDIRS}{body['id']}/archive/")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == data
    assert "attachment" in response["Content-Disposition"]
    assert client.get(f"{WORKDIRS}{body['id']}/archive/",
                      HTTP_ACCEPT="application/gzip").status_code == 200


# The schema ----------------------------------------------------------------------------------

def test_the_openapi_schema_describes_workdirs_without_warnings(tmp_path):
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    paths = yaml.safe_load(target.read_text())["paths"]
    archive = paths["/api/v1/aistation/workdirs/{id}/archive/"]["get"]
    assert "application/gzip" in archive["responses"]["200"]["content"]
    assert {"jobToken": []} in archive["security"]
    upload = paths["/api/v1/aistation/workdirs/"]["post"]
    assert "multipart/form-data" in upload["requestBody"]["content"]
    assert {"200", "201", "400"} <= set(upload["responses"])
    assert "/api/v1/aistation/workdirs/limits/" in paths
