"""The Kubernetes driver follows its cluster with watches (`podsys.drivers.kube_watch`) and
answers as the list-based driver does; an end between two reconciles is not lost; a 410 lists
again; a dropped watch resumes from the last version seen. Against the fake API server."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from kubernetes import client

from podsys.drivers import kube_watch
from podsys.drivers.base import DriverError, Phase, Resources, Workload
from podsys.drivers.kubernetes import PODS, UNFINISHED_PODS, KubernetesDriver
from podsys.services.clusters import cluster_create
from tests.fakekube import FakeKube

REPO = Path(__file__).resolve().parent.parent
NS = "ogai-watch"


@pytest.fixture(autouse=True)
def _no_watch_outlives_its_test():
    yield
    kube_watch.stop_all()
    assert kube_watch.running_threads() == []


@pytest.fixture
def kube():
    fake = FakeKube().start()
    fake.add_node("node-1", gpus=8)
    fake.add_node("node-2", gpus=8)
    try:
        yield fake
    finally:
        kube_watch.stop_all()
        fake.stop()


def driver(fake: FakeKube, **options) -> KubernetesDriver:
    return KubernetesDriver(cluster="watched", options={
        "kubeconfig": fake.kubeconfig(), "default_image": "python:3.11", "retry_delay_s": 0,
        **options})


def workload(workload_id: str, *, replicas: int = 1, gpus: int = 0, service: bool = False,
             image: str = "", placement: tuple[str, ...] = ()) -> Workload:
    return Workload(id=workload_id, command=("python", "-c", "print(1)"), replicas=replicas,
                    resources=Resources(cpu_cores=1, memory_mib=128, gpus=gpus),
                    labels={"ogai.tenant": "watch"}, service=service,
                    ports=(8000,) if service else (), image=image,
                    placement=placement)


def informer(collection) -> kube_watch.Informer:
    [watch] = kube_watch._watches.values()
    return watch.informers[collection.name]


def wait_until(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def selector(handle: str) -> str:
    return f"ogai.io/workload={handle}"


def test_an_end_between_two_reconciles_is_seen_by_watches_and_missed_by_lists(kube):
    watching, listing = driver(kube), driver(kube, watch=False)
    handle = watching.launch(workload("job-1-a1", replicas=2))
    kube.start_pods()
    assert watching.status([handle])[handle].phase == Phase.RUNNING
    assert listing.status([handle])[handle].phase == Phase.RUNNING
    # Between two reconciles: the pods succeed, then the Job and its pods are deleted.
    kube.finish_pods(label_selector=selector(handle), exit_code=0)
    batch = client.BatchV1Api(watching.api)
    batch.delete_namespaced_job(handle, "ogai-watch", body=client.V1DeleteOptions(
        propagation_policy="Background"))
    assert kube.objects("Job") == [] and kube.pods(selector(handle)) == []
    assert listing.status([handle])[handle].phase == Phase.MISSING
    ended = watching.status([handle])[handle]
    assert ended.phase == Phase.SUCCEEDED and ended.exit_code == 0
    assert [r.phase for r in ended.replicas] == [Phase.SUCCEEDED, Phase.SUCCEEDED]
    # A workload deleted while it ran (cancelled) has no end to tell: missing, as a list says.
    other = watching.launch(workload("job-2-a1"))
    kube.start_pods()
    assert watching.status([other])[other].phase == Phase.RUNNING
    watching.cancel(other)
    assert watching.status([other])[other].phase == Phase.MISSING


def test_tombstones_are_bounded_in_count_and_time(monkeypatch):
    store = kube_watch.Store(PODS)
    monkeypatch.setattr(kube_watch, "TOMBSTONE_MAX", 3)
    for i in range(5):
        store.delete({"metadata": {"name": f"p{i}", "namespace": "n",
                                   "labels": {"ogai.io/workload": f"w{i}"}}})
    assert [key[1] for key in store.tombstones] == ["p2", "p3", "p4"]
    assert store.ended("w4") and not store.ended("w0")
    monkeypatch.setattr(kube_watch, "TOMBSTONE_TTL_S", 0.0)
    store.expire()
    assert not store.tombstones


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-410"])
def test_a_410_lists_again_and_what_was_deleted_in_the_gap_leaves_the_store(kube, as_http):
    kube.watch_gone_as_http = as_http
    watching = driver(kube)
    kept, gone = watching.launch(workload("job-3-a1")), watching.launch(workload("job-4-a1"))
    kube.start_pods()
    assert {s.phase for s in watching.status([kept, gone]).values()} == {Phase.RUNNING}
    pods = informer(PODS)
    lists = pods.lists
    with kube.lock:  # in one go: no watch sends a thing before it is dropped
        kube.delete_object("Job", gone, NS)
        for pod in kube.pods(selector(gone)):
            kube.delete_object("Pod", pod["metadata"]["name"], NS)
        kube.compact_watch_history()
        kube.drop_watches()
    wait_until(lambda: pods.lists > lists)
    with pods.lock:
        assert not pods.store.labelled(gone)
        assert pods.store.labelled(kept)
    statuses = watching.status([kept, gone])
    assert statuses[kept].phase == Phase.RUNNING
    assert statuses[gone].phase == Phase.MISSING  # it ran when it went: no end to tell


def test_a_dropped_watch_resumes_from_the_last_version_seen(kube):
    watching = driver(kube)
    handle = watching.launch(workload("job-5-a1"))
    watching.status([handle])
    pods = informer(PODS)
    lists = pods.lists
    with kube.lock:
        seen = pods.store.version
        assert seen == kube.store.resource_version  # caught up (a bookmark)
        sent = len(kube.request_details)
        kube.drop_watches()

    def reopened():
        return [r for r in kube.request_details[sent:] if r["path"] == "/api/v1/pods"
                and r["query"].get("watch") == "true"
                and r["query"].get("labelSelector") == PODS.label_selector]

    wait_until(reopened)
    assert reopened()[0]["query"]["resourceVersion"] == seen
    assert reopened()[0]["query"]["allowWatchBookmarks"] == "true"
    kube.start_pods()
    assert watching.status([handle])[handle].phase == Phase.RUNNING
    assert pods.lists == lists  # resumed, not listed again


def test_watches_answer_as_lists_do_for_many_workloads_in_many_states(kube):
    kube.add_node("node-3", gpus=8)
    kube.add_node("node-4", gpus=8, unschedulable=True)
    watching, listing = driver(kube), driver(kube, watch=False)
    kube.fail_image_pulls("broken:1")
    handles = {
        "running": watching.launch(workload("job-10-a1", replicas=2, gpus=4)),
        "succeeded": watching.launch(workload("job-11-a1", replicas=2)),
        "failed": watching.launch(workload("job-12-a1")),
        "oom": watching.launch(workload("job-13-a1")),
        "pull": watching.launch(workload("job-14-a1", image="broken:1")),
        "unschedulable": watching.launch(workload("job-15-a1", gpus=64)),
        "service": watching.launch(workload("svc-16-a1", replicas=2, service=True)),
        "lost": watching.launch(workload("job-17-a1", placement=("node-3",))),
        "cancelled": watching.launch(workload("job-18-a1")),
        "pending": "job-19-a1",
    }
    assert watching.status(list(handles.values()))  # the watches start here, before the rest
    kube.start_pods()
    kube.finish_pods(label_selector=selector(handles["succeeded"]), exit_code=0)
    kube.finish_pods(label_selector=selector(handles["failed"]), exit_code=3,
                     reason="Error")
    [oom] = kube.pods(selector(handles["oom"]))
    kube.oom(oom["metadata"]["name"])
    [lost] = kube.pods(selector(handles["lost"]))
    kube.set_node_ready(lost["spec"]["nodeName"], False)
    watching.cancel(handles["cancelled"])
    watching.launch(workload(handles["pending"]))
    names = [*handles.values(), "job-99-none"]
    seen, listed = watching.status(names), listing.status(names)
    assert seen == listed
    phases = {name: seen[handle].phase for name, handle in handles.items()}
    assert phases["running"] == Phase.RUNNING and phases["succeeded"] == Phase.SUCCEEDED
    assert phases["failed"] == phases["oom"] == phases["pull"] == phases["lost"] == Phase.FAILED
    assert phases["cancelled"] == Phase.MISSING and phases["unschedulable"] == Phase.PENDING
    assert watching.nodes() == listing.nodes()
    assert {n.name: n.gpus_allocated for n in watching.nodes()}["node-1"] > 0
    assert watching.endpoint(handles["service"]) == listing.endpoint(handles["service"])


def test_a_watch_that_leaves_a_selector_is_told_deleted(kube):
    watching = driver(kube)
    handle = watching.launch(workload("job-20-a1"))
    kube.start_pods()
    watching.nodes()
    unfinished = informer(UNFINISHED_PODS)
    with unfinished.lock:
        assert len(unfinished.store.objects) == 1
    kube.finish_pods(label_selector=selector(handle))
    watching.nodes()
    with unfinished.lock:
        assert unfinished.store.objects == {}


def test_the_watch_options_are_checked():
    for options, words in (({"watch": "yes"}, "'watch'"), ({"watch_lag_s": -1}, "watch_lag_s"),
                           ({"watch_idle_s": 0}, "watch_idle_s"),
                           ({"watch_lag_s": "soon"}, "watch_lag_s")):
        with pytest.raises(DriverError, match=words):
            KubernetesDriver(cluster="c", options={"kubeconfig": "", **options})


def test_a_cluster_with_bad_watch_options_is_not_registered(world, kube):
    with pytest.raises(ValidationError, match="watch_lag_s"):
        cluster_create(actor=world.operator, name="kube-bad", driver="kubernetes",
                       options={"watch_lag_s": "soon"}, kubeconfig=kube.kubeconfig())


def test_idle_watches_stop_and_none_outlives_stop_all(kube):
    watching = driver(kube, watch_idle_s=0.3)
    watching.status(["job-30-a1"])
    assert kube_watch.running_threads()
    wait_until(lambda: not kube_watch.running_threads(), timeout=10)
    assert kube.watches_open == 0 or wait_until(lambda: kube.watches_open == 0) is None
    driver(kube).nodes()
    assert kube_watch.running_threads()
    kube_watch.stop_all()
    assert kube_watch.running_threads() == []


def test_the_bench_runs_at_tiny_sizes():
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "kube_reconcile.py"), "--quick"],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("list_reconcile_ms", "watch_reconcile_ms", "list_requests", "watch_requests",
                "bytes_listed", "bytes_watched", "time_ratio", "bytes_ratio"):
        assert key in figures
    assert figures["bytes_watched"] < figures["bytes_listed"]
