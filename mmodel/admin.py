from django.contrib import admin

from mmodel.models import Benchmark, Deployment, EvaluationRun, GatewayLimit, Model, ModelVersion


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "created_at"]
    search_fields = ["name", "tenant__name"]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["model", "number", "status", "format", "architecture", "parameters",
                    "created_at"]
    list_filter = ["status", "format", "source"]
    readonly_fields = ["artifact_path", "content_hash", "files"]


@admin.register(Benchmark)
class BenchmarkAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "kind", "documents", "created_at"]
    list_filter = ["kind"]
    readonly_fields = ["data_path", "content_hash"]


@admin.register(EvaluationRun)
class EvaluationRunAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "version", "target", "succeeded", "created_at"]


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "version", "runtime", "replicas", "active",
                    "scaled_to_zero", "last_request_at"]
    list_filter = ["runtime", "active", "scaled_to_zero"]


@admin.register(GatewayLimit)
class GatewayLimitAdmin(admin.ModelAdmin):
    """A tenant's own rate limits at the gateway (empty fields: the platform's defaults)."""

    list_display = ["tenant", "requests_per_minute", "tokens_per_minute",
                    "token_requests_per_minute", "token_tokens_per_minute"]
