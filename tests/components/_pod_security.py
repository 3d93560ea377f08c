"""The Kubernetes Pod Security Standards (baseline and restricted, "latest"), checked on a Pod manifest.

No implementation of Pod Security admission is installable here (the real one is Go, in
k8s.io/pod-security-admission), so this follows the controls of "Pod Security Standards"
(kubernetes.io/docs/concepts/security/pod-security-standards) field by field, over the pod spec, every
container kind and the pod annotations. Each finding names the control as that page does.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

LEVELS = ("privileged", "baseline", "restricted")

# Baseline "Capabilities": what may be added (the container runtime's default set, less NET_RAW).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
        "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
# Baseline "Sysctls": the safe, namespaced set.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
# Restricted "Volume Types".
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(kind) or []:
            yield f"{kind}[{container.get('name')}]", container


def _context(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    context: Mapping[str, Any] = obj.get("securityContext") or {}
    return context


def violations(pod: Mapping[str, Any], level: str) -> list[str]:
    """What the Pod Security Standards level forbids in this Pod ([] when it is admitted)."""
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r}; known: {', '.join(LEVELS)}")
    if level == "privileged":
        return []
    found = _baseline(pod)
    if level == "restricted":
        found += _restricted(pod)
    return found


def _baseline(pod: Mapping[str, Any]) -> list[str]:
    spec: Mapping[str, Any] = pod.get("spec") or {}
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    pod_context = _context(spec)
    found: list[str] = []
    scopes = [("spec", pod_context)] + [(where, _context(c)) for where, c in _containers(spec)]
    for where, context in scopes:
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"HostProcess: {where}.securityContext.windowsOptions.hostProcess")
        apparmor = (context.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"AppArmor: {where}.securityContext.appArmorProfile.type={apparmor}")
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"SELinux: {where}.securityContext.seLinuxOptions={dict(selinux)}")
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"Seccomp: {where}.securityContext.seccompProfile.type=Unconfined")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            found.append(f"Host Namespaces: spec.{field}")
    for where, container in _containers(spec):
        context = _context(container)
        if context.get("privileged"):
            found.append(f"Privileged Containers: {where}.securityContext.privileged")
        added = set((context.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if added:
            found.append(f"Capabilities: {where} adds {', '.join(sorted(added))}")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                found.append(f"Host Ports: {where} hostPort {port['hostPort']}")
        if context.get("procMount", "Default") != "Default":
            found.append(f"/proc Mount Type: {where}.securityContext.procMount={context['procMount']}")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            found.append(f"HostPath Volumes: volume {volume.get('name')} is a hostPath")
    for key, value in annotations.items():
        if key.startswith(APPARMOR_ANNOTATION) and not (value == "runtime/default" or value.startswith("localhost/")):
            found.append(f"AppArmor: annotation {key}={value}")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"Sysctls: {sysctl.get('name')}")
    return found


def _restricted(pod: Mapping[str, Any]) -> list[str]:
    spec: Mapping[str, Any] = pod.get("spec") or {}
    pod_context = _context(spec)
    found: list[str] = []
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"Volume Types: volume {volume.get('name')} is {', '.join(sorted(kinds))}")
    if pod_context.get("runAsUser") == 0:
        found.append("Running as Non-root user: spec.securityContext.runAsUser=0")
    for where, container in _containers(spec):
        context = _context(container)
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"Privilege Escalation: {where}.securityContext.allowPrivilegeEscalation is not false")
        non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
        if non_root is not True:
            found.append(f"Running as Non-root: {where} does not set runAsNonRoot=true (nor does the pod)")
        if context.get("runAsUser") == 0:
            found.append(f"Running as Non-root user: {where}.securityContext.runAsUser=0")
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"Seccomp: {where} has no RuntimeDefault or Localhost seccomp profile")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"Capabilities: {where} does not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"Capabilities: {where} adds more than NET_BIND_SERVICE")
    return found
