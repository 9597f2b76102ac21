"""The model pages' console forms (L4): registering and importing versions, benchmarks,
evaluations, deployments and the arena's votes. They check shapes only; MModel's services
decide what is allowed, and their errors are shown beside the field they name."""

from django import forms

from mmodel.choices import BenchmarkKind, Runtime, Vote
from mmodel.models.registry import model_name

MODEL_NAME_HELP = "Lower-case letters, digits, '.', '_' and '-'; a new name makes a new model."
# The services' error keys that differ from the forms' field names.
REGISTER_FIELD_MAP = {"run": "training_run"}
DEPLOYMENT_FIELD_MAP = {"cluster": "queue", "resources.gpus": "gpus_per_replica",
                        "resources.gpu_model": "gpu_model", "resources.cpu": "cpu_per_replica",
                        "resources.memory_mib": "memory_mib_per_replica"}
EVALUATION_FIELD_MAP = {"cluster": "queue"}
BENCHMARK_FIELD_MAP = {"data": "file"}


def queue_label(queue) -> str:
    return f"{queue.name} (cluster {queue.cluster.name})"


def model_version_label(version) -> str:
    return f"{version.model.name} v{version.number}"


class RegisterFromRunForm(forms.Form):
    training_run = forms.ModelChoiceField(
        queryset=None, empty_label=None,
        help_text="A finished training run of this tenant that produced a model.")
    model_name = forms.CharField(max_length=100, validators=[model_name], help_text=MODEL_NAME_HELP)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args, runs, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["training_run"].queryset = runs
        self.fields["training_run"].label_from_instance = lambda run: (
            f"#{run.pk} {run.name} · {run.get_kind_display()}"
            f"{f' · {run.parameters:,} parameters' if run.parameters else ''}")


class ModelImportForm(forms.Form):
    model_name = forms.CharField(max_length=100, validators=[model_name], help_text=MODEL_NAME_HELP)
    source_path = forms.CharField(
        label="Directory or file", max_length=1000,
        widget=forms.TextInput(attrs={"class": "mono", "spellcheck": "false",
                                      "placeholder": "/data/imports/my-model"}),
        help_text="A Hugging Face model directory (config, safetensors weights, tokenizer) or a "
        ".gguf file, on the platform's machines, under one of the allowed import roots.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    allow_pickle = forms.BooleanField(
        required=False, label="Allow pickle weights (.bin/.pt)",
        help_text="Loading pickle can run code hidden in the file: only for models you trust.")

    def __init__(self, *args, may_allow_pickle: bool, **kwargs):
        super().__init__(*args, **kwargs)
        if not may_allow_pickle:
            del self.fields["allow_pickle"]


class BenchmarkCreateForm(forms.Form):
    name = forms.CharField(max_length=100, validators=[model_name],
                           help_text="Unique in the tenant; lower-case letters, digits, '.', "
                           "'_' and '-'.")
    kind = forms.ChoiceField(choices=BenchmarkKind.choices)
    file = forms.FileField(label="Data (JSONL)",
                           help_text="One JSON object a line: the documents to score; "
                           'retrieval: passages {"id", "text"} and queries {"query", '
                           '"relevant": [ids]}.')
    prompt_template = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2, "class": "mono"}),
        help_text="Jinja over a document's fields, e.g. {{question}}; not for perplexity or "
        "retrieval.")
    target_template = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 1, "class": "mono"}),
        help_text="The expected answer: for multiple choice the index of the right choice, "
        "e.g. {{label}}; for generation the text, e.g. {{answer}}.")
    choices_template = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 1, "class": "mono"}),
        help_text="Multiple choice only: the list of choices, e.g. {{choices}}.")
    text_field = forms.CharField(required=False, max_length=100,
                                 help_text="Perplexity only: the field holding the text.")
    few_shot = forms.IntegerField(min_value=0, max_value=32, initial=0,
                                  help_text="Examples from the data shown before each question.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))


class EvaluationStartForm(forms.Form):
    version = forms.ModelChoiceField(queryset=None, empty_label=None, label="Model version")
    benchmarks = forms.ModelMultipleChoiceField(
        queryset=None, widget=forms.CheckboxSelectMultiple,
        help_text="Your tenant's benchmarks and those shipped with the platform.")
    queue = forms.ModelChoiceField(queryset=None, empty_label=None,
                                   help_text="The evaluation runs as a job in this queue.")
    limit = forms.IntegerField(min_value=1, max_value=1_000_000, required=False,
                               help_text="At most this many documents per benchmark; empty: all.")
    gpus = forms.IntegerField(label="GPUs", min_value=0, max_value=64, initial=0)

    def __init__(self, *args, versions, benchmarks, queues, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["version"].queryset = versions
        self.fields["version"].label_from_instance = model_version_label
        self.fields["benchmarks"].queryset = benchmarks
        self.fields["benchmarks"].label_from_instance = lambda benchmark: (
            f"{benchmark.name} · {benchmark.get_kind_display()}"
            f"{'' if benchmark.tenant_id else ' · shared'}")
        self.fields["queue"].queryset = queues
        self.fields["queue"].label_from_instance = queue_label


class DeploymentCreateForm(forms.Form):
    version = forms.ModelChoiceField(queryset=None, empty_label=None, label="Model version",
                                     help_text="Ready versions only.")
    name = forms.CharField(max_length=100, validators=[model_name],
                           help_text="The model name clients send to /v1/; unique in the tenant.")
    queue = forms.ModelChoiceField(queryset=None, empty_label=None,
                                   help_text="Each replica is a service job in this queue.")
    runtime = forms.ChoiceField(choices=Runtime.choices, initial=Runtime.TRANSFORMERS)
    replicas = forms.IntegerField(min_value=1, max_value=64, initial=1)
    gpus_per_replica = forms.IntegerField(label="GPUs per replica", min_value=0, max_value=64,
                                          initial=0)
    gpu_model = forms.CharField(label="GPU model", max_length=64, required=False,
                                help_text="e.g. H100; empty: any model.")
    cpu_per_replica = forms.FloatField(label="CPU cores per replica", min_value=0.1,
                                       max_value=1024, initial=2.0)
    memory_mib_per_replica = forms.IntegerField(label="Memory per replica (MiB)", min_value=256,
                                                max_value=16 * 1024 * 1024, initial=4096)
    idle_timeout_s = forms.IntegerField(
        label="Scale to zero after (seconds idle)", min_value=0, max_value=30 * 24 * 3600,
        initial=0, help_text="0: never. A request to a model scaled to zero starts it again.")
    pool = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text="Make it a pool: one NAME=VERSION a line (e.g. support=tiny:v4), each served "
                  "under NAME by the same replicas: LoRA adapters of the version above, or "
                  "whole models.")
    pool_memory_mib = forms.IntegerField(
        label="Pool memory for whole models (MiB)", min_value=0, max_value=16 * 1024 * 1024,
        initial=0, required=False,
        help_text="The least recently used is evicted past it. 0: half the replica's memory.")
    max_loras = forms.IntegerField(label="LoRA adapters held at once", min_value=1,
                                   max_value=64, initial=8, required=False)

    def __init__(self, *args, versions, queues, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["version"].queryset = versions
        self.fields["version"].label_from_instance = model_version_label
        self.fields["queue"].queryset = queues
        self.fields["queue"].label_from_instance = queue_label

    def clean_pool_memory_mib(self) -> int:
        return self.cleaned_data["pool_memory_mib"] or 0

    def clean_max_loras(self) -> int:
        return self.cleaned_data["max_loras"] or 8

    def clean_pool(self) -> list[tuple[str, object]]:
        """[(name, version)] of the lines, each version one of the ready ones offered."""
        by_label = {version.label: version
                    for version in self.fields["version"].queryset.select_related("model")}
        members = []
        for number, line in enumerate(self.cleaned_data["pool"].splitlines(), start=1):
            if not line.strip():
                continue
            name, sep, label = (part.strip() for part in line.partition("="))
            if not sep or not name or not label:
                raise forms.ValidationError(f"Line {number}: write NAME=VERSION, e.g. "
                                            "support=tiny:v4.")
            if label not in by_label:
                raise forms.ValidationError(f"Line {number}: no ready version {label} here.")
            members.append((name, by_label[label]))
        return members


class DeploymentScaleForm(forms.Form):
    replicas = forms.IntegerField(min_value=1, max_value=64)


class ArenaVoteForm(forms.Form):
    left_version = forms.ModelChoiceField(queryset=None)
    right_version = forms.ModelChoiceField(queryset=None)
    vote = forms.ChoiceField(choices=Vote.choices)
    prompt = forms.CharField(required=False, strip=False)

    def __init__(self, *args, versions, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["left_version"].queryset = versions
        self.fields["right_version"].queryset = versions
