from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from infra_os.models import Tenant
from mmodel.choices import ImportState, VersionSource, VersionStatus, WeightsFormat
from ogai.models import TimeStampedModel
from ylink.models import DatasetVersion, TrainingRun

model_name = RegexValidator(
    r"^[a-z0-9]([a-z0-9._-]{0,98}[a-z0-9])?$",
    "Use 1-100 lower-case letters, digits, '.', '_' or '-', starting and ending with a letter "
    "or digit.",
)


class Model(TimeStampedModel):
    """A named model of a tenant; each import or registered training run adds a version."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="models")
    name = models.CharField(max_length=100, validators=[model_name])
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="model_unique_name"),
        ]

    def __str__(self) -> str:
        return self.name


class ModelVersion(TimeStampedModel):
    """One immutable set of weights in Hugging Face layout (config, weights, tokenizer) in a
    folder under DATA_DIR, what it is, and where it came from."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=VersionStatus.choices,
                              default=VersionStatus.IMPORTING)
    message = models.TextField(blank=True)
    source = models.CharField(max_length=16, choices=VersionSource.choices)
    # Where it was imported from (as given), and the folder the platform serves it from.
    source_path = models.CharField(max_length=1000, blank=True)
    artifact_path = models.CharField(max_length=1000, blank=True)
    format = models.CharField(max_length=16, choices=WeightsFormat.choices)
    architecture = models.CharField(max_length=100, blank=True)
    model_type = models.CharField(max_length=64, blank=True)
    parameters = models.BigIntegerField(null=True, blank=True)
    context_length = models.PositiveIntegerField(null=True, blank=True)
    dtype = models.CharField(max_length=16, blank=True)
    tokenizer = models.CharField(max_length=100, blank=True)
    content_hash = models.CharField(max_length=64, blank=True)
    bytes = models.BigIntegerField(default=0)
    files = models.JSONField(default=list, blank=True, help_text='[{"path", "bytes"}]')
    # Lineage.
    training_run = models.ForeignKey(TrainingRun, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="model_versions")
    dataset_versions = models.ManyToManyField(DatasetVersion, blank=True,
                                              related_name="model_versions")
    base_version = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="derived_versions",
                                     help_text="The model a fine-tune or adapter starts from.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["model", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["model", "number"], name="model_version_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name} v{self.number}"

    @property
    def label(self) -> str:
        return f"{self.model.name}:v{self.number}"


class ModelImport(TimeStampedModel):
    """Importing a directory as a new version: checked (no remote code, no pickle unless
    allowed, config, tokenizer, weights that load) and copied in by a task."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="model_imports")
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="imports")
    version = models.OneToOneField(ModelVersion, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="model_import")
    source_path = models.CharField(max_length=1000)
    allow_pickle = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=ImportState.choices,
                             default=ImportState.QUEUED)
    message = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"import {self.pk} of {self.source_path}"
