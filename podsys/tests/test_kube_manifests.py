"""The Kubernetes objects built for a workload: their shape, checked against the official
client's models, and the values a cluster driver relies on."""

from __future__ import annotations

import pytest
import yaml

from podsys.drivers.base import DriverError, Resources, Volume, Workload
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
    workload_objects,
)
from podsys.drivers.kube_schema import check_object

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
    wl = workload(replicas=4, placement=("gpu-d", "gpu-b", "gpu-a", "gpu-c"))
    objs = objects(wl, data_dir="/data", artifacts_claim="ogai-artifacts", master_port=29400)
    assert [o["kind"] for o in objs] == ["Service", "Job"]
    service, job = objs
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
    assert env["OGAI_DATA_DIR"]["value"] == "/data"
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
    artifacts = volumes[mounts["/data"]["name"]]
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
    assert [o["kind"] for o in objs] == ["Service", "PodGroup", "Job"]
    group = objs[1]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["metadata"]["name"] == "job-42-a1"
    assert group["spec"]["minMember"] == 3
    assert group["spec"]["minResources"] == {"cpu": "96", "memory": "786432Mi", GPU: "24"}
    template = objs[2]["spec"]["template"]
    assert template["spec"]["schedulerName"] == "volcano"
    assert template["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": "job-42-a1"}


def test_service_workload_is_a_deployment_and_a_service():
    wl = workload(service=True, replicas=2, ports=(8000, 9090), resources=Resources(gpus=1))
    objs = objects(wl)
    assert [o["kind"] for o in objs] == ["Service", "Deployment"]
    service, deployment = objs
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
            Volume(name="datasets", mount_path="/datasets", host_path="/mnt/ds", read_only=True),
            Volume(name="models", mount_path="/models", claim_name="models-pvc"),
        )
    )
    pod = by_kind(objects(wl, image_pull_secret="regcred"))["Job"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert volumes["datasets"]["hostPath"] == {"path": "/mnt/ds"}
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
            {"volumes": (Volume(name="v", mount_path=SHM_PATH, host_path="/x"),)},
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
    assert text.startswith("apiVersion: v1\nkind: Service\n")  # field order kept
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
    assert ns["metadata"] == {
        "name": "ogai-acme",
        "labels": {MANAGED_BY: "ogai", TENANT_LABEL: "acme"},
    }
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
