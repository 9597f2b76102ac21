"""The console's forms. They check shapes only; the services decide what is allowed."""

from datetime import timedelta

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone

from infra_os.choices import Role
from infra_os.models.tenancy import slug_validator

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
    cpu_cores = forms.IntegerField(label="CPU cores", min_value=0, initial=0)
    memory_gib = forms.IntegerField(label="Memory (GiB)", min_value=0, initial=0)
    storage_gib = forms.IntegerField(label="Storage (GiB)", min_value=0, initial=0)


class TenantCreateForm(QuotaFieldsMixin):
    name = forms.CharField(
        max_length=63, validators=[slug_validator],
        help_text="Lowercase letters, digits and hyphens; it becomes a Kubernetes namespace.",
    )
    display_name = forms.CharField(max_length=200, required=False)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))

    field_order = ["name", "display_name", "description", "gpus", "cpu_cores", "memory_gib",
                   "storage_gib"]


class TenantUpdateForm(forms.Form):
    display_name = forms.CharField(max_length=200, required=False)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    is_active = forms.BooleanField(
        required=False, label="Active",
        help_text="An inactive tenant disappears from its members' switcher.",
    )

    def __init__(self, *args, platform_admin: bool, **kwargs):
        super().__init__(*args, **kwargs)
        if not platform_admin:
            # Only platform admins (de)activate tenants.
            del self.fields["is_active"]


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)
    email = forms.EmailField(required=False, help_text="Only for a new account.")
    password = forms.CharField(
        required=False, strip=False, widget=forms.PasswordInput(render_value=False),
        help_text="Give one to create a new account; leave empty to add an existing user.",
    )


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class QuotaForm(QuotaFieldsMixin):
    gpu_model_limits = forms.CharField(
        label="Per-GPU-model limits", required=False,
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono", "placeholder": "H100=8\nA100=4"}),
        help_text="One limit a line, as MODEL=COUNT. A model's limit cannot exceed the GPUs.",
    )

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
