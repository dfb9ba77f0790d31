"""The Pod Security Standard ``restricted`` profile as a check of one pod spec (what the API server's
pod-security admission enforces; kubernetes/pod-security-admission, policy/check_*.go, version "latest")."""

from __future__ import annotations

from collections.abc import Iterator

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                      "secret"}
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def _containers(pod: dict) -> Iterator[dict]:
    for field in CONTAINER_LISTS:
        yield from pod.get(field) or []


def _effective(pod: dict, container: dict, key: str):
    own = (container.get("securityContext") or {}).get(key)
    return own if own is not None else (pod.get("securityContext") or {}).get(key)


def restricted_violations(pod: dict) -> list[str]:
    """Why ``pod`` (a PodSpec) would be refused in a ``restricted`` namespace; empty when it is admitted."""
    found = [f"{field}=true" for field in ("hostNetwork", "hostPID", "hostIPC") if pod.get(field)]
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']} of type {', '.join(sorted(kinds))}")
    for container in _containers(pod):
        name, context = container["name"], container.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation must be false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: capabilities must drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {capabilities['add']}")
        if _effective(pod, container, "runAsNonRoot") is not True:
            found.append(f"{name}: runAsNonRoot must be true")
        if _effective(pod, container, "runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = (_effective(pod, container, "seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost, not {seccomp}")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            found.append(f"{name}: hostPort")
    return found


def pod_specs(document) -> Iterator[dict]:
    """Every PodSpec inside a manifest (job kinds nest pod templates at different depths)."""
    if isinstance(document, dict):
        if isinstance(document.get("containers"), list):
            yield document
        for value in document.values():
            yield from pod_specs(value)
    elif isinstance(document, list):
        for value in document:
            yield from pod_specs(value)
