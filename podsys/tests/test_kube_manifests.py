"""The Kubernetes objects built for a workload: their shape, checked against the official
client's models, and the values a cluster driver relies on."""

from __future__ import annotations

import re

import pytest
import yaml

from podsys.drivers.base import DataMount, DriverError, Resources, Volume, Workload
from podsys.drivers.kube_manifests import (
    GPU,
    INDEX_LABEL,
    MANAGED_BY,
    SHM_PATH,
    TENANT_LABEL,
    WORKLOAD_LABEL,
    KubeOptions,
    cpu_quantity,
    namespace_for,
    namespace_object,
    render_yaml,
    tenant_policies,
    workload_objects,
)
from podsys.drivers.kube_schema import check_object
from podsys.drivers.kube_security import PSA_LABELS
from tests.fakekube import pod_security

PLATFORM_LABELS = {"ogai.job": "42", "ogai.attempt": "1", "ogai.tenant": "acme"}


def workload(**fields) -> Workload:
    values: dict = {
        "id": "job-42-a1",
        "command": ("torchrun", "--nproc-per-node", "8", "train.py", "--lr", "1e-4; rm -rf /"),
        "resources": Resources(gpus=8, cpu_cores=32, memory_mib=262144),
        "image": "registry.local/train:1",
        "env": {"HF_HOME": "/cache/hf"},
        "labels": dict(PLATFORM_LABELS),
    }
    values.update(fields)
    return Workload(**values)


def objects(wl: Workload, **options) -> list[dict]:
    result = workload_objects(wl, KubeOptions(**options))
    for obj in result:
        check_object(obj)
    return result


def by_kind(objs: list[dict]) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in objs}


def env_of(pod_spec: dict) -> dict[str, dict]:
    return {item["name"]: item for item in pod_spec["containers"][0]["env"]}


def test_four_node_gang_job():
    wl = workload(replicas=4, placement=("gpu-d", "gpu-b", "gpu-a", "gpu-c"),
                  checkpoint_dir="/data/jobs/42/checkpoints")
    objs = objects(wl, data_dir="/data", artifacts_claim="ogai-artifacts", master_port=29400)
    assert [o["kind"] for o in objs] == ["NetworkPolicy", "Service", "Job"]
    _, service, job = objs
    ns = "ogai-acme"
    expected_labels = {
        MANAGED_BY: "ogai",
        WORKLOAD_LABEL: "job-42-a1",
        TENANT_LABEL: "acme",
        "ogai.io/job": "42",
        "ogai.io/attempt": "1",
    }

    assert service["metadata"] == {"name": "job-42-a1", "namespace": ns, "labels": expected_labels}
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {WORKLOAD_LABEL: "job-42-a1"}
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("rendezvous", 29400)]

    assert job["metadata"]["name"] == "job-42-a1"
    assert job["metadata"]["labels"] == expected_labels
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    assert spec["backoffLimit"] == 0
    assert "suspend" not in spec
    template = spec["template"]
    assert template["metadata"]["labels"] == expected_labels
    pod = template["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["subdomain"] == service["metadata"]["name"]
    assert pod["enableServiceLinks"] is False
    assert "schedulerName" not in pod

    (container,) = pod["containers"]
    assert container["name"] == "main"
    assert container["image"] == "registry.local/train:1"
    assert container["command"] == list(wl.command)  # an argv list, never a shell string

    env = env_of(pod)
    assert env["RANK"] == {
        "name": "RANK",
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_LABEL}']"}},
    }
    assert env["WORLD_SIZE"]["value"] == "4"
    assert env["MASTER_ADDR"]["value"] == f"job-42-a1-0.job-42-a1.{ns}.svc"
    assert env["MASTER_PORT"]["value"] == "29400"
    assert "OGAI_DATA_DIR" not in env  # a pod has no business with the whole data directory
    assert env["OGAI_CHECKPOINT_DIR"]["value"] == "/data/jobs/42/checkpoints"
    assert env["HF_HOME"]["value"] == "/cache/hf"

    amounts = {"cpu": "32", "memory": "262144Mi", GPU: "8"}
    assert container["resources"] == {"requests": amounts, "limits": amounts}

    affinity = pod["affinity"]
    (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {
            "key": "kubernetes.io/hostname",
            "operator": "In",
            "values": ["gpu-a", "gpu-b", "gpu-c", "gpu-d"],
        }
    ]
    (anti,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == {
        "labelSelector": {"matchLabels": {WORKLOAD_LABEL: "job-42-a1"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    assert "nodeSelector" not in pod
    assert pod["tolerations"] == [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert "/data" not in mounts
    checkpoints = mounts["/data/jobs/42/checkpoints"]
    assert checkpoints["subPath"] == "jobs/42/checkpoints" and checkpoints["readOnly"] is False
    artifacts = volumes[checkpoints["name"]]
    assert artifacts["persistentVolumeClaim"] == {"claimName": "ogai-artifacts"}
    shm = volumes[mounts[SHM_PATH]["name"]]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "131072Mi"}  # half the memory


def test_one_node_job_uses_a_node_selector():
    wl = workload(replicas=2, placement=("gpu-a", "gpu-a"), resources=Resources(gpus=4))
    pod = by_kind(objects(wl))["Job"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-a"}
    assert "affinity" not in pod
    assert env_of(pod)["WORLD_SIZE"]["value"] == "2"
    shm = next(v for v in pod["volumes"] if "emptyDir" in v)
    assert shm["emptyDir"]["sizeLimit"] == "1024Mi"  # half of 1Gi is below the floor


def test_shared_nodes_get_affinity_but_no_anti_affinity():
    wl = workload(replicas=4, placement=("a", "b", "a", "b"))
    pod = by_kind(objects(wl))["Job"]["spec"]["template"]["spec"]
    assert "podAntiAffinity" not in pod["affinity"]


def test_gpu_model_without_placement_selects_the_product():
    wl = workload(resources=Resources(gpus=1, gpu_model="NVIDIA-H100-80GB-HBM3"))
    pod = by_kind(objects(wl))["Job"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_cpu_only_job_has_no_gpu_or_toleration():
    wl = workload(resources=Resources(gpus=0, cpu_cores=0.5, memory_mib=4096))
    pod = by_kind(objects(wl, gpu_tolerations=True))["Job"]["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"] == {"cpu": "500m", "memory": "4096Mi"}
    assert "tolerations" not in pod
    assert "nodeSelector" not in pod and "affinity" not in pod


def test_gpu_tolerations_can_be_turned_off():
    pod = by_kind(objects(workload(), gpu_tolerations=False))["Job"]["spec"]["template"]["spec"]
    assert "tolerations" not in pod


def test_kueue_suspends_and_labels_the_job():
    job = by_kind(objects(workload(), kueue_queue="team-a"))["Job"]
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_kubernetes_never_deletes_finished_jobs_itself():
    # The driver deletes them once it has kept their logs: Kubernetes' TTL would lose them.
    assert "ttlSecondsAfterFinished" not in by_kind(objects(workload()))["Job"]["spec"]
    with pytest.raises(ValueError, match="ttl_after_finished_s"):
        KubeOptions.from_options({"ttl_after_finished_s": -1})


def test_volcano_adds_a_pod_group_and_the_scheduler():
    wl = workload(replicas=3, placement=("a", "b", "c"))
    objs = objects(wl, scheduler="volcano")
    assert [o["kind"] for o in objs] == ["NetworkPolicy", "Service", "PodGroup", "Job"]
    group = objs[2]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["metadata"]["name"] == "job-42-a1"
    assert group["spec"]["minMember"] == 3
    assert group["spec"]["minResources"] == {"cpu": "96", "memory": "786432Mi", GPU: "24"}
    template = objs[3]["spec"]["template"]
    assert template["spec"]["schedulerName"] == "volcano"
    assert template["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": "job-42-a1"}


def test_service_workload_is_a_deployment_and_a_service():
    wl = workload(service=True, replicas=2, ports=(8000, 9090), resources=Resources(gpus=1))
    objs = objects(wl)
    assert [o["kind"] for o in objs] == ["NetworkPolicy", "Service", "Deployment"]
    _, service, deployment = objs
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == {WORKLOAD_LABEL: "job-42-a1"}
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("port-8000", 8000, 8000),
        ("port-9090", 9090, 9090),
    ]
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["selector"] == {"matchLabels": {WORKLOAD_LABEL: "job-42-a1"}}
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Always"
    assert "subdomain" not in pod
    env = env_of(pod)
    assert "RANK" not in env
    assert env["WORLD_SIZE"]["value"] == "2"
    assert [p["containerPort"] for p in pod["containers"][0]["ports"]] == [8000, 9090]


def test_workload_volumes_and_pull_secret():
    wl = workload(
        volumes=(
            Volume(name="datasets", mount_path="/datasets", claim_name="ds-pvc", read_only=True),
            Volume(name="models", mount_path="/models", claim_name="models-pvc"),
        )
    )
    pod = by_kind(objects(wl, image_pull_secret="regcred"))["Job"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert volumes["datasets"]["persistentVolumeClaim"] == {"claimName": "ds-pvc",
                                                            "readOnly": True}
    assert mounts["datasets"] == {"name": "datasets", "mountPath": "/datasets", "readOnly": True}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "models-pvc"
    assert mounts["models"]["readOnly"] is False
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_default_image_and_platform_env_wins():
    wl = workload(image="", env={"WORLD_SIZE": "99", "A": "1"})
    pod = by_kind(objects(wl, default_image="ogai/base:1"))["Job"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "ogai/base:1"
    names = [item["name"] for item in pod["containers"][0]["env"]]
    assert names.count("WORLD_SIZE") == 1
    assert env_of(pod)["WORLD_SIZE"]["value"] == "1"


def test_other_labels_pass_through():
    labels = {**PLATFORM_LABELS, "example.com/team": "vision", "cost-center": "r_d.1"}
    obj = objects(workload(labels=labels))[0]
    assert obj["metadata"]["labels"]["example.com/team"] == "vision"
    assert obj["metadata"]["labels"]["cost-center"] == "r_d.1"


@pytest.mark.parametrize(
    ("fields", "options", "message"),
    [
        ({"env": {"BAD-NAME": "x"}}, {}, "BAD-NAME"),
        ({"env": {"1X": "x"}}, {}, "1X"),
        ({"labels": {**PLATFORM_LABELS, "bad key!": "x"}}, {}, "bad key!"),
        ({"labels": {**PLATFORM_LABELS, "team": "not ok"}}, {}, "team"),
        ({"labels": {**PLATFORM_LABELS, "team": "x" * 64}}, {}, "team"),
        ({"labels": {**PLATFORM_LABELS, WORKLOAD_LABEL: "other"}}, {}, "reserved"),
        ({"image": ""}, {}, "no image: set the job's image or the cluster's default_image"),
        ({"labels": {"ogai.job": "42"}}, {}, "ogai.tenant"),
        ({"labels": {**PLATFORM_LABELS, "ogai.tenant": "Acme Corp"}}, {}, "Acme Corp"),
        ({"service": True, "ports": ()}, {}, "no ports"),
        ({"replicas": 2, "placement": ("a",)}, {}, "placement"),
        ({"volumes": (Volume(name="v", mount_path="/v"),)}, {}, "exactly one"),
        (
            {"volumes": (Volume(name="v", mount_path=SHM_PATH, claim_name="x"),)},
            {},
            SHM_PATH,
        ),
        ({"id": "42-job"}, {}, "start with a letter"),
        ({"resources": Resources(gpus=1, gpu_model="H100 80GB")}, {}, "H100 80GB"),
    ],
)
def test_bad_input_is_refused_by_name(fields, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as info:
        workload_objects(workload(**fields), KubeOptions(**options))
    assert message in str(info.value)


def test_invalid_workload_id_raises_driver_error():
    with pytest.raises(DriverError):
        workload_objects(workload(id="Job_42"), KubeOptions())


def test_render_yaml_round_trips():
    objs = objects(workload(replicas=2, placement=("a", "b")), scheduler="volcano", kueue_queue="q")
    text = render_yaml(objs)
    assert text.count("\n---\n") == len(objs) - 1
    assert list(yaml.safe_load_all(text)) == objs
    assert text.startswith("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n")  # in order
    assert "clusterIP: None" in text or "clusterIP: 'None'" in text


@pytest.mark.parametrize(
    ("cores", "quantity"), [(0.5, "500m"), (2.0, "2"), (2, "2"), (1.25, "1250m"), (0.1, "100m")]
)
def test_cpu_quantity(cores, quantity):
    assert cpu_quantity(cores) == quantity


def test_cpu_renders_in_the_pod():
    for cores, quantity in ((0.5, "500m"), (2.0, "2")):
        wl = workload(resources=Resources(cpu_cores=cores))
        pod = by_kind(objects(wl))["Job"]["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["requests"]["cpu"] == quantity


def test_namespaces():
    opts = KubeOptions()
    assert namespace_for("acme", opts) == "ogai-acme"
    assert namespace_for("acme", KubeOptions(namespace_prefix="")) == "acme"
    ns = namespace_object("acme", opts)
    check_object(ns)
    assert ns["metadata"]["name"] == "ogai-acme"
    assert ns["metadata"]["labels"] == {MANAGED_BY: "ogai", TENANT_LABEL: "acme", **PSA_LABELS}
    for bad in ("Acme", "a_b", "x" * 60, ""):
        with pytest.raises(ValueError, match="namespace"):
            namespace_for(bad, KubeOptions(namespace_prefix="" if bad == "" else "ogai-"))


def test_options_from_driver_options():
    opts = KubeOptions.from_options(
        {"namespace_prefix": "t-", "master_port": 1234, "scheduler": "volcano", "kubeconfig": "x"}
    )
    assert opts == KubeOptions(namespace_prefix="t-", master_port=1234, scheduler="volcano")
    assert KubeOptions.from_options({}) == KubeOptions()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"master_port": "29500"}, "master_port"),
        ({"gpu_tolerations": "yes"}, "gpu_tolerations"),
        ({"default_image": 3}, "default_image"),
        ({"master_port": True}, "master_port"),
        ({"master_port": 70000}, "master_port"),
        ({"scheduler": "yunikorn"}, "scheduler"),
        ({"shm_size": "lots"}, "shm_size"),
        ({"artifacts_claim": "claim"}, "data_dir"),
        ({"data_dir": "relative"}, "data_dir"),
        ({"namespace_prefix": "Ogai-"}, "namespace_prefix"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        KubeOptions.from_options(options)


# The tenant boundary: what a pod may run as, see and reach ---------------------------------

CLAIM = {"data_dir": "/srv/ogai", "artifacts_claim": "ogai-artifacts"}
TOKEN = "ogai_0123456789abcdef-secret"  # a made-up token the test looks for


def every_kind_of_workload(**fields) -> dict[str, Workload]:
    """A batch job (with its own folders and a dataset), a service (a model replica) and a
    health check (the platform's own, no tenant uid), as the platform makes them."""
    own = {
        "checkpoint_dir": "/srv/ogai/jobs/42-x/checkpoints",
        "run_dir": "/srv/ogai/runs/42",
        "data_mounts": (DataMount("/srv/ogai/datasets/7/v1", read_only=True),),
        "run_as": 1_000_000_003,
        "tenant": "acme",
    }
    return {
        "batch": workload(replicas=2, placement=("a", "b"), **own, **fields),
        "service": workload(id="job-43-a1", service=True, ports=(8000,), **own, **fields),
        "health": workload(id="hc-9", resources=Resources(gpus=8), replicas=2,
                           placement=("a", "b"),
                           labels={"ogai.health-check": "nccl", "ogai.tenant": "ogai-health"},
                           **fields),
    }


def pod_of(objs: list[dict]) -> dict:
    owner = next(o for o in objs if o["kind"] in ("Job", "Deployment"))
    return owner["spec"]["template"]["spec"]


@pytest.mark.parametrize("kind", ["batch", "service", "health"])
def test_pods_run_as_non_root_without_a_token_in_the_restricted_profile(kind):
    wl = every_kind_of_workload()[kind]
    pod = pod_of(objects(wl, **CLAIM, run_as_user=4242))
    assert pod["automountServiceAccountToken"] is False
    uid = 4242 if kind == "health" else 1_000_000_003  # the tenant's own uid where it has one
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]},
    }
    # The Pod Security Standards' own rules, as the API server applies them.
    assert pod_security.violations(pod, "restricted") == []
    check_object({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod})


def test_the_artifacts_group_is_supplemental_never_an_fs_group():
    pod = pod_of(objects(every_kind_of_workload()["batch"], **CLAIM, artifacts_gid=2000))
    # fsGroup would make the kubelet chgrp the whole shared claim: every tenant's files.
    assert "fsGroup" not in pod["securityContext"]
    assert pod["securityContext"]["supplementalGroups"] == [2000]


@pytest.mark.parametrize("run_as", [0, -1, True, 2**32])
def test_a_workload_may_not_run_as_root_or_a_bad_uid(run_as):
    with pytest.raises(ValueError, match="run_as"):
        workload_objects(workload(run_as=run_as), KubeOptions())


def test_no_pod_of_any_kind_mounts_the_claim_root():
    workloads = every_kind_of_workload()
    for kind, wl in workloads.items():
        pod = pod_of(objects(wl, **CLAIM))
        claim = {v["name"] for v in pod["volumes"]
                 if v.get("persistentVolumeClaim", {}).get("claimName") == "ogai-artifacts"}
        mounts = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] in claim]
        for mount in mounts:  # only subPath mounts of the claim, at the path they stand for
            assert mount.get("subPath"), (kind, mount)
            assert mount["mountPath"] == "/srv/ogai/" + mount["subPath"], (kind, mount)
        paths = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert "/srv/ogai" not in paths and "/srv" not in paths and "/" not in paths
        if kind == "health":
            assert mounts == [] and claim == set()  # no folder of it: no claim at all
    pod = pod_of(objects(workloads["batch"], **CLAIM))
    seen = {m["mountPath"]: m["readOnly"] for m in pod["containers"][0]["volumeMounts"]
            if m.get("subPath")}
    assert seen == {"/srv/ogai/datasets/7/v1": True, "/srv/ogai/jobs/42-x/checkpoints": False,
                    "/srv/ogai/runs/42": False}


@pytest.mark.parametrize(
    "path",
    [
        "/etc",
        "/srv/ogai",  # the claim's root
        "/srv/ogai/",
        "/srv/ogai/../ogai/datasets",
        "/srv/ogai/datasets/../../../etc",
        "/srv/ogai/./datasets",
        "/srv/ogai//datasets",
        "/srv/ogai-other/datasets",  # a sibling sharing the prefix
        "datasets/7",
    ],
)
def test_a_folder_outside_the_data_directory_is_refused_by_name(path):
    for fields in ({"data_mounts": (DataMount(path, read_only=True),)},
                   {"checkpoint_dir": path}, {"run_dir": path}):
        with pytest.raises(ValueError) as info:
            workload_objects(workload(**fields), KubeOptions(**CLAIM))
        assert repr(path) in str(info.value)


def test_without_a_claim_no_folder_is_mounted_but_each_is_still_checked():
    wl = every_kind_of_workload()["batch"]
    pod = pod_of(objects(wl, data_dir="/srv/ogai"))
    assert [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]] == [SHM_PATH]
    assert [v["name"] for v in pod["volumes"]] == ["ogai-shm"]
    for options in ({"data_dir": "/srv/ogai"}, {}):
        with pytest.raises(ValueError, match=re.escape("'/srv/ogai/../etc'")):
            workload_objects(workload(data_mounts=(DataMount("/srv/ogai/../etc"),)),
                             KubeOptions(**options))
    with pytest.raises(ValueError, match="'/etc'"):
        workload_objects(workload(data_mounts=(DataMount("/etc"),)),
                         KubeOptions(data_dir="/srv/ogai"))


def test_volumes_that_would_cross_the_boundary_are_refused():
    host = workload(volumes=(Volume(name="ds", mount_path="/ds", host_path="/mnt/ds"),))
    with pytest.raises(ValueError, match=r"'ds'.*host_path"):
        workload_objects(host, KubeOptions())
    whole = workload(volumes=(Volume(name="all", mount_path="/all", claim_name="ogai-artifacts"),))
    with pytest.raises(ValueError, match=r"'all'.*whole"):
        workload_objects(whole, KubeOptions(**CLAIM))


def test_secrets_are_in_the_secret_and_the_pod_names_them_only():
    wl = workload(service=True, ports=(8888,), secret_env={"JUPYTER_TOKEN": TOKEN, "OGAI_TOKEN":
                                                            TOKEN + "2"})
    objs = objects(wl)
    assert [o["kind"] for o in objs] == ["Secret", "NetworkPolicy", "Service", "Deployment"]
    secret = objs[0]
    assert secret["metadata"]["name"] == wl.id and secret["metadata"]["namespace"] == "ogai-acme"
    assert secret["stringData"] == {"JUPYTER_TOKEN": TOKEN, "OGAI_TOKEN": TOKEN + "2"}
    env = env_of(pod_of(objs))
    assert env["JUPYTER_TOKEN"] == {"name": "JUPYTER_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": wl.id, "key": "JUPYTER_TOKEN"}}}
    assert env["OGAI_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "OGAI_TOKEN"
    others = render_yaml([o for o in objs if o["kind"] != "Secret"])
    assert TOKEN not in others and "JUPYTER_TOKEN" in others
    # A workload without secrets has no Secret.
    assert "Secret" not in by_kind(objects(workload()))


def test_a_secret_name_must_be_an_environment_name():
    with pytest.raises(ValueError, match="BAD-NAME"):
        workload_objects(workload(secret_env={"BAD-NAME": "x"}), KubeOptions())


def test_the_namespace_policies_deny_all_then_allow_dns_and_the_platform():
    opts = KubeOptions(platform_pod_labels={"app.kubernetes.io/name": "ogai"},
                       platform_ports=[8000], egress_cidrs=["10.9.0.0/16"])
    policies = {p["metadata"]["name"]: p for p in tenant_policies("acme", opts)}
    for policy in policies.values():
        check_object(policy)
        assert policy["metadata"]["namespace"] == "ogai-acme"
        assert policy["spec"]["podSelector"] == {}  # every pod of the namespace
    assert policies["ogai-default-deny"]["spec"] == {"podSelector": {},
                                                     "policyTypes": ["Ingress", "Egress"]}
    [dns] = policies["ogai-allow-dns"]["spec"]["egress"]
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    [platform] = policies["ogai-allow-platform"]["spec"]["egress"]
    assert platform == {"to": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "ogai-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ogai"}}}],
        "ports": [{"protocol": "TCP", "port": 8000}]}
    assert policies["ogai-allow-egress"]["spec"]["egress"] == [
        {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}]}]
    # No policy allows any ingress namespace-wide.
    assert all("ingress" not in p["spec"] for p in policies.values())
    outside = KubeOptions(platform_namespace="", platform_cidrs=["203.0.113.7/32"])
    names = [p["metadata"]["name"] for p in tenant_policies("acme", outside)]
    assert names == ["ogai-default-deny", "ogai-allow-dns", "ogai-allow-platform"]


def test_a_workload_reaches_its_gang_and_a_service_takes_only_the_platform():
    opts = KubeOptions(platform_pod_labels={"app.kubernetes.io/name": "ogai"},
                       platform_cidrs=["203.0.113.7/32"])
    gang = {"podSelector": {"matchLabels": {WORKLOAD_LABEL: "job-42-a1"}}}
    batch = by_kind(objects(workload()))["NetworkPolicy"]
    assert batch["metadata"]["name"] == "job-42-a1"
    assert batch["spec"] == {"podSelector": {"matchLabels": {WORKLOAD_LABEL: "job-42-a1"}},
                             "policyTypes": ["Ingress", "Egress"],
                             "ingress": [{"from": [gang]}], "egress": [{"to": [gang]}]}
    service = by_kind(workload_objects(workload(service=True, ports=(8000,)), opts))
    policy = service["NetworkPolicy"]
    check_object(policy)
    assert policy["spec"]["ingress"] == [
        {"from": [gang]},
        {"from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "ogai-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ogai"}}},
            {"ipBlock": {"cidr": "203.0.113.7/32"}}],
         "ports": [{"protocol": "TCP", "port": 8000}]},
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run_as_user": 0}, "run_as_user"),
        ({"run_as_user": "1000"}, "run_as_user"),
        ({"artifacts_gid": -5}, "artifacts_gid"),
        ({"platform_namespace": "Ogai System"}, "platform_namespace"),
        ({"dns_namespace": ""}, "dns_namespace"),
        ({"platform_pod_labels": {"app": "not ok"}}, "platform_pod_labels"),
        ({"platform_pod_labels": ["app=ogai"]}, "platform_pod_labels"),
        ({"dns_pod_labels": {"bad key!": "x"}}, "dns_pod_labels"),
        ({"platform_cidrs": ["10.0.0.5"]}, "10.0.0.5"),
        ({"platform_cidrs": "10.0.0.0/8"}, "platform_cidrs"),
        ({"egress_cidrs": ["mirror.example.org/32"]}, "mirror.example.org"),
        ({"platform_ports": [0]}, "platform_ports"),
        ({"platform_ports": ["8000"]}, "platform_ports"),
    ],
)
def test_bad_security_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        KubeOptions.from_options(options)


# The working folder and named environments --------------------------------------------------

ARCHIVE = "/srv/ogai/workdirs/3/" + "c" * 64 + ".tar.gz"


def test_the_working_folder_is_unpacked_by_an_init_container_that_sees_only_its_archive():
    wl = every_kind_of_workload(workdir_archive=ARCHIVE)["batch"]
    objs = objects(wl, **CLAIM)
    pod = pod_of(objs)
    (init,) = pod["initContainers"]
    (main,) = pod["containers"]
    assert init["image"] == main["image"] == "registry.local/train:1"
    assert init["command"] == ["tar", "-xzf", "/ogai/workdir.tar.gz", "-C", "/ogai/workdir"]
    claim = [m for m in init["volumeMounts"] if m["name"] == "ogai-artifacts"]
    # Of the shared claim, exactly the job's archive, read-only.
    assert claim == [{"name": "ogai-artifacts", "mountPath": "/ogai/workdir.tar.gz",
                      "subPath": "workdirs/3/" + "c" * 64 + ".tar.gz", "readOnly": True}]
    workdir = {"name": "ogai-workdir", "mountPath": "/ogai/workdir"}
    assert workdir in init["volumeMounts"] and workdir in main["volumeMounts"]
    assert {"name": "ogai-workdir", "emptyDir": {}} in pod["volumes"]
    assert main["workingDir"] == "/ogai/workdir"
    assert not any(m.get("subPath", "").startswith("workdirs") for m in main["volumeMounts"])
    assert init["securityContext"] == main["securityContext"]
    assert "nvidia.com/gpu" not in init["resources"]["limits"]
    assert pod_security.violations(pod, "restricted") == []
    check_object({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod})
    for obj in yaml.safe_load_all(render_yaml(objs)):  # as `ogai job render` prints it
        check_object(obj)


def test_a_working_folder_needs_the_artifacts_claim_and_its_archive_inside_it():
    with pytest.raises(ValueError, match="set the cluster's 'artifacts_claim'"):
        workload_objects(workload(workdir_archive=ARCHIVE), KubeOptions())
    with pytest.raises(ValueError, match="not inside the cluster's data_dir"):
        workload_objects(workload(workdir_archive="/etc/shadow"), KubeOptions(**CLAIM))


def test_an_environment_names_the_image_when_the_job_names_none():
    opts = {"environments": {"torch": "registry.local/torch:2.13", "vllm": "vllm/vllm:0.33"},
            "default_environment": "torch"}
    image = lambda wl: pod_of(objects(wl, **opts))["containers"][0]["image"]  # noqa: E731
    assert image(workload(image="", environment="vllm")) == "vllm/vllm:0.33"
    assert image(workload(image="")) == "registry.local/torch:2.13"  # the default
    assert image(workload(environment="vllm")) == "registry.local/train:1"  # its own image wins
    with pytest.raises(ValueError, match=r"offers no environment 'cu12'; it offers torch, vllm"):
        workload_objects(workload(image="", environment="cu12"), KubeOptions(**opts))
    with pytest.raises(ValueError, match="'default_environment' 'cu12' is none of"):
        KubeOptions(environments={"torch": "t:1"}, default_environment="cu12")


def test_the_kubernetes_driver_lists_its_environments_and_renders_without_a_cluster():
    from podsys.drivers.kubernetes import KubernetesDriver

    driver = KubernetesDriver(cluster="k", options={
        "environments": {"torch": "registry.local/torch:2.13", "vllm": "vllm/vllm:0.33"},
        "default_environment": "vllm", "kubeconfig": "not: a cluster"})
    assert [(e.name, e.where, e.default) for e in driver.environments()] == [
        ("vllm", "vllm/vllm:0.33", True), ("torch", "registry.local/torch:2.13", False)]
    rendered = list(yaml.safe_load_all(driver.render(workload(image=""))))
    assert pod_of(rendered)["containers"][0]["image"] == "vllm/vllm:0.33"
    with pytest.raises(DriverError, match="offers no environment 'cu12'"):
        driver.render(workload(image="", environment="cu12"))
