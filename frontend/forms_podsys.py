"""Forms of the PODsys pages: stack profiles, deployments, cluster accounts and LDAP. They check
shapes only; the services (podsys.services.stack, .deployments, .accounts) decide what is
allowed, the compatibility of a profile's versions included."""

from django import forms

from infra_os.models.tenancy import slug_validator
from podsys.choices import ContainerRuntime, DeploymentKind, Orchestrator, OsFamily
from podsys.models.accounts import posix_name_validator

SLUG_HELP = "Lowercase letters, digits and hyphens."
VERSION_ATTRS = {"class": "mono", "autocomplete": "off", "spellcheck": "false"}


def _version(label: str, *, required: bool = False, help_text: str = "",
             placeholder: str = "", max_length: int = 16) -> forms.CharField:
    return forms.CharField(
        label=label, max_length=max_length, required=required, help_text=help_text,
        widget=forms.TextInput(attrs={**VERSION_ATTRS, "placeholder": placeholder}),
    )


class StackProfileForm(forms.Form):
    name = forms.CharField(max_length=63, validators=[slug_validator], help_text=SLUG_HELP)
    description = forms.CharField(max_length=200, required=False)
    os_family = forms.ChoiceField(label="Operating system", choices=OsFamily.choices,
                                  initial=OsFamily.UBUNTU_2204)
    driver_version = _version("NVIDIA driver", required=True, max_length=32,
                              placeholder="550.127.05")
    cuda_version = _version("CUDA", required=True, placeholder="12.4")
    cudnn_version = _version("cuDNN", placeholder="9.1.0")
    nccl_version = _version("NCCL", placeholder="2.21.5")
    ofed_version = _version("MLNX OFED", max_length=32, placeholder="24.10-1.1.4.0",
                            help_text="Empty: no InfiniBand/RoCE stack on these nodes.")
    container_runtime = forms.ChoiceField(label="Container runtime",
                                          choices=ContainerRuntime.choices,
                                          initial=ContainerRuntime.CONTAINERD)
    container_toolkit_version = _version("NVIDIA container toolkit", placeholder="1.17.3")
    dcgm_version = _version("DCGM", placeholder="3.3.9")
    orchestrator = forms.ChoiceField(choices=Orchestrator.choices,
                                     initial=Orchestrator.KUBERNETES)
    orchestrator_version = _version("Orchestrator version", placeholder="1.30.4",
                                    help_text="Kubernetes (kubelet, kubeadm) or Slurm.")
    offline_mirror = forms.CharField(
        label="Offline package mirror", max_length=500, required=False,
        widget=forms.TextInput(attrs={**VERSION_ATTRS,
                                      "placeholder": "file:///srv/mirror or http://mirror.lan/"}),
        help_text="Set: every package comes from this mirror and nothing is fetched from the "
        "internet.",
    )

    def __init__(self, *args, editing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if editing:
            # A profile keeps its name: deployment runs name it in their record.
            self.fields["name"].disabled = True
            self.fields["name"].help_text = "A profile keeps its name."

    @classmethod
    def initial_from(cls, profile) -> dict:
        return {name: getattr(profile, name) for name in cls.base_fields}


class DeploymentStartForm(forms.Form):
    """Deploy a profile to nodes of one cluster. The node boxes are those of the cluster
    chosen (the page reloads them when the cluster changes)."""

    cluster = forms.ModelChoiceField(queryset=None, to_field_name="name",
                                     empty_label="Choose a cluster")
    profile = forms.ModelChoiceField(queryset=None, to_field_name="name",
                                     empty_label="Choose a profile")
    hosts = forms.MultipleChoiceField(
        label="Nodes", widget=forms.CheckboxSelectMultiple, choices=(),
        help_text="The nodes the playbook runs on; each stops at its first failed task, the "
        "others go on.",
    )
    check_mode = forms.BooleanField(
        label="Check mode", required=False,
        help_text="Ansible's --check: report what would change and change nothing.",
    )

    def __init__(self, *args, clusters, profiles, chosen_cluster=None, nodes=(), **kwargs):
        """`nodes`: those of `chosen_cluster`, the cluster picked so far (None: none yet)."""
        super().__init__(*args, **kwargs)
        self.chosen_cluster = chosen_cluster
        self.fields["cluster"].queryset = clusters
        self.fields["profile"].queryset = profiles
        self.fields["hosts"].choices = [(node.name, self.node_label(node)) for node in nodes]
        self.node_count = len(self.fields["hosts"].choices)

    @staticmethod
    def node_label(node) -> str:
        parts = [node.name]
        if node.gpus:
            parts.append(f"{node.gpus}\N{MULTIPLICATION SIGN} {node.gpu_model}".strip())
        if node.health != "healthy":
            parts.append(node.get_health_display().lower())
        return " · ".join(parts)

    def service_kwargs(self) -> dict:
        data = self.cleaned_data
        return {"cluster": data["cluster"], "profile": data["profile"],
                "hosts": list(data["hosts"]), "check_mode": data["check_mode"],
                "kind": DeploymentKind.STACK}


class ClusterGroupForm(forms.Form):
    prefix = "group"

    name = forms.CharField(max_length=32, validators=[posix_name_validator],
                           widget=forms.TextInput(attrs={"class": "mono"}))
    gid = forms.IntegerField(label="GID", min_value=0, required=False,
                             help_text="Empty: the next free one.")


class ClusterUserForm(forms.Form):
    prefix = "user"

    username = forms.CharField(max_length=32, validators=[posix_name_validator],
                               widget=forms.TextInput(attrs={"class": "mono",
                                                             "autocomplete": "off"}))
    full_name = forms.CharField(label="Full name", max_length=200, required=False)
    uid = forms.IntegerField(label="UID", min_value=0, required=False,
                             help_text="Empty: the next free one. The same on every node.")
    groups = forms.ModelMultipleChoiceField(queryset=None, required=False,
                                            widget=forms.CheckboxSelectMultiple)
    ssh_public_keys = forms.CharField(
        label="SSH public keys", required=False,
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono", "spellcheck": "false",
                                     "placeholder": "ssh-ed25519 AAAAC3Nza… alice@laptop"}),
        help_text="One per line (the .pub files): they become the account's whole "
        "authorized_keys on every node.",
    )

    def __init__(self, *args, groups, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["groups"].queryset = groups

    def service_kwargs(self) -> dict:
        data = dict(self.cleaned_data)
        data["groups"] = list(data["groups"])
        return data


class ClusterLdapForm(forms.Form):
    prefix = "ldap"

    uri = forms.CharField(
        label="LDAP URI", max_length=500, required=False,
        widget=forms.TextInput(attrs={"class": "mono", "placeholder": "ldaps://ldap.example:636"}),
        help_text="Empty: local accounts (the ones above) again.",
    )
    base_dn = forms.CharField(label="Base DN", max_length=500, required=False,
                              widget=forms.TextInput(attrs={"class": "mono",
                                                            "placeholder": "dc=example,dc=org"}))
    bind_dn = forms.CharField(label="Bind DN", max_length=500, required=False,
                              widget=forms.TextInput(attrs={"class": "mono"}))
    # render_value=False: the password never goes back into a page, even with an error.
    bind_password = forms.CharField(
        label="Bind password", max_length=500, required=False, strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Stored encrypted; never shown again. Empty: keep the stored one while the "
        "bind DN stays the same.",
    )

    @staticmethod
    def initial_from(ldap: dict) -> dict:
        """`ldap`: the settings as podsys.services.accounts.cluster_ldap reads them."""
        return {key: ldap.get(key, "") for key in ("uri", "base_dn", "bind_dn")}

