"""Node metrics: collection into the history, pruning, the series selector (history and
Prometheus), and the node's metrics API."""

import json
import threading
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from podsys.choices import NodeHealth
from podsys.drivers.base import DriverError, Resources, Workload
from podsys.drivers.fake import fake_cluster
from podsys.drivers.local import LocalDriver
from podsys.exporter import NodeCollector
from podsys.models import Cluster, NodeMetricSnapshot
from podsys.selectors import MetricsUnavailable, node_metric_series
from podsys.selectors_metrics import downsample, promql
from podsys.services.clusters import cluster_sync_nodes
from podsys.services.metrics import metrics_collect, metrics_prune, snapshot_values
from podsys.tasks.metrics import collect_metrics

UTIL = "DCGM_FI_DEV_GPU_UTIL"
ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"


@pytest.fixture
def rack(db):
    """A fake cluster of 2 nodes x 4 GPUs, its Node rows synced."""
    cluster = Cluster.objects.create(name="rack", driver="fake",
                                     options={"nodes": 2, "gpus_per_node": 4})
    cluster_sync_nodes(cluster=cluster)
    first, second = cluster.nodes.order_by("name")
    return cluster, fake_cluster("rack"), first, second


def busy(fake, node: str, gpus: int) -> None:
    fake.launch(Workload(id="job-1-a1", command=("python", "train.py"),
                         resources=Resources(gpus=gpus), placement=(node,)))


@contextmanager
def stub_server(answer):
    """An HTTP server on a free port; `answer(path, query)` returns (status, body). Yields
    (base URL, list of the requests it got)."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urlparse(self.path)
            query = {key: values[0] for key, values in parse_qs(url.query).items()}
            seen.append((url.path, query))
            status, body = answer(url.path, query)
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


# Collection --------------------------------------------------------------------------------


def test_busy_gpus_look_busy_and_set_values_are_kept(rack):
    cluster, fake, first, second = rack
    busy(fake, first.name, 2)
    fake.set_metric(first.name, ROWS, 3, gpu=2)
    fake.set_metric(second.name, "DCGM_FI_DEV_GPU_TEMP", 91)

    assert metrics_collect(cluster=cluster) == 2

    values = NodeMetricSnapshot.objects.get(node=first).values
    assert values[UTIL] == {"0": 97, "1": 97, "2": 0, "3": 0}
    assert values["DCGM_FI_DEV_POWER_USAGE"]["0"] > 5 * values["DCGM_FI_DEV_POWER_USAGE"]["3"]
    assert values[ROWS] == {"0": 0, "1": 0, "2": 3, "3": 0}
    assert values["DCGM_FI_DEV_FB_USED"]["0"] + values["DCGM_FI_DEV_FB_FREE"]["0"] == \
        first.gpu_memory_mib
    assert set(values["node_cpu_seconds_total"]) == {"user", "system", "idle"}
    assert values["node_memory_MemTotal_bytes"] == {"": first.memory_mib * 1024 * 1024}
    other = NodeMetricSnapshot.objects.get(node=second).values
    assert other["DCGM_FI_DEV_GPU_TEMP"] == {"0": 91, "1": 91, "2": 91, "3": 91}


def test_set_metric_refuses_what_the_node_cannot_have(rack):
    _, fake, first, _ = rack
    with pytest.raises(ValueError, match="unknown metric"):
        fake.set_metric(first.name, "DCGM_FI_DEV_NOPE", 1)
    with pytest.raises(ValueError, match="no GPU 9"):
        fake.set_metric(first.name, UTIL, 1, gpu=9)
    with pytest.raises(DriverError):
        fake.set_metric("fake-node-404", UTIL, 1)


def test_nodes_that_do_not_answer_are_skipped(rack):
    cluster, fake, first, second = rack
    fake.lose_node(second.name)  # the driver answers None for it
    assert metrics_collect(cluster=cluster) == 1
    second.health = NodeHealth.LOST
    second.save()
    first.name = "renamed-away"  # the driver does not know it: an error, logged and skipped
    first.save()
    assert metrics_collect(cluster=cluster) == 0
    assert NodeMetricSnapshot.objects.count() == 1


def test_nothing_is_kept_when_prometheus_keeps_the_history(rack, settings):
    settings.OGAI_PROMETHEUS_URL = "http://prometheus:9090"
    assert metrics_collect(cluster=rack[0]) == 0
    assert not NodeMetricSnapshot.objects.exists()


def test_metrics_url_scrapes_each_node_and_skips_those_that_fail(rack):
    cluster, _, first, second = rack
    text = NodeCollector(hostname=first.name).exposition()
    with stub_server(lambda path, query: (200, text) if path == "/node/metrics"
                     else (404, "no")) as (base, seen):
        address = base.removeprefix("http://")
        first.address = f"{address}/node"
        first.save()
        second.address = f"{address}/missing"
        second.save()
        cluster.options = {**cluster.options, "metrics_url": ["http://{address}/metrics"]}
        cluster.save()
        assert metrics_collect(cluster=cluster) == 1
    assert sorted(path for path, _ in seen) == ["/missing/metrics", "/node/metrics"]
    values = NodeMetricSnapshot.objects.get(node=first).values
    assert values["node_memory_MemTotal_bytes"][""] > 0


def test_counters_named_without_total_are_read_back_by_their_dcgm_name():
    text = ("# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL x\n# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n"
            'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",Hostname="n"} 2\n'
            "# TYPE node_cpu_seconds_total counter\n"
            'node_cpu_seconds_total{cpu="0",mode="idle"} 10\n'
            'node_cpu_seconds_total{cpu="1",mode="idle"} 5\n'
            "# TYPE something_else gauge\nsomething_else 1\n")
    assert snapshot_values(text) == {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": {"0": 2.0},
                                     "node_cpu_seconds_total": {"idle": 15.0}}


def test_prune_keeps_only_the_configured_hours(rack, settings):
    settings.OGAI_METRICS_HISTORY_H = 2
    _, _, first, _ = rack
    now = timezone.now()
    NodeMetricSnapshot.objects.bulk_create([
        NodeMetricSnapshot(node=first, at=now - timedelta(minutes=minutes), values={})
        for minutes in (0, 60, 119, 121, 600)])
    assert metrics_prune(now=now) == 2
    assert metrics_prune(now=now) == 0
    assert NodeMetricSnapshot.objects.count() == 3


def test_the_task_collects_every_active_cluster_then_prunes(rack, settings):
    first = rack[2]
    Cluster.objects.create(name="retired", driver="fake", is_active=False)
    NodeMetricSnapshot.objects.create(node=first, at=timezone.now() - timedelta(days=3),
                                      values={})
    assert collect_metrics() == 2
    assert NodeMetricSnapshot.objects.count() == 2


def test_the_local_driver_reads_this_machine(tmp_path):
    driver = LocalDriver(cluster="here", options={"root": str(tmp_path), "node_name": "box"})
    values = snapshot_values(driver.node_metrics("box"))
    assert values["node_memory_MemTotal_bytes"][""] > 0
    assert driver.node_metrics("another-node") is None


# The series selector: the history ----------------------------------------------------------


def test_series_from_the_history(rack):
    first = rack[2]
    now = timezone.now()
    NodeMetricSnapshot.objects.bulk_create([
        NodeMetricSnapshot(node=first, at=now - timedelta(minutes=minutes),
                           values={UTIL: {"0": float(minutes), "1": 1.0}})
        for minutes in (90, 30, 20, 10)])
    series = node_metric_series(node=first, names=[UTIL, ROWS],
                                since=now - timedelta(hours=1))
    assert series[ROWS] == {}
    assert [value for _, value in series[UTIL]["0"]] == [30, 20, 10]
    times = [when for when, _ in series[UTIL]["1"]]
    assert times == sorted(times)
    assert times[-1] == pytest.approx((now - timedelta(minutes=10)).timestamp())


def test_a_long_history_is_cut_to_at_most_300_points(rack):
    _, _, first, _ = rack
    now = timezone.now()
    NodeMetricSnapshot.objects.bulk_create([
        NodeMetricSnapshot(node=first, at=now - timedelta(seconds=10 * i),
                           values={UTIL: {"0": 50.0}, "node_cpu_seconds_total": {"idle": -i}})
        for i in range(1000)])
    series = node_metric_series(node=first, names=[UTIL, "node_cpu_seconds_total"],
                                since=now - timedelta(seconds=10000))
    assert 250 <= len(series[UTIL]["0"]) <= 300
    assert {value for _, value in series[UTIL]["0"]} == {50.0}
    # A counter keeps its last value in each bucket, so the newest is exact.
    assert series["node_cpu_seconds_total"]["idle"][-1][1] == 0


def test_downsampling_averages_gauges():
    points = [(float(t), float(t % 2)) for t in range(100)]
    cut = downsample(points, 0, 100, limit=10)
    assert len(cut) == 10
    assert {value for _, value in cut} == {0.5}


def test_unknown_metric_names_are_refused(rack):
    with pytest.raises(ValidationError) as refused:
        node_metric_series(node=rack[2], names=["DCGM_FI_DEV_NOPE"], since=timezone.now())
    assert "names" in refused.value.message_dict


# The series selector: Prometheus -----------------------------------------------------------


def matrix(*series):
    return {"status": "success", "data": {"resultType": "matrix", "result": list(series)}}


def test_series_from_prometheus_query_range(rack, settings):
    _, _, first, _ = rack
    first.address = "10.0.0.7"
    first.save()
    now = timezone.now()
    start = (now - timedelta(hours=1)).timestamp()

    def answer(path, query):
        if "DCGM" in query["query"]:
            return 200, matrix({"metric": {"gpu": "1"}, "values": [[start, "40"], [start + 60,
                                                                                   "42.5"]]},
                               {"metric": {"gpu": "0"}, "values": [[start, "NaN"]]})
        return 200, matrix({"metric": {}, "values": [[start, "0.25"]]})

    with stub_server(answer) as (base, seen):
        settings.OGAI_PROMETHEUS_URL = base + "/"
        series = node_metric_series(node=first, names=[UTIL, "node_load1"],
                                    since=now - timedelta(hours=1))
    assert series == {UTIL: {"0": [], "1": [(start, 40.0), (start + 60, 42.5)]},
                      "node_load1": {"": [(start, 0.25)]}}
    # The two queries go out in parallel: in either order.
    (gpu_path, gpu_query), (node_path, node_query) = sorted(
        seen, key=lambda request: "DCGM" not in request[1]["query"])
    assert gpu_path == node_path == "/api/v1/query_range"
    assert gpu_query["query"] == 'max by (gpu) (DCGM_FI_DEV_GPU_UTIL{Hostname="fake-node-000"})'
    assert node_query["query"] == \
        'max(node_load1{instance=~"(10\\\\.0\\\\.0\\\\.7|fake\\\\-node\\\\-000)(:[0-9]+)?"})'
    assert float(gpu_query["end"]) - float(gpu_query["start"]) == pytest.approx(3600, abs=5)
    assert 3600 / int(gpu_query["step"]) <= 300


def test_the_node_label_of_gpu_series_is_a_cluster_option(rack):
    cluster, _, first, _ = rack
    cluster.options = {**cluster.options, "prometheus_node_label": "kubernetes_node"}
    cluster.save()
    first.refresh_from_db()
    from podsys.metric_names import METRICS_BY_NAME

    assert promql(first, METRICS_BY_NAME[UTIL]) == \
        'max by (gpu) (DCGM_FI_DEV_GPU_UTIL{kubernetes_node="fake-node-000"})'
    assert promql(first, METRICS_BY_NAME["node_cpu_seconds_total"]).startswith(
        "sum by (mode) (node_cpu_seconds_total{instance=~")
    cluster.options = {**cluster.options, "prometheus_node_label": "not a label"}
    cluster.save()
    first.refresh_from_db()
    with pytest.raises(MetricsUnavailable, match="prometheus_node_label='not a label'"):
        promql(first, METRICS_BY_NAME[UTIL])


def test_a_slow_prometheus_costs_one_timeout_not_one_per_chart(rack, settings, monkeypatch):
    import time as clock

    from podsys import selectors_metrics

    monkeypatch.setattr(selectors_metrics, "PROMETHEUS_TIMEOUT_S", 0.5)

    def slow(path, query):
        clock.sleep(0.8)
        return 200, {"status": "success", "data": {"resultType": "matrix", "result": []}}

    names = [metric.name for metric in selectors_metrics.METRICS_BY_NAME.values()][:8]
    with stub_server(slow) as (base, _):
        settings.OGAI_PROMETHEUS_URL = base
        began = clock.monotonic()
        with pytest.raises(MetricsUnavailable, match="did not answer"):
            node_metric_series(node=rack[2], names=names, since=timezone.now())
        assert clock.monotonic() - began < 2.0, "8 queries in parallel, one deadline"


def test_prometheus_errors_say_what_went_wrong(rack, settings):
    first = rack[2]
    refusal = {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}
    with stub_server(lambda path, query: (400, refusal)) as (base, _):
        settings.OGAI_PROMETHEUS_URL = base
        with pytest.raises(MetricsUnavailable, match=r"refused the query.*parse error"):
            node_metric_series(node=first, names=[UTIL], since=timezone.now())
    settings.OGAI_PROMETHEUS_URL = "http://127.0.0.1:1"
    with pytest.raises(MetricsUnavailable, match="did not answer"):
        node_metric_series(node=first, names=[UTIL], since=timezone.now())


# The API -----------------------------------------------------------------------------------


def test_the_node_metrics_api(api, world, rack, settings):
    _, _, first, _ = rack
    NodeMetricSnapshot.objects.create(node=first, at=timezone.now() - timedelta(minutes=5),
                                      values={UTIL: {"0": 97.0}})
    client = api.as_user(world.alpha_viewer)
    url = f"/api/v1/podsys/nodes/{first.pk}/metrics/"
    answer = client.get(url, {"names": f"{UTIL},{ROWS}", "since": "3600"})
    assert answer.status_code == 200
    assert answer.json()[ROWS] == {}
    [[when, value]] = answer.json()[UTIL]["0"]
    assert value == 97.0 and when > 0

    every = client.get(url).json()
    assert UTIL in every and "node_load1" in every

    bad = client.get(url, {"names": "rm -rf"})
    assert bad.status_code == 400 and "names" in bad.json()["fields"]
    assert client.get(url, {"since": "5"}).json()["fields"]["since"]

    settings.OGAI_PROMETHEUS_URL = "http://127.0.0.1:1"
    down = client.get(url, {"names": UTIL})
    assert down.status_code == 503
    assert down.json()["code"] == "metrics_unavailable"
