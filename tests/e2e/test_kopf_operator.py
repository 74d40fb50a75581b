"""kopf (from PyPI, unchanged) runs `--standalone` against `fleet server` on built-in kinds.

The operator is written here and run as `python -m kopf run --standalone -n NS` with the
server's admin kubeconfig.  It serves ConfigMaps labelled `kopf-e2e=yes` with every kind
of handler kopf has — create (one of them failing once, so kopf stores its progress and
retries), update (on `data` only), delete (behind kopf's finalizer), a timer and a daemon —
and posts Events with `kopf.info`.  Everything the operator does is checked through the
API: the child ConfigMaps its handlers write, kopf's annotations (last-handled
configuration, progress while a handler is retried, the timer's patch), its finalizer,
the core/v1 Events, and the objects' removal once the finalizer is gone.

Both of kopf's watch modes are run: list-then-watch, and the WatchList initial stream
(`sendInitialEvents=true` ending at the `k8s.io/initial-events-end` bookmark).  A short
`timeoutSeconds` makes kopf reconnect its watches with the last resourceVersion it saw
(from events and bookmarks) several times during each test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FleetServer, create_namespace
from tests.e2e.helpers import api_get, wait_until
from tests.e2e.kopfkit import run_kopf, wait_logged

pytestmark = pytest.mark.e2e

LABEL = "kopf-e2e"
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
LAST_HANDLED = "kopf.zalando.org/last-handled-configuration"

OPERATOR = '''
import asyncio
import logging

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

kubernetes.config.load_kube_config()
core = kubernetes.client.CoreV1Api()
SELECT = {"kopf-e2e": "yes"}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.watching.server_timeout = 3        # reconnect often, resuming from the last resourceVersion
    settings.watching.initial_streaming = INITIAL_STREAMING
    settings.posting.level = logging.INFO
    settings.posting.loggers = True             # kopf posts its INFO logs about objects as Events too


def put(namespace, name, data, owner=None):
    """Create or update a ConfigMap through the official client."""
    body = {"metadata": {"name": name}, "data": {k: str(v) for k, v in data.items()}}
    if owner is not None:
        kopf.append_owner_reference(body, owner=owner)
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as e:
        if e.status != 409:
            raise
        core.patch_namespaced_config_map(name, namespace, {"data": body["data"]})


@kopf.on.create("configmaps", labels=SELECT)
def created(body, name, namespace, **_):
    put(namespace, f"{name}-child", dict(body.get("data") or {}), owner=body)
    kopf.info(body, reason="ChildCreated", message=f"created {name}-child")
    return {"child": f"{name}-child"}


@kopf.on.create("configmaps", labels=SELECT)
def flaky(name, namespace, retry, **_):
    if retry == 0:
        raise kopf.TemporaryError("not yet", delay=2)
    put(namespace, f"{name}-flaky", {"retries": retry})


@kopf.on.update("configmaps", labels=SELECT, field="data")
def updated(body, name, namespace, old, new, **_):
    put(namespace, f"{name}-child", dict(new or {}))
    kopf.info(body, reason="ChildUpdated", message=f"{sorted(old or {})} -> {sorted(new or {})}")


@kopf.on.delete("configmaps", labels=SELECT)
def deleted(name, namespace, meta, **_):
    put(namespace, f"{name}-deleted", {"deletionTimestamp": meta.get("deletionTimestamp") or ""})


@kopf.timer("configmaps", labels=SELECT, interval=0.5)
def tick(annotations, patch, **_):
    patch.metadata.annotations["kopf-e2e/ticks"] = str(int(annotations.get("kopf-e2e/ticks", "0")) + 1)


@kopf.daemon("configmaps", labels=SELECT, cancellation_polling=0.5)  # re-check a stopping daemon soon
async def watcher(name, namespace, stopped, **_):
    await asyncio.to_thread(put, namespace, f"{name}-daemon", {"state": "running"})
    await stopped.wait()
    await asyncio.to_thread(put, namespace, f"{name}-daemon", {"state": "stopped", "reason": str(stopped.reason)})
'''


def cm_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/configmaps" + (f"/{name}" if name else "")


def get_cm(srv: FleetServer, ns: str, name: str) -> dict[str, Any] | None:
    code, body = api_get(srv, cm_path(ns, name))
    if code == 404:
        return None
    assert code == 200, (code, body)
    return body


def create_cm(srv: FleetServer, ns: str, name: str, data: dict[str, str]) -> dict[str, Any]:
    with srv.client() as c:
        r = c.post(cm_path(ns), json={"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": name, "labels": {LABEL: "yes"}}, "data": data})
    assert r.status_code == 201, (r.status_code, r.text)
    return r.json()


def events_for(srv: FleetServer, ns: str, name: str) -> list[dict[str, Any]]:
    code, body = api_get(srv, f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name={name}")
    assert code == 200, (code, body)
    return body["items"]


def data_of(srv: FleetServer, ns: str, name: str) -> dict[str, str] | None:
    cm = get_cm(srv, ns, name)
    return None if cm is None else (cm.get("data") or {})


@pytest.mark.parametrize("initial_streaming", [False, True], ids=["list-watch", "watch-list"])
def test_kopf_standalone_on_configmaps(fleet_server: FleetServer, namespace: str, tmp_path: Path,
                                       initial_streaming: bool) -> None:
    srv, ns = fleet_server, namespace
    # One object exists before the operator starts: kopf finds it in its initial listing.
    early = create_cm(srv, ns, "early", {"a": "1"})
    source = OPERATOR.replace("INITIAL_STREAMING", repr(initial_streaming))
    with run_kopf(srv, source, tmp_path / "kopf", namespaces=[ns]) as kp:
        try:
            _exercise(srv, ns, early)
            wait_logged(kp, f"[{ns}/app] Deletion is processed: 1 succeeded; 0 failed.", timeout=30)
            assert kp.alive(), kp.digest(8000)
            assert not kp.problems(), "\n".join(kp.problems())
        except BaseException:
            print(kp.digest())
            raise


def _exercise(srv: FleetServer, ns: str, early: dict[str, Any]) -> None:
    # -- the object listed at start-up is handled like a new one -------------------------
    wait_until(lambda: data_of(srv, ns, "early-child") == {"a": "1"}, timeout=30, what="early-child")

    # -- create: the handler's child, kopf's finalizer and last-handled configuration -----
    app = create_cm(srv, ns, "app", {"k": "v1"})
    child = wait_until(lambda: get_cm(srv, ns, "app-child"), timeout=30, what="app-child")
    assert child["data"] == {"k": "v1"}
    assert [(o["kind"], o["name"], o["uid"]) for o in child["metadata"]["ownerReferences"]] == \
        [("ConfigMap", "app", app["metadata"]["uid"])]

    def handled() -> dict[str, Any] | None:
        cm = get_cm(srv, ns, "app")
        return cm if cm and LAST_HANDLED in (cm["metadata"].get("annotations") or {}) else None

    # The failing-once handler: while it waits for its retry, kopf keeps its progress
    # in an annotation; once it succeeds the progress is purged.
    def progress_seen() -> dict[str, Any] | None:
        cm = get_cm(srv, ns, "app")
        ann = (cm or {}).get("metadata", {}).get("annotations") or {}
        raw = ann.get("kopf.zalando.org/flaky")
        return json.loads(raw) if raw and json.loads(raw).get("retries") else None

    progress = wait_until(progress_seen, timeout=30, what="kopf's progress annotation for 'flaky'")
    assert progress["retries"] == 1 and progress["success"] is False, progress
    assert progress["message"] == "not yet"
    assert wait_until(lambda: data_of(srv, ns, "app-flaky"), timeout=30, what="app-flaky") == {"retries": "1"}
    cm = wait_until(handled, timeout=30, what="last-handled-configuration")
    assert FINALIZER in cm["metadata"]["finalizers"]
    last = json.loads(cm["metadata"]["annotations"][LAST_HANDLED])
    assert last["data"] == {"k": "v1"} and last["metadata"]["labels"] == {LABEL: "yes"}
    wait_until(lambda: "kopf.zalando.org/flaky" not in (get_cm(srv, ns, "app") or {})
               .get("metadata", {}).get("annotations", {}), timeout=30, what="progress purged")

    # -- kopf.info → a core/v1 Event about the object ------------------------------------
    def event(reason: str) -> dict[str, Any] | None:
        return next((e for e in events_for(srv, ns, "app") if e["reason"] == reason), None)

    ev = wait_until(lambda: event("ChildCreated"), timeout=30, what="the ChildCreated Event")
    assert ev["type"] == "Normal" and ev["message"] == "created app-child"
    assert ev["involvedObject"]["uid"] == app["metadata"]["uid"]
    assert ev["involvedObject"]["kind"] == "ConfigMap" and ev["involvedObject"]["namespace"] == ns
    assert ev["source"]["component"] == "kopf" and ev["reportingComponent"] == "kopf"
    # kopf posts its own per-object INFO logs as Events too (settings.posting.level).
    wait_until(lambda: event("Logging"), timeout=30, what="kopf's Logging Event")

    # -- timer and daemon -----------------------------------------------------------------
    def ticks() -> int:
        ann = (get_cm(srv, ns, "app") or {}).get("metadata", {}).get("annotations") or {}
        return int(ann.get("kopf-e2e/ticks", "0"))

    wait_until(lambda: ticks() >= 3, timeout=30, what="three timer ticks")
    assert wait_until(lambda: data_of(srv, ns, "app-daemon"), timeout=30, what="daemon") == {"state": "running"}

    # -- update: only a change of `data` calls the handler ---------------------------------
    with srv.client() as c:
        r = c.patch(cm_path(ns, "app"), json={"data": {"k": "v2", "extra": "x"}},
                    headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    wait_until(lambda: data_of(srv, ns, "app-child") == {"k": "v2", "extra": "x"}, timeout=30,
               what="the update handler's child data")
    ev = wait_until(lambda: event("ChildUpdated"), timeout=30, what="the ChildUpdated Event")
    assert ev["message"] == "['k'] -> ['extra', 'k']"
    wait_until(lambda: json.loads(((get_cm(srv, ns, "app") or {}).get("metadata", {}).get("annotations") or {})
                                  .get(LAST_HANDLED, "{}")).get("data") == {"k": "v2", "extra": "x"},
               timeout=30, what="last-handled-configuration after the update")

    # -- delete: kopf's finalizer holds the object until the delete handler has run --------
    with srv.client() as c:
        r = c.delete(cm_path(ns, "app"))
    assert r.status_code in (200, 202), r.text
    tomb = wait_until(lambda: data_of(srv, ns, "app-deleted"), timeout=30, what="the delete handler's tombstone")
    assert tomb["deletionTimestamp"], tomb  # the handler saw the object marked for deletion
    wait_until(lambda: get_cm(srv, ns, "app") is None, timeout=30, what="app removed once kopf's finalizer is gone")
    daemon = wait_until(lambda: (data_of(srv, ns, "app-daemon") or {}).get("state") == "stopped"
                        and data_of(srv, ns, "app-daemon"), timeout=30, what="the daemon stopped")
    assert "DELETED" in daemon["reason"], daemon
    # The garbage collector removes the child the handler owned.
    wait_until(lambda: get_cm(srv, ns, "app-child") is None, timeout=60, what="app-child collected")


RELIST = '''
import kopf
import kubernetes

kubernetes.config.load_kube_config()
core = kubernetes.client.CoreV1Api()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.watching.server_timeout = 2        # reconnect with a resourceVersion that will be compacted


@kopf.on.create("configmaps", labels={"kopf-e2e": "yes"})
def created(name, namespace, **_):
    core.create_namespaced_config_map(namespace, {"metadata": {"name": f"{name}-child"}})
'''


def test_kopf_relists_after_410_expired(fleet_server_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """History compacted past the resourceVersion kopf resumes from: the watch answers an
    in-stream 410 Expired, kopf restarts with a fresh list, and handles what came since —
    without handling an already-handled object again (its state is in annotations)."""
    srv = fleet_server_factory.start(extra_args=["--retention", "5", "--compaction-interval", "0.5"])
    ns, churn = "kopf-relist", "kopf-churn"
    for name in (ns, churn):
        create_namespace(srv, name)
    with run_kopf(srv, RELIST, tmp_path / "kopf", namespaces=[ns]) as kp:
        try:
            create_cm(srv, ns, "first", {})
            wait_until(lambda: get_cm(srv, ns, "first-child"), timeout=30, what="first handled")
            # Writes elsewhere move the revision on while kopf's stream sees nothing; the
            # compactor then trims the history kopf would resume from.
            with srv.client() as c:
                for i in range(30):
                    r = c.post(cm_path(churn), json={"metadata": {"name": f"c{i}"}})
                    assert r.status_code == 201, r.text
            wait_logged(kp, f"Restarting the watch-stream for configmaps.v1 in '{ns}'", timeout=30)
            create_cm(srv, ns, "second", {})
            wait_until(lambda: get_cm(srv, ns, "second-child"), timeout=30, what="second handled after the relist")
            assert kp.output().count(f"[{ns}/first] Handler 'created' succeeded.") == 1, kp.digest(8000)
            assert not kp.problems(), "\n".join(kp.problems())
        except BaseException:
            print(kp.digest())
            raise
