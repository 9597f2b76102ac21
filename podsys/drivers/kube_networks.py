"""A job's extra networks and RDMA devices on Kubernetes: the cluster's offer (its driver
options `networks` and `rdma_resource`), what a pod gets for them, and where such a pod runs.

Pure functions building plain dicts, like `kube_manifests`, which assembles them. A job asks
`network: {attachments: [name, …], rdma: N}` (`Workload.networks`, `Resources.rdma`):

* each attachment is a Multus NetworkAttachmentDefinition the operator named in the cluster's
  `networks` option; the pod carries them in the `k8s.v1.cni.cncf.io/networks` annotation (the
  JSON-list form), in the job's order, and Multus names their interfaces net1, net2, … in that
  order unless the option gives one;
* `rdma: N` is N of the cluster's RDMA extended resource per replica (`rdma_resource`, e.g.
  `rdma/rdma_shared_device_a` from the RDMA shared device plugin, or an SR-IOV resource such as
  `nvidia.com/mlnx_sriov_rdma`), requests equal to limits, counted like GPUs;
* NCCL finds them through `NCCL_SOCKET_IFNAME` (the attachments' interfaces) and `NCCL_IB_HCA`
  (the HCAs the option names for them), unless the job sets those itself.

The tenant boundary. Registering memory with an HCA needs `IPC_LOCK`, which the `restricted`
and even the `baseline` Pod Security levels refuse. Rather than loosen the tenant's namespace,
pods that ask for RDMA run in a second namespace of the tenant, `<tenant namespace>-rdma`:
enforce level `privileged` (the only one that lets a pod add IPC_LOCK), warn and audit
`restricted` (every such pod is logged as what it is), the same default-deny NetworkPolicies
and no service-account token. The platform's rendering is the only author of pods there, and it
gives them exactly what the tenant namespace's pods get plus IPC_LOCK: every capability else
dropped, non-root, no privilege escalation, RuntimeDefault seccomp, no host namespaces, no
hostPath (`check_rdma_pod` proves it of every RDMA pod before it leaves the renderer). Namespace
names cannot tell tenant `a`'s RDMA namespace from tenant `a-rdma`'s own namespace, so each
carries its tenant and kind as labels and `check_namespace_owner` refuses a namespace labelled
for someone else. Attachments alone need no privilege and stay in the tenant's namespace; note
that NetworkPolicies do not govern secondary interfaces, so a network offered to several
tenants joins them: an option's `tenants` list keeps a network to the tenants it names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
RDMA_CAPABILITY = "IPC_LOCK"
RDMA_NAMESPACE_SUFFIX = "-rdma"
# On the RDMA namespace: what it is, so it is never taken for another tenant's own namespace.
NAMESPACE_KIND_LABEL = "ogai.io/namespace-kind"
KIND_TENANT, KIND_RDMA = "tenant", "rdma"
RDMA_PSA_LABELS = {
    "pod-security.kubernetes.io/enforce": "privileged",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/audit-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/warn-version": "latest",
}
NCCL_IB_HCA = "NCCL_IB_HCA"
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A Linux interface name: at most 15 characters, no '/', ':' or space.
_INTERFACE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$")
_HCA = re.compile(r"^[A-Za-z0-9_.-]{1,64}(:[0-9]{1,3})?$")
# An extended resource: `domain/name`, outside the kubernetes.io domains and not a GPU.
_EXTENDED = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_NETWORK_KEYS = {"definition", "interface", "hcas", "tenants"}


@dataclass(frozen=True)
class Attachment:
    """One network a job may attach: its NetworkAttachmentDefinition, the interface name
    Multus gives it ("" = net1, net2, … by position), the HCAs behind it for NCCL and the
    tenants that may attach it (empty = all)."""

    name: str
    namespace: str
    definition: str
    interface: str = ""
    hcas: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()


def _label(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(f"{what} {value!r} is not a DNS-1123 label (lower-case letters, "
                         "digits and '-', at most 63 characters)")
    return value


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what} must be a list of strings, not {value!r}")
    return value


def parse_networks(option: Any) -> dict[str, Attachment]:
    """The cluster option `networks`: {name: {"definition": "namespace/name", "interface":
    "net1", "hcas": ["mlx5_0"], "tenants": ["team-a"]}}, only `definition` required."""
    if not isinstance(option, dict):
        raise ValueError(f"cluster option 'networks' must map network names to their "
                         f"settings, not {type(option).__name__}")
    parsed: dict[str, Attachment] = {}
    interfaces: dict[str, str] = {}
    for name, spec in option.items():
        what = f"cluster option 'networks' {name!r}"
        _label(name, "cluster option 'networks': network name")
        if not isinstance(spec, dict):
            raise ValueError(f"{what} must be an object with a 'definition' "
                             "(the NetworkAttachmentDefinition as namespace/name)")
        unknown = sorted(set(spec) - _NETWORK_KEYS)
        if unknown:
            raise ValueError(f"{what}: unknown key {unknown[0]!r} (known: "
                             f"{', '.join(sorted(_NETWORK_KEYS))})")
        definition = spec.get("definition")
        if not isinstance(definition, str) or definition.count("/") != 1:
            raise ValueError(f"{what}: 'definition' must name the NetworkAttachmentDefinition "
                             f"as 'namespace/name', not {definition!r}")
        namespace, nad = definition.split("/")
        _label(namespace, f"{what}: definition namespace")
        if len(nad) > 253 or not _DNS_SUBDOMAIN.match(nad):
            raise ValueError(f"{what}: definition name {nad!r} is not a Kubernetes name")
        interface = spec.get("interface", "")
        if not isinstance(interface, str) or (interface and not _INTERFACE.match(interface)):
            raise ValueError(f"{what}: 'interface' {interface!r} is not a network interface "
                             "name (at most 15 letters, digits, '_', '.' or '-')")
        if interface:
            if interface in interfaces:
                raise ValueError(f"{what}: interface {interface!r} is also network "
                                 f"{interfaces[interface]!r}'s")
            interfaces[interface] = name
        hcas = _strings(spec.get("hcas", []), f"{what}: 'hcas'")
        for hca in hcas:
            if not _HCA.match(hca):
                raise ValueError(f"{what}: HCA {hca!r} is not a device name such as 'mlx5_0' "
                                 "or 'mlx5_0:1'")
        tenants = _strings(spec.get("tenants", []), f"{what}: 'tenants'")
        for tenant in tenants:
            _label(tenant, f"{what}: tenant")
        parsed[name] = Attachment(name=name, namespace=namespace, definition=nad,
                                  interface=interface, hcas=tuple(hcas), tenants=tuple(tenants))
    return parsed


def check_rdma_resource(name: Any) -> None:
    """The cluster option `rdma_resource`: an extended resource name ("" = no RDMA)."""
    if not isinstance(name, str):
        raise ValueError(f"cluster option 'rdma_resource' must be a str, not {name!r}")
    if not name:
        return
    domain = name.partition("/")[0]
    if (not _EXTENDED.match(name) or domain == "kubernetes.io"
            or domain.endswith(".kubernetes.io") or name == "nvidia.com/gpu"):
        raise ValueError(f"cluster option 'rdma_resource' {name!r} is not an extended resource "
                         "name such as 'rdma/rdma_shared_device_a' or "
                         "'nvidia.com/mlnx_sriov_rdma'")


# What a pod gets --------------------------------------------------------------------------


def chosen(names: tuple[str, ...], offered: dict[str, Attachment], tenant: str,
           cluster: str = "the cluster") -> list[Attachment]:
    """The attachments a job names, in its order, or ValueError naming those offered."""
    if len(set(names)) != len(names):
        raise ValueError("a network is attached twice")
    picked = []
    for name in names:
        attachment = offered.get(name)
        if attachment is None:
            listed = ", ".join(sorted(offered)) or "none"
            raise ValueError(f"{cluster} offers no network {name!r}; it offers {listed}")
        if attachment.tenants and tenant not in attachment.tenants:
            raise ValueError(f"network {name!r} of {cluster} is not offered to tenant "
                             f"{tenant!r}")
        picked.append(attachment)
    return picked


def interfaces(attachments: list[Attachment]) -> list[str]:
    """The interface each attachment gets in the pod: its own, else net<position>."""
    return [a.interface or f"net{position}" for position, a in enumerate(attachments, start=1)]


def multus_annotation(attachments: list[Attachment]) -> str:
    """The annotation's value in Multus' JSON-list form, compact and in order."""
    entries = []
    for attachment in attachments:
        entry = {"name": attachment.definition, "namespace": attachment.namespace}
        if attachment.interface:
            entry["interface"] = attachment.interface
        entries.append(entry)
    return json.dumps(entries, separators=(",", ":"))


def nccl_env(attachments: list[Attachment], rdma: int) -> dict[str, str]:
    """NCCL_SOCKET_IFNAME (the attachments' interfaces) and, for RDMA, NCCL_IB_HCA (their
    HCAs); nothing for a job that attaches nothing."""
    env: dict[str, str] = {}
    if attachments:
        env[NCCL_SOCKET_IFNAME] = ",".join(interfaces(attachments))
    hcas = [hca for attachment in attachments for hca in attachment.hcas]
    if rdma > 0 and hcas:
        env[NCCL_IB_HCA] = ",".join(dict.fromkeys(hcas))
    return env


def rdma_container_context(context: dict) -> dict:
    """A container security context with IPC_LOCK added, and nothing else changed."""
    capabilities = dict(context.get("capabilities") or {})
    capabilities["add"] = [RDMA_CAPABILITY]
    return {**context, "capabilities": capabilities}


def check_rdma_pod(spec: dict) -> None:
    """The RDMA pod asks nothing the tenant namespace's pods could not, but IPC_LOCK. Its
    namespace's enforce level lets anything through, so this is what holds the line: a rendered
    pod that breaks it is a bug, refused here before it reaches the cluster."""
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            raise ValueError(f"an RDMA pod may not set {key}")
    pod = spec.get("securityContext") or {}
    if pod.get("runAsNonRoot") is not True or pod.get("runAsUser") in (None, 0):
        raise ValueError("an RDMA pod must run as a non-root user")
    if (pod.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        raise ValueError("an RDMA pod must keep the RuntimeDefault seccomp profile")
    if pod.get("sysctls"):
        raise ValueError("an RDMA pod may not set sysctls")
    allowed_volumes = {"emptyDir", "persistentVolumeClaim", "secret", "configMap", "projected",
                       "downwardAPI"}
    for volume in spec.get("volumes") or []:
        if not set(volume) - {"name"} <= allowed_volumes:
            raise ValueError(f"an RDMA pod may not mount volume {volume.get('name')!r} of its "
                             "kind (hostPath and the like)")
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        context = container.get("securityContext") or {}
        capabilities = context.get("capabilities") or {}
        if (context.get("privileged") is not False
                or context.get("allowPrivilegeEscalation") is not False
                or capabilities.get("drop") != ["ALL"]
                or set(capabilities.get("add") or []) - {RDMA_CAPABILITY}
                or context.get("runAsUser") == 0 or "procMount" in context
                or "seLinuxOptions" in context or "windowsOptions" in context
                or "seccompProfile" in context or "appArmorProfile" in context):
            raise ValueError(f"container {container.get('name')!r} of an RDMA pod must drop "
                             "every capability but IPC_LOCK, unprivileged, without privilege "
                             "escalation")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            raise ValueError("an RDMA pod may not use host ports")


# Where it runs ------------------------------------------------------------------------------


def rdma_namespace(tenant_namespace: str) -> str:
    name = tenant_namespace + RDMA_NAMESPACE_SUFFIX
    if len(name) > 63:
        raise ValueError(f"namespace {name!r} for RDMA work is longer than 63 characters: "
                         "a shorter namespace_prefix or tenant name is needed")
    return name


def check_namespace_owner(found_labels: dict | None, wanted_labels: dict) -> None:
    """Refuse a namespace that exists for another tenant or kind (tenant `a`'s RDMA namespace
    is named like tenant `a-rdma`'s own): its labels name them, and are never patched over."""
    found = found_labels or {}
    for key in ("ogai.io/tenant", NAMESPACE_KIND_LABEL):
        value = found.get(key)
        if key == NAMESPACE_KIND_LABEL and value is None and wanted_labels.get(key) == KIND_TENANT:
            continue  # a tenant namespace made before namespaces had kinds
        if value is not None and value != wanted_labels.get(key):
            raise ValueError(f"namespace is labelled {key}={value!r}, not "
                             f"{wanted_labels.get(key)!r}: it is not this tenant's")


# Nodes --------------------------------------------------------------------------------------


def _count(value: Any) -> int:
    """A quantity of whole devices ("4", 4, "4k" is not a device count)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    text = str(value).strip()
    return int(text) if text.isdigit() else 0


def node_rdma(allocatable: dict | None, resource: str) -> int:
    """The RDMA devices a node offers: its allocatable amount of the cluster's RDMA resource
    (0 without one)."""
    if not resource:
        return 0
    return _count((allocatable or {}).get(resource, 0))


def pod_rdma(pod: Any, resource: str) -> int:
    """The RDMA devices a pod's containers hold (their limits, else requests; extended
    resources have them equal): what counts against its node's. `pod` is the API's JSON shape
    (a dict) or the client's object (`V1Pod`)."""
    if not resource:
        return 0
    if isinstance(pod, dict):
        containers = (pod.get("spec") or {}).get("containers") or []
        found = [c.get("resources") or {} for c in containers]
        amounts = [r.get("limits") or r.get("requests") or {} for r in found]
    else:
        containers = getattr(pod.spec, "containers", None) or []
        amounts = []
        for container in containers:
            resources = container.resources
            amounts.append((getattr(resources, "limits", None)
                            or getattr(resources, "requests", None) or {}) if resources else {})
    return sum(_count(amount.get(resource, 0)) for amount in amounts)
