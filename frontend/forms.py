"""The console's forms. They check shapes only; the services decide what is allowed."""

import re
import shlex
from datetime import timedelta

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from aistation.choices import QueuePolicy
from aistation.services.jobs import MAX_TIME_LIMIT_S
from infra_os.choices import Role
from infra_os.models.tenancy import slug_validator
from ogai import json_input
from podsys.models import Node

MAX_TOKEN_DAYS = 366


def add_service_errors(form: forms.Form, exc: ValidationError, field_map: dict | None = None):
    """Show a service's ValidationError on the form: each field's messages on that field, the
    rest (or fields the form lacks) at the top."""
    field_map = field_map or {}
    if not hasattr(exc, "error_dict"):
        form.add_error(None, exc.messages)
        return
    for field, errors in exc.error_dict.items():
        target = field_map.get(field, field)
        messages = [message for error in errors for message in error.messages]
        form.add_error(target if target in form.fields else None, messages)


class QuotaFieldsMixin(forms.Form):
    gpus = forms.IntegerField(label="GPUs", min_value=0, initial=0)
    cpu_cores = forms.IntegerField(label="CPU cores", min_value=0, initial=0,
                                   help_text="Held by its jobs at once; 0: no CPU limit.")
    memory_gib = forms.IntegerField(label="Memory (GiB)", min_value=0, initial=0,
                                    help_text="Held by its jobs at once; 0: no memory limit.")
    storage_gib = forms.IntegerField(label="Storage (GiB)", min_value=0, initial=0)


def log_retention_field() -> forms.IntegerField:
    # Not required: empty keeps what the tenant has (30 days for a new one).
    return forms.IntegerField(
        label="Log retention (days)", min_value=1, max_value=3650, initial=30, required=False,
        help_text="How long the log store keeps its jobs' output: 1 to 3650 whole days. What "
        "it keeps counts against the storage quota.")


class LogRetentionMixin:
    def clean(self):
        data = super().clean()
        if data.get("log_retention_days") is None:
            data.pop("log_retention_days", None)
        return data


class TenantCreateForm(LogRetentionMixin, QuotaFieldsMixin):
    name = forms.CharField(
        max_length=63, validators=[slug_validator],
        help_text="Lowercase letters, digits and hyphens; it becomes a Kubernetes namespace.",
    )
    display_name = forms.CharField(max_length=200, required=False)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))

    log_retention_days = log_retention_field()

    field_order = ["name", "display_name", "description", "gpus", "cpu_cores", "memory_gib",
                   "storage_gib", "log_retention_days"]


class TenantUpdateForm(LogRetentionMixin, forms.Form):
    display_name = forms.CharField(max_length=200, required=False)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    is_active = forms.BooleanField(
        required=False, label="Active",
        help_text="An inactive tenant disappears from its members' switcher.",
    )
    log_retention_days = log_retention_field()

    def __init__(self, *args, platform_admin: bool, **kwargs):
        super().__init__(*args, **kwargs)
        if not platform_admin:
            # Only platform admins (de)activate tenants and say how long their logs are kept.
            del self.fields["is_active"]
            del self.fields["log_retention_days"]


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)
    email = forms.EmailField(required=False, help_text="Only for a new account.")
    password = forms.CharField(
        required=False, strip=False, widget=forms.PasswordInput(render_value=False),
        help_text="Give one to create a new account; leave empty to add an existing user.",
    )


class InvitationForm(forms.Form):
    username = forms.CharField(
        max_length=150,
        help_text="The account to invite. They join when they accept; until then nothing "
        "changes.")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class QuotaForm(QuotaFieldsMixin):
    rdma_devices = forms.IntegerField(
        label="RDMA devices", min_value=0, initial=0, required=False,
        help_text="Held by its jobs at once (RDMA per replica times replicas); 0 or empty: no "
        "RDMA limit.")
    gpu_model_limits = forms.CharField(
        label="Per-GPU-model limits", required=False,
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono", "placeholder": "H100=8\nA100=4"}),
        help_text="One limit a line, as MODEL=COUNT. A model's limit cannot exceed the GPUs.",
    )

    def clean_rdma_devices(self) -> int:
        return self.cleaned_data["rdma_devices"] or 0

    @staticmethod
    def limits_as_text(limits: dict) -> str:
        return "\n".join(f"{model}={count}" for model, count in sorted(limits.items()))

    def clean_gpu_model_limits(self) -> dict:
        limits: dict[str, int] = {}
        text = self.cleaned_data["gpu_model_limits"]
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            model, sep, count = line.partition("=")
            model, count = model.strip(), count.strip()
            if not sep or not model or not count.isdigit():
                raise ValidationError(f"Line {number}: write MODEL=COUNT, e.g. H100=8.")
            if model in limits:
                raise ValidationError(f"Line {number}: {model} is given twice.")
            limits[model] = int(count)
        return limits


class ApiTokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Say where it is used, e.g. “laptop CLI”.")
    expires_in_days = forms.IntegerField(
        label="Expires in (days)", required=False, min_value=1, max_value=MAX_TOKEN_DAYS,
        initial=90, help_text=f"1 to {MAX_TOKEN_DAYS} days; leave empty for a token that never "
        "expires.",
    )

    def expires_at(self):
        days = self.cleaned_data.get("expires_in_days")
        return timezone.now() + timedelta(days=days) if days else None


# Jobs, queues and clusters (L1, L2) ---------------------------------------------------------

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The job services' error keys that differ from the form's field names.
JOB_SUBMIT_FIELD_MAP = {
    "archive": "workdir_archive",
    "sha256": "workdir_archive",
    "resources.gpus": "gpus_per_replica",
    "resources.gpu_model": "gpu_model",
    "resources.cpu": "cpu_per_replica",
    "resources.memory_mib": "memory_mib_per_replica",
    "network.rdma": "rdma_per_replica",
    "network.attachments": "networks",
    "cluster": "queue",
}


class JobSubmitForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="A name to find the job by; not unique.")
    queue = forms.ModelChoiceField(queryset=None, empty_label=None,
                                   help_text="The queue decides the cluster the job runs on.")
    command = forms.CharField(
        max_length=10000,
        widget=forms.TextInput(attrs={"class": "mono", "placeholder": "python train.py --epochs 3",
                                      "autocomplete": "off", "spellcheck": "false"}),
        help_text="The program and its arguments, split like a shell would (quotes group "
        "words), but run without a shell: no pipes, redirections, globs or $VARIABLES.",
    )
    env = forms.CharField(
        label="Environment", required=False,
        widget=forms.Textarea(attrs={"rows": 3, "class": "mono", "spellcheck": "false",
                                     "placeholder": "HF_HOME=/data/hf\nSEED=1"}),
        help_text="One variable a line, as KEY=VALUE.",
    )
    image = forms.CharField(max_length=500, required=False,
                            help_text="A container image; clusters that run local processes "
                            "ignore it.")
    environment = forms.CharField(
        max_length=100, required=False,
        help_text="The cluster's named environment the command runs in (a Python environment "
        "on a local cluster); empty: its default.")
    workdir_archive = forms.FileField(
        label="Working folder", required=False,
        widget=forms.FileInput(attrs={"accept": ".tar.gz,.tgz,.zip"}),
        help_text="The folder the command runs in, as a .tar.gz (`tar czf train.tar.gz -C "
        "folder .`) or a .zip of files and folders (no links); code and small files only, "
        "data goes through datasets.")
    # A copy of a job keeps its working folder unless another archive is uploaded.
    workdir = forms.ModelChoiceField(queryset=None, required=False, widget=forms.HiddenInput)
    gpus_per_replica = forms.IntegerField(label="GPUs", min_value=0, max_value=1024, initial=1)
    gpu_model = forms.CharField(label="GPU model", max_length=64, required=False,
                                help_text="e.g. H100; empty: any model.")
    cpu_per_replica = forms.FloatField(label="CPU cores", min_value=0.01,
                                       max_value=4096, initial=1)
    memory_mib_per_replica = forms.IntegerField(label="Memory (MiB)", min_value=1,
                                                max_value=16 * 1024 * 1024, initial=1024)
    replicas = forms.IntegerField(min_value=1, max_value=1024, initial=1,
                                  help_text="Processes of the job; all start together or none.")
    networks = forms.CharField(
        label="Extra networks", max_length=1000, required=False,
        widget=forms.TextInput(attrs={"class": "mono", "placeholder": "ib-a, ib-b",
                                      "autocomplete": "off", "spellcheck": "false"}),
        help_text="Networks of the cluster each replica attaches, in order, separated by "
        "commas; empty: the cluster's default network only.")
    rdma_per_replica = forms.IntegerField(
        label="RDMA devices", min_value=0, max_value=1024, initial=0, required=False,
        help_text="Per replica, on its node like GPUs; 0 or empty: none.")
    priority = forms.IntegerField(min_value=-1000, max_value=1000, required=False,
                                  help_text="Higher runs first; empty: the queue's default.")
    max_restarts = forms.IntegerField(min_value=0, max_value=100, initial=0,
                                      help_text="Restarts after a failure before it fails.")
    time_limit_s = forms.IntegerField(label="Time limit (seconds)", min_value=1,
                                      max_value=MAX_TIME_LIMIT_S, required=False,
                                      help_text="Stopped after this long; empty: no limit.")

    def __init__(self, *args, queues, workdirs, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["queue"].queryset = queues
        self.fields["workdir"].queryset = workdirs
        self.fields["workdir_archive"].help_text += (
            f" At most {settings.OGAI_WORKDIR_MAX_MB} MiB (OGAI_WORKDIR_MAX_MB).")
        self.fields["queue"].label_from_instance = lambda queue: (
            f"{queue.name} (cluster {queue.cluster.name})"
        )
        # One GPU where the tenant's clusters have GPUs; none on a machine without any, so
        # the first job a newcomer submits can run.
        if not Node.objects.filter(cluster__queues__in=queues, gpus__gt=0).exists():
            self.fields["gpus_per_replica"].initial = 0

    @staticmethod
    def initial_from(job) -> dict:
        """The form's values for submitting a copy of `job`."""
        return {
            "name": job.name, "queue": job.queue_id, "command": shlex.join(job.command),
            "env": "\n".join(f"{key}={value}" for key, value in job.env.items()),
            "image": job.image, "environment": job.environment, "workdir": job.workdir_id,
            "gpus_per_replica": job.gpus_per_replica,
            "gpu_model": job.gpu_model, "cpu_per_replica": job.cpu_per_replica,
            "memory_mib_per_replica": job.memory_mib_per_replica, "replicas": job.replicas,
            "priority": job.priority, "max_restarts": job.max_restarts,
            "time_limit_s": job.time_limit_s, "networks": ", ".join(job.networks),
            "rdma_per_replica": job.rdma_per_replica,
        }

    def clean_rdma_per_replica(self) -> int:
        return self.cleaned_data["rdma_per_replica"] or 0

    def clean_networks(self) -> list[str]:
        names = [name.strip() for name in self.cleaned_data["networks"].split(",")
                 if name.strip()]
        for name in names:
            if len(name) > 63 or not DNS_LABEL.match(name):
                raise ValidationError(f"{name!r} is not a network name (lower-case letters, "
                                      "digits and '-', starting and ending with a letter or "
                                      "digit).")
        if len(set(names)) != len(names):
            raise ValidationError("A network is named twice.")
        return names

    def clean_command(self) -> list[str]:
        try:
            parts = shlex.split(self.cleaned_data["command"])
        except ValueError as exc:
            raise ValidationError(f"Cannot split the command: {exc}.") from None
        if not parts:
            raise ValidationError("Give the program to run.")
        return parts

    def clean_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), start=1):
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            key = key.strip()
            if not sep or not ENV_NAME.match(key):
                raise ValidationError(f"Line {number}: write KEY=VALUE, where KEY is letters, "
                                      "digits and underscores, not starting with a digit.")
            if key in env:
                raise ValidationError(f"Line {number}: {key} is given twice.")
            env[key] = value
        return env


class QueueFieldsMixin(forms.Form):
    description = forms.CharField(max_length=200, required=False)
    default_priority = forms.IntegerField(
        label="Default priority", min_value=-1000, max_value=1000, initial=0,
        help_text="The priority of jobs that give none; higher runs first.",
    )
    gpu_limit = forms.IntegerField(
        label="GPU limit", min_value=0, required=False,
        help_text="GPUs the queue's jobs may hold at once; empty: up to the tenant's quota.",
    )
    policy = forms.ChoiceField(choices=QueuePolicy.choices, initial=QueuePolicy.FAIR)


class QueueCreateForm(QueueFieldsMixin):
    name = forms.CharField(max_length=63, validators=[slug_validator],
                           help_text="Lowercase letters, digits and hyphens.")
    cluster = forms.ModelChoiceField(queryset=None, empty_label=None,
                                     help_text="Where the queue's jobs run.")

    field_order = ["name", "cluster", "description", "default_priority", "gpu_limit", "policy"]

    def __init__(self, *args, clusters, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["cluster"].queryset = clusters


class QueueUpdateForm(QueueFieldsMixin):
    is_active = forms.BooleanField(
        label="Active", required=False,
        help_text="A closed queue takes no new jobs; what it holds runs on.",
    )


class SecretTextarea(forms.Textarea):
    """A textarea that never writes its value back into the page."""

    def format_value(self, value):
        return None


class ClusterCreateForm(forms.Form):
    name = forms.CharField(max_length=63, validators=[slug_validator],
                           help_text="Lowercase letters, digits and hyphens.")
    display_name = forms.CharField(max_length=200, required=False)
    driver = forms.ChoiceField(choices=(), help_text="How OGAI talks to the cluster.")
    tenant = forms.ModelChoiceField(queryset=None, required=False, empty_label="All tenants",
                                    to_field_name="name",
                                    help_text="A tenant's own cluster, or one all tenants share.")
    options = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono", "spellcheck": "false",
                                     "placeholder": '{"nodes": 2, "gpus_per_node": 8}'}),
        help_text="The driver's options as a JSON object; empty: its defaults.",
    )
    kubeconfig = forms.CharField(
        required=False, strip=False,
        widget=SecretTextarea(attrs={"rows": 6, "class": "mono", "spellcheck": "false",
                                     "autocomplete": "off"}),
        help_text="Kubernetes only: the kubeconfig OGAI uses. Stored encrypted and never shown "
        'again (not even if this form comes back with an error). Or set {"in_cluster": true}.',
    )

    def __init__(self, *args, drivers, tenants, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["driver"].choices = [(name, name) for name in sorted(drivers)]
        self.fields["tenant"].queryset = tenants

    def clean_options(self) -> dict:
        text = self.cleaned_data["options"].strip()
        if not text:
            return {}
        try:
            options = json_input.loads(text)
        except ValueError as exc:
            raise ValidationError(f"Not JSON: {exc}.") from None
        if not isinstance(options, dict):
            raise ValidationError('Give an object, e.g. {"nodes": 2}.')
        return options


# Notebooks (JupyterLab environments, L2) ------------------------------------------------------

# The notebook services' error keys (they submit a job) that differ from the form's fields.
NOTEBOOK_START_FIELD_MAP = {
    "resources.gpus": "gpus",
    "resources.gpu_model": "gpu_model",
    "resources.cpu": "cpu",
    "resources.memory_mib": "memory_mib",
    "gpus_per_replica": "gpus",
    "cpu_per_replica": "cpu",
    "memory_mib_per_replica": "memory_mib",
    "cluster": "queue",
}


class NotebookStartForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="A name to find the environment by.")
    queue = forms.ModelChoiceField(queryset=None, empty_label=None,
                                   help_text="Its sessions wait and run in this queue, within "
                                   "the tenant's quota.")
    image = forms.CharField(max_length=500, required=False,
                            help_text="empty: the cluster's own environment (local driver)")
    gpus = forms.IntegerField(label="GPUs", min_value=0, max_value=1024, initial=0,
                              help_text="Held while it runs; freed when it stops.")
    gpu_model = forms.CharField(label="GPU model", max_length=64, required=False,
                                help_text="e.g. H100; empty: any model.")
    cpu = forms.FloatField(label="CPU cores", min_value=0.01, max_value=4096, initial=1)
    memory_mib = forms.IntegerField(label="Memory (MiB)", min_value=1,
                                    max_value=16 * 1024 * 1024, initial=4096)

    def __init__(self, *args, queues, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["queue"].queryset = queues
        self.fields["queue"].label_from_instance = lambda queue: (
            f"{queue.name} (cluster {queue.cluster.name})"
        )


class NotebookPolicyForm(forms.Form):
    idle_minutes = forms.IntegerField(
        label="Idle limit (minutes)", min_value=5, max_value=7 * 24 * 60,
        help_text="A running environment with no kernel busy and no browser open this long is "
        "stopped to free its GPUs; its home folder stays. 5 minutes to a week.",
    )
