"""A job's network on Kubernetes (`kube_networks`, `kube_manifests`): the cluster options that
offer networks and RDMA devices, what a rendered pod carries for them (exactly), the RDMA
namespace and the attacks on the tenant boundary it must hold; and the pure helpers the
driver's node inventory uses."""

import json
from dataclasses import replace

import pytest

from podsys.drivers.base import DataMount, Resources, Volume, Workload
from podsys.drivers.kube_manifests import (
    KubeOptions,
    namespace_labels,
    namespace_object,
    tenant_policies,
    workload_namespace,
    workload_objects,
)
from podsys.drivers.kube_networks import (
    check_namespace_owner,
    check_rdma_pod,
    node_rdma,
    parse_networks,
    pod_rdma,
)
from podsys.drivers.kube_security import container_security_context
from tests.fakekube import fake_kube, pod_security  # noqa: F401  (fake_kube: a fixture)

RDMA = "rdma/rdma_shared_device_a"
NETWORKS = {
    "ib-a": {"definition": "net-ops/ib-a", "hcas": ["mlx5_0", "mlx5_1"]},
    "roce": {"definition": "net-ops/roce-b", "interface": "roce0", "hcas": ["mlx5_2"]},
    "private": {"definition": "team-b/fabric", "tenants": ["team-b"]},
}


def opts(**changes) -> KubeOptions:
    return KubeOptions.from_options({"default_image": "trainer:1", "rdma_resource": RDMA,
                                     "networks": NETWORKS, **changes})


def workload(**changes) -> Workload:
    base = Workload(id="job-7-a1", command=("python", "train.py"),
                    resources=Resources(gpus=8, cpu_cores=16, memory_mib=65536),
                    replicas=2, labels={"ogai.tenant": "team-a", "ogai.job": "7"},
                    run_as=20005)
    return replace(base, **changes)


def job_of(objects: list[dict]) -> dict:
    return next(o for o in objects if o["kind"] == "Job")


def pod_of(objects: list[dict]) -> dict:
    return job_of(objects)["spec"]["template"]


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# -- the options ------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "words"), [
    ({"networks": ["ib-a"]}, "must be a dict"),
    ({"networks": {"IB": {"definition": "a/b"}}}, "network name 'IB' is not a DNS-1123 label"),
    ({"networks": {"ib": {}}}, "'definition' must name the NetworkAttachmentDefinition"),
    ({"networks": {"ib": {"definition": "ib-a"}}}, "as 'namespace/name'"),
    ({"networks": {"ib": {"definition": "Net/ib"}}}, "definition namespace 'Net'"),
    ({"networks": {"ib": {"definition": "a/b", "interface": "eth0/1"}}}, "interface"),
    ({"networks": {"ib": {"definition": "a/b", "interface": "averyveryverylongname"}}},
     "interface"),
    ({"networks": {"ib": {"definition": "a/b", "hcas": "mlx5_0"}}}, "must be a list"),
    ({"networks": {"ib": {"definition": "a/b", "hcas": ["mlx5 0"]}}}, "HCA 'mlx5 0'"),
    ({"networks": {"ib": {"definition": "a/b", "mtu": 9000}}}, "unknown key 'mtu'"),
    ({"networks": {"a": {"definition": "x/a", "interface": "ib0"},
                   "b": {"definition": "x/b", "interface": "ib0"}}}, "also network 'a'"),
    ({"rdma_resource": "rdma"}, "not an extended resource name"),
    ({"rdma_resource": "nvidia.com/gpu"}, "not an extended resource name"),
    ({"rdma_resource": "kubernetes.io/hugepages"}, "not an extended resource name"),
    ({"rdma_resource": 4}, "must be a str"),
])
def test_bad_network_options_are_refused_by_name(options, words):
    with pytest.raises(ValueError, match="cluster option") as info:
        KubeOptions.from_options({"default_image": "x", **options})
    assert words in str(info.value)


def test_the_options_parse_into_attachments():
    parsed = parse_networks(NETWORKS)
    assert parsed["roce"].interface == "roce0"
    assert parsed["ib-a"].hcas == ("mlx5_0", "mlx5_1")
    assert parsed["private"].tenants == ("team-b",)


# -- the pod ----------------------------------------------------------------------------------


def test_an_rdma_pod_carries_exactly_the_annotation_resources_capability_and_environment():
    objects = workload_objects(workload(networks=("ib-a", "roce"),
                                        resources=Resources(gpus=8, cpu_cores=16,
                                                            memory_mib=65536, rdma=2)), opts())
    template = pod_of(objects)
    assert template["metadata"]["annotations"] == {
        "k8s.v1.cni.cncf.io/networks":
            '[{"name":"ib-a","namespace":"net-ops"},'
            '{"name":"roce-b","namespace":"net-ops","interface":"roce0"}]'}
    [container] = template["spec"]["containers"]
    amounts = {"cpu": "16", "memory": "65536Mi", "nvidia.com/gpu": "8", RDMA: "2"}
    assert container["resources"] == {"requests": amounts, "limits": amounts}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "privileged": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}
    env = env_of(container)
    assert env["NCCL_SOCKET_IFNAME"] == "net1,roce0"
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1,mlx5_2"
    # Memory-backed /dev/shm, half the replica's memory (at least 1Gi, or the cluster's
    # shm_size), as every pod has.
    shm = next(v for v in template["spec"]["volumes"] if v["name"] == "ogai-shm")
    assert shm == {"name": "ogai-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "32768Mi"}}
    assert {"name": "ogai-shm", "mountPath": "/dev/shm"} in container["volumeMounts"]  # noqa: S108
    # The pods and their peers' objects are in the tenant's RDMA namespace.
    assert {o["metadata"]["namespace"] for o in objects} == {"ogai-team-a-rdma"}
    assert env["MASTER_ADDR"] == "job-7-a1-0.job-7-a1.ogai-team-a-rdma.svc"


def test_attachments_alone_add_only_the_annotation_and_the_interface():
    plain = workload_objects(workload(), opts())
    attached = workload_objects(workload(networks=("roce",)), opts())
    template = pod_of(attached)
    assert json.loads(template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"]) == [
        {"name": "roce-b", "namespace": "net-ops", "interface": "roce0"}]
    [container] = template["spec"]["containers"]
    # No RDMA: no HCA, no capability, no RDMA resource, and the tenant's own namespace.
    assert env_of(container)["NCCL_SOCKET_IFNAME"] == "roce0"
    assert "NCCL_IB_HCA" not in env_of(container)
    assert container["securityContext"] == container_security_context()
    assert RDMA not in container["resources"]["limits"]
    assert {o["metadata"]["namespace"] for o in attached} == {"ogai-team-a"}
    # Take the network away and it is the plain pod again.
    del template["metadata"]["annotations"]
    container["env"] = [e for e in container["env"] if e["name"] != "NCCL_SOCKET_IFNAME"]
    assert attached == plain


def test_a_job_without_a_network_renders_as_before():
    objects = workload_objects(workload(), opts())
    plain = workload_objects(workload(), KubeOptions.from_options({"default_image": "trainer:1"}))
    assert objects == plain  # the cluster offering networks changes nothing for it
    template = pod_of(objects)
    assert "annotations" not in template["metadata"]
    [container] = template["spec"]["containers"]
    assert not any(e["name"].startswith("NCCL_") for e in container["env"])
    assert container["securityContext"] == container_security_context()
    assert {o["metadata"]["namespace"] for o in objects} == {"ogai-team-a"}


def test_the_job_may_tune_nccl_itself():
    objects = workload_objects(workload(networks=("ib-a",), env={"NCCL_IB_HCA": "=mlx5_1"},
                                        resources=Resources(gpus=8, rdma=1)), opts())
    [container] = pod_of(objects)["spec"]["containers"]
    assert [e for e in container["env"] if e["name"] == "NCCL_IB_HCA"] == [
        {"name": "NCCL_IB_HCA", "value": "=mlx5_1"}]


def test_volcano_gangs_count_the_rdma_devices():
    objects = workload_objects(workload(resources=Resources(gpus=8, rdma=2)),
                               opts(scheduler="volcano"))
    group = next(o for o in objects if o["kind"] == "PodGroup")
    assert group["spec"]["minResources"][RDMA] == "4"


@pytest.mark.parametrize(("changes", "words"), [
    ({"networks": ("ib-x",)}, "offers no network 'ib-x'; it offers ib-a, private, roce"),
    ({"networks": ("ib-a", "ib-a")}, "attached twice"),
    ({"networks": ("private",)}, "network 'private' of the cluster is not offered to tenant "
                                 "'team-a'"),
])
def test_networks_the_cluster_does_not_offer_are_refused(changes, words):
    with pytest.raises(ValueError) as info:
        workload_objects(workload(**changes), opts())
    assert words in str(info.value)


def test_rdma_on_a_cluster_without_an_rdma_resource_is_refused_in_words():
    with pytest.raises(ValueError, match="offers no RDMA devices: set its 'rdma_resource'"):
        workload_objects(workload(resources=Resources(rdma=1)), opts(rdma_resource=""))


# -- the namespace and Pod Security -----------------------------------------------------------


def test_the_rdma_namespace_enforces_privileged_and_warns_and_audits_restricted():
    namespace = namespace_object("team-a", opts(), rdma=True)
    assert namespace["metadata"]["name"] == "ogai-team-a-rdma"
    labels = namespace["metadata"]["labels"]
    assert labels["ogai.io/tenant"] == "team-a"
    assert labels["ogai.io/namespace-kind"] == "rdma"
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    assert not pod_security.label_errors(labels)
    # The same namespace-wide policies as the tenant's own namespace: default deny first.
    plain = tenant_policies("team-a", opts())
    rdma = tenant_policies("team-a", opts(), rdma=True)
    assert [p["metadata"]["name"] for p in rdma] == [p["metadata"]["name"] for p in plain]
    assert {p["metadata"]["namespace"] for p in rdma} == {"ogai-team-a-rdma"}
    assert [p["spec"] for p in rdma] == [p["spec"] for p in plain]


def test_the_rendered_rdma_pod_passes_pod_security_where_it_goes_and_only_there():
    rdma_workload = workload(networks=("ib-a",), resources=Resources(gpus=8, rdma=2),
                             data_mounts=(DataMount("/data/x", read_only=True),))
    objects = workload_objects(rdma_workload, opts())
    spec = pod_of(objects)["spec"]
    rdma_level = pod_security.enforced_level(namespace_labels("team-a", rdma=True))
    assert pod_security.violations(spec, rdma_level) == []
    # The tenant's own namespace refuses it: adding IPC_LOCK breaks baseline and restricted.
    tenant_level = pod_security.enforced_level(namespace_labels("team-a"))
    broken = pod_security.violations(spec, tenant_level)
    assert broken and all("capabilities" in rule for rule in broken), broken
    # What the restricted warning says about it is the capability, and nothing else.
    assert len(pod_security.violations(spec, "restricted")) == 2  # baseline's and restricted's
    assert workload_namespace(rdma_workload, opts()) == "ogai-team-a-rdma"


def test_the_fake_api_server_runs_the_rdma_pods_in_the_rdma_namespace(fake_kube):  # noqa: F811
    fake = fake_kube
    fake.add_node("ib-node-1", gpus=8, extended={RDMA: "2"})
    fake.add_node("ib-node-2", gpus=8, extended={RDMA: "2"})
    _create(fake, namespace_object("team-a", opts(), rdma=True))
    _create(fake, namespace_object("team-a", opts()))
    rdma_workload = workload(resources=Resources(gpus=1, rdma=2), replicas=2)
    for obj in workload_objects(rdma_workload, opts()):
        _create(fake, obj)
    # The same pods in the tenant's own namespace are refused by its Pod Security level.
    elsewhere = replace(rdma_workload, id="job-8-a1")
    for obj in workload_objects(elsewhere, opts()):
        obj["metadata"]["namespace"] = "ogai-team-a"
        _create(fake, obj)
    pods = _wait_for_pods(fake, "ogai.io/workload=job-7-a1", 2)
    assert {p["metadata"]["namespace"] for p in pods} == {"ogai-team-a-rdma"}
    # Two RDMA devices each, on nodes offering 2: one per node, though the GPUs would fit one.
    assert sorted(p["spec"].get("nodeName") for p in pods) == ["ib-node-1", "ib-node-2"]
    assert [pod_rdma(p, RDMA) for p in pods] == [2, 2]
    assert fake.pods("ogai.io/workload=job-8-a1") == []
    refusals = [e for e in fake.objects("Event", "ogai-team-a")
                if e.get("reason") == "FailedCreate"]
    assert refusals and 'violates PodSecurity "restricted:latest"' in refusals[0]["message"]


def _create(fake, obj: dict) -> None:
    """POST the object to the fake API server, as the driver would."""
    kind, namespace = obj["kind"], obj["metadata"].get("namespace")
    plural = {"Namespace": "namespaces", "Service": "services", "Job": "jobs",
              "NetworkPolicy": "networkpolicies", "Secret": "secrets"}[kind]
    group = {"Job": "/apis/batch/v1", "NetworkPolicy": "/apis/networking.k8s.io/v1"}.get(
        kind, "/api/v1")
    path = f"{group}/namespaces/{namespace}/{plural}" if namespace else f"{group}/{plural}"
    status, body = fake.handle("POST", path, {"content-type": "application/json",
                                              "authorization": f"Bearer {fake.token}"},
                               json.dumps(obj).encode())
    assert status == 201, (status, body)


def _wait_for_pods(fake, selector: str, count: int) -> list[dict]:
    import time
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pods = fake.pods(selector)
        if len(pods) == count and all(p["spec"].get("nodeName") for p in pods):
            return pods
        time.sleep(0.05)
    raise AssertionError(f"pods of {selector}: {fake.pods(selector)}")


# -- attacks on the tenant boundary -----------------------------------------------------------


def test_an_rdma_job_gets_no_host_path():
    attack = workload(resources=Resources(rdma=1),
                      volumes=(Volume(name="host", mount_path="/host", host_path="/"),))
    with pytest.raises(ValueError, match="host_path volume"):
        workload_objects(attack, opts())


def test_an_rdma_job_cannot_pass_itself_off_as_another_tenant_or_workload():
    for labels in ({"ogai.tenant": "team-a", "ogai.io/tenant": "team-b"},
                   {"ogai.tenant": "team-a", "ogai.io/workload": "job-1-a1"},
                   {"ogai.tenant": "team-a", "app.kubernetes.io/managed-by": "me"}):
        with pytest.raises(ValueError, match="reserved for the platform"):
            workload_objects(workload(labels=labels, resources=Resources(rdma=1)), opts())


def test_an_rdma_job_lands_only_in_its_own_tenants_rdma_namespace():
    objects = workload_objects(workload(labels={"ogai.tenant": "team-a-rdma"},
                                        resources=Resources(rdma=1)), opts())
    # Tenant `team-a-rdma`'s RDMA namespace: never tenant team-a's, whose names it resembles.
    assert {o["metadata"]["namespace"] for o in objects} == {"ogai-team-a-rdma-rdma"}
    # Tenant `team-a-rdma`'s own namespace is named as tenant team-a's RDMA namespace: the
    # labels tell them apart, and a namespace labelled for another is refused, never patched.
    theirs = namespace_labels("team-a-rdma")
    ours = namespace_labels("team-a", rdma=True)
    with pytest.raises(ValueError, match="not this tenant's"):
        check_namespace_owner(theirs, ours)
    with pytest.raises(ValueError, match="not this tenant's"):
        check_namespace_owner(ours, theirs)
    check_namespace_owner(ours, ours)
    check_namespace_owner(theirs, theirs)
    check_namespace_owner({}, ours)  # a namespace just made, without labels yet


@pytest.mark.parametrize("mutate", [
    lambda spec: spec.update(hostNetwork=True),
    lambda spec: spec.update(hostPID=True),
    lambda spec: spec.update(hostIPC=True),
    lambda spec: spec["containers"][0]["securityContext"].update(privileged=True),
    lambda spec: spec["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
    lambda spec: spec["containers"][0]["securityContext"]["capabilities"]["add"].append(
        "SYS_ADMIN"),
    lambda spec: spec["containers"][0]["securityContext"]["capabilities"]["add"].append(
        "NET_RAW"),
    lambda spec: spec["containers"][0]["securityContext"]["capabilities"].update(drop=[]),
    lambda spec: spec["containers"][0]["securityContext"].update(runAsUser=0),
    lambda spec: spec["securityContext"].update(runAsUser=0),
    lambda spec: spec["securityContext"].update(runAsNonRoot=False),
    lambda spec: spec["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    lambda spec: spec["containers"][0]["securityContext"].update(
        seccompProfile={"type": "Unconfined"}),
    lambda spec: spec["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
    lambda spec: spec["containers"][0].update(ports=[{"containerPort": 1, "hostPort": 1}]),
    lambda spec: spec["securityContext"].update(sysctls=[{"name": "kernel.x", "value": "1"}]),
])
def test_an_rdma_pod_with_anything_more_than_ipc_lock_is_refused(mutate):
    """The RDMA namespace's enforce level lets anything through, so the renderer's own check
    must refuse whatever else a pod could get there."""
    spec = pod_of(workload_objects(workload(resources=Resources(gpus=1, rdma=1)), opts()))["spec"]
    check_rdma_pod(spec)  # as rendered: fine
    mutate(spec)
    with pytest.raises(ValueError):
        check_rdma_pod(spec)


def test_an_rdma_job_cannot_use_a_network_kept_for_another_tenant():
    with pytest.raises(ValueError, match="not offered to tenant 'team-a'"):
        workload_objects(workload(networks=("private",), resources=Resources(rdma=1)), opts())
    objects = workload_objects(workload(networks=("private",),
                                        labels={"ogai.tenant": "team-b"}), opts())
    assert json.loads(pod_of(objects)["metadata"]["annotations"][
        "k8s.v1.cni.cncf.io/networks"]) == [{"name": "fabric", "namespace": "team-b"}]


# -- node inventory helpers -------------------------------------------------------------------


def test_a_nodes_rdma_devices_come_from_its_allocatable_map():
    assert node_rdma({RDMA: "4", "nvidia.com/gpu": "8"}, RDMA) == 4
    assert node_rdma({RDMA: 4}, RDMA) == 4
    assert node_rdma({"nvidia.com/gpu": "8"}, RDMA) == 0
    assert node_rdma({RDMA: "4"}, "") == 0
    assert node_rdma(None, RDMA) == 0
    assert node_rdma({RDMA: "1k"}, RDMA) == 0  # not a device count


def test_a_pods_rdma_devices_come_from_its_containers_limits():
    from kubernetes import client
    as_dict = {"spec": {"containers": [
        {"resources": {"limits": {RDMA: "2"}, "requests": {RDMA: "2"}}},
        {"resources": {"requests": {RDMA: "1"}}}, {}]}}
    assert pod_rdma(as_dict, RDMA) == 3
    as_object = client.V1Pod(spec=client.V1PodSpec(containers=[
        client.V1Container(name="a", resources=client.V1ResourceRequirements(
            limits={RDMA: "2"})),
        client.V1Container(name="b")]))
    assert pod_rdma(as_object, RDMA) == 2
    assert pod_rdma(as_object, "") == 0
