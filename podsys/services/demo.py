from django.contrib.auth import get_user_model
from django.db import transaction

from podsys.drivers.fake_state import shared_state_dir, state_file
from podsys.models import Cluster, Fleet, StackProfile
from podsys.services.clusters import cluster_create, cluster_sync_nodes
from podsys.services.fleets import fleet_create, pool_create

LOCAL_CLUSTER = "local"

# A fleet to try dispatch and capacity on demand without GPUs: two clusters of the fake driver
# and a pool of the simulated cloud, all on the wall clock (`podsys.drivers.fake_state`). Their
# work is simulated: a job there runs for OGAI_FAKE_DURATION_S (else 10 minutes) and ends.
DEMO_FLEET = "demo-fleet"
DEMO_FLEET_CLUSTERS = [
    ("sim-east", "Simulated east (2 x 8 H100)",
     {"nodes": 2, "gpu_model": "H100", "default_duration_s": 600}),
    ("sim-west", "Simulated west (1 x 8 A100)",
     {"nodes": 1, "gpu_model": "A100", "gpu_memory_mib": 81920, "default_duration_s": 600}),
]
DEMO_POOL = "burst"  # its nodes join sim-east, boot in a minute and go back 3 minutes idle
DEMO_POOL_TYPE = {"name": "h100x8", "gpu_model": "H100", "gpus": 8, "cpu_cores": 64,
                  "memory_mib": 524288, "price_per_hour": 20.0, "boot_s": 60}

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
    """Register this machine as the `local` cluster (GPUs found through NVML, else none), two
    example stack profiles, and the simulated demo fleet."""
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
    _seed_fleet(stdout)


def _seed_fleet(stdout) -> None:
    admin = get_user_model().objects.filter(is_staff=True, is_active=True).order_by("pk").first()
    if admin is None or Fleet.objects.filter(name=DEMO_FLEET).exists():
        return
    folder = shared_state_dir()
    clusters = {}
    for name, display_name, options in DEMO_FLEET_CLUSTERS:
        if folder is not None:  # left by an earlier demo whose database is gone
            state_file(folder, "cluster", name).unlink(missing_ok=True)
        clusters[name] = cluster_create(actor=admin, name=name, driver="fake",
                                        options=options, display_name=display_name)
        cluster_sync_nodes(cluster=clusters[name])
    fleet = fleet_create(actor=admin, name=DEMO_FLEET, clusters=list(clusters.values()),
                         display_name="Demo fleet (simulated)")
    if folder is not None:
        state_file(folder, "cloud", DEMO_POOL).unlink(missing_ok=True)
    pool = pool_create(
        actor=admin, fleet=fleet, name=DEMO_POOL, cluster=clusters["sim-east"],
        provider="podsys.providers.simulated.SimulatedProvider", node_type="h100x8",
        max_nodes=4, cool_down_s=180,
        provider_options={"joins": "sim-east", "types": [DEMO_POOL_TYPE],
                          "stock": {"h100x8": 4}})
    stdout.write(f"  fleet           {DEMO_FLEET}   {', '.join(clusters)} and pool "
                 f"{pool.name} (up to {pool.max_nodes} simulated {pool.node_type} "
                 "nodes)\n")
