"""The console's working folders: uploading one with the job form (a .tar.gz or a .zip), and
the job page showing what the job ships."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from aistation.models import Job, Workdir
from aistation.services.workdirs import workdir_upload
from aistation.services.workloads import workdir_archive_path
from aistation.tests.archives import TRAIN, tar_gz, with_member, zip_bytes

SPEC = {"name": "train", "command": "python train.py", "env": "", "image": "",
        "environment": "", "gpus_per_replica": "0", "gpu_model": "", "cpu_per_replica": "1",
        "memory_mib_per_replica": "1024", "replicas": "1", "priority": "",
        "max_restarts": "0", "time_limit_s": ""}


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()


@pytest.fixture
def farm(farm):
    """The fake farm, offering the environment these jobs name."""
    farm.cluster.options = {**farm.cluster.options, "environments": {"torch-cpu": "fake"}}
    farm.cluster.save(update_fields=["options"])
    return farm


def _post(client, farm, archive: bytes | None, name="train.tar.gz", **changes):
    data = {**SPEC, "queue": farm.queues["alpha"].pk, **changes}
    if archive is not None:
        data["workdir_archive"] = SimpleUploadedFile(name, archive)
    return client.post(reverse("frontend:job-submit"), data)


def test_the_form_uploads_a_tar_and_the_job_page_shows_it(signed_in, farm):
    client = signed_in(farm.world.alpha_member)
    page = client.get(reverse("frontend:job-submit")).content.decode()
    assert 'enctype="multipart/form-data"' in page
    assert "At most 200 MiB (OGAI_WORKDIR_MAX_MB)" in page
    response = _post(client, farm, tar_gz(TRAIN), environment="torch-cpu")
    assert response.status_code == 302, response.context and response.context["form"].errors
    job = Job.objects.get()
    assert job.environment == "torch-cpu"
    assert job.workdir.file_count == 2
    assert workdir_archive_path(job.tenant_id, job.workdir.sha256).exists()
    page = client.get(response.url).content.decode()
    sha = job.workdir.sha256
    assert f'<code title="{sha}">{sha[:12]}</code>' in page
    assert f'<span id="workdir-sha256" hidden>{sha}</span>' in page
    assert "conf/model.yaml" in page and "train.py" in page
    assert "torch-cpu" in page


def test_a_zip_is_made_into_the_canonical_archive(signed_in, farm):
    client = signed_in(farm.world.alpha_member)
    response = _post(client, farm, zip_bytes(TRAIN), name="train.zip")
    assert response.status_code == 302
    same, created = workdir_upload(actor=farm.world.alpha_member, tenant=farm.world.alpha,
                                   archive=SimpleUploadedFile("t.tar.gz", tar_gz(TRAIN)))
    # The server's tar of the zip is the client's tar of the same files.
    assert not created and same == Job.objects.get().workdir


def test_a_bad_archive_shows_on_its_field_and_submits_nothing(signed_in, farm):
    client = signed_in(farm.world.alpha_member)
    response = _post(client, farm, tar_gz(TRAIN, extra=with_member("../x", data=b"x")))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert "outside the folder" in " ".join(errors["workdir_archive"])
    assert 'class="field-error"' in response.content.decode()
    assert not Job.objects.exists()
    assert not Workdir.objects.exists()


def test_an_archive_past_the_limit_names_the_limit(signed_in, farm, settings):
    settings.OGAI_WORKDIR_MAX_MB = 0
    response = _post(signed_in(farm.world.alpha_member), farm, tar_gz(TRAIN))
    errors = " ".join(response.context["form"].errors["workdir_archive"])
    assert "limit of 0 MiB (OGAI_WORKDIR_MAX_MB)" in errors
    assert not Job.objects.exists()


def test_a_viewer_cannot_upload_with_the_form(signed_in, farm):
    response = _post(signed_in(farm.world.alpha_viewer), farm, tar_gz(TRAIN))
    assert response.status_code == 403
    assert not Workdir.objects.exists()


def test_a_copy_of_a_job_keeps_its_workdir(signed_in, farm):
    workdir, _ = workdir_upload(actor=farm.world.alpha_member, tenant=farm.world.alpha,
                                archive=SimpleUploadedFile("t.tar.gz", tar_gz(TRAIN)))
    original = farm.submit(workdir=workdir, environment="torch-cpu")
    client = signed_in(farm.world.alpha_member)
    page = client.get(reverse("frontend:job-submit"), {"from": original.pk})
    assert page.context["form"].initial["workdir"] == workdir.pk
    assert f"ships job {original.pk}'s working folder" in page.content.decode()
    response = _post(client, farm, None, workdir=str(workdir.pk), environment="torch-cpu")
    assert response.status_code == 302
    copy = Job.objects.exclude(pk=original.pk).get()
    assert copy.workdir == workdir and copy.environment == "torch-cpu"


def test_another_tenants_workdir_cannot_be_slipped_into_the_form(signed_in, farm):
    theirs, _ = workdir_upload(actor=farm.world.beta_member, tenant=farm.world.beta,
                               archive=SimpleUploadedFile("t.tar.gz", tar_gz(TRAIN)))
    response = _post(signed_in(farm.world.alpha_member), farm, None, workdir=str(theirs.pk))
    assert response.status_code == 200
    assert "workdir" in response.context["form"].errors
    assert not Job.objects.exists()


def test_the_job_page_lists_the_first_files_and_counts_the_rest(signed_in, farm):
    files = {f"data/{number:04}.txt": b"x" for number in range(205)}
    workdir, _ = workdir_upload(actor=farm.world.alpha_member, tenant=farm.world.alpha,
                                archive=SimpleUploadedFile("t.tar.gz", tar_gz(files)))
    job = farm.submit(workdir=workdir)
    page = signed_in(farm.world.alpha_member).get(
        reverse("frontend:job", args=[job.pk])).content.decode()
    assert "data/0199.txt" in page
    assert "data/0200.txt" not in page
    assert "… 5 more" in page
    assert "205 files" in page


def test_a_job_without_a_workdir_says_so(signed_in, farm):
    job = farm.submit()
    page = signed_in(farm.world.alpha_member).get(
        reverse("frontend:job", args=[job.pk])).content.decode()
    assert "none: the job starts in an empty folder" in page
