"""Reads of MModel's registry, scoped to the caller's tenants."""

from django.db.models import Count, Max, OuterRef, QuerySet, Subquery

from infra_os.access import scope_to_user
from infra_os.models import Tenant
from mmodel.models import Model, ModelImport, ModelVersion
from ylink.models import DatasetVersion, PipelineRun, TrainingRun


def models_for(user, tenant: Tenant | None = None) -> QuerySet[Model]:
    """Models with their version count and newest version's number and id."""
    newest = ModelVersion.objects.filter(model=OuterRef("pk")).order_by("-number")
    models = scope_to_user(Model.objects.select_related("tenant", "created_by"), user)
    if tenant is not None:
        models = models.filter(tenant=tenant)
    return models.annotate(version_count=Count("versions", distinct=True),
                           latest_version=Max("versions__number"),
                           latest_version_id=Subquery(newest.values("pk")[:1]),
                           latest_version_status=Subquery(newest.values("status")[:1]))


def versions_for(user, tenant: Tenant | None = None) -> QuerySet[ModelVersion]:
    versions = scope_to_user(
        ModelVersion.objects.select_related("model", "model__tenant", "created_by",
                                            "training_run", "base_version",
                                            "base_version__model")
        .prefetch_related("dataset_versions__dataset"),
        user, tenant_field="model__tenant")
    if tenant is not None:
        versions = versions.filter(model__tenant=tenant)
    return versions


def imports_for(user, tenant: Tenant | None = None) -> QuerySet[ModelImport]:
    imports = scope_to_user(
        ModelImport.objects.select_related("tenant", "model", "version", "created_by"), user)
    if tenant is not None:
        imports = imports.filter(tenant=tenant)
    return imports


def model_version_path(*, actor, tenant: Tenant, reference: str) -> str:
    """The folder of model version `reference` ("name:vN") of `tenant`, if `actor` may see it
    and it is ready: what YLink's steps that name a model run on (see ylink.callbacks).
    Raises ylink.callbacks.ModelNotFound saying why not."""
    from mmodel import storage
    from mmodel.choices import VersionStatus
    from ylink.callbacks import ModelNotFound

    name, _, number = reference.rpartition(":v")
    if not name or not number.isdigit():
        raise ModelNotFound(f"'{reference}' is not a model version; write name:vN")
    version = versions_for(actor, tenant).filter(model__name=name, number=int(number)).first()
    if version is None:
        raise ModelNotFound(f"{tenant.name} has no model version {reference}")
    if version.status != VersionStatus.READY or not version.artifact_path:
        raise ModelNotFound(f"model version {reference} is {version.status}, not ready")
    return str(storage.absolute(version.artifact_path))


class _Graph:
    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}
        self.edges: list[list[str]] = []

    def node(self, kind: str, pk: int, label: str) -> str:
        key = f"{kind}:{pk}"
        self.nodes.setdefault(key, {"id": key, "kind": kind, "label": label, "pk": pk})
        return key

    def edge(self, source: str, target: str) -> None:
        if [source, target] not in self.edges:
            self.edges.append([source, target])


def _dataset(graph: _Graph, version: DatasetVersion, seen: set[int]) -> str:
    """A dataset version and what made it: its pipeline run and input, its parent, up to
    the upload."""
    key = graph.node("dataset_version", version.pk, str(version))
    if version.pk in seen:
        return key
    seen.add(version.pk)
    run: PipelineRun | None = version.pipeline_run
    if run is not None:
        run_key = graph.node("pipeline_run", run.pk, run.name)
        graph.edge(run_key, key)
        graph.edge(_dataset(graph, run.input_version, seen), run_key)
    elif version.parent is not None:
        graph.edge(_dataset(graph, version.parent, seen), key)
    return key


def _training(graph: _Graph, run: TrainingRun) -> str:
    return graph.node("training_run", run.pk, f"{run.name} ({run.kind})")


def _model_version(graph: _Graph, version: ModelVersion, seen: set[int],
                   datasets: set[int]) -> str:
    """A model version and where it came from: its training run, that run's data, its base
    version (and the base's own origins)."""
    key = graph.node("model_version", version.pk, version.label)
    if version.pk in seen:
        return key
    seen.add(version.pk)
    run = version.training_run
    into = key
    if run is not None:
        into = _training(graph, run)
        graph.edge(into, key)
    for dataset_version in version.dataset_versions.select_related(
            "dataset", "pipeline_run", "pipeline_run__input_version__dataset",
            "parent__dataset"):
        graph.edge(_dataset(graph, dataset_version, datasets), into)
    if version.base_version is not None:
        graph.edge(_model_version(graph, version.base_version, seen, datasets), into)
    return key


def version_lineage(version: ModelVersion) -> dict:
    """The version's lineage as a graph: {"nodes": [{"id", "kind", "label", "pk"}],
    "edges": [[from_id, to_id], ...]}, an edge going from what was used to what it made.
    Kinds: dataset_version, pipeline_run, training_run, model_version. Includes the versions
    built on this one."""
    graph = _Graph()
    seen: set[int] = set()
    datasets: set[int] = set()
    _model_version(graph, version, seen, datasets)
    pending = [version]
    while pending:
        current = pending.pop()
        for derived in current.derived_versions.select_related("model", "training_run"):
            derived_key = graph.node("model_version", derived.pk, derived.label)
            into = derived_key
            if derived.training_run is not None:
                into = _training(graph, derived.training_run)
                graph.edge(into, derived_key)
            graph.edge(graph.node("model_version", current.pk, current.label), into)
            if derived.pk not in seen:
                seen.add(derived.pk)
                pending.append(derived)
    return {"nodes": list(graph.nodes.values()), "edges": graph.edges}
