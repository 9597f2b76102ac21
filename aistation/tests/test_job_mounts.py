"""The folders of the data directory a job may mount: what the platform hands it, reached
through no link but the platform's own (a Slurm run's folder moved to the cluster's shared
path)."""

import os

import pytest

from aistation.services.jobs import job_submit
from podsys.drivers.base import DataMount

pytestmark = pytest.mark.django_db

TENANTS_UID = 1_990_000_009


@pytest.fixture
def data_dir(settings, tmp_path):
    data = tmp_path / "data"
    (data / "ylink").mkdir(parents=True)
    settings.DATA_DIR = data
    return data


def _submit(world, queue, path):
    return job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="reads",
                      command=["true"], mounts=[DataMount(str(path))])


def test_a_mount_through_a_link_a_tenant_planted_is_refused(world, local_queue, data_dir,
                                                            tmp_path):
    other = tmp_path / "another-tenants"
    other.mkdir()
    planted = data_dir / "ylink" / "output"
    planted.symlink_to(other)
    os.lchown(planted, TENANTS_UID, TENANTS_UID)  # written by a job as its tenant's account
    with pytest.raises(ValueError, match="is not a folder inside the data directory"):
        _submit(world, local_queue, planted)
    with pytest.raises(ValueError, match="is not a folder inside the data directory"):
        _submit(world, local_queue, planted / "model")
    with pytest.raises(ValueError, match="is not a folder inside the data directory"):
        _submit(world, local_queue, data_dir / "ylink" / ".." / "..")


def test_a_mount_through_the_platforms_own_link_is_handed_out(world, local_queue, data_dir,
                                                              tmp_path):
    home = tmp_path / "shared" / "data" / "ylink" / "run"
    home.mkdir(parents=True)
    moved = data_dir / "ylink" / "run"
    moved.symlink_to(home)  # the platform's: a Slurm run's folder on the shared path
    job = _submit(world, local_queue, moved)
    assert job.mounts == [{"path": str(moved), "read_only": True}]
