"""NetworkPolicy (networking.k8s.io/v1) as a network plugin that enforces it behaves: whether
one endpoint (a pod, or an address outside the cluster) may open a connection to another, and
what the API server refuses in a policy.

Semantics (https://kubernetes.io/docs/concepts/services-networking/network-policies/): a pod
selected by no policy of a direction is open in that direction; one selected by any is open
only to what one of their rules allows. A connection needs the source's egress and the
target's ingress to allow it. Rules: peers (`from`/`to`: all when absent) and ports (all when
absent); a peer is a podSelector (the policy's namespace), a namespaceSelector, both (those
pods of those namespaces), or an ipBlock (addresses, pods' included, minus `except`)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

PROTOCOLS = ("TCP", "UDP", "SCTP")
_PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def selector_matches(selector: dict | None, labels: dict | None) -> bool:
    """A LabelSelector: matchLabels and matchExpressions, ANDed; `{}` matches everything."""
    labels = labels or {}
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, op, values = expression["key"], expression["operator"], expression.get("values")
        if op == "In" and labels.get(key) not in (values or []):
            return False
        if op == "NotIn" and key in labels and labels[key] in (values or []):
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# -- validation ----------------------------------------------------------------------------------


def _selector_errors(selector: Any, where: str) -> list[str]:
    if selector is None:
        return []
    errors = []
    for index, expression in enumerate(selector.get("matchExpressions") or []):
        here = f"{where}.matchExpressions[{index}]"
        op = expression.get("operator")
        if op not in OPERATORS:
            errors.append(f"{here}.operator: Unsupported value: {op!r}")
        elif op in ("In", "NotIn") and not expression.get("values"):
            errors.append(f"{here}.values: Required value: for 'in', 'notin' operators")
        elif op in ("Exists", "DoesNotExist") and expression.get("values"):
            errors.append(f"{here}.values: Forbidden: may not be specified for 'exists' or "
                          "'doesnotexist'")
    return errors


def _network(cidr: Any, where: str) -> tuple[Any, list[str]]:
    try:
        return ipaddress.ip_network(cidr, strict=False), []
    except (TypeError, ValueError):
        return None, [f"{where}: Invalid value: {cidr!r}: must be a valid CIDR"]


def _peer_errors(peer: dict, where: str) -> list[str]:
    kinds = [k for k in ("podSelector", "namespaceSelector", "ipBlock") if peer.get(k) is not None]
    if not kinds:
        return [f"{where}: Required value: must specify a peer"]
    if "ipBlock" in kinds and len(kinds) > 1:
        return [f"{where}: Forbidden: may not specify more than 1 peer type with ipBlock"]
    errors = _selector_errors(peer.get("podSelector"), f"{where}.podSelector")
    errors += _selector_errors(peer.get("namespaceSelector"), f"{where}.namespaceSelector")
    if block := peer.get("ipBlock"):
        network, errors_cidr = _network(block.get("cidr"), f"{where}.ipBlock.cidr")
        errors += errors_cidr
        for index, excluded in enumerate(block.get("except") or []):
            inner, bad = _network(excluded, f"{where}.ipBlock.except[{index}]")
            errors += bad
            if network is not None and inner is not None and (
                    inner.version != network.version or not inner.subnet_of(network)):
                errors.append(f"{where}.ipBlock.except[{index}]: Invalid value: {excluded!r}: "
                              "must be a strict subset of `cidr`")
    return errors


def _port_errors(port: dict, where: str) -> list[str]:
    errors = []
    if port.get("protocol", "TCP") not in PROTOCOLS:
        errors.append(f"{where}.protocol: Unsupported value: {port.get('protocol')!r}")
    number = port.get("port")
    if isinstance(number, bool) or (isinstance(number, int) and not 1 <= number <= 65535):
        errors.append(f"{where}.port: Invalid value: {number!r}: must be between 1 and 65535")
    elif isinstance(number, str) and not _PORT_NAME.match(number):
        errors.append(f"{where}.port: Invalid value: {number!r}: must be a port name")
    if port.get("endPort") is not None:
        if not isinstance(number, int):
            errors.append(f"{where}.endPort: Required value: needs a numeric port")
        elif port["endPort"] < number:
            errors.append(f"{where}.endPort: Invalid value: must be at least port")
    return errors


def policy_errors(policy: dict) -> list[str]:
    """What the API server's validation refuses in a NetworkPolicy (beyond its schema)."""
    spec = policy.get("spec") or {}
    errors = _selector_errors(spec.get("podSelector"), "spec.podSelector")
    types = spec.get("policyTypes") or []
    for index, kind in enumerate(types):
        if kind not in ("Ingress", "Egress"):
            errors.append(f"spec.policyTypes[{index}]: Unsupported value: {kind!r}")
    if len(set(types)) != len(types):
        errors.append("spec.policyTypes: Duplicate value")
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        for index, rule in enumerate(spec.get(direction) or []):
            where = f"spec.{direction}[{index}]"
            for number, peer in enumerate(rule.get(peers_key) or []):
                errors += _peer_errors(peer, f"{where}.{peers_key}[{number}]")
            for number, port in enumerate(rule.get("ports") or []):
                errors += _port_errors(port, f"{where}.ports[{number}]")
    return errors


def _compact(selector: dict | None) -> None:
    """An empty matchLabels or matchExpressions is not kept (`omitempty`): `{}` comes back."""
    for key in ("matchLabels", "matchExpressions"):
        if selector is not None and key in selector and not selector[key]:
            del selector[key]


def default_policy(policy: dict) -> None:
    """What the API server defaults: the policy types, and TCP for a port without one; what it
    drops: empty selector fields."""
    spec = policy.setdefault("spec", {})
    spec.setdefault("podSelector", {})
    _compact(spec["podSelector"])
    if not spec.get("policyTypes"):
        spec["policyTypes"] = ["Ingress"] + (["Egress"] if spec.get("egress") else [])
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        for rule in spec.get(direction) or []:
            for port in rule.get("ports") or []:
                port.setdefault("protocol", "TCP")
            for peer in rule.get(peers_key) or []:
                _compact(peer.get("podSelector"))
                _compact(peer.get("namespaceSelector"))


# -- reachability --------------------------------------------------------------------------------


class Endpoint:
    """One end of a connection: a pod (its labels, its namespace's labels, its ports and IP), or
    an address outside the cluster."""

    def __init__(self, *, ip: str = "", pod: dict | None = None,
                 namespace_labels: dict | None = None) -> None:
        self.pod = pod
        self.ip = ip or ((pod or {}).get("status") or {}).get("podIP", "")
        self.namespace = (pod or {}).get("metadata", {}).get("namespace", "")
        self.labels = (pod or {}).get("metadata", {}).get("labels") or {}
        self.namespace_labels = namespace_labels or {}

    def named_port(self, name: str, protocol: str) -> int | None:
        for container in ((self.pod or {}).get("spec") or {}).get("containers") or []:
            for port in container.get("ports") or []:
                if port.get("name") == name and port.get("protocol", "TCP") == protocol:
                    return port.get("containerPort")
        return None


def _peer_matches(peer: dict, policy_namespace: str, other: Endpoint) -> bool:
    if block := peer.get("ipBlock"):
        if not other.ip:
            return False
        address = ipaddress.ip_address(other.ip)
        network = ipaddress.ip_network(block["cidr"], strict=False)
        if address.version != network.version or address not in network:
            return False
        return not any(address in ipaddress.ip_network(e, strict=False)
                       for e in block.get("except") or []
                       if ipaddress.ip_network(e, strict=False).version == address.version)
    if other.pod is None:  # selectors pick pods only
        return False
    if peer.get("namespaceSelector") is not None:
        if not selector_matches(peer["namespaceSelector"], other.namespace_labels):
            return False
    elif other.namespace != policy_namespace:
        return False
    return peer.get("podSelector") is None or selector_matches(peer["podSelector"], other.labels)


def _port_matches(rule_port: dict, target: Endpoint, port: int, protocol: str) -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    wanted = rule_port.get("port")
    if wanted is None:
        return True
    if isinstance(wanted, str):
        return target.named_port(wanted, protocol) == port
    return wanted <= port <= (rule_port.get("endPort") or wanted)


def _allowed(policies: list[dict], subject: Endpoint, direction: str, other: Endpoint,
             target: Endpoint, port: int, protocol: str) -> bool:
    """Whether the policies of `subject`'s namespace let it send (Egress) to, or take
    (Ingress) from, `other`, on `target`'s port."""
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [p for p in policies
                 if p["metadata"].get("namespace") == subject.namespace
                 and direction in (p["spec"].get("policyTypes") or [])
                 and selector_matches(p["spec"].get("podSelector"), subject.labels)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(key) or []:
            peers = rule.get(peers_key) or []
            if peers and not any(_peer_matches(peer, subject.namespace, other)
                                 for peer in peers):
                continue
            ports = rule.get("ports") or []
            if ports and not any(_port_matches(p, target, port, protocol) for p in ports):
                continue
            return True
    return False


def can_connect(policies: list[dict], source: Endpoint, target: Endpoint, port: int,
                protocol: str = "TCP") -> bool:
    egress = source.pod is None or _allowed(policies, source, "Egress", target, target, port,
                                            protocol)
    ingress = target.pod is None or _allowed(policies, target, "Ingress", source, target, port,
                                             protocol)
    return egress and ingress
