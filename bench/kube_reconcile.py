"""A Kubernetes reconcile, by lists and by watches, on a large cluster (the fake API server).

The fake API server (tests/fakekube) is loaded straight into its store with 5,000 nodes and
50,000 pods (`--nodes`, `--pods`), realistic in size (labels, annotations, owner references, a
container with env, resources, volume mounts and a security context, conditions and container
statuses), in Indexed Jobs of 1 to 8 pods and 2-replica Deployments over 20 tenant namespaces.
Then, `--reconciles` times (3): 1% of the pods change at once (phase transitions, Jobs whose pods
all end, new Jobs with their pods, ended Jobs deleted with their pods, some of them ending and
deleted in the same round), and one reconcile (`status()` of every handle, then `nodes()`) runs
with the list-based driver (`watch: false`: one list per collection per call) and one with the
watch-based driver, on the same cluster state.

`watch_reconcile_ms` runs from the moment the change is made (all of it, under the server's
lock) to the moment the watch driver's `status()` and `nodes()` return having applied every
change: it includes the events' encoding, sending, decoding and applying, and the cheap
`limit=1` lists each call makes to learn the versions to wait for. `list_reconcile_ms` is the
same two calls by lists. Requests and bytes are counted on the server's side: every request and
every byte it sent (headers, bodies, the watch streams' events and bookmarks), from the change
to the end of the reconcile. Both drivers' answers are compared after every round: they must
be equal, except for workloads that ended and were deleted in the same round, which the list
driver reports missing and the watch driver ended (`ends_seen_only_by_watch`). The watches'
first list (`watch_start_ms`, once per process) is not part of a reconcile.

Server and drivers share this process (and its GIL); `gc.freeze()` after loading keeps the
collector off the server's store for both sides. `--quick` runs tiny sizes (a smoke test).
"""

import argparse
import gc
import json
import random
import resource
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from podsys.drivers import kube_watch  # noqa: E402
from podsys.drivers.base import Phase  # noqa: E402
from podsys.drivers.kubernetes import KubernetesDriver  # noqa: E402
from tests.fakekube.server import FakeKube  # noqa: E402

TENANTS = 20
STAMP = "2026-12-01T10:00:00Z"
LATER = "2026-12-01T11:00:00Z"
SIZES = (1, 2, 4, 8, 4, 2, 1, 8)  # pods per Job, in turn


def node_object(index: int) -> dict:
    name = f"gpu-{index:05d}"
    capacity = {"cpu": "96", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8",
                "ephemeral-storage": "3500Gi"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.present": "true", "topology.kubernetes.io/zone": f"z{index % 4}"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"podCIDR": f"10.{index // 250}.{index % 250}.0/24",
                 "taints": [{"key": "nvidia.com/gpu", "value": "present",
                             "effect": "NoSchedule"}]},
        "status": {
            "capacity": capacity, "allocatable": dict(capacity),
            "conditions": [
                {"type": t, "status": "False", "reason": f"Kubelet{r}",
                 "message": f"kubelet {m}", "lastHeartbeatTime": STAMP,
                 "lastTransitionTime": STAMP}
                for t, r, m in (("MemoryPressure", "HasSufficientMemory", "has memory"),
                                ("DiskPressure", "HasNoDiskPressure", "has no disk pressure"),
                                ("PIDPressure", "HasSufficientPID", "has sufficient PID"))]
            + [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status", "lastHeartbeatTime": STAMP,
                "lastTransitionTime": STAMP}],
            "addresses": [{"type": "InternalIP", "address": f"10.1.{index // 250}.{index % 250}"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": "amd64", "bootID": str(uuid.uuid4()),
                         "containerRuntimeVersion": "containerd://1.7.20",
                         "kernelVersion": "6.8.0-45-generic", "kubeProxyVersion": "v1.31.0",
                         "kubeletVersion": "v1.31.0", "machineID": uuid.uuid4().hex,
                         "operatingSystem": "linux", "osImage": "Ubuntu 24.04.1 LTS",
                         "systemUUID": str(uuid.uuid4())}}}


def labels_of(workload: str, tenant: str) -> dict:
    job = workload.split("-")[1]
    return {"app.kubernetes.io/managed-by": "ogai", "ogai.io/workload": workload,
            "ogai.io/tenant": tenant, "ogai.io/job": job, "ogai.io/attempt": "1"}


def container(workload: str, namespace: str, replicas: int) -> dict:
    return {
        "name": "main", "image": "registry.example.org/train:2026.11",
        "command": ["python", "-m", "ylink.runners.train", "--recipe", "pretrain",
                    "--steps", "100000"],
        "env": [{"name": "WORLD_SIZE", "value": str(replicas)},
                {"name": "RANK", "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.annotations['batch.kubernetes.io/"
                                 "job-completion-index']"}}},
                {"name": "MASTER_ADDR", "value": f"{workload}-0.{workload}.{namespace}.svc"},
                {"name": "MASTER_PORT", "value": "29500"},
                {"name": "NCCL_DEBUG", "value": "WARN"},
                {"name": "OGAI_RUN_DIR", "value": f"/data/runs/{workload}"}],
        "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "90", "memory": "960Gi"},
                      "requests": {"nvidia.com/gpu": "8", "cpu": "90", "memory": "960Gi"}},
        "volumeMounts": [{"name": "ogai-artifacts", "mountPath": f"/data/runs/{workload}",
                          "subPath": f"runs/{workload}"},
                         {"name": "ogai-shm", "mountPath": "/dev/shm"},  # noqa: S108
                         {"name": "ogai-artifacts", "mountPath": "/data/datasets/corpus",
                          "subPath": "datasets/corpus", "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}


def pod_template(workload: str, namespace: str, tenant: str, replicas: int) -> dict:
    return {"metadata": {"labels": labels_of(workload, tenant)},
            "spec": {"containers": [container(workload, namespace, replicas)],
                     "restartPolicy": "Never", "subdomain": workload,
                     "securityContext": {"runAsUser": 10007, "runAsGroup": 10007,
                                         "fsGroup": 10007},
                     "automountServiceAccountToken": False,
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                      "effect": "NoSchedule"}],
                     "volumes": [{"name": "ogai-artifacts", "persistentVolumeClaim": {
                         "claimName": "ogai-data"}},
                         {"name": "ogai-shm", "emptyDir": {"medium": "Memory",
                                                           "sizeLimit": "480Gi"}}]}}


def owner_object(kind: str, workload: str, namespace: str, tenant: str, replicas: int) -> dict:
    template = pod_template(workload, namespace, tenant, replicas)
    if kind == "Job":
        spec = {"completions": replicas, "parallelism": replicas, "completionMode": "Indexed",
                "backoffLimit": 0, "template": template, "suspend": False}
        status = {"active": replicas, "ready": replicas, "startTime": STAMP, "succeeded": 0,
                  "failed": 0}
        api = "batch/v1"
    else:
        spec = {"replicas": replicas, "selector": {"matchLabels": {
            "ogai.io/workload": workload}}, "template": template}
        status = {"replicas": replicas, "readyReplicas": replicas,
                  "availableReplicas": replicas, "observedGeneration": 1}
        api = "apps/v1"
    return {"apiVersion": api, "kind": kind,
            "metadata": {"name": workload, "namespace": namespace,
                         "uid": str(uuid.uuid4()), "labels": labels_of(workload, tenant)},
            "spec": spec, "status": status}


def pod_object(owner: dict, index: int, node: str, phase: str) -> dict:
    meta = owner["metadata"]
    workload, namespace = meta["name"], meta["namespace"]
    template = owner["spec"]["template"]
    labels = dict(template["metadata"]["labels"])
    annotations = {}
    if owner["kind"] == "Job":
        labels.update({"batch.kubernetes.io/job-completion-index": str(index),
                       "batch.kubernetes.io/controller-uid": meta["uid"],
                       "batch.kubernetes.io/job-name": workload, "job-name": workload})
        annotations["batch.kubernetes.io/job-completion-index"] = str(index)
    spec = json.loads(json.dumps(template["spec"]))
    spec.update(nodeName=node, hostname=f"{workload}-{index}", schedulerName="default-scheduler",
                dnsPolicy="ClusterFirst", serviceAccountName="default", priority=0,
                enableServiceLinks=True, preemptionPolicy="PreemptLowerPriority")
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{workload}-{index}-{uuid.uuid4().hex[:5]}",
                        "generateName": f"{workload}-{index}-", "namespace": namespace,
                        "labels": labels, "annotations": annotations,
                        "ownerReferences": [{"apiVersion": owner["apiVersion"],
                                             "kind": owner["kind"], "name": workload,
                                             "uid": meta["uid"], "controller": True,
                                             "blockOwnerDeletion": True}]},
           "spec": spec, "status": {}}
    return with_phase(pod, phase)


def with_phase(pod: dict, phase: str, exit_code: int = 0) -> dict:
    """A new pod dict (the old one is left as it was) in `phase`."""
    pod = {**pod, "metadata": dict(pod["metadata"])}
    if phase == "Pending":
        state, ready = {"waiting": {"reason": "ContainerCreating"}}, False
    elif phase == "Running":
        state, ready = {"running": {"startedAt": STAMP}}, True
    else:
        state, ready = {"terminated": {
            "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": STAMP, "finishedAt": LATER,
            "containerID": f"containerd://{uuid.uuid4().hex}"}}, False
    conditions = [{"type": t, "status": "True" if t in ("PodScheduled", "Initialized",
                                                        "PodReadyToStartContainers") or ready
                   else "False", "lastProbeTime": None, "lastTransitionTime": STAMP}
                  for t in ("PodReadyToStartContainers", "Initialized", "Ready",
                            "ContainersReady", "PodScheduled")]
    pod["status"] = {
        "phase": phase, "conditions": conditions, "hostIP": "10.1.0.1",
        "hostIPs": [{"ip": "10.1.0.1"}], "podIP": "10.244.3.17", "podIPs": [{"ip": "10.244.3.17"}],
        "startTime": STAMP, "qosClass": "Guaranteed",
        "containerStatuses": [{
            "name": "main", "image": "registry.example.org/train:2026.11",
            "imageID": "registry.example.org/train@sha256:" + "ab" * 32,
            "containerID": f"containerd://{uuid.uuid4().hex}", "ready": ready,
            "started": phase == "Running", "restartCount": 0, "state": state}]}
    return pod


def ended_job(job: dict, failed: bool) -> dict:
    job = {**job, "metadata": dict(job["metadata"]), "status": dict(job["status"])}
    kind = "Failed" if failed else "Complete"
    job["status"].update(active=0, ready=0, conditions=[{
        "type": kind, "status": "True", "lastProbeTime": LATER, "lastTransitionTime": LATER}])
    if not failed:
        job["status"]["succeeded"] = job["spec"]["completions"]
        job["status"]["completionTime"] = LATER
    else:
        job["status"]["failed"] = 1
    return job


class Cluster:
    """The bench's cluster: what it loaded and how it changes it."""

    def __init__(self, fake: FakeKube, nodes: int, pods: int, seed: int = 7) -> None:
        self.fake, self.random = fake, random.Random(seed)  # noqa: S311 - a repeatable load
        self.nodes = [f"gpu-{i:05d}" for i in range(nodes)]
        self.owners: dict[str, dict] = {}  # workload -> Job/Deployment
        self.pods: dict[str, list[dict]] = {}  # workload -> its pods
        self.serial = 0
        objects: list[dict] = [node_object(i) for i in range(nodes)]
        for t in range(TENANTS):
            objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": f"ogai-t{t}", "labels": {"kubernetes.io/metadata.name": f"ogai-t{t}"}},
                "status": {"phase": "Active"}})
        made = 0
        while made < pods:
            phase = self.random.choices(["Running", "Pending", "Succeeded"], [85, 10, 5])[0]
            owner, members = self._workload(min(self._size(), pods - made), phase)
            objects.append(owner)
            objects.extend(members)
            made += len(members)
        fake.load(objects)

    def _size(self) -> int:
        return SIZES[self.serial % len(SIZES)] if self.serial % 10 else 2

    def _workload(self, size: int, phase: str) -> tuple[dict, list[dict]]:
        self.serial += 1
        deployment = self.serial % 10 == 0
        name = f"{'svc' if deployment else 'job'}-{self.serial}-a1"
        tenant = f"t{self.serial % TENANTS}"
        owner = owner_object("Deployment" if deployment else "Job", name, f"ogai-{tenant}",
                             tenant, size)
        if phase == "Succeeded" and not deployment:
            owner = ended_job(owner, failed=False)
        elif phase == "Succeeded":
            phase = "Running"
        start = self.random.randrange(len(self.nodes))
        members = [pod_object(owner, i, self.nodes[(start + i) % len(self.nodes)], phase)
                   for i in range(size)]
        self.owners[name], self.pods[name] = owner, members
        return owner, members

    def change(self, count: int) -> dict:
        """Change about `count` pods at once: phase transitions, ends, new Jobs, deletions."""
        fake, rnd = self.fake, self.random
        changed, deleted, ended_and_deleted = 0, [], []
        jobs = [w for w, o in self.owners.items() if o["kind"] == "Job"]
        with fake.lock:
            # Half: one pod's phase moves on (Pending -> Running, or a Running pod restarts).
            for workload in rnd.sample(jobs, min(len(jobs), count // 2)):
                members = self.pods[workload]
                i = rnd.randrange(len(members))
                phase = members[i]["status"]["phase"]
                if phase in ("Succeeded", "Failed"):
                    continue
                members[i] = with_phase(members[i], "Running")
                if phase == "Running":
                    members[i]["status"]["containerStatuses"][0]["restartCount"] = 1
                fake.put_object(members[i])
                changed += 1
            # A fifth: whole Jobs end (a tenth of them fail); some are then deleted at once.
            running = [w for w in jobs if self.pods[w][0]["status"]["phase"] == "Running"]
            rnd.shuffle(running)
            budget = count // 5
            for workload in running:
                if budget <= 0:
                    break
                failed = rnd.random() < 0.1
                members = [with_phase(p, "Failed" if failed and i == 0 else "Succeeded",
                                      exit_code=3 if failed and i == 0 else 0)
                           for i, p in enumerate(self.pods[workload])]
                self.pods[workload] = members
                for pod in members:
                    fake.put_object(pod)
                self.owners[workload] = ended_job(self.owners[workload], failed)
                fake.put_object(self.owners[workload])
                budget -= len(members)
                changed += len(members)
                if rnd.random() < 0.2:
                    ended_and_deleted.append(workload)
            # A tenth: Jobs that ended before are deleted, with their pods (cleanup).
            finished = [w for w in jobs if w not in ended_and_deleted
                        and self.pods[w][0]["status"]["phase"] in ("Succeeded", "Failed")]
            budget = count // 10
            for workload in [*ended_and_deleted, *rnd.sample(finished, len(finished))]:
                if budget <= 0 and workload not in ended_and_deleted:
                    break
                for pod in self.pods.pop(workload):
                    fake.delete_object("Pod", pod["metadata"]["name"],
                                       pod["metadata"]["namespace"])
                    budget -= 1
                    changed += 1
                owner = self.owners.pop(workload)
                fake.delete_object("Job", workload, owner["metadata"]["namespace"])
                deleted.append(workload)
            # The rest: new Jobs, their pods bound and creating.
            budget = count - changed
            while budget > 0:
                owner, members = self._workload(min(self._size(), budget), "Pending")
                fake.put_object(owner)
                for pod in members:
                    fake.put_object(pod)
                budget -= len(members)
                changed += len(members)
        return {"changed": changed, "deleted": deleted, "ended_and_deleted": ended_and_deleted}


def reconcile(driver: KubernetesDriver, handles: list[str]) -> tuple[dict, list]:
    return driver.status(handles), driver.nodes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--reconciles", type=int, default=3)
    parser.add_argument("--change", type=float, default=0.01, help="share of pods changed")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.pods, args.reconciles = 20, 400, 2
    started = time.monotonic()
    fake = FakeKube().start()
    fake.watch_history = max(10_000, args.pods)
    try:
        cluster = Cluster(fake, args.nodes, args.pods)
        print(f"loaded {args.nodes} nodes, {args.pods} pods, {len(cluster.owners)} workloads "
              f"in {time.monotonic() - started:.1f} s", flush=True)
        options = {"kubeconfig": fake.kubeconfig(), "retry_delay_s": 0}
        listing = KubernetesDriver(cluster="bench", options={**options, "watch": False})
        # The lag bound only caps the wait: it ends as soon as every change is applied.
        watching = KubernetesDriver(cluster="bench", options={**options, "watch_lag_s": 30})
        handles = sorted(cluster.owners)
        t0 = time.perf_counter()
        reconcile(watching, handles)  # the watches' first lists
        watch_start_ms = (time.perf_counter() - t0) * 1000
        gc.collect()
        gc.freeze()
        rounds = []
        for round_ in range(args.reconciles):
            fake.reset_traffic()
            change = cluster.change(max(1, int(args.pods * args.change)))
            t0 = time.perf_counter()  # the change is made: the watches' events are on their way
            handles = sorted({*handles, *cluster.owners})
            seen, seen_nodes = reconcile(watching, handles)
            watch_ms = (time.perf_counter() - t0) * 1000
            watched = fake.reset_traffic()
            t0 = time.perf_counter()
            listed, listed_nodes = reconcile(listing, handles)
            list_ms = (time.perf_counter() - t0) * 1000
            traffic = fake.reset_traffic()
            # Both answer the same, but for what was deleted in this round having ended (this
            # round or before): the list finds nothing, the watches its end (tombstones).
            only_watch = sorted(h for h in handles if seen[h] != listed[h])
            assert set(only_watch) <= set(change["deleted"]), [
                (h, seen[h], listed[h]) for h in only_watch[:2]]
            assert all(listed[h].phase == Phase.MISSING and seen[h].phase in (
                Phase.SUCCEEDED, Phase.FAILED) for h in only_watch)
            assert set(change["ended_and_deleted"]) <= set(only_watch)
            assert seen_nodes == listed_nodes
            handles = sorted(h for h in handles if h in cluster.owners)
            rounds.append({"list_ms": list_ms, "watch_ms": watch_ms, "list": traffic,
                           "watch": watched, "changed": change["changed"],
                           "ends_seen_only_by_watch": len(change["ended_and_deleted"])})
            print(f"round {round_ + 1}: {change['changed']} pods changed; list {list_ms:.0f} ms "
                  f"{traffic['requests']} requests {traffic['bytes']:,} bytes; watch "
                  f"{watch_ms:.0f} ms {watched['requests']} requests {watched['bytes']:,} bytes"
                  f" ({len(change['ended_and_deleted'])} ended and deleted in the round: seen "
                  "ended by the watches only)", flush=True)
    finally:
        kube_watch.stop_all()
        fake.stop()

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    list_ms = mean([r["list_ms"] for r in rounds])
    watch_ms = mean([r["watch_ms"] for r in rounds])
    bytes_listed = mean([r["list"]["bytes"] for r in rounds])
    bytes_watched = mean([r["watch"]["bytes"] for r in rounds])
    print(json.dumps({
        "nodes": args.nodes, "pods": args.pods, "reconciles": args.reconciles,
        "pods_changed_per_reconcile": mean([r["changed"] for r in rounds]),
        "list_reconcile_ms": round(list_ms, 1), "watch_reconcile_ms": round(watch_ms, 1),
        "list_requests": mean([r["list"]["requests"] for r in rounds]),
        "watch_requests": mean([r["watch"]["requests"] for r in rounds]),
        "bytes_listed": round(bytes_listed), "bytes_watched": round(bytes_watched),
        "time_ratio": round(list_ms / watch_ms, 1),
        "bytes_ratio": round(bytes_listed / max(bytes_watched, 1), 1),
        "ends_seen_only_by_watch": sum(r["ends_seen_only_by_watch"] for r in rounds),
        "watch_start_ms": round(watch_start_ms, 1),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "wall_s": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()
