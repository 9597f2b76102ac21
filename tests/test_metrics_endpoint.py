"""OGAI's own /metrics: requests, Celery queues, jobs by state, scheduler cycles, nodes."""

import socket
import time
import uuid

import pytest
from kombu import Connection
from kombu.transport import filesystem
from kombu.transport.virtual import BrokerState
from prometheus_client.parser import text_string_to_metric_families

from aistation.choices import JobState
from aistation.services.scheduling import schedule_cluster
from ogai import metrics
from ogai.celery import QUEUES
from podsys.models import Cluster


def scrape(client, **headers) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}} of /metrics, read by prometheus_client."""
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = \
                sample.value
    return found


class _OwnFilesystemTransport(filesystem.Transport):
    # kombu's filesystem transport keeps its bindings in one state for the whole process: the
    # platform's (Celery's "default" queue, bound by earlier tests in another folder) would
    # keep this test's binding from being written, and its message from being routed.
    global_state = BrokerState()


def filesystem_broker(folder) -> Connection:
    folder.mkdir(exist_ok=True)
    # Every folder inside the test's own: kombu's default control folder is the working
    # directory's `control/`.
    return Connection(transport=_OwnFilesystemTransport, transport_options={
        "data_folder_in": str(folder), "data_folder_out": str(folder),
        "control_folder": str(folder / "control")})


def test_metrics_carry_every_documented_series(client, farm):
    for tenant in ("alpha", "beta", "alpha"):  # the third waits: 2 nodes x 8 GPUs
        farm.submit(tenant, gpus=8)
    farm.cycle()
    client.get("/healthz")
    client.get("/no-such-page/")

    found = scrape(client)

    requests = found["ogai_http_requests_total"]
    assert requests[(("method", "GET"), ("status", "200"))] >= 1
    assert requests[(("method", "GET"), ("status", "404"))] >= 1
    assert found["ogai_http_request_duration_seconds_count"][(("method", "GET"),)] >= 2
    assert (("le", "+Inf"), ("method", "GET")) in found["ogai_http_request_duration_seconds_bucket"]

    assert found["ogai_celery_broker_up"][()] == 1
    assert {labels[0][1] for labels in found["ogai_celery_queue_length"]} == set(QUEUES)

    jobs = {labels[0][1]: value for labels, value in found["ogai_jobs"].items()}
    assert set(jobs) == set(JobState.values)  # every state, 0 included
    assert jobs["running"] + jobs["admitted"] == 2
    assert jobs["queued"] == 1
    assert jobs["failed"] == 0

    farm_label = (("cluster", "farm"),)
    assert found["ogai_scheduler_cycles_total"][farm_label] == 1
    assert found["ogai_scheduler_cycle_seconds_total"][farm_label] > 0
    assert found["ogai_scheduler_cycle_last_seconds"][farm_label] == \
        pytest.approx(found["ogai_scheduler_cycle_seconds_total"][farm_label])

    nodes = found["ogai_nodes"]
    assert nodes[(("cluster", "farm"), ("state", "in_service"))] == 2
    assert nodes[(("cluster", "farm"), ("state", "cordoned"))] == 0


def test_cycles_add_up_and_skipped_ones_do_not_count(client, farm):
    farm.cycle()
    farm.cycle()
    cluster = Cluster.objects.get(pk=farm.cluster.pk)
    assert cluster.cycles_total == 2
    # Asked for before the last cycle looked: skipped, not counted.
    assert schedule_cluster(cluster_id=cluster.pk, requested_at=time.time() - 3600).skipped
    cluster.refresh_from_db()
    assert cluster.cycles_total == 2
    assert cluster.cycle_seconds_total >= cluster.cycle_seconds_last > 0
    assert scrape(client)["ogai_scheduler_cycles_total"][(("cluster", "farm"),)] == 2


def test_cordoned_and_lost_nodes_are_counted_apart(client, farm):
    first, second = farm.cluster.nodes.order_by("name")
    first.schedulable = False
    first.save()
    second.health = "lost"
    second.save()
    nodes = scrape(client)["ogai_nodes"]
    assert nodes[(("cluster", "farm"), ("state", "cordoned"))] == 1
    assert nodes[(("cluster", "farm"), ("state", "lost"))] == 1
    assert nodes[(("cluster", "farm"), ("state", "in_service"))] == 0


def test_the_token_setting_guards_metrics(client, db, settings):
    settings.OGAI_METRICS_TOKEN = "scrape-me"
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic scrape-me").status_code == 401
    assert "ogai_jobs" in scrape(client, HTTP_AUTHORIZATION="Bearer scrape-me")


def test_without_a_token_only_the_metrics_networks_may_read(client, db, settings):
    settings.OGAI_METRICS_NETWORKS = ["10.0.0.0/8"]
    refused = client.get("/metrics", REMOTE_ADDR="203.0.113.9")
    assert refused.status_code == 403
    assert b"OGAI_METRICS_TOKEN" in refused.content
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    settings.OGAI_METRICS_TOKEN = "s3cret-scrape"
    allowed = client.get("/metrics", REMOTE_ADDR="203.0.113.9",
                         HTTP_AUTHORIZATION="Bearer s3cret-scrape")
    assert allowed.status_code == 200


def test_queue_lengths_on_the_filesystem_broker(tmp_path):
    with filesystem_broker(tmp_path / "queue") as connection:
        for queue, count in (("cluster", 2), ("default", 1)):
            simple = connection.SimpleQueue(queue)
            for number in range(count):
                simple.put({"n": number})
            simple.close()
        assert metrics.queue_lengths(connection, QUEUES) == {
            "default": 1, "cluster": 2, "provision": 0, "toolchain": 0}


def _redis_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.mark.skipif(not _redis_answers(), reason="no Redis at 127.0.0.1:6379")
def test_queue_lengths_on_redis():
    names = [f"ogai-test-{uuid.uuid4().hex[:8]}-{n}" for n in range(2)]
    with Connection("redis://127.0.0.1:6379/15") as connection:
        simple = connection.SimpleQueue(names[0])
        try:
            for number in range(3):
                simple.put({"n": number})
            # The second queue never got a message: Redis has no key for it.
            assert metrics.queue_lengths(connection, names) == {names[0]: 3, names[1]: 0}
        finally:
            simple.clear()
            simple.close()


def test_queue_length_through_metrics(client, db, tmp_path, monkeypatch):
    folder = tmp_path / "queue"
    with filesystem_broker(folder) as connection:
        simple = connection.SimpleQueue("provision")
        simple.put({"run": 1})
        simple.put({"run": 2})
        simple.close()
    monkeypatch.setattr(metrics, "_broker_connection", lambda: filesystem_broker(folder))
    lengths = scrape(client)["ogai_celery_queue_length"]
    assert lengths[(("queue", "provision"),)] == 2
    assert lengths[(("queue", "cluster"),)] == 0


def test_a_broker_that_does_not_answer_is_reported_not_fatal(client, db, monkeypatch):
    # redis-py retries a refused connection for about 2 s: the scrape waits less than that.
    monkeypatch.setattr(metrics, "BROKER_TIMEOUT_S", 0.2)
    monkeypatch.setattr(metrics, "_broker_connection", lambda: Connection(
        "redis://127.0.0.1:1/0", connect_timeout=0.2,
        transport_options={"socket_connect_timeout": 0.2, "max_retries": 0}))
    started = time.monotonic()
    found = scrape(client)
    assert time.monotonic() - started < 1.5
    assert found["ogai_celery_broker_up"][()] == 0
    assert "ogai_celery_queue_length" not in found
    assert "ogai_jobs" in found


def test_a_failing_collector_leaves_the_rest(client, db, monkeypatch):
    class Broken:
        def collect(self):
            raise RuntimeError("database gone")

    monkeypatch.setattr(metrics, "_collectors", [Broken(), *metrics._collectors])
    found = scrape(client)
    assert "ogai_jobs" in found and "ogai_http_requests_total" in found
