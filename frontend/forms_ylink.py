"""The toolchain's console forms (L3): datasets and uploads, the pipeline builder, training runs.
They check shapes only; `ylink.steps`, `ylink.presets` and the services decide what is allowed,
and their errors are shown beside the field they name."""

import re
from dataclasses import dataclass, field
from typing import Any

import django_filters
from django import forms
from django.core.exceptions import ValidationError

from frontend.filters import OneOfManySelect
from frontend.forms import add_service_errors
from ylink.choices import DatasetKind, TrainingKind, VersionFormat
from ylink.filtersets import TrainingRunFilterSet
from ylink.presets import (
    ARCHITECTURES,
    LORA_FIELDS,
    MODEL_FIELDS,
    PRESETS,
    PROMPT_TUNING_FIELDS,
    PROMPT_TUNING_INITS,
    PROMPT_TUNING_KINDS,
    SOURCE_INITS,
    TOKENIZER_FIELDS,
    TRAINING_FIELDS,
)
from ylink.presets import Field as SpecField
from ylink.services.pipelines import MAX_REPLICAS as MAX_PIPELINE_REPLICAS
from ylink.steps import DEFAULT_PIPELINE, MAX_STEPS, STEP_TYPES, Param

# Datasets -------------------------------------------------------------------------------------


class DatasetCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Lower-case letters, digits, '.', '_' and "
                           "'-'; unique in the tenant.")
    kind = forms.ChoiceField(choices=DatasetKind.choices, initial=DatasetKind.TEXT,
                             help_text="Instructions are JSONL with 'prompt' and 'response' on "
                             "every line, for fine-tuning.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))


class DatasetUploadForm(forms.Form):
    file = forms.FileField(
        label="Corpus file",
        help_text="JSONL with a 'text' field on each line, plain text (.txt, .md: one document "
        "a file), or a .zip of them. Each upload becomes a new version.",
    )


# Pipeline builder -----------------------------------------------------------------------------

# The pipeline service's error keys that differ from the form's field names.
PIPELINE_FIELD_MAP = {
    "resources.cpu": "cpu",
    "resources.memory_mib": "memory_mib",
    "cpu_per_replica": "cpu",
    "memory_mib_per_replica": "memory_mib",
    "cluster": "queue",
    "kind": "executor",  # a cluster that runs no Ray clusters
}
STEP_ERROR = re.compile(r"^steps\[(\d+)\](?:\.params\.(\w+)|\.(\w+))?$")


def version_choice_label(version) -> str:
    kind = "token shards" if version.format == VersionFormat.TOKENS else "documents"
    return f"{version.dataset.name} v{version.number} · {version.documents:,} {kind}"


class PipelineRunForm(forms.Form):
    """Everything of a pipeline run but its steps (see StepsEditor)."""

    version = forms.ModelChoiceField(queryset=None, empty_label=None, label="Dataset version",
                                     help_text="Documents only; the output becomes the next "
                                     "version of the same dataset.")
    name = forms.CharField(max_length=100, required=False,
                           help_text="Empty: the dataset's name and “-pipeline”.")
    queue = forms.ModelChoiceField(queryset=None, empty_label=None,
                                   help_text="Its job waits and runs in this queue.")
    replicas = forms.IntegerField(min_value=1, max_value=MAX_PIPELINE_REPLICAS, initial=1,
                                  help_text="Processes sharing the work; dedup stays global.")
    cpu = forms.FloatField(label="CPU cores", min_value=0.01, max_value=4096, initial=1,
                           help_text="Per replica.")
    memory_mib = forms.IntegerField(label="Memory (MiB)", min_value=64,
                                    max_value=16 * 1024 * 1024, initial=2048,
                                    help_text="Per replica.")
    tokenizer_run = forms.ModelChoiceField(
        queryset=None, required=False, empty_label="Bytes (no trained tokenizer)",
        label="Tokenizer", help_text="For a tokenize step: a finished tokenizer run.")
    executor = forms.ChoiceField(
        required=False, choices=[("local", "Replicas (plain processes)"),
                 ("ray", "Ray (a Ray cluster job: a head and the replicas as workers)")],
        initial="local", help_text="Either gives the same output, document for document; Ray "
        "needs a cluster whose driver runs Ray clusters.")

    def __init__(self, *args, versions, queues, tokenizers, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["version"].queryset = versions
        self.fields["version"].label_from_instance = version_choice_label
        self.fields["queue"].queryset = queues
        self.fields["queue"].label_from_instance = lambda queue: (
            f"{queue.name} (cluster {queue.cluster.name})")
        self.fields["tokenizer_run"].queryset = tokenizers
        self.fields["tokenizer_run"].label_from_instance = lambda run: f"#{run.pk} {run.name}"


@dataclass
class ParamInput:
    """One parameter of one step, as the builder shows it."""

    name: str
    param: Param
    value: Any
    prefix: str
    error: str = ""

    @property
    def html_name(self) -> str:
        return self.prefix + self.name

    @property
    def kind(self) -> str:
        return self.param.kind

    @property
    def shown(self) -> str:
        """The value as the input holds it."""
        value = self.value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return repr(value)  # every digit typed comes back
        return "" if value is None else str(value)

    @property
    def checked(self) -> bool:
        return self.value is True

    @property
    def default_shown(self) -> str:
        default = self.param.default
        if isinstance(default, bool):
            return "on" if default else "off"
        return f"{default:g}" if isinstance(default, float) else str(default)


@dataclass
class StepCard:
    index: int
    type: str
    params: list[ParamInput] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    last: bool = False

    @property
    def spec(self):
        return STEP_TYPES.get(self.type)

    @property
    def number(self) -> int:
        return self.index + 1

    @property
    def has_errors(self) -> bool:
        return bool(self.errors) or any(param.error for param in self.params)


def _typed(param: Param, raw: str) -> Any:
    """What a text box held, as the catalogue's type when it reads as one; otherwise the text
    itself, so `validate_steps` says what is wrong with it."""
    text = raw.strip()
    if param.kind == "int":
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return text
    if param.kind == "float":
        try:
            return float(text)
        except ValueError:
            return text
    return raw


class StepsEditor:
    """The builder's steps, carried in the form as `steps-N-type` and `steps-N-<param>`, and
    what the step buttons do to them (add, remove, move up or down, back to the defaults)."""

    PREFIX = "steps"
    MAX_STEPS = MAX_STEPS

    def __init__(self, steps: list[dict]):
        self.steps = [{"type": step.get("type", ""), "params": dict(step.get("params") or {})}
                      for step in steps]
        self.errors: dict[int, dict[str, list[str]]] = {}
        self.general_errors: list[str] = []

    @classmethod
    def defaults(cls) -> "StepsEditor":
        return cls(DEFAULT_PIPELINE)

    @classmethod
    def from_post(cls, data) -> "StepsEditor":
        raw_count = data.get(f"{cls.PREFIX}-count", "0")
        count = min(int(raw_count), cls.MAX_STEPS) if raw_count.isdigit() else 0
        steps = []
        for index in range(count):
            prefix = f"{cls.PREFIX}-{index}-"
            step_type = data.get(prefix + "type", "")
            params: dict[str, Any] = {}
            spec = STEP_TYPES.get(step_type)
            for name, param in (spec.params.items() if spec else ()):
                if prefix + name not in data:
                    continue  # not sent: the catalogue's default
                if param.kind == "bool":
                    # A hidden "false" comes before the checkbox's "true".
                    params[name] = "true" in data.getlist(prefix + name)
                else:
                    params[name] = _typed(param, data.get(prefix + name, ""))
            steps.append({"type": step_type, "params": params})
        return cls(steps)

    def apply(self, action: str, add_type: str = "") -> bool:
        """Do what a step button asks; False when `action` is not one of them."""
        verb, _, target = action.partition(":")
        if verb == "add":
            if add_type not in STEP_TYPES or len(self.steps) >= self.MAX_STEPS:
                return True
            new = {"type": add_type, "params": {}}
            # Anything added after a tokenize step goes before it: tokenize must stay last.
            if self.steps and self.steps[-1]["type"] == "tokenize" and add_type != "tokenize":
                self.steps.insert(len(self.steps) - 1, new)
            else:
                self.steps.append(new)
            return True
        if verb == "defaults":
            self.steps = [dict(step, params=dict(step["params"])) for step in DEFAULT_PIPELINE]
            return True
        if verb not in ("remove", "up", "down") or not target.isdigit():
            return False
        index = int(target)
        if not 0 <= index < len(self.steps):
            return True
        if verb == "remove":
            del self.steps[index]
        elif verb == "up" and index > 0:
            self.steps[index - 1], self.steps[index] = self.steps[index], self.steps[index - 1]
        elif verb == "down" and index < len(self.steps) - 1:
            self.steps[index + 1], self.steps[index] = self.steps[index], self.steps[index + 1]
        return True

    def add_errors(self, errors: dict[str, list[str]]) -> dict[str, list[str]]:
        """Take the step errors ("steps[2].params.threshold") of a service's error dict and
        return the rest."""
        rest = {}
        for key, messages in errors.items():
            text = " ".join(messages)
            if key == "steps":
                self.general_errors.append(text)
                continue
            match = STEP_ERROR.match(key)
            if match is None or int(match[1]) >= len(self.steps):
                rest[key] = messages
                continue
            index, param, other = int(match[1]), match[2], match[3]
            if param:
                place = param
            else:
                place = ""
                if other not in (None, "type"):
                    text = f"{other}: {text}"
            self.errors.setdefault(index, {}).setdefault(place, []).append(text)
        return rest

    def cards(self) -> list[StepCard]:
        cards = []
        for index, step in enumerate(self.steps):
            errors = self.errors.get(index, {})
            card = StepCard(index=index, type=step["type"], last=index == len(self.steps) - 1)
            card.errors.extend(errors.get("", []))
            spec = STEP_TYPES.get(step["type"])
            if spec is None:
                if not card.errors:
                    card.errors.append(f"unknown step type '{step['type']}'")
            else:
                prefix = f"{self.PREFIX}-{index}-"
                for name, param in spec.params.items():
                    card.params.append(ParamInput(
                        name=name, param=param, value=step["params"].get(name, param.default),
                        prefix=prefix, error=" ".join(errors.get(name, []))))
                card.errors.extend(f"{name}: {' '.join(messages)}"
                                   for name, messages in errors.items()
                                   if name and name not in spec.params)
            cards.append(card)
        return cards


def split_service_errors(form: forms.Form, editor: StepsEditor, exc, field_map=None) -> None:
    """A service's ValidationError: step errors beside their step's fields, the rest on the
    form."""
    if not hasattr(exc, "error_dict"):
        form.add_error(None, exc.messages)
        return
    errors = {key: [m for error in errors for m in error.messages]
              for key, errors in exc.error_dict.items()}
    rest = editor.add_errors(errors)
    if rest:
        add_service_errors(form, ValidationError(rest), field_map=field_map)


# Training -------------------------------------------------------------------------------------

# Which training settings the form offers; their bounds and help come from ylink.presets.
TRAINING_FORM_FIELDS = ("max_steps", "batch_size", "grad_accum", "lr", "warmup_steps",
                        "checkpoint_every", "log_every", "precision", "distributed")
TRAINING_FIELD_MAP = {
    **{f"training.{name}": name for name in TRAINING_FORM_FIELDS},
    "model.preset": "preset",
    "model.architecture": "architecture",
    "model.context_length": "context_length",
    "tokenizer.vocab_size": "vocab_size",
    "tokenizer.min_frequency": "min_frequency",
    "lora.r": "lora_r",
    "lora.alpha": "lora_alpha",
    "lora.dropout": "lora_dropout",
    "prompt_tuning.num_virtual_tokens": "num_virtual_tokens",
    "prompt_tuning.init": "prompt_init",
    "prompt_tuning.init_text": "init_text",
    "prompt_tuning.num_ranks": "num_ranks",
    "resources.gpus": "gpus",
    "resources.gpu_model": "gpu_model",
    "resources.cpu": "cpu",
    "resources.memory_mib": "memory_mib",
    "gpus_per_replica": "gpus",
    "cpu_per_replica": "cpu",
    "memory_mib_per_replica": "memory_mib",
    "cluster": "queue",
}


def _spec_field(spec: SpecField, *, label: str, required: bool = True) -> forms.Field:
    """A form field for one setting of a train spec section, with its bounds and help."""
    help_text = spec.help[:1].upper() + spec.help[1:] + "."
    common = {"label": label, "help_text": help_text, "required": required}
    if spec.type == "choice":
        return forms.ChoiceField(choices=[(c, c) for c in spec.choices], initial=spec.default,
                                 **common)
    bounds = {"min_value": spec.min, "max_value": spec.max}
    if spec.type == "int":
        return forms.IntegerField(initial=spec.default, **bounds, **common)
    widget = forms.NumberInput(attrs={"step": "any"})
    return forms.FloatField(initial=spec.default, widget=widget, **bounds, **common)


def _preset_label(name: str) -> str:
    return f"{name}: {PRESETS[name]['description']}"


TRAINING_LABELS = {
    "max_steps": "Steps", "batch_size": "Batch size", "grad_accum": "Gradient accumulation",
    "lr": "Learning rate", "warmup_steps": "Warmup steps",
    "checkpoint_every": "Checkpoint every (steps)", "log_every": "Log every (steps)",
    "precision": "Precision", "distributed": "Distributed",
}


class TrainingRunForm(forms.Form):
    name = forms.CharField(max_length=100, required=False,
                           help_text="Empty: the dataset's name and the kind.")
    kind = forms.ChoiceField(choices=TrainingKind.choices, initial=TrainingKind.PRETRAIN)
    dataset_version = forms.ModelChoiceField(
        queryset=None, empty_label=None, label="Dataset version",
        help_text="Pretraining reads token shards (a pipeline ending with tokenize); a tokenizer, "
        "SFT and LoRA read documents (SFT and LoRA: an instruction dataset).")
    base_run = forms.ModelChoiceField(
        queryset=None, required=False, label="Base model", empty_label="—",
        help_text="Fine-tunes and prompt tuning: the finished run whose model to adapt.")
    # Pretraining.
    preset = forms.ChoiceField(choices=[(name, _preset_label(name)) for name in PRESETS],
                               initial=MODEL_FIELDS["preset"].default, label="Model size",
                               help_text="The layer count and width; the vocabulary comes from "
                               "the token shards.")
    architecture = forms.ChoiceField(choices=[(a, a) for a in ARCHITECTURES],
                                     initial=MODEL_FIELDS["architecture"].default)
    context_length = _spec_field(MODEL_FIELDS["context_length"], label="Context length",
                                 required=False)
    # Tokenizer.
    vocab_size = _spec_field(TOKENIZER_FIELDS["vocab_size"], label="Vocabulary size")
    min_frequency = _spec_field(TOKENIZER_FIELDS["min_frequency"], label="Minimum frequency")
    # LoRA.
    lora_r = _spec_field(LORA_FIELDS["r"], label="Rank (r)")
    lora_alpha = _spec_field(LORA_FIELDS["alpha"], label="Alpha")
    lora_dropout = _spec_field(LORA_FIELDS["dropout"], label="Dropout")
    # Prompt tuning (both kinds).
    num_virtual_tokens = _spec_field(PROMPT_TUNING_FIELDS["num_virtual_tokens"],
                                     label="Virtual tokens", required=False)
    prompt_init = forms.ChoiceField(
        required=False,
        choices=[(name, name) for name in PROMPT_TUNING_INITS if name not in SOURCE_INITS],
        initial=PROMPT_TUNING_FIELDS["init"].default, label="Initialisation",
        help_text="random, text (the tokens of the text below) or sample_vocab (prompt "
        "tuning only). Starting from source tasks is the two-stage recipe's second stage "
        "(API and CLI: ogai train mpt).")
    init_text = forms.CharField(max_length=2000, required=False, label="Initial text",
                                help_text="With text: its tokens' embeddings start the prompt.")
    num_ranks = _spec_field(PROMPT_TUNING_FIELDS["num_ranks"], label="Task factor rank",
                            required=False)
    # Resources and scheduling.
    queue = forms.ModelChoiceField(queryset=None, empty_label=None,
                                   help_text="Its job waits and runs in this queue.")
    gpus = forms.IntegerField(label="GPUs", min_value=0, max_value=1024, initial=0,
                              help_text="Per replica; 0 trains on CPUs.")
    gpu_model = forms.CharField(label="GPU model", max_length=64, required=False,
                                help_text="e.g. H100; empty: any model.")
    replicas = forms.IntegerField(min_value=1, max_value=1024, initial=1,
                                  help_text="DDP or FSDP ranks; all start together.")
    cpu = forms.FloatField(label="CPU cores", min_value=0.01, max_value=4096, initial=1,
                           help_text="Per replica.")
    memory_mib = forms.IntegerField(label="Memory (MiB)", min_value=64,
                                    max_value=16 * 1024 * 1024, initial=4096,
                                    help_text="Per replica.")
    max_restarts = forms.IntegerField(min_value=0, max_value=100, initial=3,
                                      help_text="Restarts after a failure; each resumes from "
                                      "the newest checkpoint.")

    def __init__(self, *args, versions, base_runs, queues, **kwargs):
        super().__init__(*args, **kwargs)
        for name in TRAINING_FORM_FIELDS:
            self.fields[name] = _spec_field(TRAINING_FIELDS[name], label=TRAINING_LABELS[name])
        self.fields["dataset_version"].queryset = versions
        self.fields["dataset_version"].label_from_instance = version_choice_label
        self.fields["base_run"].queryset = base_runs
        self.fields["base_run"].label_from_instance = lambda run: (
            f"#{run.pk} {run.name} ({run.get_kind_display()})")
        self.fields["queue"].queryset = queues
        self.fields["queue"].label_from_instance = lambda queue: (
            f"{queue.name} (cluster {queue.cluster.name})")

    def service_kwargs(self) -> dict:
        """The keyword arguments of `training_run_start`: only the sections the kind reads."""
        data = self.cleaned_data
        kind = data["kind"]
        kwargs = {
            "kind": kind, "name": data["name"], "dataset_version": data["dataset_version"],
            "queue": data["queue"], "gpus": data["gpus"], "gpu_model": data["gpu_model"],
            "replicas": data["replicas"], "cpu": data["cpu"], "memory_mib": data["memory_mib"],
            "max_restarts": data["max_restarts"],
        }
        if kind == TrainingKind.TOKENIZER:
            kwargs["tokenizer"] = {"vocab_size": data["vocab_size"],
                                   "min_frequency": data["min_frequency"]}
            return kwargs
        kwargs["training"] = {name: data[name] for name in TRAINING_FORM_FIELDS}
        if kind == TrainingKind.PRETRAIN:
            model = {"preset": data["preset"], "architecture": data["architecture"]}
            if data.get("context_length") is not None:
                model["context_length"] = data["context_length"]
            kwargs["model"] = model
        else:
            kwargs["base_run"] = data["base_run"]
        if kind == TrainingKind.LORA:
            kwargs["lora"] = {"r": data["lora_r"], "alpha": data["lora_alpha"],
                              "dropout": data["lora_dropout"]}
        if kind in PROMPT_TUNING_KINDS:
            # Left empty: the spec's defaults.
            prompt = {"num_virtual_tokens": data["num_virtual_tokens"],
                      "init": data["prompt_init"], "init_text": data["init_text"],
                      "num_ranks": data["num_ranks"]
                      if kind == TrainingKind.MULTITASK_PROMPT_TUNING else None}
            kwargs["prompt_tuning"] = {key: value for key, value in prompt.items()
                                       if value not in (None, "")}
        return kwargs


class ConsoleTrainingRunFilterSet(TrainingRunFilterSet):
    kind = django_filters.MultipleChoiceFilter(choices=TrainingKind.choices,
                                               widget=OneOfManySelect)
