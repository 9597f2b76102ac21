"""The fake Kubernetes API server, through the official client over real HTTP."""

import json
import time

import pytest
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from podsys.drivers.kube_schema import check_object
from tests.fakekube import fake_kube  # noqa: F401  (the fixture)
from tests.fakekube.server import label_selector_matches, quantity


def api_client(fake, retries=None) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config_from_dict(yaml.safe_load(fake.kubeconfig()), client_configuration=cfg)
    if retries is not None:
        cfg.retries = retries
    return client.ApiClient(cfg)


@pytest.fixture
def kube(fake_kube):  # noqa: F811
    api = api_client(fake_kube)
    yield fake_kube, api
    api.close()


def indexed_job(name, completions=2, gpus=8, node_selector=None, affinity_hosts=None,
                backoff_limit=0, image="trainer:1"):
    container = client.V1Container(
        name="main", image=image, command=["python", "train.py"],
        resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}))
    affinity = None
    if affinity_hosts:
        affinity = client.V1Affinity(node_affinity=client.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
                node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=[
                    client.V1NodeSelectorRequirement(key="kubernetes.io/hostname",
                                                     operator="In",
                                                     values=affinity_hosts)])])))
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"ogai.io/workload": name},
                                     annotations={"ogai.io/note": "x"}),
        spec=client.V1PodSpec(containers=[container], restart_policy="Never",
                              subdomain=name, node_selector=node_selector,
                              affinity=affinity))
    return client.V1Job(
        api_version="batch/v1", kind="Job", metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(completions=completions, parallelism=completions,
                              completion_mode="Indexed", backoff_limit=backoff_limit,
                              template=template))


def test_discovery_and_version(kube):
    fake, api = kube
    assert client.VersionApi(api).get_code().git_version == "v1.31.0"
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert groups == {"batch", "apps", "networking.k8s.io", "rbac.authorization.k8s.io",
                      "autoscaling", "policy"}
    fake.volcano = fake.kueue = True
    groups = {g.name: g.versions[0].version
              for g in client.ApisApi(api).get_api_versions().groups}
    assert groups["scheduling.volcano.sh"] == "v1beta1" and groups["kueue.x-k8s.io"] == "v1beta1"
    assert fake.request_details[0]["authorization"] == f"Bearer {fake.token}"
    assert ("GET", "/version") in fake.requests


def test_missing_token_is_refused(kube):
    fake, _ = kube
    http = urllib3.PoolManager()
    answer = http.request("GET", fake.url + "/api/v1/namespaces")
    assert answer.status == 401
    assert answer.json()["reason"] == "Unauthorized"


def test_namespaces_create_list_conflict_delete(kube):
    _, api = kube
    core = client.CoreV1Api(api)
    made = core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team-a")))
    assert made.metadata.uid and made.metadata.resource_version
    assert made.metadata.creation_timestamp is not None
    with pytest.raises(ApiException) as err:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": "team-a"}})
    assert err.value.status == 409 and "AlreadyExists" in err.value.body
    names = {ns.metadata.name for ns in core.list_namespace().items}
    assert {"default", "kube-system", "team-a"} <= names
    core.delete_namespace("team-a")
    with pytest.raises(ApiException) as err:
        core.read_namespace("team-a")
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:  # creating in a missing namespace
        client.CoreV1Api(api).create_namespaced_service("team-a", client.V1Service(
            metadata=client.V1ObjectMeta(name="svc"), spec=client.V1ServiceSpec(
                ports=[client.V1ServicePort(port=80)])))
    assert err.value.status == 404


def test_indexed_job_pods_are_bound_by_selector_affinity_and_gpus(kube):
    fake, api = kube
    fake.add_node("gpu-a", labels={"pool": "train"})
    fake.add_node("gpu-b", labels={"pool": "train"})
    fake.add_node("gpu-c", labels={"pool": "other"})  # fails the nodeSelector
    fake.add_node("gpu-d", gpus=4, labels={"pool": "train"})  # too few GPUs
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job("default", indexed_job(
        "job-1", node_selector={"pool": "train"},
        affinity_hosts=["gpu-a", "gpu-b", "gpu-c", "gpu-d"]))
    pods = client.CoreV1Api(api).list_namespaced_pod(
        "default", label_selector="ogai.io/workload=job-1").items
    assert len(pods) == 2
    by_index = {p.metadata.labels["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    assert set(by_index) == {"0", "1"}
    for index, pod in by_index.items():
        assert pod.metadata.name.startswith(f"job-1-{index}-")
        assert pod.metadata.labels["job-name"] == "job-1"
        assert pod.metadata.annotations["batch.kubernetes.io/job-completion-index"] == index
        assert pod.metadata.annotations["ogai.io/note"] == "x"
        assert pod.metadata.owner_references[0].kind == "Job"
        assert pod.spec.hostname == f"job-1-{index}" and pod.spec.subdomain == "job-1"
        assert pod.status.phase == "Pending"
    assert {p.spec.node_name for p in pods} == {"gpu-a", "gpu-b"}
    on_a = client.CoreV1Api(api).list_pod_for_all_namespaces(
        field_selector="spec.nodeName=gpu-a").items
    assert len(on_a) == 1
    for obj in fake.objects("Pod") + fake.objects("Job") + fake.objects("Node"):
        check_object(obj)  # what the fake makes is valid too


def test_start_and_finish_complete_the_job(kube):
    fake, api = kube
    fake.add_node("n1")
    fake.add_node("n2")
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job("default", indexed_job("job-2"))
    assert sorted(fake.start_pods()) == sorted(p["metadata"]["name"] for p in fake.pods())
    pods = core.list_namespaced_pod("default", label_selector="job-name=job-2").items
    assert all(p.status.phase == "Running" and p.status.pod_ip for p in pods)
    assert all(p.status.container_statuses[0].state.running for p in pods)
    assert batch.read_namespaced_job("job-2", "default").status.active == 2
    names = fake.finish_pods(label_selector="ogai.io/workload=job-2", exit_code=0)
    assert len(names) == 2
    job = batch.read_namespaced_job("job-2", "default")
    assert job.status.succeeded == 2 and job.status.active == 0
    assert [c.type for c in job.status.conditions] == ["Complete"]
    assert job.status.completed_indexes == "0,1"
    pod = core.read_namespaced_pod(names[0], "default")
    assert pod.status.phase == "Succeeded"
    assert pod.status.container_statuses[0].state.terminated.reason == "Completed"
    listed = core.list_namespaced_pod("default", field_selector="status.phase!=Succeeded")
    assert listed.items == []


def test_oom_fails_pod_and_job(kube):
    fake, api = kube
    fake.add_node("n1")
    fake.add_node("n2")
    fake.auto_run = True
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job("default", indexed_job("job-3"))
    first = fake.pods("batch.kubernetes.io/job-completion-index=0")[0]["metadata"]["name"]
    fake.oom(first)
    # backoffLimit 0: the job fails and its other pod goes
    job = batch.read_namespaced_job("job-3", "default")
    assert job.status.failed == 1
    failed = [c for c in job.status.conditions if c.type == "Failed"]
    assert failed and failed[0].reason == "BackoffLimitExceeded"
    pod = core.read_namespaced_pod(first, "default")
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.reason, terminated.exit_code) == ("OOMKilled", 137)
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == [first]


def test_unschedulable_pod_gets_failed_scheduling_event(kube):
    fake, api = kube
    for name in ("n1", "n2", "n3"):
        fake.add_node(name, gpus=4)
    core = client.CoreV1Api(api)
    client.BatchV1Api(api).create_namespaced_job("default", indexed_job("big", completions=1))
    pod = core.list_namespaced_pod("default", label_selector="job-name=big").items[0]
    assert pod.status.phase == "Pending" and pod.spec.node_name is None
    scheduled = pod.status.conditions[0]
    assert (scheduled.type, scheduled.status, scheduled.reason) == (
        "PodScheduled", "False", "Unschedulable")
    events = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={pod.metadata.name}").items
    failed = [e for e in events if e.reason == "FailedScheduling"]
    assert failed and failed[0].type == "Warning"
    assert failed[0].message == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    fake.add_node("n4", gpus=8)  # the scheduler retries when things change
    assert core.read_namespaced_pod(pod.metadata.name, "default").spec.node_name == "n4"
    for event in fake.objects("Event"):
        check_object(event)


def test_suspended_job_waits_and_failures_retry_up_to_backoff_limit(kube):
    fake, api = kube
    fake.add_node("n1", gpus=0)
    batch = client.BatchV1Api(api)
    job = indexed_job("later", completions=1, gpus=0, backoff_limit=1)
    job.spec.suspend = True
    batch.create_namespaced_job("default", job)
    assert fake.pods("job-name=later") == []
    batch.patch_namespaced_job("later", "default", {"spec": {"suspend": False}})
    first = fake.pods("job-name=later")
    assert len(first) == 1
    fake.finish_pod(first[0]["metadata"]["name"], exit_code=2)  # backoffLimit 1: one retry
    second = [p for p in fake.pods("job-name=later") if p["status"]["phase"] == "Pending"]
    assert len(second) == 1
    assert second[0]["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0"
    fake.finish_pod(second[0]["metadata"]["name"], exit_code=2)
    status = batch.read_namespaced_job("later", "default").status
    assert status.failed == 2 and status.conditions[-1].type == "Failed"
    pod = fake.get("Pod", second[0]["metadata"]["name"])
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "Error"


def test_foreground_delete_removes_pods_and_orphan_keeps_them(kube):
    fake, api = kube
    fake.add_node("n1")
    fake.add_node("n2")
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job("default", indexed_job("fg"))
    batch.create_namespaced_job("default", indexed_job("orph", gpus=0))
    assert len(fake.pods("job-name=fg")) == 2
    batch.delete_namespaced_job("fg", "default", body=client.V1DeleteOptions(
        propagation_policy="Foreground"))
    assert fake.pods("job-name=fg") == [] and len(fake.objects("Job")) == 1
    batch.delete_namespaced_job("orph", "default", propagation_policy="Orphan")
    kept = fake.pods("job-name=orph")
    assert len(kept) == 2 and all(not p["metadata"]["ownerReferences"] for p in kept)
    with pytest.raises(ApiException) as err:
        batch.delete_namespaced_job("fg", "default")
    assert err.value.status == 404


def test_deployment_keeps_replicas(kube):
    fake, api = kube
    fake.add_node("n1", gpus=0)
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment("default", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}})
    pods = fake.pods("app=web")
    assert len(pods) == 2 and all(p["metadata"]["name"].startswith("web-") for p in pods)
    client.CoreV1Api(api).delete_namespaced_pod(pods[0]["metadata"]["name"], "default")
    assert len(fake.pods("app=web")) == 2
    fake.start_pods()
    assert apps.read_namespaced_deployment("web", "default").status.ready_replicas == 2
    for obj in fake.objects("Deployment") + fake.objects("Event"):
        check_object(obj)
    apps.delete_namespaced_deployment("web", "default")
    assert fake.pods("app=web") == []


def test_fail_next_then_success(kube):
    fake, api = kube
    core = client.CoreV1Api(api)
    fake.fail_next("GET", r"^/api/v1/nodes$", status=500)
    with pytest.raises(ApiException) as err:
        core.list_node()
    assert err.value.status == 500 and "InternalError" in err.value.body
    assert core.list_node().items == []
    fake.fail_next("POST", r"/services$", status=409, times=2)
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
           "spec": {"ports": [{"port": 80}], "clusterIP": "None"}}
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            core.create_namespaced_service("default", svc)
        assert err.value.status == 409
    assert fake.objects("Service") == []
    assert core.create_namespaced_service("default", svc).spec.cluster_ip == "None"


def test_refused_connection_then_back(kube):
    fake, _ = kube
    api = api_client(fake, retries=0)
    fake.refuse_connections()
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        client.CoreV1Api(api).list_namespace()
    assert time.monotonic() - started < 5
    fake.accept_connections()
    assert client.CoreV1Api(api).list_namespace().items


def test_unknown_field_is_422(kube):
    _, api = kube
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "bad"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x",
                                                           "gpus": 8}]}}}}
    with pytest.raises(ApiException) as err:
        client.BatchV1Api(api).create_namespaced_job("default", body)
    assert err.value.status == 422
    assert "spec.template.spec.containers[0].gpus" in err.value.body
    assert '"reason": "Invalid"' in err.value.body or '"reason":"Invalid"' in err.value.body
    bad_label = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "x", "labels": {"a": "not/allowed"}}}
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(api).create_namespace(bad_label)
    assert err.value.status == 422


def test_logs_with_tail_lines(kube):
    fake, api = kube
    fake.add_node("n1")
    fake.auto_run = True
    client.BatchV1Api(api).create_namespaced_job("default", indexed_job("logs", completions=1))
    name = fake.pods("job-name=logs")[0]["metadata"]["name"]
    fake.set_logs(name, "one\ntwo\nthree\n")
    core = client.CoreV1Api(api)

    def log(**kwargs):
        # kubernetes 36 returns the repr of the bytes ("b'...'") when it preloads a log
        # (kubernetes-client/python#2596): read the raw answer instead, as a driver must.
        answer = core.read_namespaced_pod_log(name, "default", _preload_content=False, **kwargs)
        return answer.data.decode()

    assert log(container="main") == "one\ntwo\nthree\n"
    assert log(tail_lines=2) == "two\nthree\n"
    assert log(tail_lines=0) == ""
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("nope", "default")
    assert err.value.status == 404


def test_node_patch_not_ready_image_pull_and_crash_loop(kube):
    fake, api = kube
    fake.add_node("n1")
    fake.add_node("n2", gpus=0)
    core = client.CoreV1Api(api)
    core.patch_node("n1", {"spec": {"unschedulable": True}, "metadata": {"labels": {"x": "y"}}})
    node = core.read_node("n1")
    assert node.spec.unschedulable and node.metadata.labels["x"] == "y"
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    fake.set_node_ready("n2", False)
    assert [c.status for c in core.read_node("n2").status.conditions] == ["False"]
    fake.fail_image_pulls("broken:1")
    client.BatchV1Api(api).create_namespaced_job(
        "default", indexed_job("pull", completions=1, gpus=0, image="broken:1"))
    pod = fake.pods("job-name=pull")[0]
    assert pod["spec"].get("nodeName") is None  # no node fits: n1 cordoned, n2 NotReady
    fake.set_node_ready("n2", True)
    pod = core.read_namespaced_pod(pod["metadata"]["name"], "default")
    assert pod.spec.node_name == "n2"
    waiting = pod.status.container_statuses[0].state.waiting
    assert waiting.reason == "ImagePullBackOff" and "broken:1" in waiting.message
    assert fake.start_pods() == []
    core.patch_node("n1", {"spec": {"unschedulable": None}})
    client.BatchV1Api(api).create_namespaced_job(
        "default", indexed_job("crash", completions=1, gpus=0))
    fake.start_pods("job-name=crash")
    name = fake.pods("job-name=crash")[0]["metadata"]["name"]
    fake.crash_loop(name)
    status = core.read_namespaced_pod(name, "default").status.container_statuses[0]
    assert status.state.waiting.reason == "CrashLoopBackOff" and status.restart_count == 1


def test_volcano_podgroups_only_when_enabled(kube):
    fake, api = kube
    custom = client.CustomObjectsApi(api)
    group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "pg"}, "spec": {"minMember": 2}}
    args = ("scheduling.volcano.sh", "v1beta1", "default", "podgroups")
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(*args, group)
    assert err.value.status == 404
    fake.volcano = True
    made = custom.create_namespaced_custom_object(*args, group)
    assert made["metadata"]["uid"] and made["status"]["phase"] == "Pending"
    assert [g["metadata"]["name"] for g in custom.list_namespaced_custom_object(*args)[
        "items"]] == ["pg"]
    custom.delete_namespaced_custom_object(*args, "pg")
    assert fake.objects("PodGroup") == []


def test_selectors_and_quantities():
    labels = {"a": "1", "b": "2"}
    assert label_selector_matches("a=1,b", labels)
    assert label_selector_matches("a==1,c!=3,!c", labels)
    assert not label_selector_matches("a=1,c", labels)
    assert label_selector_matches("a in (1,5),b notin (3)", labels)
    assert quantity("500m") * 2 == 1 and quantity("1Gi") == 2**30 and quantity(8) == 8


# Secrets, NetworkPolicies, Pod Security ------------------------------------------------------

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def restricted_pod(name, **changes):
    """A pod the restricted level admits; `changes` break it one way or another."""
    container = {"name": "main", "image": "x:1", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
    spec = {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container]}
    for path, value in changes.items():
        *parents, last = path.split(".")
        target = spec
        for part in parents:
            target = target[part] if part != "container" else container
        target[last] = value
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_a_secret_keeps_string_data_as_base64_and_feeds_the_env_by_reference(kube):
    fake, api = kube
    core = client.CoreV1Api(api)
    core.create_namespaced_secret("default", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
        "stringData": {"TOKEN": "t0ps3cret"}})
    stored = fake.get("Secret", "s", "default")
    assert "stringData" not in stored and stored["type"] == "Opaque"
    assert stored["data"] == {"TOKEN": "dDBwczNjcmV0"}
    assert core.read_namespaced_secret("s", "default").data == {"TOKEN": "dDBwczNjcmV0"}
    for bad in ({"data": {"TOKEN": "not base64!"}}, {"stringData": {"bad key/": "x"}}):
        with pytest.raises(ApiException) as err:
            core.create_namespaced_secret("default", {"metadata": {"name": "bad"}, **bad})
        assert err.value.status == 422
    fake.add_node("gpu-a")
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "TOKEN"}}},
           {"name": "OTHER", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "X"}}}]
    job = indexed_job("job-s", completions=1, gpus=1)
    job.spec.template.spec.containers[0].env = env[:1]
    client.BatchV1Api(api).create_namespaced_job("default", job)
    job.metadata.name = "job-t"
    job.spec.template.spec.containers[0].env = env
    client.BatchV1Api(api).create_namespaced_job("default", job)
    fake.start_pods()
    [good] = fake.pods("job-name=job-s")
    assert good["status"]["phase"] == "Running"
    assert fake.container_env(good["metadata"]["name"])["TOKEN"] == "t0ps3cret"
    [bad] = fake.pods("job-name=job-t")  # the kubelet cannot make it: a missing Secret
    waiting = bad["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting == {"reason": "CreateContainerConfigError",
                       "message": 'secret "gone" not found'}


def test_network_policies_are_validated_defaulted_and_replaced(kube):
    fake, api = kube
    net = client.NetworkingV1Api(api)
    body = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "p"},
            "spec": {"podSelector": {}, "egress": [{"ports": [{"port": 53}]}]}}
    made = net.create_namespaced_network_policy("default", body)
    assert made.spec.policy_types == ["Ingress", "Egress"]  # defaulted, as the server does
    assert made.spec.egress[0].ports[0].protocol == "TCP"
    body["spec"] = {"podSelector": {}, "policyTypes": ["Egress"]}
    net.replace_namespaced_network_policy("p", "default", body)
    assert fake.get("NetworkPolicy", "p", "default")["spec"]["policyTypes"] == ["Egress"]
    broken = [
        {"podSelector": {}, "policyTypes": ["Sideways"]},
        {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]},
        {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8",
                                                            "except": ["11.0.0.0/16"]}}]}]},
        {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"},
                                                "podSelector": {}}]}]},
        {"podSelector": {}, "ingress": [{"ports": [{"port": 70000}]}]},
        {"podSelector": {}, "ingress": [{"ports": [{"protocol": "ICMP"}]}]},
        {"podSelector": {}, "ingress": [{"from": [{}]}]},
        {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
        {"podSelector": {}, "egress": [{"to": [{"ipBlock": {}}]}]},  # cidr is required
    ]
    for number, spec in enumerate(broken):
        with pytest.raises(ApiException) as err:
            net.create_namespaced_network_policy("default", {
                "metadata": {"name": f"bad-{number}"}, "spec": spec})
        assert err.value.status == 422, spec


def test_a_namespace_is_patched_with_a_merge_patch_and_its_pod_security_labels_checked(kube):
    fake, api = kube
    core = client.CoreV1Api(api)
    fake.add_namespace("team", labels={"keep": "me"})
    core.patch_namespace("team", {"metadata": {"labels": RESTRICTED}},
                         _content_type="application/merge-patch+json")
    labels = fake.get("Namespace", "team")["metadata"]["labels"]
    assert labels["keep"] == "me" and labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for bad in ({"pod-security.kubernetes.io/enforce": "strict"},
                {"pod-security.kubernetes.io/warn-version": "1.31"}):
        with pytest.raises(ApiException) as err:
            core.patch_namespace("team", {"metadata": {"labels": bad}},
                                 _content_type="application/merge-patch+json")
        assert err.value.status == 422


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"securityContext.runAsNonRoot": False}, "runAsNonRoot"),
        ({"securityContext.runAsUser": 0}, "runAsUser=0"),
        ({"container.securityContext": {"capabilities": {"drop": ["ALL"]}}},
         "allowPrivilegeEscalation"),
        ({"container.securityContext": {"allowPrivilegeEscalation": False, "privileged": True,
                                        "capabilities": {"drop": ["ALL"]}}}, "privileged"),
        ({"container.securityContext": {"allowPrivilegeEscalation": False,
                                        "capabilities": {"add": ["SYS_ADMIN"]}}},
         "capabilities"),
        ({"securityContext.seccompProfile": {"type": "Unconfined"}}, "seccompProfile"),
        ({"hostNetwork": True}, "host namespaces"),
        ({"hostPID": True}, "host namespaces"),
        ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "hostPath"),
        ({"container.ports": [{"containerPort": 80, "hostPort": 80}]}, "hostPort"),
    ],
)
def test_the_restricted_level_refuses_pods_that_break_it(kube, changes, rule):
    fake, api = kube
    fake.add_namespace("locked", labels=RESTRICTED)
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("locked", restricted_pod("fine"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("locked", restricted_pod("bad", **changes))
    assert err.value.status == 403
    message = json.loads(err.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest"' in message and rule in message
    core.create_namespaced_pod("default", restricted_pod("bad", **changes))  # not enforced there


def test_a_controllers_pod_the_level_refuses_is_an_event_and_no_pod(kube):
    fake, api = kube
    fake.add_namespace("locked", labels=RESTRICTED)
    fake.add_node("gpu-a")
    client.BatchV1Api(api).create_namespaced_job("locked", indexed_job("job-r", completions=1))
    assert fake.pods(namespace="locked") == []
    [event] = [e for e in fake.objects("Event", "locked") if e["reason"] == "FailedCreate"]
    assert event["message"].startswith('Error creating: pods "job-r-0-" is forbidden: '
                                       'violates PodSecurity "restricted:latest"')


def test_can_connect_follows_the_network_policies(kube):
    fake, api = kube
    for name in ("a", "b"):
        fake.add_namespace(name)
    a1 = fake.add_pod("a", "a1", {"app": "x"}, ports=(80,))
    a2 = fake.add_pod("a", "a2", {"app": "y"}, ports=(80,))
    b1 = fake.add_pod("b", "b1", {"app": "x"})
    assert fake.can_connect(b1, a1, 80) and fake.can_connect(a1, "8.8.8.8", 53)  # no policy
    net = client.NetworkingV1Api(api)

    def policy(name, spec):
        net.create_namespaced_network_policy("a", {"metadata": {"name": name}, "spec": spec})

    policy("deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
    assert not fake.can_connect(b1, a1, 80) and not fake.can_connect(a1, a2, 80)
    assert not fake.can_connect(a1, "8.8.8.8", 53) and fake.can_connect(b1, "8.8.8.8", 53)
    policy("peers", {"podSelector": {"matchLabels": {"app": "x"}},
                     "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "y"}}}],
                                  "ports": [{"port": 80}]}],
                     "egress": [{"to": [{"ipBlock": {"cidr": "8.8.0.0/16",
                                                     "except": ["8.8.4.0/24"]}}]}]})
    policy("out", {"podSelector": {"matchLabels": {"app": "y"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"podSelector": {}}]}]})
    assert fake.can_connect(a2, a1, 80) and not fake.can_connect(a2, a1, 81)
    assert not fake.can_connect(b1, a1, 80)  # a podSelector alone: the policy's namespace
    assert fake.can_connect(a1, "8.8.8.8", 53) and not fake.can_connect(a1, "8.8.4.4", 53)
    policy("from-b", {"podSelector": {"matchLabels": {"app": "x"}}, "policyTypes": ["Ingress"],
                      "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": "b"}}}]}]})
    assert fake.can_connect(b1, a1, 9999) and not fake.can_connect("1.2.3.4", a1, 80)
