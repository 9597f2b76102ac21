"""What confines a tenant's work on Kubernetes: the Pod Security level of its namespace, the
security context of its pods, and the NetworkPolicies that let a pod reach only its gang peers,
the cluster's DNS and the platform (its API, the gateway, the notebook proxy).

Pure functions building plain dicts in the API's JSON shape, like `kube_manifests`, which
assembles them; the settings come from its `KubeOptions` (checked there, with the helpers here).
NetworkPolicies add up: a namespace-wide default deny (ingress and egress), then one policy per
allowed kind of traffic, so each says what it lets through.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from podsys.drivers.base import ROLE_LABEL, ROLE_MODEL_CLIENT, ROLE_MODEL_SERVER

if TYPE_CHECKING:
    from podsys.drivers.kube_manifests import KubeOptions

# Pod Security Admission: the namespace refuses any pod the `restricted` profile forbids
# (privileged, host namespaces, hostPath, root, added capabilities, no seccomp...), and says so
# in the audit log and to whoever applies such a pod by hand.
PSA_LEVEL = "restricted"
PSA_LABELS = {
    f"pod-security.kubernetes.io/{mode}{suffix}": value
    for mode in ("enforce", "audit", "warn")
    for suffix, value in (("", PSA_LEVEL), ("-version", "latest"))
}
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace

DEFAULT_DENY = "ogai-default-deny"
ALLOW_DNS = "ogai-allow-dns"
ALLOW_PLATFORM = "ogai-allow-platform"
ALLOW_EGRESS = "ogai-allow-egress"
# Every name a namespace-wide policy of OGAI may have: one no longer wanted is deleted.
NAMESPACE_POLICIES = (DEFAULT_DENY, ALLOW_DNS, ALLOW_PLATFORM, ALLOW_EGRESS)
DNS_PORT = 53
MAX_ID = 2**32 - 2  # uids and gids are 32-bit; 2^32-1 means "none" to the kernel


# The pod ------------------------------------------------------------------------------------


def check_id(value: int, what: str) -> None:
    """A uid or gid a pod may run as: never root (the restricted profile refuses uid 0)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ID:
        raise ValueError(f"{what} {value!r} must be a uid/gid from 1 to {MAX_ID} (never root)")


def pod_security_context(uid: int, supplemental_gid: int) -> dict:
    """Non-root as `uid` (and the same gid), the runtime's default seccomp profile. No fsGroup:
    on a shared claim the kubelet would chgrp the whole volume, every tenant's files, to it; a
    gid the artifacts belong to is added as a supplemental group instead."""
    context: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if supplemental_gid:
        context["supplementalGroups"] = [supplemental_gid]
    return context


def container_security_context() -> dict:
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }


# Checking the network options ---------------------------------------------------------------


def check_cidr(value: Any, what: str) -> None:
    if not isinstance(value, str) or "/" not in value:
        raise ValueError(f"{what} {value!r} is not a CIDR such as '10.0.0.5/32'")
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"{what} {value!r} is not a CIDR such as '10.0.0.5/32'") from None


def check_port(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"{what} {value!r} is not a port number")


# NetworkPolicies ----------------------------------------------------------------------------


def _policy(name: str, namespace: str, labels: dict, spec: dict) -> dict:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
    }


def _in_namespace(namespace: str, pod_labels: dict[str, str]) -> dict:
    """A peer: the pods of another namespace with these labels (every pod there if none; `{}`
    as the API server answers it, or every launch would see a change to put right)."""
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
        "podSelector": {"matchLabels": dict(pod_labels)} if pod_labels else {},
    }


def platform_peers(opts: KubeOptions) -> list[dict]:
    """Where the platform runs: its pods in the cluster, or its addresses outside it."""
    peers = []
    if opts.platform_namespace:
        peers.append(_in_namespace(opts.platform_namespace, opts.platform_pod_labels))
    peers += [{"ipBlock": {"cidr": cidr}} for cidr in opts.platform_cidrs]
    return peers


def _tcp(ports: list[int]) -> list[dict]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def namespace_policies(namespace: str, labels: dict, opts: KubeOptions) -> list[dict]:
    """The tenant namespace's own policies, for every pod in it: deny everything, then DNS,
    then the platform (and any destinations the operator allows every tenant, such as a
    package mirror). Gang peers and ingress are per workload (`workload_policy`)."""
    everyone: dict = {}
    policies = [
        _policy(DEFAULT_DENY, namespace, labels,
                {"podSelector": everyone, "policyTypes": ["Ingress", "Egress"]}),
        _policy(ALLOW_DNS, namespace, labels, {
            "podSelector": everyone,
            "policyTypes": ["Egress"],
            "egress": [{
                "to": [_in_namespace(opts.dns_namespace, opts.dns_pod_labels)],
                "ports": [{"protocol": "UDP", "port": DNS_PORT},
                          {"protocol": "TCP", "port": DNS_PORT}],
            }],
        }),
    ]
    if peers := platform_peers(opts):
        rule: dict[str, Any] = {"to": peers}
        if opts.platform_ports:
            rule["ports"] = _tcp(list(opts.platform_ports))
        policies.append(_policy(ALLOW_PLATFORM, namespace, labels, {
            "podSelector": everyone, "policyTypes": ["Egress"], "egress": [rule]}))
    if opts.egress_cidrs:
        policies.append(_policy(ALLOW_EGRESS, namespace, labels, {
            "podSelector": everyone,
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": cidr}} for cidr in opts.egress_cidrs]}],
        }))
    return policies


def workload_policy(name: str, namespace: str, labels: dict, selector: dict[str, str],
                    service_ports: list[int], opts: KubeOptions) -> dict:
    """The workload's pods (`selector`) talk to each other (rendezvous, NCCL) on any port; a
    service's pods (a model replica, a notebook) also accept the platform on their ports, and
    nobody else: another workload of the same tenant goes through the gateway too, but for a
    model server's clients (an endpoint evaluation)."""
    gang = [{"podSelector": {"matchLabels": dict(selector)}}]
    ingress: list[dict] = [{"from": gang}]
    if service_ports and (peers := platform_peers(opts)):
        ingress.append({"from": peers, "ports": _tcp(service_ports)})
    if service_ports and labels.get(ROLE_LABEL) == ROLE_MODEL_SERVER:
        # The platform's evaluation runner, scoring this endpoint from the tenant's namespace
        # (it sends the deployment's key, as the gateway does).
        clients = [{"podSelector": {"matchLabels": {ROLE_LABEL: ROLE_MODEL_CLIENT}}}]
        ingress.append({"from": clients, "ports": _tcp(service_ports)})
    egress: list[dict] = [{"to": gang}]
    if labels.get(ROLE_LABEL) == ROLE_MODEL_CLIENT:
        egress.append({"to": [{"podSelector": {"matchLabels": {ROLE_LABEL: ROLE_MODEL_SERVER}}}]})
    return _policy(name, namespace, labels, {
        "podSelector": {"matchLabels": dict(selector)},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": ingress,
        "egress": egress,
    })
