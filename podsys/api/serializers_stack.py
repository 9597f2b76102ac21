"""Stack profiles and deployment runs in the API."""

from rest_framework import serializers

from infra_os.models.tenancy import slug_validator
from podsys.choices import (
    ContainerRuntime,
    DeploymentKind,
    Orchestrator,
    OsFamily,
    TaskStatus,
)
from podsys.models import Cluster, DeploymentRun, DeploymentTaskResult, StackProfile
from podsys.selectors_stack import HOST_STATE_CHOICES


class StackProfileSerializer(serializers.ModelSerializer):
    deployment_count = serializers.IntegerField(
        read_only=True, help_text="Deployment runs that used this profile.")

    class Meta:
        model = StackProfile
        fields = ["id", "name", "description", "os_family", "driver_version", "cuda_version",
                  "cudnn_version", "nccl_version", "ofed_version", "container_runtime",
                  "container_toolkit_version", "dcgm_version", "orchestrator",
                  "orchestrator_version", "offline_mirror", "deployment_count", "created_at",
                  "updated_at"]
        read_only_fields = fields


def _version(help_text: str, *, required: bool = False) -> serializers.CharField:
    if required:
        return serializers.CharField(max_length=32, help_text=help_text)
    return serializers.CharField(max_length=32, allow_blank=True, default="",
                                 help_text=help_text)


class StackProfileCreateSerializer(serializers.Serializer):
    """The versions a node runs; checked against OGAI's compatibility matrix (a refusal names
    the field and the reason)."""

    name = serializers.CharField(max_length=63, validators=[slug_validator])
    description = serializers.CharField(max_length=200, allow_blank=True, default="")
    os_family = serializers.ChoiceField(choices=OsFamily.choices, default=OsFamily.UBUNTU_2204)
    driver_version = _version("NVIDIA driver, e.g. 550.127.05.", required=True)
    cuda_version = _version("CUDA toolkit, e.g. 12.4.", required=True)
    cudnn_version = _version("cuDNN, e.g. 9.5; empty: none.")
    nccl_version = _version("NCCL, e.g. 2.21; empty: none.")
    ofed_version = _version("MLNX/DOCA OFED, e.g. 24.10-1.1.4.0; empty: no InfiniBand stack.")
    container_runtime = serializers.ChoiceField(choices=ContainerRuntime.choices,
                                                default=ContainerRuntime.CONTAINERD)
    container_toolkit_version = _version("NVIDIA container toolkit, e.g. 1.17; empty: latest.")
    dcgm_version = _version("DCGM, e.g. 4.2; empty: none.")
    orchestrator = serializers.ChoiceField(choices=Orchestrator.choices,
                                           default=Orchestrator.KUBERNETES)
    orchestrator_version = _version("Kubernetes (e.g. 1.31) or Slurm (e.g. 24.05) version.")
    offline_mirror = serializers.CharField(
        max_length=500, allow_blank=True, default="",
        help_text="A package mirror (a path on the nodes, or an http(s) URL inside the site): "
        "set, every package comes from it and nothing from the internet.")


class StackProfileUpdateSerializer(StackProfileCreateSerializer):
    """Any of a profile's fields; the whole profile is checked again."""


class DeploymentRunSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    profile = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                              allow_null=True)
    failed_tasks = serializers.IntegerField(read_only=True, default=0,
                                            help_text="Failed or unreachable task results.")

    class Meta:
        model = DeploymentRun
        fields = ["id", "cluster", "kind", "profile", "playbook", "hosts", "check_mode",
                  "extra_vars", "state", "rerun_of", "created_by", "started_at",
                  "finished_at", "rc", "stats", "message", "failed_tasks", "created_at"]
        read_only_fields = fields


class DeploymentRunCreateSerializer(serializers.Serializer):
    cluster = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all(),
                                           help_text="The cluster's name.")
    kind = serializers.ChoiceField(choices=[DeploymentKind.STACK], default=DeploymentKind.STACK,
                                   help_text="Stack deployments here; accounts are pushed "
                                   "under /cluster-users/push/.")
    profile = serializers.SlugRelatedField(slug_field="name",
                                           queryset=StackProfile.objects.all(),
                                           help_text="The stack profile's name.")
    hosts = serializers.ListField(child=serializers.CharField(max_length=253), min_length=1,
                                  max_length=5000, help_text="Node names of the cluster.")
    check_mode = serializers.BooleanField(
        default=False, help_text="Ansible's check mode: report what would change, change "
        "nothing.")
    extra_vars = serializers.DictField(
        default=dict, help_text="More playbook variables (stack_min_free_gib, "
        "stack_allow_reboot, stack_fabric_manager, ...); never secrets: they are stored.")


class DeploymentTaskResultSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeploymentTaskResult
        fields = ["host", "position", "play", "role", "task", "status", "changed", "output",
                  "started_at", "finished_at", "duration_s"]
        read_only_fields = fields


class DeploymentGridTaskSerializer(serializers.Serializer):
    position = serializers.IntegerField()
    task = serializers.CharField()
    role = serializers.CharField()


class DeploymentGridCellSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=TaskStatus.choices)
    changed = serializers.BooleanField()
    output = serializers.CharField(help_text="The task's output where it failed or was "
                                   "unreachable; empty for the others.")
    duration_s = serializers.FloatField(allow_null=True)


class DeploymentGridHostSerializer(serializers.Serializer):
    host = serializers.CharField()
    state = serializers.ChoiceField(choices=HOST_STATE_CHOICES)
    cells = serializers.ListField(
        child=DeploymentGridCellSerializer(allow_null=True),
        help_text="One per task, in the order of `tasks`; null where the node has not reached "
        "that task.")
    failed_task = serializers.CharField(help_text="The task the node failed at, if it did.")
    output = serializers.CharField(help_text="That task's output.")


class DeploymentGridSerializer(serializers.Serializer):
    tasks = DeploymentGridTaskSerializer(many=True)
    hosts = DeploymentGridHostSerializer(many=True)
