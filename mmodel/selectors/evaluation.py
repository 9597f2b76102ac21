"""Reads of MModel's evaluation, scoped to the caller's tenants. Shared benchmarks (no
tenant) are visible to everyone signed in."""

from django.db.models import Q, QuerySet

from infra_os.access import is_platform_admin, member_tenant_ids, role_in, scope_to_user
from infra_os.models import Tenant
from mmodel.models import (
    Benchmark,
    EvaluationResult,
    EvaluationRun,
    EvaluationSample,
    ModelVersion,
)


def benchmarks_for(user, tenant: Tenant | None = None) -> QuerySet[Benchmark]:
    """The benchmarks of the user's tenants (of `tenant` when given) and the shared ones."""
    benchmarks = Benchmark.objects.select_related("tenant", "created_by")
    if not user.is_authenticated:
        return benchmarks.none()
    if not is_platform_admin(user):
        benchmarks = benchmarks.filter(Q(tenant__isnull=True)
                                       | Q(tenant__in=member_tenant_ids(user)))
    if tenant is not None:
        benchmarks = benchmarks.filter(Q(tenant__isnull=True) | Q(tenant=tenant))
    return benchmarks


def evaluation_runs_for(user, tenant: Tenant | None = None) -> QuerySet[EvaluationRun]:
    runs = scope_to_user(
        EvaluationRun.objects.select_related(
            "tenant", "created_by", "job", "version", "version__model", "deployment")
        .prefetch_related("benchmarks", "results__benchmark"),
        user)
    if tenant is not None:
        runs = runs.filter(tenant=tenant)
    return runs


def evaluation_samples(*, run: EvaluationRun,
                       benchmark: Benchmark | None = None) -> QuerySet[EvaluationSample]:
    samples = run.samples.select_related("benchmark")
    if benchmark is not None:
        samples = samples.filter(benchmark=benchmark)
    return samples.order_by("benchmark__name", "index")


def leaderboard(*, user, tenant: Tenant) -> list[dict]:
    """One row per version of the tenant that has results: {"version": ModelVersion,
    "scores": {benchmark_name: {metric: value}}, "runs": {benchmark_name: {"run", "documents",
    "limit", "benchmark_documents", "benchmark_version"}}}, each benchmark's scores from the
    newest succeeded run of that version on it, with how many documents that run scored (a run
    with a limit may have scored fewer than the benchmark holds: its scores are not comparable
    with a full run's). Empty for a tenant the user is not in."""
    if not (is_platform_admin(user) or role_in(user, tenant) is not None):
        return []
    results = (EvaluationResult.objects
               .filter(run__tenant=tenant, run__succeeded=True)
               .select_related("benchmark")
               .order_by("-run__finished_at", "-run_id")
               .values_list("run__version_id", "run_id", "benchmark__name", "metric", "value",
                            "samples", "run__limit", "benchmark__documents",
                            "benchmark__content_hash"))
    newest: dict[tuple[int, str], int] = {}
    scores: dict[int, dict[str, dict[str, float]]] = {}
    runs: dict[int, dict[str, dict]] = {}
    for (version_id, run_id, benchmark, metric, value, samples, limit, documents,
         content_hash) in results:
        if newest.setdefault((version_id, benchmark), run_id) != run_id:
            continue  # an older run of this version on this benchmark
        scores.setdefault(version_id, {}).setdefault(benchmark, {})[metric] = value
        # The documents the runner said it scored; else what the limit leaves of the benchmark.
        scored = samples or (min(limit, documents) if limit else documents)
        about = runs.setdefault(version_id, {}).setdefault(benchmark, {
            "run": run_id, "documents": scored, "limit": limit,
            "benchmark_documents": documents, "benchmark_version": content_hash[:12]})
        about["documents"] = max(about["documents"], scored)
    versions = ModelVersion.objects.select_related("model").filter(pk__in=scores) \
        .order_by("model__name", "-number")
    return [{"version": version, "scores": scores[version.pk], "runs": runs[version.pk]}
            for version in versions]


def paired_samples(*, run_a: EvaluationRun, run_b: EvaluationRun, benchmark: Benchmark,
                   offset: int = 0, limit: int | None = None) -> list[dict]:
    """The documents of a benchmark both runs answered, side by side: {"index", "prompt",
    "target", "a": {"output", "correct", "scores"}, "b": {…}}, in document order."""
    fields = ("index", "prompt", "target", "output", "correct", "scores")
    a_rows = run_a.samples.filter(benchmark=benchmark).order_by("index")
    b_rows = {row["index"]: row for row in run_b.samples.filter(benchmark=benchmark)
              .values(*fields)}
    pairs = []
    skipped = 0
    for row in a_rows.values(*fields).iterator():
        other = b_rows.get(row["index"])
        if other is None:
            continue
        if skipped < offset:
            skipped += 1
            continue
        if limit is not None and len(pairs) >= limit:
            break
        pairs.append({
            "index": row["index"], "prompt": row["prompt"], "target": row["target"],
            "a": {key: row[key] for key in ("output", "correct", "scores")},
            "b": {key: other[key] for key in ("output", "correct", "scores")},
        })
    return pairs
