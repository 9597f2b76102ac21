"""platform/'s monitoring files: Grafana dashboards, provisioning, Prometheus configuration and
alert rules. Every metric their queries use must exist: in `podsys.metric_names` (what the DCGM
exporter, the node exporter and OGAI's own exporter serve) or on OGAI's /metrics."""

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from podsys.metric_names import NODE_METRICS

PLATFORM = Path(__file__).resolve().parent.parent / "platform"
# One copy of the dashboards, for compose and Kubernetes (ConfigMaps) alike.
DASHBOARD_DIR = PLATFORM / "kubernetes" / "monitoring" / "dashboards"
DASHBOARDS = sorted(DASHBOARD_DIR.glob("*.json"))
RULES = PLATFORM / "prometheus" / "rules.yml"
PROMETHEUS = PLATFORM / "prometheus" / "prometheus.yml"
# Prometheus's own series about each scrape.
BUILT_IN = {"up"}
PROMQL_WORDS = {"and", "or", "unless", "bool", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (identifiers that are not functions,
    keywords, label names or durations)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^{}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges and subqueries
    expr = re.sub(r"\boffset\s+\S+", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\b(on|ignoring)\s*\(\s*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word = match.group(0)
        if expr[match.end():].lstrip().startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function or an aggregation, or a keyword
        names.add(word)
    return names


def test_metric_names_reads_promql():
    assert metric_names('sum by (gpu) (rate(a_total{x="y{z}"}[5m])) / on() b offset 1h') == \
        {"a_total", "b"}
    assert metric_names("histogram_quantile(0.9, sum by (le) (rate(c_bucket[$__rate_interval])))"
                        ) == {"c_bucket"}
    assert metric_names("x > 0.97 and changes(y[15m]) > 0") == {"x", "y"}


@pytest.fixture
def known_names(client, farm) -> set[str]:
    """Every name on OGAI's /metrics once there are jobs, nodes and a cycle, with the node
    metrics and Prometheus's own."""
    farm.submit(gpus=1)
    farm.cycle()
    client.get("/healthz")
    response = client.get("/metrics")
    assert response.status_code == 200
    names = {sample.name
             for family in text_string_to_metric_families(response.content.decode())
             for sample in family.samples}
    assert {"ogai_jobs", "ogai_scheduler_cycles_total", "ogai_celery_queue_length",
            "ogai_http_requests_total", "ogai_nodes"} <= names
    return names | {metric.name for metric in NODE_METRICS} | BUILT_IN


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries.append((panel["title"], target["expr"]))
    return queries


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_dashboards_are_grafana_json_on_known_metrics(path, known_names):
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"].startswith("OGAI")
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {var["name"]: var for var in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"], panel["title"]
    queries = dashboard_queries(dashboard)
    assert queries
    for title, expr in queries:
        unknown = metric_names(expr) - known_names
        assert not unknown, f"{path.name}, panel {title!r}: unknown metrics {unknown}"
        assert metric_names(expr), f"{path.name}, panel {title!r} reads no metric"
    for var in variables.values():
        if var["type"] == "query":
            source = re.match(r"label_values\((\w+),\s*(\w+)\)", var["definition"])
            assert source and source.group(1) in known_names, var["name"]


def test_the_gpu_dashboard_is_per_node_on_the_dcgm_names():
    dashboard = json.loads((DASHBOARD_DIR / "gpu-nodes.json").read_text())
    variables = {var["name"] for var in dashboard["templating"]["list"]}
    assert "Hostname" in variables
    used = set().union(*(metric_names(expr) for _, expr in dashboard_queries(dashboard)))
    gpu_metrics = {metric.name for metric in NODE_METRICS if metric.per_gpu}
    assert gpu_metrics <= used, f"no panel for {gpu_metrics - used}"
    for _, expr in dashboard_queries(dashboard):
        if metric_names(expr) & gpu_metrics:
            assert 'Hostname=~"$Hostname"' in expr


def test_alert_rules_are_complete_and_on_known_metrics(known_names):
    rules = yaml.safe_load(RULES.read_text())
    alerts = []
    for group in rules["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            assert re.fullmatch(r"\d+[smh]", rule["for"])
            unknown = metric_names(rule["expr"]) - known_names
            assert not unknown, f"alert {rule['alert']}: unknown metrics {unknown}"
            alerts.append(rule["alert"])
    assert len(alerts) == len(set(alerts))
    used = set().union(*(metric_names(rule["expr"]) for group in rules["groups"]
                         for rule in group["rules"]))
    for needed in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP",
                   "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                   "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_POWER_MGMT_LIMIT",
                   "ogai_scheduler_cycle_seconds_total", "ogai_celery_queue_length",
                   "ogai_http_requests_total", "up"):
        assert needed in used, f"no alert on {needed}"


def test_prometheus_config_loads_the_rules_and_scrapes_what_the_rules_name():
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert [Path(path).name for path in config["rule_files"]] == [RULES.name]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert {"ogai", "dcgm-exporter", "node-exporter"} <= set(jobs)
    assert jobs["ogai"]["metrics_path"] == "/metrics"
    named = set(re.findall(r'job="([^"]+)"', RULES.read_text()))
    assert named <= set(jobs)


def test_grafana_provisioning_points_at_the_dashboards_compose_mounts():
    provisioning = PLATFORM / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert sources["datasources"][0]["type"] == "prometheus"
    providers = yaml.safe_load((provisioning / "dashboards" / "ogai.yaml").read_text())
    path = providers["providers"][0]["options"]["path"]
    compose = yaml.safe_load((PLATFORM / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./kubernetes/monitoring/dashboards:{path}:ro" in mounts
    assert "./prometheus/rules.yml:/etc/prometheus/rules.yml:ro" in \
        compose["services"]["prometheus"]["volumes"]
