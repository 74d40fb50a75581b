"""Kubernetes' rules for turning a pod's container into what the runtime runs.

Split from `fleet.agent.worker` (which re-exports these names), pure functions:
command and args against the image's Entrypoint/Cmd with `$(VAR)` expansion
(`fleet.api.expansion`), the
image's and the spec's plain env, resources, the user, restart policy decisions,
the grace period of a pod and the machine's allocatable resources (for
`resourceFieldRef` defaults when no Node object is at hand).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleet.agent.node import read_meminfo
from fleet.api.expansion import expand_vars
from fleet.api.quantity import int_value, milli_value
from fleet.runtime.driver import Resources, User

DEFAULT_GRACE = 30


def resolve_argv(container: Mapping[str, Any], image_config: Mapping[str, Any],
                 env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(command, args): spec command replaces Entrypoint (and drops Cmd); spec args
    replace Cmd; $(VAR) references are expanded as the kubelet does."""
    entry = list(image_config.get("Entrypoint") or [])
    cmd = list(image_config.get("Cmd") or [])
    if container.get("command"):
        command, args = list(container["command"]), list(container.get("args") or [])
    elif container.get("args"):
        command, args = entry, list(container["args"])
    else:
        command, args = entry, cmd
    command = [expand_vars(str(a), env) for a in command]
    args = [expand_vars(str(a), env) for a in args]
    if not command and args:
        command, args = args[:1], args[1:]
    return command, args


def image_env(image_config: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for item in image_config.get("Env") or []:
        k, _, v = str(item).partition("=")
        if k:
            out[k] = v
    return out


def plain_env(container: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
    """`env` entries with a `value` (expanded against what precedes them)."""
    env = dict(base)
    for e in container.get("env") or []:
        if "valueFrom" in e:
            continue
        env[e["name"]] = expand_vars(str(e.get("value", "")), env)
    return env


def container_resources(container: Mapping[str, Any]) -> Resources:
    res = container.get("resources") or {}
    lim = res.get("limits") or {}
    req = res.get("requests") or {}
    return Resources(
        cpu_request_millis=milli_value(str(req["cpu"])) if "cpu" in req else None,
        cpu_limit_millis=milli_value(str(lim["cpu"])) if "cpu" in lim else None,
        memory_limit_bytes=int_value(str(lim["memory"])) if "memory" in lim else None,
    )


def container_user(container: Mapping[str, Any], pod_spec: Mapping[str, Any],
                   image_config: Mapping[str, Any]) -> User:
    sc = container.get("securityContext") or {}
    psc = pod_spec.get("securityContext") or {}
    uid = sc.get("runAsUser", psc.get("runAsUser"))
    gid = sc.get("runAsGroup", psc.get("runAsGroup"))
    img_user = str(image_config.get("User") or "")
    if uid is None and img_user:
        u, _, g = img_user.partition(":")
        if u.isdigit():
            uid = int(u)
        if gid is None and g.isdigit():
            gid = int(g)
    extra = tuple(int(g) for g in psc.get("supplementalGroups") or [])
    return User(uid=int(uid or 0), gid=int(gid if gid is not None else 0), additional_gids=extra)


def restart_wanted(restart_policy: str, exit_code: int, *, init: bool) -> bool:
    policy = restart_policy or "Always"
    if init:
        return exit_code != 0 and policy != "Never"
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return exit_code != 0
    return False


def machine_allocatable(data_dir: Path) -> dict[str, str]:
    """The machine's cpu, memory and disk as the Node reports them as allocatable, for
    when no Node object is at hand (blocking: reads /proc and statvfs)."""
    mem = read_meminfo().get("MemTotal", 0)
    try:
        st = os.statvfs(data_dir)
        disk = st.f_blocks * st.f_frsize
    except OSError:
        disk = 0
    return {"cpu": str(os.cpu_count() or 1), "memory": f"{mem // 1024}Ki",
            "ephemeral-storage": f"{disk // 1024}Ki"}


def grace_period(pod: Mapping[str, Any]) -> float:
    md = pod.get("metadata") or {}
    if md.get("deletionGracePeriodSeconds") is not None:
        return float(md["deletionGracePeriodSeconds"])
    g = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return float(DEFAULT_GRACE if g is None else g)


__all__ = [
    "DEFAULT_GRACE", "container_resources", "container_user", "grace_period",
    "image_env", "machine_allocatable", "plain_env", "resolve_argv", "restart_wanted",
]
