from django.db import transaction

from podsys.models import Cluster, StackProfile
from podsys.services.clusters import cluster_sync_nodes

LOCAL_CLUSTER = "local"

# Two stacks an operator would start from, checked against the compatibility matrix like any.
DEMO_PROFILES = [
    {"name": "h100-ubuntu2204-k8s",
     "description": "H100 nodes for Kubernetes: driver 550, CUDA 12.4, InfiniBand",
     "os_family": "ubuntu22.04", "driver_version": "550.127.05", "cuda_version": "12.4",
     "cudnn_version": "9.1.0", "nccl_version": "2.21.5", "ofed_version": "24.10-1.1.4.0",
     "container_runtime": "containerd", "container_toolkit_version": "1.16.2",
     "dcgm_version": "3.3.7", "orchestrator": "kubernetes", "orchestrator_version": "1.30"},
    {"name": "a100-rocky9-slurm",
     "description": "A100 nodes for Slurm: driver 535, CUDA 12.2, no InfiniBand",
     "os_family": "rhel9", "driver_version": "535.183.01", "cuda_version": "12.2",
     "cudnn_version": "8.9.7", "nccl_version": "2.19.3",
     "container_runtime": "containerd", "container_toolkit_version": "1.16.2",
     "dcgm_version": "3.3.7", "orchestrator": "slurm", "orchestrator_version": "23.11"},
]


@transaction.atomic
def demo_seed(*, stdout) -> None:
    """Register this machine as the `local` cluster (GPUs found through NVML, else none), and
    two example stack profiles."""
    cluster, created = Cluster.objects.get_or_create(
        name=LOCAL_CLUSTER,
        defaults={"driver": "local", "display_name": "This machine"},
    )
    nodes = cluster_sync_nodes(cluster=cluster)
    if created:
        gpus = sum(node.gpus for node in nodes)
        cpus = sum(node.cpu_cores for node in nodes)
        stdout.write(f"  cluster         local        {gpus} GPUs, {cpus:g} CPU cores\n")
    for fields in DEMO_PROFILES:
        if StackProfile.objects.filter(name=fields["name"]).exists():
            continue
        profile = StackProfile(**fields)
        profile.full_clean()
        profile.save()
        stdout.write(f"  stack profile   {profile.name}\n")
