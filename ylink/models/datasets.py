from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from infra_os.models import Tenant
from ogai.models import TimeStampedModel
from ylink.choices import DatasetKind, VersionFormat

dataset_name = RegexValidator(
    r"^[a-z0-9]([a-z0-9._-]{0,98}[a-z0-9])?$",
    "Use 1-100 lower-case letters, digits, '.', '_' or '-', starting and ending with a letter "
    "or digit.",
)


class Dataset(TimeStampedModel):
    """A named corpus of a tenant; each upload or pipeline run adds a version."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="datasets")
    name = models.CharField(max_length=100, validators=[dataset_name])
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=16, choices=DatasetKind.choices, default=DatasetKind.TEXT)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="dataset_unique_name"),
        ]

    def __str__(self) -> str:
        return self.name


class DatasetVersion(models.Model):
    """One immutable state of a dataset: files in a folder under DATA_DIR, their content hash
    and statistics, and where they came from (an upload, or a pipeline run on a parent)."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    format = models.CharField(max_length=16, choices=VersionFormat.choices)
    # Relative to DATA_DIR.
    path = models.CharField(max_length=500, editable=False)
    content_hash = models.CharField(max_length=64)
    documents = models.BigIntegerField(default=0)
    bytes = models.BigIntegerField(default=0)
    tokens = models.BigIntegerField(null=True, blank=True)
    # Length histogram, lengths, the tokenizer and window of token shards, the upload's files.
    stats = models.JSONField(default=dict, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="children")
    pipeline_run = models.ForeignKey("ylink.PipelineRun", null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="outputs")
    source = models.CharField(max_length=255, blank=True, help_text="The uploaded file's name.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["dataset", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "number"], name="dataset_version_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.dataset.name} v{self.number}"
