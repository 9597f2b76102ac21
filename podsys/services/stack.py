"""Software-stack profiles: the versions a GPU node runs, checked against the compatibility
matrix (`podsys.compat`) whenever one is created or changed."""

from django.core.exceptions import ValidationError
from django.db import transaction

from infra_os.access import require_platform_admin
from infra_os.services.audit import audit_record
from podsys import compat
from podsys.models import StackProfile

# What an operator sets on a profile (everything but its timestamps).
PROFILE_FIELDS = (
    "name", "description", "os_family", "driver_version", "cuda_version", "cudnn_version",
    "nccl_version", "ofed_version", "container_runtime", "container_toolkit_version",
    "dcgm_version", "orchestrator", "orchestrator_version", "offline_mirror",
)


def _check_fields(fields: dict) -> None:
    unknown = sorted(set(fields) - set(PROFILE_FIELDS))
    if unknown:
        raise ValidationError({unknown[0]: f"A stack profile has no field {unknown[0]!r}."})


def _clean_values(fields: dict) -> dict:
    return {key: value.strip() if isinstance(value, str) else value
            for key, value in fields.items()}


@transaction.atomic
def stack_profile_create(*, actor, **fields) -> StackProfile:
    """A new profile; refused, field by field with the reason, when the matrix refuses it."""
    require_platform_admin(actor)
    _check_fields(fields)
    profile = StackProfile(**_clean_values(fields))
    profile.full_clean()
    profile.save()
    audit_record(actor=actor, action="stack_profile.create", obj=profile,
                 changes={field: getattr(profile, field) for field in PROFILE_FIELDS})
    return profile


@transaction.atomic
def stack_profile_update(*, actor, profile: StackProfile, **fields) -> StackProfile:
    """Change some fields of a profile; the whole profile is checked again. Nodes already
    deployed keep what they run until the next deployment."""
    require_platform_admin(actor)
    _check_fields(fields)
    profile = StackProfile.objects.select_for_update().get(pk=profile.pk)
    changes = {}
    for field, value in _clean_values(fields).items():
        if getattr(profile, field) != value:
            changes[field] = {"from": getattr(profile, field), "to": value}
            setattr(profile, field, value)
    if not changes:
        return profile
    profile.full_clean()
    profile.save()
    audit_record(actor=actor, action="stack_profile.update", obj=profile, changes=changes)
    return profile


@transaction.atomic
def stack_profile_delete(*, actor, profile: StackProfile) -> None:
    """Delete a profile no deployment used; one that was deployed stays, as their record."""
    require_platform_admin(actor)
    used = profile.deployments.count()
    if used:
        raise ValidationError({"name": f"Profile {profile.name} was deployed by {used} "
                               f"deployment run{'s' if used != 1 else ''}; it stays as their "
                               "record."})
    audit_record(actor=actor, action="stack_profile.delete", obj=profile,
                 changes={"name": profile.name})
    profile.delete()


def _mirror_url(mirror: str) -> str:
    """A path on the nodes becomes a file:/// URL, which apt, dnf and get_url all read."""
    mirror = mirror.rstrip("/")
    return f"file://{mirror}" if mirror.startswith("/") else mirror


def stack_profile_vars(profile: StackProfile) -> dict:
    """The stack playbook's variables for a profile (all `stack_*`): its versions, and what the
    roles derive from them (package names, the CUDA major, the OS's package manager)."""
    os_entry = compat.matrix()["os_families"][profile.os_family]
    cuda = compat.series(profile.cuda_version)
    ofed_series = profile.ofed_version.split("-")[0] if profile.ofed_version else ""
    return {
        "stack_profile": profile.name,
        "stack_os_family": profile.os_family,
        "stack_os_distributions": list(os_entry["distributions"]),
        "stack_os_version": os_entry["version"],
        "stack_package_manager": os_entry["package_manager"],
        "stack_repo_os": os_entry["repo"],
        "stack_driver_version": profile.driver_version,
        "stack_driver_branch": compat.driver_branch(profile.driver_version),
        "stack_driver_cuda_major": compat.driver_cuda_major(profile.driver_version),
        "stack_cuda_version": cuda,
        "stack_cuda_major": compat.version_tuple(cuda)[0],
        "stack_cuda_package": cuda.replace(".", "-"),
        "stack_cudnn_version": profile.cudnn_version,
        "stack_nccl_version": profile.nccl_version,
        "stack_ofed_version": profile.ofed_version,
        "stack_ofed_series": ofed_series,
        "stack_ofed_package": (compat.matrix()["ofed"][ofed_series]["package"]
                               if ofed_series else ""),
        "stack_container_runtime": profile.container_runtime,
        "stack_container_toolkit_version": profile.container_toolkit_version,
        "stack_dcgm_version": profile.dcgm_version,
        "stack_orchestrator": profile.orchestrator,
        "stack_orchestrator_version": profile.orchestrator_version,
        "stack_orchestrator_series": (compat.series(profile.orchestrator_version)
                                      if profile.orchestrator_version else ""),
        "stack_offline_mirror": _mirror_url(profile.offline_mirror),
    }
