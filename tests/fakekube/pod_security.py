"""Pod Security Admission as the API server applies it (Kubernetes 1.31): a namespace's
``pod-security.kubernetes.io/enforce`` label names a level of the Pod Security Standards, and a
pod that breaks one of its rules is refused, with the rules it breaks in the message.

Written from the standards themselves (https://kubernetes.io/docs/concepts/security/
pod-security-standards/), not from what OGAI renders, so it can catch OGAI's pods out."""

from __future__ import annotations

import re

LEVELS = ("privileged", "baseline", "restricted")
MODES = ("enforce", "audit", "warn")
PREFIX = "pod-security.kubernetes.io/"
_VERSION = re.compile(r"^(latest|v1\.[0-9]+)$")

# What baseline lets a container add; restricted lets it add NET_BIND_SERVICE only.
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                         "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                         "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t"}


def label_errors(labels: dict | None) -> list[str]:
    """What is wrong with a namespace's Pod Security labels (the API server refuses it)."""
    errors = []
    for key, value in (labels or {}).items():
        if not key.startswith(PREFIX):
            continue
        mode = key[len(PREFIX):]
        if mode in MODES and value not in LEVELS:
            errors.append(f"{key}: Invalid value: {value!r}: must be one of "
                          f"{', '.join(LEVELS)}")
        elif mode.endswith("-version") and mode[:-len("-version")] in MODES \
                and not _VERSION.match(value):
            errors.append(f"{key}: Invalid value: {value!r}: must be 'latest' or 'v1.x'")
    return errors


def enforced_level(labels: dict | None) -> str:
    return (labels or {}).get(f"{PREFIX}enforce", "privileged")


def _containers(spec: dict) -> list[dict]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or [])]


def _names(containers: list[dict]) -> str:
    quoted = ", ".join(f'"{c.get("name", "")}"' for c in containers)
    return f"container{'s' if len(containers) > 1 else ''} {quoted}"


def _baseline(spec: dict) -> list[str]:
    pod = spec.get("securityContext") or {}
    containers = _containers(spec)
    contexts = [(c, c.get("securityContext") or {}) for c in containers]
    found = []
    hosts = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    if hosts:
        found.append(f"host namespaces ({', '.join(hosts)})")
    if (pod.get("windowsOptions") or {}).get("hostProcess") or any(
            (ctx.get("windowsOptions") or {}).get("hostProcess") for _, ctx in contexts):
        found.append("hostProcess (pod or containers must not set hostProcess=true)")
    if bad := [c for c, ctx in contexts if ctx.get("privileged")]:
        found.append(f"privileged ({_names(bad)} must not set "
                     "securityContext.privileged=true)")
    if bad := [c for c, ctx in contexts
               if set((ctx.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES]:
        found.append(f"non-default capabilities ({_names(bad)} must not include them in "
                     "securityContext.capabilities.add)")
    if bad := [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]:
        found.append(f"hostPath volumes ({', '.join(repr(n) for n in bad)})")
    if bad := [c for c in containers if any(p.get("hostPort") for p in c.get("ports") or [])]:
        found.append(f"hostPort ({_names(bad)} use hostPort)")
    profiles = [pod.get("seccompProfile") or {}] + [ctx.get("seccompProfile") or {}
                                                    for _, ctx in contexts]
    if any(profile.get("type") == "Unconfined" for profile in profiles):
        found.append("seccompProfile (pod or containers must not set type to Unconfined)")
    armors = [pod.get("appArmorProfile") or {}] + [ctx.get("appArmorProfile") or {}
                                                   for _, ctx in contexts]
    if any(armor.get("type") == "Unconfined" for armor in armors):
        found.append("appArmorProfile (must not be Unconfined)")
    options = [pod.get("seLinuxOptions") or {}] + [ctx.get("seLinuxOptions") or {}
                                                   for _, ctx in contexts]
    if any(o.get("type", "") not in SELINUX_TYPES or o.get("user") or o.get("role")
           for o in options):
        found.append("seLinuxOptions (forbidden type, user or role)")
    if bad := [c for c, ctx in contexts if ctx.get("procMount", "Default") != "Default"]:
        found.append(f"procMount ({_names(bad)} must not set procMount)")
    if bad := [s.get("name") for s in pod.get("sysctls") or [] if s.get("name") not in
               SAFE_SYSCTLS]:
        found.append(f"forbidden sysctls ({', '.join(map(str, bad))})")
    return found


def _restricted(spec: dict) -> list[str]:
    pod = spec.get("securityContext") or {}
    containers = _containers(spec)
    contexts = [(c, c.get("securityContext") or {}) for c in containers]
    found = []
    bad_volumes = [v["name"] for v in spec.get("volumes") or []
                   if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    if bad_volumes:
        found.append(f"restricted volume types ({', '.join(repr(n) for n in bad_volumes)})")
    if bad := [c for c, ctx in contexts if ctx.get("allowPrivilegeEscalation") is not False]:
        found.append(f"allowPrivilegeEscalation != false ({_names(bad)} must set "
                     "securityContext.allowPrivilegeEscalation=false)")
    if bad := [c for c, ctx in contexts if "ALL" not in
               ((ctx.get("capabilities") or {}).get("drop") or [])
               or set((ctx.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}]:
        found.append(f"unrestricted capabilities ({_names(bad)} must set "
                     'securityContext.capabilities.drop=["ALL"])')
    non_root = [ctx.get("runAsNonRoot", pod.get("runAsNonRoot")) for _, ctx in contexts]
    if not contexts or not all(value is True for value in non_root):
        found.append("runAsNonRoot != true (pod or containers must set "
                     "securityContext.runAsNonRoot=true)")
    if pod.get("runAsUser") == 0 or any(ctx.get("runAsUser") == 0 for _, ctx in contexts):
        found.append("runAsUser=0 (pod and containers must not set runAsUser=0)")
    seccomp = [((ctx.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type"))
               for _, ctx in contexts]
    if not all(kind in ("RuntimeDefault", "Localhost") for kind in seccomp):
        found.append('seccompProfile (pod or containers must set securityContext.'
                     'seccompProfile.type to "RuntimeDefault" or "Localhost")')
    return found


def violations(spec: dict, level: str) -> list[str]:
    """The rules of `level` the pod spec breaks, in the API server's words; none for
    `privileged`."""
    if level == "privileged":
        return []
    found = _baseline(spec)
    if level == "restricted":
        found += _restricted(spec)
    return found
