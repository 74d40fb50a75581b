"""kopf (from PyPI, unchanged) on custom resources: `--standalone`, and kopf's own peering.

The CRDs are kopf's: `kopfexamples.kopf.dev` (its examples' kind, here with a status
subresource) and the peering kinds `kopfpeerings.kopf.dev` / `clusterkopfpeerings.kopf.dev`
(kopf's docs/peering.yaml).  The operators are written here and run as subprocesses with
the server's admin kubeconfig.

- standalone: create/update/delete handlers, a handler failing once (kopf keeps its progress
  in an annotation while it waits to retry, then purges it), handler results and
  `patch.status` written through the status subresource, kopf's finalizer, a timer counting
  in `status`, a daemon patching `status` with the official client, and Events.
- peering: two operator processes in one KopfPeering; both record themselves in the
  peering object's status, the one with the higher priority handles and the other pauses;
  when it exits, the other resumes and handles.
- cluster-wide: `--all-namespaces` with a ClusterKopfPeering, paused by `kopf freeze` and
  resumed by `kopf resume` (kopf's own CLI, writing the peering object).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FleetServer
from tests.e2e.helpers import api_get, wait_until
from tests.e2e.kopfkit import (
    EXAMPLE_CRD,
    PEERING_CRDS,
    ensure_crds,
    kopf_env,
    run_kopf,
    service_account_kubeconfig,
    wait_logged,
)

pytestmark = pytest.mark.e2e

FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
LAST_HANDLED = "kopf.zalando.org/last-handled-configuration"
EX = "/apis/kopf.dev/v1"
PAUSED_STREAM = "Pausing the watch-stream for kopfexamples.v1.kopf.dev"

STANDALONE = '''
import asyncio
import logging

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

kubernetes.config.load_kube_config()
core = kubernetes.client.CoreV1Api()
custom = kubernetes.client.CustomObjectsApi()
KEX = ("kopf.dev", "v1", "kopfexamples")


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.watching.server_timeout = 3        # reconnect often, resuming from the last resourceVersion
    settings.posting.level = logging.INFO
    settings.posting.loggers = True


def put_cm(namespace, name, data):
    body = {"metadata": {"name": name}, "data": {k: str(v) for k, v in data.items()}}
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as e:
        if e.status != 409:
            raise
        core.patch_namespaced_config_map(name, namespace, {"data": body["data"]})


@kopf.on.create(*KEX)
def created(body, spec, patch, **_):
    patch.status["phase"] = "Created"
    kopf.info(body, reason="Created", message=f"field={spec.get('field')}")
    return {"field": spec.get("field")}


@kopf.on.create(*KEX)
def flaky(retry, patch, **_):
    if retry == 0:
        raise kopf.TemporaryError("not yet", delay=2)
    patch.status["flakyRetries"] = retry


@kopf.on.update(*KEX, field="spec.field")
def updated(body, old, new, patch, **_):
    patch.status["phase"] = "Updated"
    kopf.info(body, reason="Updated", message=f"{old} -> {new}")
    return {"from": old, "to": new}


@kopf.on.delete(*KEX)
def deleted(name, namespace, meta, **_):
    put_cm(namespace, f"{name}-deleted", {"deletionTimestamp": meta.get("deletionTimestamp") or ""})


@kopf.timer(*KEX, interval=0.5)
def tick(status, patch, **_):
    patch.status["ticks"] = int(status.get("ticks") or 0) + 1


@kopf.daemon(*KEX, cancellation_polling=0.5)
async def watcher(name, namespace, stopped, **_):
    await asyncio.to_thread(custom.patch_namespaced_custom_object_status, *KEX[:2], namespace, KEX[2], name,
                            {"status": {"daemon": "running"}})
    await stopped.wait()
    await asyncio.to_thread(put_cm, namespace, f"{name}-daemon", {"reason": str(stopped.reason)})
'''

PEERED = '''
import kopf


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.watching.server_timeout = 3


@kopf.on.create("kopf.dev", "v1", "kopfexamples")
@kopf.on.update("kopf.dev", "v1", "kopfexamples", field="spec")
def handle(spec, patch, **_):
    patch.status["handledBy"] = "OPERATOR_ID"
    patch.status["field"] = spec.get("field")
'''


def kex(srv: FleetServer, ns: str, name: str) -> dict[str, Any] | None:
    code, body = api_get(srv, f"{EX}/namespaces/{ns}/kopfexamples/{name}")
    if code == 404:
        return None
    assert code == 200, (code, body)
    return body


def create_kex(srv: FleetServer, ns: str, name: str, field: str) -> dict[str, Any]:
    with srv.client() as c:
        r = c.post(f"{EX}/namespaces/{ns}/kopfexamples",
                   json={"apiVersion": "kopf.dev/v1", "kind": "KopfExample",
                         "metadata": {"name": name}, "spec": {"field": field}})
    assert r.status_code == 201, (r.status_code, r.text)
    return r.json()


def patch_kex(srv: FleetServer, ns: str, name: str, field: str) -> None:
    with srv.client() as c:
        r = c.patch(f"{EX}/namespaces/{ns}/kopfexamples/{name}", json={"spec": {"field": field}},
                    headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, (r.status_code, r.text)


def status_of(srv: FleetServer, ns: str, name: str) -> dict[str, Any]:
    return (kex(srv, ns, name) or {}).get("status") or {}


def cm_data(srv: FleetServer, ns: str, name: str) -> dict[str, str] | None:
    code, body = api_get(srv, f"/api/v1/namespaces/{ns}/configmaps/{name}")
    return body.get("data") or {} if code == 200 else None


def events_for(srv: FleetServer, ns: str, name: str) -> list[dict[str, Any]]:
    code, body = api_get(srv, f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name={name}")
    assert code == 200, (code, body)
    return body["items"]


@pytest.fixture(scope="module")
def kopf_crds(fleet_server: FleetServer) -> None:
    ensure_crds(fleet_server, EXAMPLE_CRD, *PEERING_CRDS)


def test_kopf_standalone_on_custom_resources(fleet_server: FleetServer, kopf_crds: None, namespace: str,
                                             tmp_path: Path) -> None:
    srv, ns = fleet_server, namespace
    with run_kopf(srv, STANDALONE, tmp_path / "kopf", namespaces=[ns]) as kp:
        try:
            _exercise_standalone(srv, ns)
            wait_logged(kp, f"[{ns}/ex] Deletion is processed: 1 succeeded; 0 failed.", timeout=30)
            assert kp.alive(), kp.digest(8000)
            assert not kp.problems(), "\n".join(kp.problems())
        except BaseException:
            print(kp.digest())
            raise


def _exercise_standalone(srv: FleetServer, ns: str) -> None:
    obj = create_kex(srv, ns, "ex", "a")

    # While the failing-once handler waits for its retry, kopf keeps its progress in an
    # annotation (kopf 1.45's default progress storage), purged once the handler succeeds.
    def progress() -> dict[str, Any] | None:
        ann = ((kex(srv, ns, "ex") or {}).get("metadata") or {}).get("annotations") or {}
        raw = ann.get("kopf.zalando.org/flaky")
        return json.loads(raw) if raw and json.loads(raw).get("retries") else None

    p = wait_until(progress, timeout=30, what="kopf's progress annotation for 'flaky'")
    assert p["retries"] == 1 and p["success"] is False and p["message"] == "not yet", p

    # Handler results and patch.status land in the status (through the status subresource).
    st = wait_until(lambda: (s := status_of(srv, ns, "ex")).get("flakyRetries") == 1 and s, timeout=30,
                    what="creation done")
    assert st["created"] == {"field": "a"} and st["phase"] == "Created", st
    cur = kex(srv, ns, "ex")
    assert cur is not None
    assert FINALIZER in cur["metadata"]["finalizers"]
    assert "kopf.zalando.org/flaky" not in (cur["metadata"].get("annotations") or {})
    assert json.loads(cur["metadata"]["annotations"][LAST_HANDLED]) == {"spec": {"field": "a"}}
    # Status writes went through the status subresource: the main resource's generation
    # counts spec changes only, and managedFields record kopf's status writes as such.
    assert cur["metadata"]["generation"] == 1
    status_managers = {(m["manager"], m.get("subresource")) for m in cur["metadata"].get("managedFields") or []}
    assert ("kopf", "status") in status_managers, status_managers

    ev = wait_until(lambda: next((e for e in events_for(srv, ns, "ex") if e["reason"] == "Created"), None),
                    timeout=30, what="the Created Event")
    assert ev["message"] == "field=a"
    assert {k: ev["involvedObject"][k] for k in ("apiVersion", "kind", "name", "namespace", "uid")} == \
        {"apiVersion": "kopf.dev/v1", "kind": "KopfExample", "name": "ex", "namespace": ns,
         "uid": obj["metadata"]["uid"]}

    # Timer and daemon.
    wait_until(lambda: int(status_of(srv, ns, "ex").get("ticks") or 0) >= 3, timeout=30, what="three ticks")
    wait_until(lambda: status_of(srv, ns, "ex").get("daemon") == "running", timeout=30, what="the daemon's status")

    # Update of spec.field: the update handler's result and phase.
    patch_kex(srv, ns, "ex", "b")
    st = wait_until(lambda: (s := status_of(srv, ns, "ex")).get("phase") == "Updated" and s, timeout=30,
                    what="the update handler")
    assert st["updated/spec.field"] == {"from": "a", "to": "b"}, st
    assert (kex(srv, ns, "ex") or {})["metadata"]["generation"] == 2
    wait_until(lambda: any(e["reason"] == "Updated" and e["message"] == "a -> b" for e in events_for(srv, ns, "ex")),
               timeout=30, what="the Updated Event")

    # Delete: the finalizer holds the object for the delete handler, then lets it go.
    with srv.client() as c:
        r = c.delete(f"{EX}/namespaces/{ns}/kopfexamples/ex")
    assert r.status_code in (200, 202), r.text
    tomb = wait_until(lambda: cm_data(srv, ns, "ex-deleted"), timeout=30, what="the delete handler's tombstone")
    assert tomb["deletionTimestamp"], tomb
    wait_until(lambda: kex(srv, ns, "ex") is None, timeout=30, what="ex removed once kopf's finalizer is gone")
    daemon = wait_until(lambda: cm_data(srv, ns, "ex-daemon"), timeout=30, what="the daemon stopped")
    assert "DELETED" in daemon["reason"], daemon


def peers(srv: FleetServer, ns: str, name: str) -> dict[str, Any]:
    code, body = api_get(srv, f"{EX}/namespaces/{ns}/kopfpeerings/{name}")
    assert code == 200, (code, body)
    return body.get("status") or {}


def handled(srv: FleetServer, ns: str, name: str) -> tuple[str | None, str | None]:
    st = status_of(srv, ns, name)
    return st.get("handledBy"), st.get("field")


def test_kopf_peering_two_operators(fleet_server: FleetServer, kopf_crds: None, namespace: str,
                                    tmp_path: Path) -> None:
    srv, ns = fleet_server, namespace
    with srv.client() as c:
        r = c.post(f"{EX}/namespaces/{ns}/kopfpeerings",
                   json={"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "peers"}})
    assert r.status_code == 201, r.text
    with run_kopf(srv, PEERED.replace("OPERATOR_ID", "a"), tmp_path / "a", namespaces=[ns],
                  standalone=False, peering="peers", priority=10) as a:
        try:
            wait_logged(a, "Resuming operations after the pause", timeout=30)
            create_kex(srv, ns, "one", "1")
            wait_until(lambda: status_of(srv, ns, "one").get("handledBy") == "a", timeout=30, what="a handles one")

            paused_before = a.output().count(PAUSED_STREAM)
            with run_kopf(srv, PEERED.replace("OPERATOR_ID", "b"), tmp_path / "b", namespaces=[ns],
                          standalone=False, peering="peers", priority=20) as b:
                try:
                    wait_logged(a, "Pausing operations in favour of", timeout=30)
                    # ... and its watch is closed.
                    wait_logged(a, PAUSED_STREAM, timeout=30, count=paused_before + 1)
                    # Both keep themselves alive in the peering object's status.
                    st = wait_until(lambda: len(p := peers(srv, ns, "peers")) == 2 and p, timeout=30,
                                    what="two peers")
                    assert sorted(v["priority"] for v in st.values()) == [10, 20], st
                    patch_kex(srv, ns, "one", "2")
                    create_kex(srv, ns, "two", "1")
                    wait_until(lambda: handled(srv, ns, "one") == ("b", "2"),
                               timeout=30, what="b handles one's update")
                    wait_until(lambda: status_of(srv, ns, "two").get("handledBy") == "b", timeout=30,
                               what="b handles two")
                    assert f"[{ns}/two]" not in a.output(), a.digest(8000)
                    assert not b.problems(), "\n".join(b.problems())
                except BaseException:
                    print(b.digest())
                    raise
            # b has exited and removed itself from the peering: a resumes and handles again.
            wait_until(lambda: len(peers(srv, ns, "peers")) == 1, timeout=30, what="b gone from the peering")
            wait_until(lambda: a.output().count("Resuming operations after the pause") >= 2, timeout=30,
                       what="a resumed")
            patch_kex(srv, ns, "two", "2")
            wait_until(lambda: handled(srv, ns, "two") == ("a", "2"), timeout=30,
                       what="a handles two's update")
            assert not a.problems(), "\n".join(a.problems())
        except BaseException:
            print(a.digest())
            raise


CLUSTER_WIDE = '''
import kopf

SELECT = {"kopf-e2e-cw": "NAMESPACE"}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.watching.server_timeout = 3


@kopf.on.create("kopf.dev", "v1", "kopfexamples", labels=SELECT)
@kopf.on.update("kopf.dev", "v1", "kopfexamples", labels=SELECT, field="spec")
def handle(spec, patch, **_):
    patch.status["handledBy"] = "cluster-wide"
    patch.status["field"] = spec.get("field")
'''


def test_kopf_cluster_wide_peering_freeze_resume(fleet_server: FleetServer, kopf_crds: None, namespace: str,
                                                 tmp_path: Path) -> None:
    """`--all-namespaces` with a ClusterKopfPeering; `kopf freeze` pauses it, `kopf resume` resumes."""
    srv, ns = fleet_server, namespace
    peering = ns  # cluster-scoped: unique per test
    with srv.client() as c:
        r = c.post(f"{EX}/clusterkopfpeerings",
                   json={"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": peering}})
    assert r.status_code == 201, r.text

    def create(name: str, field: str) -> None:
        with srv.client() as c:
            r = c.post(f"{EX}/namespaces/{ns}/kopfexamples",
                       json={"apiVersion": "kopf.dev/v1", "kind": "KopfExample",
                             "metadata": {"name": name, "labels": {"kopf-e2e-cw": ns}}, "spec": {"field": field}})
        assert r.status_code == 201, r.text

    def kopf_cli(*args: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "kopf", *args, "--all-namespaces", f"--peering={peering}"],
                              env=kopf_env(srv), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)

    with run_kopf(srv, CLUSTER_WIDE.replace("NAMESPACE", ns), tmp_path / "cw", all_namespaces=True,
                  standalone=False, peering=peering) as op:
        try:
            wait_logged(op, "Resuming operations after the pause", timeout=30)
            create("cw", "1")
            wait_until(lambda: handled(srv, ns, "cw") == ("cluster-wide", "1"), timeout=30, what="handled")
            code, cw_peering = api_get(srv, f"{EX}/clusterkopfpeerings/{peering}")
            assert code == 200 and len(cw_peering.get("status") or {}) == 1, cw_peering

            paused_before = op.output().count(PAUSED_STREAM)
            kopf_cli("freeze", "--lifetime=60", "--message=e2e maintenance")
            wait_logged(op, "Pausing operations in favour of", timeout=30)
            wait_logged(op, PAUSED_STREAM, timeout=30, count=paused_before + 1)  # its watch is closed
            patch_kex(srv, ns, "cw", "2")
            time.sleep(3)  # long enough for a running operator to handle it (it took < 1s above)
            assert handled(srv, ns, "cw") == ("cluster-wide", "1"), "a frozen operator handled a change"

            kopf_cli("resume")
            wait_until(lambda: handled(srv, ns, "cw") == ("cluster-wide", "2"), timeout=30,
                       what="the change handled after resume")
            assert not op.problems(), "\n".join(op.problems())
        except BaseException:
            print(op.digest())
            raise


def kopf_rbac(ns: str, sa: str) -> list[tuple[str, dict[str, Any]]]:
    """kopf's documented RBAC (docs/deployment-rbac.yaml) for a namespaced operator, plus
    `kopfexamples/status` (this CRD has a status subresource) — (collection path, object)."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    cluster_rules = [
        {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"], "verbs": ["list", "watch", "patch", "get"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["kopf.dev"], "resources": ["kopfexamples"], "verbs": ["list", "watch"]},
    ]
    ns_rules = [
        {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"], "verbs": ["list", "watch", "patch", "get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": ["kopf.dev"], "resources": ["kopfexamples", "kopfexamples/status"],
         "verbs": ["list", "watch", "patch"]},
    ]
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    return [
        (f"/api/v1/namespaces/{ns}/serviceaccounts",
         {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}),
        (f"{rbac}/clusterroles",
         {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": f"{ns}-kopf"},
          "rules": cluster_rules}),
        (f"{rbac}/clusterrolebindings",
         {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": f"{ns}-kopf"},
          "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{ns}-kopf"},
          "subjects": subject}),
        (f"{rbac}/namespaces/{ns}/roles",
         {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "kopf"},
          "rules": ns_rules}),
        (f"{rbac}/namespaces/{ns}/rolebindings",
         {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "kopf"},
          "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kopf"},
          "subjects": subject}),
        (f"{EX}/namespaces/{ns}/kopfpeerings",
         {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "peers"}}),
    ]


def test_kopf_as_service_account_with_its_documented_rbac(fleet_server: FleetServer, kopf_crds: None,
                                                          namespace: str, tmp_path: Path) -> None:
    """How kopf is deployed: a ServiceAccount with the RBAC kopf's docs give, a token, peering."""
    srv, ns = fleet_server, namespace
    with srv.client() as c:
        for path, obj in kopf_rbac(ns, "kopf-operator"):
            r = c.post(path, json=obj)
            assert r.status_code == 201, (path, r.status_code, r.text)
    kubeconfig = service_account_kubeconfig(srv, ns, "kopf-operator", tmp_path / "sa.kubeconfig")
    with run_kopf(srv, PEERED.replace("OPERATOR_ID", "sa"), tmp_path / "sa", namespaces=[ns],
                  standalone=False, peering="peers", kubeconfig=kubeconfig) as op:
        try:
            wait_logged(op, "Resuming operations after the pause", timeout=30)
            create_kex(srv, ns, "rbac", "1")
            wait_until(lambda: handled(srv, ns, "rbac") == ("sa", "1"), timeout=30, what="handled as the SA")
            patch_kex(srv, ns, "rbac", "2")
            wait_until(lambda: handled(srv, ns, "rbac") == ("sa", "2"), timeout=30, what="update handled")
            st = peers(srv, ns, "peers")
            assert len(st) == 1, st
            assert not op.problems(), "\n".join(op.problems())
            # Nothing kopf needed was refused (it logs and falls back when it is).
            assert "Not enough permissions" not in op.output(), op.digest(8000)
        except BaseException:
            print(op.digest())
            raise
