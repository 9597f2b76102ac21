from django.contrib import admin

from ylink.models import Dataset, DatasetVersion, PipelineRun, TrainingRun


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "kind", "created_at"]
    list_filter = ["kind"]
    search_fields = ["name", "tenant__name"]


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = ["dataset", "number", "format", "documents", "bytes", "created_at"]
    list_filter = ["format"]
    readonly_fields = ["path", "content_hash"]


@admin.register(PipelineRun)
class PipelineRunAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "input_version", "replicas", "succeeded", "created_at"]


@admin.register(TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "kind", "step", "total_steps", "succeeded", "created_at"]
    list_filter = ["kind"]
