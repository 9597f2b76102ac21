from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from aistation.api.serializers import RejectUnknownFields, caller_tenant, tenant_and_queue
from aistation.selectors import job_waiting_reason
from infra_os.api.serializers import CallerTenantField
from ylink.choices import RUNNER_EVENT_KINDS, DatasetKind, TrainingKind
from ylink.models import (
    Checkpoint,
    Dataset,
    DatasetVersion,
    PipelineRun,
    TrainingMetric,
    TrainingRun,
)
from ylink.presets import SOURCE_INITS
from ylink.selectors import dataset_version_list, training_run_list
from ylink.steps import EXECUTORS


class DatasetCreateSerializer(RejectUnknownFields, serializers.Serializer):
    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=DatasetKind.choices, default=DatasetKind.TEXT)
    description = serializers.CharField(allow_blank=True, default="", max_length=10000)

    def validate(self, attrs):
        attrs["tenant"] = caller_tenant(self.context["request"].user, attrs.get("tenant"),
                                        "create datasets in")
        return attrs


class DatasetUploadSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="A .jsonl, .txt or .md file, or a .zip of them.")


class DatasetCreateUploadSerializer(DatasetCreateSerializer):
    """A new dataset and its first version in one request: no dataset when the file is
    refused."""

    file = serializers.FileField(help_text="A .jsonl, .txt or .md file, or a .zip of them.")


class DatasetSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    versions = serializers.IntegerField(source="version_count", read_only=True)
    latest_version = serializers.IntegerField(read_only=True, allow_null=True)

    class Meta:
        model = Dataset
        fields = ["id", "name", "tenant", "kind", "description", "versions", "latest_version",
                  "created_by", "created_at"]


class DatasetVersionSerializer(serializers.ModelSerializer):
    dataset = serializers.SlugRelatedField(slug_field="name", read_only=True)
    dataset_id = serializers.IntegerField(read_only=True)
    tenant = serializers.CharField(source="dataset.tenant.name", read_only=True)
    parent = serializers.PrimaryKeyRelatedField(read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = DatasetVersion
        fields = ["id", "dataset", "dataset_id", "tenant", "number", "format", "content_hash",
                  "documents", "bytes", "tokens", "stats", "parent", "pipeline_run", "source",
                  "created_by", "created_at"]


class SampleSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    id = serializers.CharField()
    chars = serializers.IntegerField()
    text = serializers.CharField()
    truncated = serializers.BooleanField()
    metadata = serializers.DictField()


class SamplePageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    offset = serializers.IntegerField()
    limit = serializers.IntegerField()
    results = SampleSerializer(many=True)


def find_version(user, attrs: dict, prefix: str = "") -> DatasetVersion:
    """The version `attrs` name (by id, or dataset name and number), popping those keys; its
    errors name the fields with `prefix` (a nested object's name and a dot)."""
    versions = dataset_version_list(user=user)
    if attrs.get("dataset_version") is not None:
        if attrs.get("dataset") or attrs.get("version"):
            raise serializers.ValidationError({f"{prefix}dataset_version": (
                "Give either dataset_version, or dataset (and version): not both.")})
        found = versions.filter(pk=attrs.pop("dataset_version")).first()
        if found is None:
            raise serializers.ValidationError({f"{prefix}dataset_version": "No such version."})
        return found
    if not attrs.get("dataset"):
        raise serializers.ValidationError(
            {f"{prefix}dataset_version": "Name the dataset version (or a dataset by name)."})
    versions = versions.filter(dataset__name=attrs.pop("dataset"))
    if attrs.get("tenant") is not None:
        versions = versions.filter(dataset__tenant=attrs["tenant"])
    number = attrs.pop("version", None)
    if number is not None:
        versions = versions.filter(number=number)
    tenants = set(versions.values_list("dataset__tenant", flat=True))
    if len(tenants) > 1:
        raise serializers.ValidationError({f"{prefix}tenant": "Several of your tenants have "
                                           "this dataset: name the tenant."})
    found = versions.order_by("-number").first()
    if found is None:
        raise serializers.ValidationError({f"{prefix}dataset": "No such dataset version."})
    return found


class DatasetChoice(RejectUnknownFields, serializers.Serializer):
    """Which dataset version a run reads: by id, or by dataset name and version number
    (default: the newest)."""

    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    dataset_version = serializers.IntegerField(required=False, help_text="A version's id.")
    dataset = serializers.CharField(required=False, max_length=100,
                                    help_text="A dataset's name (instead of dataset_version).")
    version = serializers.IntegerField(required=False, min_value=1,
                                       help_text="With dataset: its version number.")
    queue = serializers.CharField(max_length=63, default="default")
    name = serializers.CharField(max_length=100, allow_blank=True, default="")

    def _version(self, attrs) -> DatasetVersion:
        return find_version(self.context["request"].user, attrs)

    def validate(self, attrs):
        version = self._version(attrs)
        attrs["tenant"] = version.dataset.tenant
        _, queue = tenant_and_queue(self.context["request"].user, attrs, "run work in")
        attrs.pop("tenant")
        return {**attrs, "version": version, "queue": queue}


class PipelineResourcesSerializer(RejectUnknownFields, serializers.Serializer):
    cpu = serializers.FloatField(min_value=0.01, max_value=4096, default=1.0,
                                 help_text="CPU cores per replica.")
    memory_mib = serializers.IntegerField(min_value=64, max_value=16 * 1024 * 1024,
                                          default=2048, help_text="Memory per replica, MiB.")


class PipelineRunStartSerializer(DatasetChoice):
    steps = serializers.ListField(child=serializers.JSONField(), min_length=1, max_length=50,
                                  help_text="Steps in order: {type, params}. See "
                                  "/api/v1/ylink/pipeline-steps/.")
    replicas = serializers.IntegerField(min_value=1, max_value=64, default=1)
    tokenizer_run = serializers.IntegerField(required=False, allow_null=True, default=None,
                                             help_text="A finished tokenizer run for the "
                                             "tokenize step (default: bytes).")
    resources = PipelineResourcesSerializer(default=dict)
    executor = serializers.ChoiceField(
        choices=list(EXECUTORS), default="local",
        help_text="`local`: `replicas` plain replicas. `ray`: datatrove's RayPipelineExecutor "
        "on a Ray cluster job of `replicas` workers (and a head); the same output.")

    def validate(self, attrs):
        attrs = super().validate(attrs)
        resources = {"cpu": 1.0, "memory_mib": 2048, **attrs.pop("resources")}
        tokenizer = attrs.pop("tokenizer_run")
        if tokenizer is not None:
            tokenizer = training_run_list(user=self.context["request"].user) \
                .filter(pk=tokenizer).first()
            if tokenizer is None:
                raise serializers.ValidationError({"tokenizer_run": "No such training run."})
        return {**attrs, **resources, "tokenizer_run": tokenizer}


class TrainingResourcesSerializer(PipelineResourcesSerializer):
    gpus = serializers.IntegerField(min_value=0, max_value=1024, default=0,
                                    help_text="GPUs per replica.")
    gpu_model = serializers.CharField(max_length=64, allow_blank=True, default="")
    memory_mib = serializers.IntegerField(min_value=64, max_value=16 * 1024 * 1024,
                                          default=4096, help_text="Memory per replica, MiB.")


class TrainingRunStartSerializer(DatasetChoice):
    kind = serializers.ChoiceField(choices=TrainingKind.choices)
    base_run = serializers.IntegerField(required=False, allow_null=True, default=None,
                                        help_text="Fine-tunes: the run whose model to start "
                                        "from.")
    model = serializers.DictField(required=False, help_text="preset, architecture, "
                                  "context_length (pretraining).")
    tokenizer = serializers.DictField(required=False, help_text="vocab_size, min_frequency.")
    lora = serializers.DictField(required=False, help_text="r, alpha, dropout, target_modules.")
    prompt_tuning = serializers.DictField(
        required=False, help_text="Prompt-tuning kinds: num_virtual_tokens, init, init_text, "
        "num_ranks, tasks, source_adapter_path, source_task.")
    training = serializers.DictField(required=False, help_text="max_steps, batch_size, "
                                     "grad_accum, lr, warmup_steps, checkpoint_every, …")
    replicas = serializers.IntegerField(min_value=1, max_value=1024, default=1)
    max_restarts = serializers.IntegerField(min_value=0, max_value=100, default=3)
    resources = TrainingResourcesSerializer(default=dict)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        resources = {"cpu": 1.0, "memory_mib": 4096, "gpus": 0, "gpu_model": "",
                     **attrs.pop("resources")}
        base = attrs.pop("base_run")
        if base is not None:
            base = training_run_list(user=self.context["request"].user).filter(pk=base).first()
            if base is None:
                raise serializers.ValidationError({"base_run": "No such training run."})
        attrs["dataset_version"] = attrs.pop("version")
        return {**attrs, **resources, "base_run": base}


class VersionRefSerializer(RejectUnknownFields, serializers.Serializer):
    dataset_version = serializers.IntegerField(required=False, help_text="A version's id.")
    dataset = serializers.CharField(required=False, max_length=100,
                                    help_text="A dataset's name (instead of dataset_version).")
    version = serializers.IntegerField(required=False, min_value=1,
                                       help_text="With dataset: its version number.")


class MultitaskPromptTuningSerializer(RejectUnknownFields, serializers.Serializer):
    """The two-stage recipe of multi-task prompt tuning: two runs of a base model, the
    second waiting for the first."""

    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    queue = serializers.CharField(max_length=63, default="default")
    name = serializers.CharField(max_length=90, allow_blank=True, default="",
                                 help_text="Its runs are NAME-source and NAME-target.")
    base_run = serializers.IntegerField(help_text="The run whose model both stages tune.")
    source = VersionRefSerializer(help_text="Stage 1's instruction dataset version, with a "
                                  "task column naming each example's source task.")
    target = VersionRefSerializer(help_text="Stage 2's: the target task's examples.")
    prompt_tuning = serializers.DictField(
        required=False, default=dict, help_text="Both stages: num_virtual_tokens, num_ranks; "
        "stage 1: init, init_text.")
    source_training = serializers.DictField(required=False, default=None, allow_null=True,
                                            help_text="Stage 1's training settings.")
    target_training = serializers.DictField(required=False, default=None, allow_null=True,
                                            help_text="Stage 2's (default: stage 1's).")
    target_init = serializers.ChoiceField(
        choices=list(SOURCE_INITS), default="average_source_tasks",
        help_text="How stage 2's prompt starts from stage 1's: the average of the source "
        "tasks, one source task (source_task), or the shared prompt only.")
    source_task = serializers.CharField(required=False, allow_null=True, default=None,
                                        max_length=100,
                                        help_text="With exact_source_task: which one.")
    replicas = serializers.IntegerField(min_value=1, max_value=1024, default=1)
    max_restarts = serializers.IntegerField(min_value=0, max_value=100, default=3)
    resources = TrainingResourcesSerializer(default=dict)

    def validate(self, attrs):
        user = self.context["request"].user
        tenant = attrs.get("tenant")
        versions = {}
        for stage in ("source", "target"):
            ref = {**attrs.pop(stage), **({"tenant": tenant} if tenant else {})}
            versions[stage] = find_version(user, ref, prefix=f"{stage}.")
        tenants = {version.dataset.tenant for version in versions.values()}
        if len(tenants) > 1:
            raise serializers.ValidationError(
                {"target": "Both stages' datasets must be of one tenant."})
        attrs["tenant"] = tenants.pop()
        _, queue = tenant_and_queue(user, attrs, "run work in")
        attrs.pop("tenant")
        base = training_run_list(user=user).filter(pk=attrs.pop("base_run"),
                                                  tenant=queue.tenant).first()
        if base is None:
            raise serializers.ValidationError({"base_run": "No such training run."})
        if attrs["target_init"] == "exact_source_task" and not attrs["source_task"]:
            raise serializers.ValidationError(
                {"source_task": "Name the source task that target_init exact_source_task "
                 "starts from."})
        resources = {"cpu": 1.0, "memory_mib": 4096, "gpus": 0, "gpu_model": "",
                     **attrs.pop("resources")}
        return {**attrs, **resources, "queue": queue, "base_run": base,
                "source_version": versions["source"], "target_version": versions["target"]}


class _RunSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    state = serializers.CharField(read_only=True)
    job = serializers.PrimaryKeyRelatedField(read_only=True)
    reason = serializers.SerializerMethodField(help_text="What its job is waiting for or why "
                                               "it ended.")

    waiting_reason = serializers.SerializerMethodField(
        help_text="Why its job waits for the scheduler, naming what is scarce and who holds "
                  "it; empty unless it waits.")

    def get_reason(self, run) -> str:
        return run.job.reason if run.job and not run.succeeded else ""

    def get_waiting_reason(self, run) -> str:
        return job_waiting_reason(run.job)


class PipelineRunSerializer(_RunSerializer):
    input_version = DatasetVersionSerializer(read_only=True)
    output_version = DatasetVersionSerializer(read_only=True)
    executor = serializers.SerializerMethodField(
        help_text="`ray`: run by datatrove's RayPipelineExecutor on a Ray cluster job.")

    class Meta:
        model = PipelineRun
        fields = ["id", "name", "tenant", "state", "reason", "waiting_reason", "message",
                  "input_version",
                  "steps", "replicas", "executor", "tokenizer_run", "step_results",
                  "output_version", "job", "created_by", "created_at", "finished_at"]

    @extend_schema_field(serializers.ChoiceField(choices=list(EXECUTORS)))
    def get_executor(self, run) -> str:
        return "ray" if run.job is not None and run.job.ray else "local"


class TrainingRunSerializer(_RunSerializer):
    dataset_version = DatasetVersionSerializer(read_only=True)
    base_run = serializers.PrimaryKeyRelatedField(read_only=True)
    after_run = serializers.PrimaryKeyRelatedField(
        read_only=True, help_text="A recipe's earlier stage: this run's job starts once it "
        "succeeds.")

    def get_reason(self, run) -> str:
        before = run.waiting_for
        if before is not None and not run.message:
            return f"waiting for training run {before.pk} to succeed"
        return super().get_reason(run)

    class Meta:
        model = TrainingRun
        fields = ["id", "name", "tenant", "kind", "state", "reason", "waiting_reason", "message",
                  "dataset_version", "base_run", "after_run", "spec", "gpus", "replicas",
                  "step",
                  "total_steps", "tokens", "tokens_per_s", "eta_s", "loss", "lr",
                  "resumed_from_step", "progress_at", "artifact", "output_path", "parameters",
                  "job", "created_by", "created_at", "finished_at"]


class TrainingMetricSerializer(serializers.ModelSerializer):
    class Meta:
        model = TrainingMetric
        fields = ["step", "loss", "lr", "tokens", "tokens_per_s", "grad_norm", "reported_at"]


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = ["step", "path", "bytes", "created_at"]


class StepTypeSerializer(serializers.Serializer):
    type = serializers.CharField()
    title = serializers.CharField()
    description = serializers.CharField()
    drops = serializers.BooleanField(help_text="Whether the step removes documents.")
    params = serializers.DictField(child=serializers.DictField(), help_text="Per parameter: "
                                   "type, default, help, min/max or choices.")


class RunnerEventSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=RUNNER_EVENT_KINDS)
    at = serializers.CharField(required=False, allow_blank=True, max_length=64)
    data = serializers.DictField(default=dict)


class RunnerEventBatchSerializer(serializers.Serializer):
    events = RunnerEventSerializer(many=True, allow_empty=True, max_length=1000)


class RunnerEventReplySerializer(serializers.Serializer):
    accepted = serializers.IntegerField()


class MultitaskPromptTuningRunsSerializer(serializers.Serializer):
    source = TrainingRunSerializer(help_text="Stage 1: the source tasks.")
    target = TrainingRunSerializer(help_text="Stage 2: the target task; its job starts once "
                                   "stage 1 succeeded (after_run).")
