"""A job names its environment: refused at submission when the cluster lacks it (with the list
of those it has), listed for those who run on the cluster, and shown by `ogai job render` on
the local cluster."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.core.exceptions import ValidationError

from aistation.services.jobs import job_submit
from aistation.services.manifests import job_manifests
from aistation.services.queues import queue_create
from podsys.models import Cluster, Node
from podsys.services.clusters import cluster_create, cluster_refresh_capacity


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("envs") / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True,
                   timeout=120)
    return folder


@pytest.fixture
def local(local_queue, bare_venv):
    """alpha's queue on the local cluster `here`, which also offers the venv `bare`."""
    cluster = local_queue.cluster
    cluster.options = {**cluster.options, "environments": {"bare": str(bare_venv)}}
    cluster.save(update_fields=["options"])
    return local_queue


def submit(world, queue, **extra):
    return job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="train",
                      command=["python", "train.py"], **extra)


def test_an_environment_the_cluster_lacks_is_refused_with_the_list_it_has(world, local):
    with pytest.raises(ValidationError) as info:
        submit(world, local, environment="torch-cu12")
    [message] = info.value.message_dict["environment"]
    assert message.startswith("Cluster here offers no environment 'torch-cu12'; it offers "
                              "platform (Python 3.11."), message
    assert "torch 2.13.0" in message and "bare (Python 3.11." in message
    assert "no torch)" in message
    job = submit(world, local, environment="bare")
    assert job.environment == "bare"


def test_a_broken_environment_is_refused_saying_why(world, local, tmp_path):
    cluster = local.cluster
    cluster.options = {**cluster.options, "environments": {"old": str(tmp_path / "gone")}}
    cluster.save(update_fields=["options"])
    with pytest.raises(ValidationError, match=r"Environment 'old' of cluster here cannot run "
                       r"jobs \(unusable: .*gone is not a folder"):
        submit(world, local, environment="old")


def test_a_cluster_without_environments_refuses_any_name_and_says_what_to_use(world, farm):
    with pytest.raises(ValidationError, match="Cluster farm offers no named environments; "
                       "leave `environment` empty"):
        farm.submit(environment="torch")
    cluster = Cluster.objects.create(name="kube", driver="kubernetes", options={})
    Node.objects.create(cluster=cluster, name="gpu-0", gpus=8, cpu_cores=64, memory_mib=65536)
    cluster_refresh_capacity(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="kube", cluster=cluster)
    with pytest.raises(ValidationError, match=r"name an image \(`image`\) instead"):
        submit(world, queue, environment="torch")
    cluster.options = {"environments": {"torch": "registry.local/torch:2.13"}}
    cluster.save(update_fields=["options"])
    job = submit(world, queue, environment="torch")
    rendered = list(yaml.safe_load_all(job_manifests(job=job)))
    pod = rendered[-1]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.local/torch:2.13"


def test_render_on_the_local_cluster_shows_the_environment_and_starts_nothing(world, local,
                                                                             bare_venv):
    job = submit(world, local, environment="bare", env={"LR": "3e-4"})
    shown = yaml.safe_load(job_manifests(job=job))
    assert shown["environment"]["name"] == "bare"
    assert shown["environment"]["prefix"] == str(bare_venv)
    assert shown["environment"]["torch"] == "not installed"
    assert shown["command"] == ["python", "train.py"]
    assert shown["env"]["LR"] == "3e-4"
    assert shown["sandbox"]["confined"] is True
    default = yaml.safe_load(job_manifests(job=submit(world, local)))
    assert default["environment"]["name"] == "platform"
    assert default["environment"]["torch"].startswith("2.13.0")
    assert not job.attempts.exists()
    root = local.cluster.options["root"]
    assert not list((Path(root) / "workloads").glob("*"))


def url(cluster):
    return f"/api/v1/podsys/clusters/{cluster.name}/environments/"


def test_the_environments_are_listed_for_tenants_with_a_queue_and_admins(api, world, local,
                                                                        bare_venv):
    response = api.as_user(world.alpha_viewer).get(url(local.cluster))
    assert response.status_code == 200, response.content
    listed = response.json()
    assert [env["name"] for env in listed] == ["platform", "bare"]
    platform, bare = listed
    assert platform["default"] is True and platform["torch"].startswith("2.13.0")
    assert platform["python"].startswith("3.11.")
    assert bare == {"name": "bare", "where": str(bare_venv), "python": platform["python"],
                    "torch": "", "default": False, "problem": ""}
    assert api.as_user(world.operator).get(url(local.cluster)).status_code == 200


def test_another_tenant_without_a_queue_there_gets_404(api, world, local):
    # The cluster is shared (beta sees it in the list), but beta runs nothing there.
    assert api.as_user(world.beta_admin).get(f"/api/v1/podsys/clusters/{local.cluster.name}/") \
        .status_code == 200
    response = api.as_user(world.beta_admin).get(url(local.cluster))
    assert response.status_code == 404, response.content
    assert response.json()["code"] == "not_found"
    api.force_authenticate(user=None)
    assert api.get(url(local.cluster)).status_code in {401, 403}
    # A tenant's own cluster stays invisible to the others altogether.
    local.cluster.tenant = world.alpha
    local.cluster.save(update_fields=["tenant"])
    assert api.as_user(world.beta_admin).get(url(local.cluster)).status_code == 404


def test_a_local_cluster_with_bad_environments_is_refused_at_registration(world):
    with pytest.raises(ValidationError) as info:
        cluster_create(actor=world.operator, name="bad", driver="local",
                       options={"environments": {"torch": "relative/env"}})
    assert "'torch' must be an absolute folder" in info.value.message_dict["options"][0]
    assert not Cluster.objects.filter(name="bad").exists()


def test_a_working_folder_is_refused_at_submission_where_the_pods_cannot_get_it(world,
                                                                                settings):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from aistation.services.workdirs import workdir_upload
    from aistation.tests.archives import TRAIN, tar_gz

    cluster = Cluster.objects.create(name="kube", driver="kubernetes",
                                     options={"default_image": "python:3.11"})
    Node.objects.create(cluster=cluster, name="gpu-0", gpus=8, cpu_cores=64, memory_mib=65536)
    cluster_refresh_capacity(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="kube", cluster=cluster)
    workdir, _ = workdir_upload(actor=world.alpha_member, tenant=world.alpha,
                                archive=SimpleUploadedFile("f.tar.gz", tar_gz(TRAIN)))
    # No artifacts volume: the init container would have no archive to unpack; every attempt
    # would fail at launch.
    with pytest.raises(ValidationError) as info:
        submit(world, queue, workdir=workdir)
    [message] = info.value.message_dict["workdir"]
    assert "Cluster kube cannot ship a working folder" in message and "artifacts_claim" in message
    assert submit(world, queue).workdir is None, "without a working folder it is taken"
    cluster.options = {**cluster.options, "artifacts_claim": "ogai-data",
                       "data_dir": str(settings.DATA_DIR)}
    cluster.save(update_fields=["options"])
    job = submit(world, queue, workdir=workdir)
    pod = list(yaml.safe_load_all(job_manifests(job=job)))[-1]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["name"] == "ogai-workdir"
