"""Hand-built Nodes and Pods for the scheduler's table-driven tests."""

from __future__ import annotations

from typing import Any


def node(name: str, cpu: str = "4", memory: str = "8Gi", pods: int | None = 110, *,
         labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None,
         unschedulable: bool = False, **extra: str) -> dict[str, Any]:
    allocatable: dict[str, Any] = {"cpu": cpu, "memory": memory, **extra}
    if pods is not None:
        allocatable["pods"] = str(pods)
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": spec, "status": {"allocatable": allocatable, "capacity": dict(allocatable)}}


def container(name: str = "c", cpu: str | None = None, memory: str | None = None,
              **extra: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    c: dict[str, Any] = {"name": name, "image": "busybox", "resources": {"requests": requests}}
    c.update(extra)
    return c


def pod(name: str = "p", cpu: str | None = None, memory: str | None = None, *,
        namespace: str = "default", node_name: str | None = None,
        containers: list[dict[str, Any]] | None = None, init: list[dict[str, Any]] | None = None,
        phase: str | None = None, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"containers": containers or [container(cpu=cpu, memory=memory)]}
    if init:
        s["initContainers"] = init
    if node_name:
        s["nodeName"] = node_name
    s.update(spec)
    p: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
                         "spec": s, "status": {}}
    if phase:
        p["status"]["phase"] = phase
    return p
