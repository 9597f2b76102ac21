"""Forms of the bare-metal pages: servers, racks, provisioning profiles and batches. They check
shapes only; the services (infra_os.services.servers and .provisioning) decide what is allowed."""

from django import forms

from infra_os.choices import BootMethod
from infra_os.models.tenancy import slug_validator
from infra_os.services.servers import IMPORT_COLUMNS

SLUG_HELP = "Lowercase letters, digits and hyphens."
# bmc_update's error keys, as the BMC form names its fields.
BMC_FIELD_MAP = {"bmc_address": "address", "bmc_username": "username",
                 "bmc_password": "password", "bmc_system_id": "system_id",
                 "bmc_verify_tls": "verify_tls"}


def _password_field(**kwargs) -> forms.CharField:
    # render_value=False: a form that comes back with an error never writes the password into
    # the page.
    return forms.CharField(
        max_length=256, strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        **kwargs,
    )


class ServerRegisterForm(forms.Form):
    name = forms.CharField(max_length=63, validators=[slug_validator], help_text=SLUG_HELP)
    rack = forms.CharField(
        max_length=63, required=False, widget=forms.TextInput(attrs={"list": "rack-names"}),
        help_text="A rack's name; a new name adds the rack.",
    )
    description = forms.CharField(max_length=200, required=False)
    bmc_address = forms.CharField(
        label="BMC address", max_length=255,
        widget=forms.TextInput(attrs={"class": "mono", "placeholder": "https://10.0.0.5"}),
        help_text="The Redfish service's URL.",
    )
    bmc_username = forms.CharField(label="BMC user", max_length=128,
                                   widget=forms.TextInput(attrs={"autocomplete": "off"}))
    bmc_password = _password_field(
        label="BMC password",
        help_text="Stored encrypted; never shown again.",
    )
    system_id = forms.CharField(
        label="System id", max_length=255, required=False,
        help_text="The Redfish system's id when the BMC manages several; empty: its only one.",
    )
    verify_tls = forms.BooleanField(
        label="Verify the BMC's TLS certificate", required=False, initial=True,
        help_text="Turn off only for BMCs with self-signed certificates.",
    )
    expected_gpu_model = forms.CharField(label="Expected GPU model", max_length=64,
                                         required=False, help_text="e.g. H100")
    expected_gpu_count = forms.IntegerField(label="Expected GPUs", min_value=0, max_value=64,
                                            initial=0)
    boot_mac = forms.CharField(
        label="Boot MAC", max_length=17, required=False,
        widget=forms.TextInput(attrs={"class": "mono", "placeholder": "aa:bb:cc:dd:ee:ff"}),
        help_text="The NIC it network-boots from; empty: the first NIC the BMC reports.",
    )


class ServerImportForm(forms.Form):
    file = forms.FileField(
        help_text="CSV with a header row, or a JSON list of objects (.json); at most 2 MB.",
        widget=forms.ClearableFileInput(attrs={"accept": ".csv,.json,text/csv,application/json"}),
    )

    columns = IMPORT_COLUMNS


class ServerUpdateForm(forms.Form):
    rack = forms.CharField(
        max_length=63, required=False, widget=forms.TextInput(attrs={"list": "rack-names"}),
        help_text="Empty: in no rack. A new name adds the rack.",
    )
    description = forms.CharField(max_length=200, required=False)
    expected_gpu_model = forms.CharField(label="Expected GPU model", max_length=64,
                                         required=False)
    expected_gpu_count = forms.IntegerField(label="Expected GPUs", min_value=0, max_value=64)

    @staticmethod
    def initial_from(server) -> dict:
        return {"rack": server.rack.name if server.rack else "",
                "description": server.description,
                "expected_gpu_model": server.expected_gpu_model,
                "expected_gpu_count": server.expected_gpu_count}


class BmcUpdateForm(forms.Form):
    address = forms.CharField(label="BMC address", max_length=255,
                              widget=forms.TextInput(attrs={"class": "mono"}))
    username = forms.CharField(label="BMC user", max_length=128,
                               widget=forms.TextInput(attrs={"autocomplete": "off"}))
    password = _password_field(label="New password", required=False,
                               help_text="Empty: keep the current one (it is never shown).")
    system_id = forms.CharField(label="System id", max_length=255, required=False)
    verify_tls = forms.BooleanField(label="Verify the BMC's TLS certificate", required=False)

    @staticmethod
    def initial_from(bmc) -> dict:
        return {"address": bmc.address, "username": bmc.username, "system_id": bmc.system_id,
                "verify_tls": bmc.verify_tls}

    def service_kwargs(self) -> dict:
        data = dict(self.cleaned_data)
        if not data.get("password"):
            data["password"] = None
        return data


class RackForm(forms.Form):
    name = forms.CharField(max_length=63, validators=[slug_validator], help_text=SLUG_HELP)
    location = forms.CharField(max_length=200, required=False,
                               help_text="Room, row, position.")


class ProfileForm(forms.Form):
    name = forms.CharField(max_length=63, validators=[slug_validator], help_text=SLUG_HELP)
    description = forms.CharField(max_length=200, required=False)
    boot_method = forms.ChoiceField(choices=BootMethod.choices, initial=BootMethod.PXE)
    user_data = forms.CharField(
        label="cloud-init user data", required=False,
        widget=forms.Textarea(attrs={"rows": 12, "class": "mono", "spellcheck": "false",
                                     "placeholder": "#cloud-config\npackages:\n  - nvidia-driver"}),
        help_text="Handed to every server's first boot with its one-time callback token.",
    )

    def __init__(self, *args, editing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if editing:
            # A profile keeps its name: batches name it in their record.
            self.fields["name"].disabled = True
            self.fields["name"].help_text = "A profile keeps its name."

    @staticmethod
    def initial_from(profile) -> dict:
        return {"name": profile.name, "description": profile.description,
                "boot_method": profile.boot_method, "user_data": profile.user_data}


class BatchCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="e.g. “rack-b ubuntu 24.04”.")
    profile = forms.ModelChoiceField(queryset=None, to_field_name="name",
                                     empty_label="Choose a profile")
    image_url = forms.URLField(
        label="Image URL", max_length=500, assume_scheme="https",
        widget=forms.URLInput(attrs={"class": "mono",
                                     "placeholder": "http://images.example/ubuntu-24.04.iso"}),
        help_text="The OS image the servers install.",
    )
    boot_method = forms.ChoiceField(
        choices=[("", "The profile's"), *BootMethod.choices], required=False,
        label="Boot method", help_text="Empty: the profile's.",
    )
    servers = forms.ModelMultipleChoiceField(
        queryset=None, to_field_name="name", widget=forms.CheckboxSelectMultiple,
        help_text="Servers with a BMC that are not retired, leased, cluster nodes or already "
        "being provisioned.",
    )
    concurrency = forms.IntegerField(min_value=1, max_value=1000, initial=20,
                                     help_text="Servers installed at once.")
    max_attempts = forms.IntegerField(label="Attempts", min_value=1, max_value=10, initial=3,
                                      help_text="Per server, before it is reported failed.")
    power_timeout_s = forms.IntegerField(label="Power timeout (s)", min_value=1,
                                         max_value=3600, initial=300,
                                         help_text="How long a power cycle may take.")
    callback_timeout_s = forms.IntegerField(
        label="Callback timeout (s)", min_value=1, max_value=86400, initial=3600,
        help_text="How long after power-on the first-boot agent has to call back.",
    )

    def __init__(self, *args, profiles, servers, installable, **kwargs):
        """`servers`: every server a batch may name (the service says why one cannot be
        installed); the boxes offered are the `installable` ones and those already chosen."""
        super().__init__(*args, **kwargs)
        self.fields["profile"].queryset = profiles
        field = self.fields["servers"]
        field.queryset = servers
        chosen = set(self._chosen_names())
        offered = list(installable) + [s for s in servers.filter(name__in=chosen)
                                       .exclude(pk__in=[s.pk for s in installable])]
        offered.sort(key=lambda server: server.name)
        field.widget.choices = [(server.name, self.server_label(server)) for server in offered]
        self.offered_count = len(offered)

    def _chosen_names(self) -> list[str]:
        if self.is_bound:
            return self.data.getlist(self.add_prefix("servers")) \
                if hasattr(self.data, "getlist") else list(self.data.get("servers") or [])
        return [str(name) for name in (self.initial.get("servers") or [])]

    @staticmethod
    def server_label(server) -> str:
        parts = [server.name]
        if server.rack_id:
            parts.append(f"rack {server.rack.name}")
        gpus = server.billed_gpu_count
        if gpus:
            parts.append(f"{gpus}\N{MULTIPLICATION SIGN} {server.billed_gpu_model}".strip())
        return " · ".join(parts)

    def service_kwargs(self) -> dict:
        data = dict(self.cleaned_data)
        data["servers"] = list(data["servers"])
        return data
