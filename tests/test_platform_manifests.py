"""platform/kubernetes/ (the platform deploying itself) and platform/Dockerfile.

Every Kustomize target renders with `kubectl kustomize` (CI machines have kubectl; without it these
tests fail, they never skip), every rendered object validates against the Kubernetes API schemas
of 1.30 to 1.33 (PyPI kubernetes-validate, bundled and offline), the properties a safe
deployment needs hold, and every overlay applies, in dependency order, to the fake API server
through the official client.

Custom resources (the Prometheus Operator's ServiceMonitor and PrometheusRule, CloudNativePG's
Cluster) have no schema in kubernetes-validate: their common shape is checked
(`kube_schema.check_object`), and what matters in them is asserted below by name
(`test_the_service_monitor_*`, `test_the_prometheus_rule_*`, `test_the_cloudnativepg_*`).
"""

import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config, utils
from kubernetes_validate import SchemaNotFoundError, ValidationError, validate

from podsys.drivers.kube_schema import check_object
from tests.fakekube import FakeKube

ROOT = Path(__file__).resolve().parent.parent
PLATFORM = ROOT / "platform"
KUBE = PLATFORM / "kubernetes"
OVERLAYS = ("overlays/external", "overlays/cloudnativepg")
TARGETS = ("base", *OVERLAYS, "rbac", "monitoring")
VERSIONS = ("1.30.0", "1.31.0", "1.32.0", "1.33.0")
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "Cluster"}
WORKLOADS = ("Deployment", "StatefulSet", "Job")
NAMESPACE = "ogai-system"
SECRET = "ogai-secrets"
CNPG_SECRET_KEY = "uri"  # CloudNativePG's app Secret: the whole database URL
# Settings that are secrets: read from a Secret by reference, never written in a manifest.
SECRET_SETTINGS = {"DATABASE_URL", "CELERY_BROKER_URL", "OGAI_CACHE_URL", "SECRET_KEY",
                   "OGAI_ENCRYPTION_KEY", "OGAI_METRICS_TOKEN", "REDIS_PASSWORD"}
QUEUES = ("default", "cluster", "provision", "toolchain")  # ogai/celery.py
WRITABLE = {"/tmp", "/var/lib/ogai"}  # noqa: S108 - mount points in the pod (emptyDir, claim)
# Applied in this order: what others refer to (or live in) first.
APPLY_ORDER = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
               "RoleBinding", "ConfigMap", "Secret", "PersistentVolumeClaim", "Cluster",
               "Service", "Deployment", "StatefulSet", "Job", "HorizontalPodAutoscaler",
               "PodDisruptionBudget", "Ingress", "NetworkPolicy", "ServiceMonitor",
               "PrometheusRule")


@functools.cache
def render(target: str) -> tuple[dict, ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed: it renders platform/kubernetes/ (kubectl "
                    "kustomize) and CI has it; install kubectl 1.30 or newer")
    done = subprocess.run([kubectl, "kustomize", str(KUBE / target)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, f"kubectl kustomize {target}:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def of_kind(objects, kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]


def named(objects, kind: str, name: str) -> dict:
    found = [obj for obj in of_kind(objects, kind) if obj["metadata"]["name"] == name]
    assert found, f"no {kind} {name}"
    return found[0]


def pod_specs(objects) -> list[tuple[str, dict]]:
    return [(f"{obj['kind']} {obj['metadata']['name']}", obj["spec"]["template"]["spec"])
            for obj in objects if obj["kind"] in WORKLOADS]


def containers(spec: dict) -> list[dict]:
    return [*(spec.get("initContainers") or []), *spec["containers"]]


def is_ogai(obj: dict) -> bool:
    return obj["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "ogai"


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# -- rendering and schemas ----------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_renders(target):
    objects = render(target)
    assert objects
    for obj in objects:
        check_object(obj)  # the client's models; custom kinds: their common shape


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_every_object_validates_against_the_api_schemas(target, version):
    skipped = set()
    for obj in render(target):
        try:
            validate(obj, version, strict=True)
        except SchemaNotFoundError:
            # No schema for custom resources: checked by the tests named after them.
            assert obj["kind"] in CUSTOM_KINDS, f"no schema for {obj['kind']} in {version}"
            skipped.add(obj["kind"])
        except ValidationError as exc:
            path = ".".join(str(part) for part in exc.path)
            pytest.fail(f"{target}: {obj['kind']} {obj['metadata']['name']} is invalid in "
                        f"Kubernetes {version} at {path}: {exc.message}")
    assert {"ServiceMonitor", "PrometheusRule"} <= skipped


# -- the properties of the workloads -----------------------------------------------------------


@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_every_container_has_requests_limits_and_a_locked_down_context(target):
    for where, spec in pod_specs(render(target)):
        pod = spec.get("securityContext") or {}
        assert pod.get("runAsNonRoot") is True, where
        assert pod.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert "automountServiceAccountToken" in spec, f"{where}: say whether it needs a token"
        for container in containers(spec):
            name = f"{where}/{container['name']}"
            resources = container.get("resources") or {}
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(part) or {}), f"{name}: {part}"
            context = container.get("securityContext") or {}
            assert context.get("runAsNonRoot") is True, name
            assert context.get("allowPrivilegeEscalation") is False, name
            assert context.get("capabilities", {}).get("drop") == ["ALL"], name
            assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
            assert context.get("readOnlyRootFilesystem") is True, name
            if is_ogai_image(container["image"]):  # its only writable folders
                mounts = {mount["mountPath"] for mount in container.get("volumeMounts", [])}
                assert mounts >= WRITABLE, f"{name}: no writable folders"


def is_ogai_image(image: str) -> bool:
    return image.rsplit(":", 1)[0].endswith("/ogai")


def test_ogai_pods_run_as_the_images_user():
    dockerfile = (PLATFORM / "Dockerfile").read_text()
    uid = int(re.search(r"useradd .*--uid (\d+)", dockerfile).group(1))
    assert re.search(rf"^USER {uid}(:\d+)?$", dockerfile, re.M)
    for where, spec in pod_specs(render("overlays/external")):
        assert spec["securityContext"]["runAsUser"] == uid, where


@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_every_image_is_pinned_to_a_tag(target):
    objects = render(target)
    images = [(where, c["image"]) for where, spec in pod_specs(objects) for c in containers(spec)]
    images += [(f"Cluster {c['metadata']['name']}", c["spec"]["imageName"])
               for c in of_kind(objects, "Cluster")]
    for where, image in images:
        name, _, tag = image.rpartition(":")
        assert name and "/" not in tag, f"{where}: {image} has no tag"
        assert tag != "latest" and re.match(r"^v?\d+\.\d+", tag), f"{where}: {image}"


@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_web_and_gateway_are_probed_and_workers_pinged(target):
    objects = render(target)
    for name in ("ogai-web", "ogai-gateway"):
        container = named(objects, "Deployment", name)["spec"]["template"]["spec"][
            "containers"][0]
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz?exclude=worker"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        # Probes and Prometheus come by the pod's address: Django must accept it as a host.
        env = {item["name"]: item for item in container["env"]}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert "$(POD_IP)" in env["ALLOWED_HOSTS"]["value"]
    for queue in QUEUES:
        container = named(objects, "Deployment", f"ogai-worker-{queue}")["spec"]["template"][
            "spec"]["containers"][0]
        assert container["command"][container["command"].index("--queues") + 1] == queue
        probe = " ".join(container["livenessProbe"]["exec"]["command"])
        assert "inspect ping" in probe and f"-d {queue}@$HOSTNAME" in probe
        assert f"{queue}@%h" in container["command"]


@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_every_worker_has_an_autoscaler_and_a_disruption_budget(target):
    objects = render(target)
    workers = [d for d in of_kind(objects, "Deployment")
               if d["spec"]["template"]["metadata"]["labels"].get(
                   "app.kubernetes.io/component") == "worker"]
    assert {w["metadata"]["name"] for w in workers} == {f"ogai-worker-{q}" for q in QUEUES}
    scalers = {h["spec"]["scaleTargetRef"]["name"]: h
               for h in of_kind(objects, "HorizontalPodAutoscaler")}
    budgets = of_kind(objects, "PodDisruptionBudget")
    for worker in workers:
        name, labels = worker["metadata"]["name"], worker["spec"]["template"]["metadata"]["labels"]
        assert "replicas" not in worker["spec"], f"{name}: the autoscaler owns replicas"
        assert scalers[name]["spec"]["scaleTargetRef"]["kind"] == "Deployment"
        assert 1 <= scalers[name]["spec"]["minReplicas"] <= scalers[name]["spec"]["maxReplicas"]
        assert [b for b in budgets if matches(b["spec"]["selector"]["matchLabels"], labels)
                and matches(b["spec"]["selector"]["matchLabels"],
                            worker["spec"]["selector"]["matchLabels"])], f"{name}: no PDB"


@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_beat_is_one_pod_never_two(target):
    beat = named(render(target), "Deployment", "ogai-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert "beat" in beat["spec"]["template"]["spec"]["containers"][0]["command"]


@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_the_migration_job_is_awaited_by_every_ogai_pod(target):
    objects = render(target)
    job = named(objects, "Job", "ogai-migrate")
    migrate = job["spec"]["template"]["spec"]["containers"][0]
    assert migrate["command"] == ["python", "manage.py", "migrate", "--noinput"]
    deployments = [d for d in of_kind(objects, "Deployment") if is_ogai(d)]
    assert "ogai-web" in {d["metadata"]["name"] for d in deployments}
    for deployment in deployments:
        inits = deployment["spec"]["template"]["spec"].get("initContainers") or []
        waits = [c for c in inits if "manage.py migrate --check" in " ".join(c["command"])]
        assert waits, f"{deployment['metadata']['name']} does not wait for the migrations"
        assert waits[0]["image"] == migrate["image"]
        assert re.search(r"seq \d+", waits[0]["command"][-1]), "the wait must be bounded"
        assert waits[0].get("envFrom") == migrate.get("envFrom")
        assert waits[0].get("env") == migrate.get("env")  # the same database


# -- secrets, settings, services and the network ---------------------------------------------


@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_no_secret_value_is_in_the_manifests_and_every_secret_is_referenced(target):
    objects = render(target)
    assert not of_kind(objects, "Secret"), "the Secrets are created by hand or by operators"
    for config_map in of_kind(objects, "ConfigMap"):
        assert not SECRET_SETTINGS & set(config_map.get("data") or {}), config_map["metadata"]
    allowed = {SECRET} | {f"{c['metadata']['name']}-app" for c in of_kind(objects, "Cluster")}
    for where, spec in pod_specs(objects):
        for container in containers(spec):
            for item in container.get("env") or []:
                assert not (item["name"] in SECRET_SETTINGS and "value" in item), where
                ref = (item.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in allowed, f"{where}: {ref}"
            sources = container.get("envFrom") or []
            assert all(s.get("secretRef", {"name": SECRET})["name"] == SECRET for s in sources)
            if is_ogai_image(container["image"]):
                assert {"secretRef": {"name": SECRET}} in sources, where


def test_the_settings_are_the_platforms_own_and_production():
    config_map = next(c for c in of_kind(render("base"), "ConfigMap")
                      if c["metadata"]["name"].startswith("ogai-config"))
    data = config_map["data"]
    assert data["OGAI_PROFILE"] == "production"
    assert data["OGAI_DATA_DIR"] == "/var/lib/ogai"
    assert data["OGAI_INTERNAL_URL"] == "http://ogai-web.ogai-system.svc:8000"
    host = named(render("base"), "Ingress", "ogai")["spec"]["rules"][0]["host"]
    assert host in data["OGAI_PUBLIC_HOSTS"].split(",")
    assert f"https://{host}" in data["CSRF_TRUSTED_ORIGINS"].split(",")


@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_services_and_ingress_reach_their_pods(target):
    objects = render(target)
    deployments = of_kind(objects, "Deployment")
    services = {s["metadata"]["name"]: s for s in of_kind(objects, "Service")}
    for service in services.values():
        selected = [d for d in deployments
                    if matches(service["spec"]["selector"], d["spec"]["template"]["metadata"]
                               ["labels"])]
        assert len(selected) == 1, service["metadata"]["name"]
        ports = {p["name"] for c in selected[0]["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    paths = {path["path"]: path["backend"]["service"]
             for rule in named(objects, "Ingress", "ogai")["spec"]["rules"]
             for path in rule["http"]["paths"]}
    assert paths["/v1/"]["name"] == "ogai-gateway" and paths["/"]["name"] == "ogai-web"
    for backend in paths.values():
        assert backend["port"]["name"] in {p["name"] for p in
                                           services[backend["name"]]["spec"]["ports"]}


@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_only_the_pods_that_drive_clusters_get_a_token(target):
    objects = render(target)
    accounts = {a["metadata"]["name"]: a for a in of_kind(objects, "ServiceAccount")}
    assert accounts["ogai-runtime"]["automountServiceAccountToken"] is False
    bound = {s["name"] for b in of_kind(objects, "ClusterRoleBinding") for s in b["subjects"]}
    for where, spec in pod_specs(objects):
        assert spec["serviceAccountName"] in accounts, where
        if spec["automountServiceAccountToken"]:
            assert spec["serviceAccountName"] in bound, where
            assert where.split()[-1] == "ogai-web" or "-worker-" in where, where


@pytest.mark.parametrize("target", ("base", *OVERLAYS))
def test_network_policies_deny_ingress_and_allow_what_ogai_needs(target):
    policies = {p["metadata"]["name"]: p["spec"] for p in of_kind(render(target),
                                                                    "NetworkPolicy")}
    deny = policies["ogai-default-deny-ingress"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] \
        and not deny.get("ingress")
    ingress_from = [peer for spec in policies.values() for rule in spec.get("ingress", [])
                    for peer in rule["from"]]
    namespaces = {peer.get("namespaceSelector", {}).get("matchLabels", {}).get(
        "kubernetes.io/metadata.name") for peer in ingress_from}
    assert {"ingress-nginx", "monitoring"} <= namespaces
    egress_ports = {port["port"] for spec in policies.values() for rule in spec.get("egress", [])
                    for port in rule.get("ports", [])}
    assert {53, 5432, 6379, 443, 6443} <= egress_ports


# -- custom resources: what the schemas cannot check ------------------------------------------


def test_the_service_monitor_scrapes_web_and_gateway_with_the_token():
    objects = render("base")
    monitor = named(objects, "ServiceMonitor", "ogai")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    scraped = [s for s in of_kind(objects, "Service")
               if matches(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert {s["metadata"]["name"] for s in scraped} == {"ogai-web", "ogai-gateway"}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics"
        assert all(endpoint["port"] in {p["name"] for p in s["spec"]["ports"]} for s in scraped)
        assert endpoint["authorization"]["credentials"] == {"name": SECRET,
                                                            "key": "OGAI_METRICS_TOKEN"}


def test_the_prometheus_rule_is_the_alert_rules_file():
    rules = yaml.safe_load((PLATFORM / "prometheus" / "rules.yml").read_text())
    rule = named(render("base"), "PrometheusRule", "ogai")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == rules["groups"]
    script = KUBE / "monitoring" / "render_prometheus_rule.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_dashboards_are_config_maps_grafana_loads():
    files = sorted((KUBE / "monitoring" / "dashboards").glob("*.json"))
    maps = [c for c in of_kind(render("base"), "ConfigMap")
            if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    loaded = {name: json.loads(text) for c in maps for name, text in c["data"].items()}
    assert sorted(loaded) == [path.name for path in files]
    for path in files:
        assert loaded[path.name] == json.loads(path.read_text())


def test_the_cloudnativepg_cluster_feeds_database_url():
    objects = render("overlays/cloudnativepg")
    cluster = named(objects, "Cluster", "ogai-postgres")
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    assert cluster["spec"]["instances"] >= 1 and cluster["spec"]["storage"]["size"]
    assert cluster["spec"]["bootstrap"]["initdb"]["database"] == "ogai"
    expected = {"secretKeyRef": {"name": "ogai-postgres-app", "key": CNPG_SECRET_KEY}}
    for where, spec in pod_specs(objects):
        for container in containers(spec):
            if is_ogai_image(container["image"]):
                env = {item["name"]: item for item in container.get("env") or []}
                assert env["DATABASE_URL"]["valueFrom"] == expected, where
    redis = named(objects, "Deployment", "ogai-redis")["spec"]["template"]["spec"]
    assert redis["securityContext"]["runAsUser"] != 0
    assert named(objects, "Service", "ogai-redis")["spec"]["ports"][0]["port"] == 6379
    assert not of_kind(render("overlays/external"), "Cluster")
    assert "ogai-redis" not in {d["metadata"]["name"]
                                for d in of_kind(render("overlays/external"), "Deployment")}


# -- the image ----------------------------------------------------------------------------------


def test_the_dockerfile_is_reproducible_and_non_root():
    dockerfile = (PLATFORM / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", dockerfile, re.M).group(1)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base
    user = re.search(r"^USER (\S+)", dockerfile, re.M).group(1)
    assert user.split(":")[0] not in ("root", "0")
    assert "collectstatic --noinput" in dockerfile
    assert "SOURCE_DATE_EPOCH" in dockerfile and "--no-cache-dir" in dockerfile
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in dockerfile
    pyproject = (ROOT / "pyproject.toml").read_text()
    dependencies = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.M | re.S).group(1)
    for requirement in re.findall(r'^\s*"([^"]+)"', dependencies, re.M):
        assert "==" in requirement, f"{requirement} is not pinned"


# -- applied to an API server ---------------------------------------------------------------


def api_client(fake: FakeKube) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config_from_dict(yaml.safe_load(fake.kubeconfig()), client_configuration=cfg)
    return client.ApiClient(cfg)


def apply(api: client.ApiClient, obj: dict) -> None:
    """Create one object: built-in kinds through the typed APIs, custom ones as custom objects."""
    if obj["kind"] in CUSTOM_KINDS:
        group, version = obj["apiVersion"].split("/")
        plural = obj["kind"].lower() + "s"  # servicemonitors, prometheusrules, clusters
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            group, version, obj["metadata"]["namespace"], plural, obj)
    else:
        utils.create_from_dict(api, obj)


@pytest.mark.parametrize("target", OVERLAYS)
def test_every_overlay_applies_to_an_api_server(target):
    objects = sorted(render(target), key=lambda obj: APPLY_ORDER.index(obj["kind"]))
    with FakeKube(monitoring=True, cnpg=True) as fake:
        fake.add_node("cpu-1", gpus=0)
        api = api_client(fake)
        for obj in objects[:1]:
            apply(api, obj)  # the namespace, then the Secret the operator creates by hand
        secret = {name: "x" for name in SECRET_SETTINGS}
        client.CoreV1Api(api).create_namespaced_secret(NAMESPACE, client.V1Secret(
            metadata=client.V1ObjectMeta(name=SECRET), string_data=secret))
        for obj in objects[1:]:
            apply(api, obj)
        for obj in objects:
            namespace = obj["metadata"].get("namespace")
            assert fake.get(obj["kind"], obj["metadata"]["name"], namespace), obj["metadata"]
        web = fake.pods("app.kubernetes.io/component=web", NAMESPACE)
        assert len(web) == 2  # the Deployment controller made them: Pod Security let them in
        assert fake.pods("app.kubernetes.io/component=migrate", NAMESPACE)
        assert fake.pods("app.kubernetes.io/component=beat", NAMESPACE)
        if target.endswith("external"):
            fake.start_pods(namespace=NAMESPACE)
            assert {p["status"]["phase"] for p in fake.pods(namespace=NAMESPACE)} == {"Running"}
