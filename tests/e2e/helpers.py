"""Small helpers shared by the end-to-end tests (no fixtures here; see tests/conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from tests.conftest import FleetServer

T = TypeVar("T")

# REST paths of the kinds the tests touch: (prefix, plural).
PATHS = {
    "Deployment": ("/apis/apps/v1", "deployments"),
    "Service": ("/api/v1", "services"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "Pod": ("/api/v1", "pods"),
}


def obj_path(kind: str, namespace: str, name: str = "") -> str:
    prefix, plural = PATHS[kind]
    p = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{p}/{name}" if name else p


def api_get(srv: FleetServer, path: str) -> tuple[int, Any]:
    """GET `path`; returns (status code, decoded JSON or text)."""
    with srv.client() as c:
        r = c.get(path)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def get_obj(srv: FleetServer, kind: str, namespace: str, name: str) -> dict[str, Any]:
    code, body = api_get(srv, obj_path(kind, namespace, name))
    assert code == 200, (code, body)
    return body


def assert_absent(srv: FleetServer, kind: str, namespace: str, name: str) -> None:
    code, body = api_get(srv, obj_path(kind, namespace, name))
    assert code == 404, f"{kind} {namespace}/{name} should not exist: {code} {body}"
    assert body["kind"] == "Status" and body["reason"] == "NotFound", body


def api_create(srv: FleetServer, kind: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    with srv.client() as c:
        r = c.post(obj_path(kind, namespace), json=obj)
    assert r.status_code == 201, (r.status_code, r.text)
    return r.json()


def wait_until(
    fn: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"
) -> T:
    """Poll `fn` until it returns something truthy, at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    for c in obj["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name!r} in {obj['spec']['template']['spec']['containers']}")


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env") or []}


def dump_all(*docs: dict[str, Any]) -> str:
    return yaml.safe_dump_all(list(docs), sort_keys=False)
