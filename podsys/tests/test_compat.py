"""The compatibility matrix: a profile it refuses is refused with the reason, naming the field."""

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from podsys.choices import DeploymentKind, OsFamily
from podsys.compat import matrix, profile_problems
from podsys.models import DeploymentRun, StackProfile
from podsys.services.stack import (
    stack_profile_create,
    stack_profile_delete,
    stack_profile_update,
    stack_profile_vars,
)
from tests.factories import ClusterFactory

GOOD = {
    "name": "h100", "os_family": "ubuntu22.04", "driver_version": "550.127.05",
    "cuda_version": "12.4", "cudnn_version": "9.5", "nccl_version": "2.21",
    "ofed_version": "24.10-1.1.4.0", "container_runtime": "containerd",
    "container_toolkit_version": "1.17", "dcgm_version": "4.2", "orchestrator": "kubernetes",
    "orchestrator_version": "1.31",
}


def problems(**changes) -> dict[str, str]:
    return profile_problems(StackProfile(**{**GOOD, **changes}))


def test_a_sound_profile_passes():
    assert problems() == {}
    assert problems(os_family="rhel9", orchestrator="slurm", orchestrator_version="24.05",
                    ofed_version="", dcgm_version="") == {}
    assert problems(orchestrator="none", orchestrator_version="", container_runtime="docker") == {}


# NVIDIA's published minimum Linux driver per CUDA version, and the release just below it.
@pytest.mark.parametrize(("cuda", "minimum", "below"), [
    ("11.8", "520.61.05", "520.61.04"),
    ("12.0", "525.60.13", "525.60.12"),
    ("12.1", "530.30.02", "530.30.01"),
    ("12.2", "535.54.03", "535.54.02"),
    ("12.3", "545.23.06", "545.23.05"),
    ("12.4", "550.54.14", "550.54.13"),
    ("12.5", "555.42.02", "555.42.01"),
    ("12.6", "560.28.03", "560.28.02"),
    ("12.8", "570.26", "570.25"),
    ("12.9", "575.51.03", "575.51.02"),
    ("13.0", "580.65.06", "580.65.05"),
])
def test_each_cuda_needs_its_published_minimum_driver(cuda, minimum, below):
    base = {"cuda_version": cuda, "cudnn_version": "", "nccl_version": "", "dcgm_version": ""}
    assert "driver_version" not in problems(driver_version=minimum, **base)
    reason = problems(driver_version=below, **base)["driver_version"]
    assert f"Driver {below} is too old for CUDA {cuda}" in reason
    assert minimum in reason


def test_a_driver_too_old_for_the_cuda_version_names_both():
    reason = problems(driver_version="535.183.01", cuda_version="12.4")["driver_version"]
    assert reason == ("Driver 535.183.01 is too old for CUDA 12.4: CUDA 12.4 needs driver "
                      "550.54.14 or newer.")
    # A patch release of CUDA is judged by its series.
    assert "driver_version" in problems(driver_version="535.183.01", cuda_version="12.4.1")


@pytest.mark.parametrize(("field", "value", "text"), [
    ("cuda_version", "12.7", "Unknown CUDA version 12.7"),
    ("cuda_version", "twelve", "Unknown CUDA version twelve"),
    ("driver_version", "999.10.01", "Unknown driver branch R999"),
    ("driver_version", "latest", "not an NVIDIA driver version"),
    ("cudnn_version", "7.6", "Unknown cuDNN version 7.6"),
    ("nccl_version", "2.9", "Unknown NCCL version 2.9"),
    ("dcgm_version", "2.4", "Unknown DCGM version 2.4"),
    ("ofed_version", "5.8-1.0.1.1", "Unknown OFED version 5.8-1.0.1.1"),
    ("container_toolkit_version", "1.2", "Unknown NVIDIA container toolkit version 1.2"),
    ("orchestrator_version", "1.20", "Unknown Kubernetes version 1.20"),
    ("os_family", "debian12", "Unknown OS version debian12"),
])
def test_unknown_versions_are_refused(field, value, text):
    assert text in problems(**{field: value})[field]


@pytest.mark.parametrize(("changes", "field", "text"), [
    # cuDNN 9.11 and NCCL 2.22 have no CUDA 11 build.
    ({"driver_version": "520.61.05", "cuda_version": "11.8", "cudnn_version": "9.11",
      "nccl_version": "2.21", "dcgm_version": "3.3"},
     "cudnn_version", "cuDNN 9.11 has no build for CUDA 11.8 (CUDA 11); it is built for CUDA 12"),
    ({"driver_version": "520.61.05", "cuda_version": "11.8", "cudnn_version": "9.5",
      "nccl_version": "2.22", "dcgm_version": "3.3"},
     "nccl_version", "NCCL 2.22 has no build for CUDA 11.8"),
    # CUDA 13 builds start with cuDNN 9.13 and NCCL 2.27.
    ({"driver_version": "580.65.06", "cuda_version": "13.0", "cudnn_version": "9.5",
      "nccl_version": "2.27", "dcgm_version": "4.4"},
     "cudnn_version", "cuDNN 9.5 has no build for CUDA 13.0"),
    # DCGM 3.x has no build for an R580 (CUDA 13) driver.
    ({"driver_version": "580.65.06", "cuda_version": "13.0", "cudnn_version": "9.13",
      "nccl_version": "2.28", "dcgm_version": "3.3"},
     "dcgm_version", "DCGM 3.3 has no build for driver 580.65.06 (CUDA 13)"),
    # MLNX OFED 23.10 does not ship for Ubuntu 24.04; CUDA 12.4 neither.
    ({"os_family": "ubuntu24.04", "driver_version": "555.42.06", "cuda_version": "12.5",
      "ofed_version": "23.10-3.2.2.0"},
     "ofed_version", "OFED 23.10-3.2.2.0 does not ship for ubuntu24.04"),
    ({"os_family": "ubuntu24.04"}, "cuda_version", "CUDA 12.4 has no packages for ubuntu24.04"),
    # Kubernetes needs containerd; a version is required.
    ({"container_runtime": "docker"}, "container_runtime", "Kubernetes dropped docker support"),
    ({"orchestrator_version": ""}, "orchestrator_version", "Give the Kubernetes version"),
    ({"orchestrator": "slurm", "orchestrator_version": ""}, "orchestrator_version",
     "Give the Slurm version"),
    ({"orchestrator": "none"}, "orchestrator_version", "Bare nodes take no orchestrator version"),
    ({"offline_mirror": "mirror/here"}, "offline_mirror", "absolute path"),
])
def test_combinations_the_matrix_refuses(changes, field, text):
    found = problems(**changes)
    assert text in found[field], found
    assert len(found) == 1, found


def test_the_matrix_fixes_come_back_clean():
    assert problems(driver_version="580.65.06", cuda_version="13.0", cudnn_version="9.13",
                    nccl_version="2.28", dcgm_version="4.4") == {}
    assert problems(offline_mirror="/srv/mirror") == {}
    assert problems(offline_mirror="http://mirror.site.internal/gpu") == {}


def test_the_matrix_names_real_operating_systems_only():
    families = set(matrix()["os_families"])
    assert families == set(OsFamily.values)
    for table in ("cuda", "ofed"):
        for entry in matrix()[table].values():
            assert set(entry["os"]) <= families


def test_the_service_refuses_with_the_reason(world):
    with pytest.raises(ValidationError) as refused:
        stack_profile_create(actor=world.operator, **{**GOOD, "driver_version": "535.54.03"})
    reason = refused.value.message_dict["driver_version"][0]
    assert "535.54.03" in reason and "12.4" in reason
    assert not StackProfile.objects.exists()

    with pytest.raises(PermissionDenied):
        stack_profile_create(actor=world.alpha_admin, **GOOD)
    with pytest.raises(ValidationError) as refused:
        stack_profile_create(actor=world.operator, **GOOD, gpu_count=8)
    assert "gpu_count" in refused.value.message_dict


def test_updates_are_checked_again_and_deployed_profiles_stay(world):
    profile = stack_profile_create(actor=world.operator, **GOOD)
    with pytest.raises(ValidationError) as refused:
        stack_profile_update(actor=world.operator, profile=profile, cuda_version="12.8")
    assert "too old for CUDA 12.8" in refused.value.message_dict["driver_version"][0]
    profile.refresh_from_db()
    assert profile.cuda_version == "12.4"

    profile = stack_profile_update(actor=world.operator, profile=profile, cuda_version="12.8",
                                   driver_version="570.86.15")
    assert (profile.driver_version, profile.cuda_version) == ("570.86.15", "12.8")

    DeploymentRun.objects.create(cluster=ClusterFactory(), kind=DeploymentKind.STACK,
                                 profile=profile, playbook="stack.yml", hosts=["n1"])
    with pytest.raises(ValidationError) as refused:
        stack_profile_delete(actor=world.operator, profile=profile)
    assert "deployed by 1 deployment run" in refused.value.message_dict["name"][0]
    profile.deployments.all().delete()
    stack_profile_delete(actor=world.operator, profile=profile)
    assert not StackProfile.objects.exists()


def test_the_playbook_gets_the_profile_as_variables():
    variables = stack_profile_vars(StackProfile(**{**GOOD, "offline_mirror": "/srv/mirror/"}))
    assert variables["stack_package_manager"] == "apt"
    assert variables["stack_repo_os"] == "ubuntu2204"
    assert variables["stack_driver_branch"] == 550
    assert variables["stack_cuda_package"] == "12-4"
    assert variables["stack_cuda_major"] == 12
    assert variables["stack_ofed_package"] == "doca-ofed"
    assert variables["stack_orchestrator_series"] == "1.31"
    assert variables["stack_offline_mirror"] == "file:///srv/mirror"
    rhel = stack_profile_vars(StackProfile(**{**GOOD, "os_family": "rhel9"}))
    assert (rhel["stack_package_manager"], rhel["stack_offline_mirror"]) == ("dnf", "")
