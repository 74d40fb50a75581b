"""The server's ingress loop (fleet/network/ingress.py) on real informers over a fake API:
nothing is built before every informer listed, statuses are written only when they
change (and our own writes coming back cost no write), events are recorded once while
their cause lasts, and an engine that refuses a table leaves the previous one serving."""

from __future__ import annotations

import copy
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet._core.supervise import REGISTRY
from fleet.client import ApiException
from fleet.network import ingress
from fleet.network.ingress import INPUTS, IngressController, ensure_classes, observe, wire
from fleet.network.ingress_cert import ensure_default_certificate
from fleet.network.ingress_status import EventDeduper, desired_status, merge_patch
from fleet.network.routetable import (
    Backend,
    BuildResult,
    EngineError,
    Listener,
    Route,
    RouteEvent,
    RouteTable,
    Source,
    StatusUpdate,
    VirtualHost,
)


def apply_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply_merge_patch(out.get(k), v)
    return out


PLURALS = [plural for _api, plural in INPUTS.values()]


class FakeAPI:
    """list_all + watch per resource (watch events pushed by the test), and the writes
    the controller makes (status patches, creates), recorded."""

    def __init__(self, objs: dict[str, list[dict[str, Any]]] | None = None) -> None:
        self.objs = {p: list((objs or {}).get(p, [])) for p in PLURALS}
        self.send: dict[str, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._recv: dict[str, trio.MemoryReceiveChannel[dict[str, Any]]] = {}
        for plural in PLURALS:
            self.send[plural], self._recv[plural] = trio.open_memory_channel(100)
        self.hold = {p: trio.Event() for p in PLURALS}
        for e in self.hold.values():
            e.set()
        self.patches: list[tuple[str, str, str | None, Any]] = []
        self.patch_error: ApiException | None = None
        self.created: list[dict[str, Any]] = []
        self.existing: set[tuple[str, str]] = set()

    def push(self, plural: str, etype: str, obj: dict[str, Any]) -> None:
        """A change made by someone else: stored, and sent to the watch."""
        md = obj["metadata"]
        self.objs[plural] = [o for o in self.objs[plural]
                             if (o["metadata"]["name"], o["metadata"].get("namespace"))
                             != (md["name"], md.get("namespace"))]
        if etype != "DELETED":
            self.objs[plural].append(obj)
        self.send[plural].send_nowait({"type": etype, "object": obj})

    async def list_all(self, api_version: str, plural: str, namespace: str | None = None,
                       **kw: Any) -> dict[str, Any]:
        await self.hold[plural].wait()
        return {"items": list(self.objs[plural]), "metadata": {"resourceVersion": "1"}}

    async def watch(self, api_version: str, plural: str, namespace: str | None = None,
                    **kw: Any) -> AsyncIterator[dict[str, Any]]:
        async for event in self._recv[plural]:
            yield event

    async def patch(self, api_version: str, plural: str, name: str, patch: Any, content_type: str,
                    namespace: str | None = None, *, subresource: str | None = None) -> dict[str, Any]:
        assert subresource == "status"
        if self.patch_error is not None:
            raise self.patch_error
        self.patches.append((plural, name, namespace, patch))
        # The write comes back through the watch, as the API server's would.
        for obj in self.objs[plural]:
            md = obj["metadata"]
            if md["name"] == name and md.get("namespace") == namespace:
                obj = copy.deepcopy(obj)
                obj["status"] = apply_merge_patch(obj.get("status") or {}, patch["status"])
                obj["metadata"]["resourceVersion"] = str(int(md["resourceVersion"]) + 100)
                self.send[plural].send_nowait({"type": "MODIFIED", "object": obj})
                return obj
        return {}

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None) -> dict[str, Any]:
        if (plural, body["metadata"]["name"]) in self.existing:
            raise ApiException({"reason": "AlreadyExists"}, 409)
        self.created.append(body)
        return body


class FakeEngine:
    name = "fake"

    def __init__(self) -> None:
        self.tables: list[RouteTable] = []
        self.fail = False

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def apply(self, table: RouteTable) -> None:
        if self.fail:
            raise EngineError("nginx -t: configuration test failed")
        self.tables.append(table)


class FakeRecorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((obj["metadata"]["name"], type_, reason, message))


def ing(name: str, service: str, rv: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": "default", "uid": f"u-{name}", "resourceVersion": str(rv),
                     "generation": 1},
        "spec": {"defaultBackend": {"service": {"name": service, "port": {"number": 80}}}}}
    if status is not None:
        obj["status"] = status
    return obj


def svc(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default", "uid": f"s-{name}", "resourceVersion": "1"},
            "spec": {"ports": [{"port": 80}]}}


LB = {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}


def fake_build(inputs: dict[str, list[dict[str, Any]]], generation: int,
               unavailable: frozenset[int] = frozenset()) -> BuildResult:
    """A stand-in for routebuild.build: one host per Ingress, a Warning for a missing Service."""
    services = {s["metadata"]["name"] for s in inputs["services"]}
    hosts, statuses, events = [], [], []
    for obj in sorted(inputs["ingresses"], key=lambda o: o["metadata"]["name"]):
        if obj["spec"].get("ingressClassName") == "other":
            continue  # another controller's
        name = obj["metadata"]["name"]
        target = obj["spec"]["defaultBackend"]["service"]["name"]
        problem = "" if target in services else f'service "default/{target}" not found'
        hosts.append(VirtualHost(f"{name}.example", (Route(
            Source("Ingress", "default", name),
            backends=(Backend("default", target, 80, problem=problem),)),)))
        statuses.append(StatusUpdate("networking.k8s.io/v1", "Ingress", "default", name, LB))
        if problem:
            events.append(RouteEvent("Ingress", "default", name, "Warning", "ServiceNotFound", problem))
    table = RouteTable((Listener(8080, "HTTP", tuple(hosts)),), generation)
    return BuildResult(table, tuple(statuses), tuple(events))


async def start(nursery: trio.Nursery, api: FakeAPI, engine: FakeEngine | None = None,
                build: Any = fake_build, addresses: tuple[str, ...] = ()
                ) -> tuple[IngressController, FakeEngine, FakeRecorder]:
    engine = engine or FakeEngine()
    recorder = FakeRecorder()
    caches: dict[str, Any] = {}
    ctl = IngressController(engine, api, recorder, caches, build, build_in_thread=False,
                            addresses=addresses)
    caches.update(wire(ctl, api))  # type: ignore[arg-type]
    for inf in caches.values():
        nursery.start_soon(inf.run)
    await nursery.start(ctl.loop)
    return ctl, engine, recorder


async def test_nothing_is_built_before_every_informer_listed(autojump_clock: Any) -> None:
    api = FakeAPI({"ingresses": [ing("a", "web")], "services": [svc("web")]})
    api.hold["endpointslices"] = trio.Event()
    async with trio.open_nursery() as n:
        engine = FakeEngine()
        n.start_soon(start, n, api, engine)
        await trio.sleep(5)
        assert engine.tables == [] and api.patches == []
        api.hold["endpointslices"].set()
        await trio.sleep(1)
        assert len(engine.tables) == 1
        assert [h.hostname for h in engine.tables[0].listeners[0].hosts] == ["a.example"]
        n.cancel_scope.cancel()


async def test_statuses_are_written_only_when_they_change(autojump_clock: Any) -> None:
    api = FakeAPI({"ingresses": [ing("a", "web"), ing("b", "web", status=LB)], "services": [svc("web")]})
    async with trio.open_nursery() as n:
        ctl, engine, _ = await start(n, api)
        # b already holds the status the build asks for: only a is written.
        assert api.patches == [("ingresses", "a", "default", {"status": LB})]
        # Our write came back through the watch (status and resourceVersion only):
        # no new pass, no write.
        await trio.sleep(1)
        assert len(api.patches) == 1 and len(engine.tables) == 1 and ctl.generation == 1
        # A spec change builds again; the same statuses are still in place: no write.
        api.push("ingresses", "MODIFIED", ing("a", "other", 3, status=LB))
        await trio.sleep(1)
        assert ctl.generation == 2 and len(api.patches) == 1
        # Someone clears a's status: it is written back.
        api.push("ingresses", "MODIFIED", ing("a", "other", 4, status={"loadBalancer": {}}))
        await trio.sleep(1)
        assert api.patches[1:] == [("ingresses", "a", "default", {"status": LB})]
        n.cancel_scope.cancel()


async def test_a_failed_status_write_is_retried_and_a_vanished_object_ignored(autojump_clock: Any) -> None:
    api = FakeAPI({"ingresses": [ing("a", "web")], "services": [svc("web")]})
    api.patch_error = ApiException({"reason": "InternalError"}, 500)
    before = REGISTRY.get_sample_value("fleet_ingress_status_write_failures_total") or 0.0
    async with trio.open_nursery() as n:
        ctl, engine, _ = await start(n, api)
        assert (REGISTRY.get_sample_value("fleet_ingress_status_write_failures_total") or 0) > before
        api.patch_error = None
        await trio.sleep(5)  # the retry after back-off
        assert api.patches == [("ingresses", "a", "default", {"status": LB})]
        assert len(engine.tables) == 1  # the table was served all along, not re-applied
        api.patch_error = ApiException({"reason": "NotFound"}, 404)
        assert await ctl.write_statuses(fake_build(ctl.snapshot(), 9)) is True
        n.cancel_scope.cancel()


async def test_events_are_recorded_once_while_their_cause_lasts(autojump_clock: Any) -> None:
    api = FakeAPI({"ingresses": [ing("a", "missing")], "services": [svc("web")]})
    async with trio.open_nursery() as n:
        ctl, _, rec = await start(n, api)
        warning = ("a", "Warning", "ServiceNotFound", 'service "default/missing" not found')
        assert rec.events == [warning]
        for rv in (2, 3):  # more passes, same problem: no more events
            api.push("services", "ADDED", svc(f"x{rv}"))
            await trio.sleep(1)
        assert ctl.generation == 3 and rec.events == [warning]
        api.push("services", "ADDED", svc("missing"))
        await trio.sleep(1)
        api.push("services", "DELETED", svc("missing"))
        await trio.sleep(1)
        assert rec.events == [warning, warning]  # gone, then back: reported again
        n.cancel_scope.cancel()


async def test_an_engine_failure_keeps_the_previous_table(autojump_clock: Any) -> None:
    api = FakeAPI({"ingresses": [ing("a", "web")], "services": [svc("web")]})
    failures = REGISTRY.get_sample_value("fleet_ingress_sync_failures_total") or 0.0
    async with trio.open_nursery() as n:
        ctl, engine, _ = await start(n, api)
        first = ctl.applied
        assert first is not None and engine.tables == [first]
        engine.fail = True
        api.push("ingresses", "ADDED", ing("b", "web"))
        await trio.sleep(0.5)
        assert ctl.applied is first  # what the engine still serves
        assert (REGISTRY.get_sample_value("fleet_ingress_sync_failures_total") or 0) > failures
        assert [p[1] for p in api.patches] == ["a"]  # b's status waits for a served table
        engine.fail = False
        await trio.sleep(10)  # retried with back-off, no new change needed
        assert ctl.applied is not None and ctl.applied is not first
        assert [h.hostname for h in ctl.applied.listeners[0].hosts] == ["a.example", "b.example"]
        assert [p[1] for p in api.patches] == ["a", "b"]
        n.cancel_scope.cancel()


async def test_a_build_that_raises_is_counted_and_retried(autojump_clock: Any) -> None:
    calls = []

    def flaky(inputs: dict[str, list[dict[str, Any]]], generation: int,
              unavailable: frozenset[int] = frozenset()) -> BuildResult:
        calls.append(generation)
        if len(calls) == 1:
            raise ValueError("builder bug")
        return fake_build(inputs, generation)

    api = FakeAPI({"ingresses": [ing("a", "web")], "services": [svc("web")]})
    async with trio.open_nursery() as n:
        ctl, engine, _ = await start(n, api, build=flaky)
        assert calls == [1, 2] and len(engine.tables) == 1
        n.cancel_scope.cancel()


async def test_an_equal_table_is_not_applied_again() -> None:
    api, engine, rec = FakeAPI({"ingresses": [ing("a", "web")]}), FakeEngine(), FakeRecorder()
    caches = {name: _Static(api.objs[plural]) for name, (_a, plural) in INPUTS.items()}
    ctl = IngressController(engine, api, rec, caches, fake_build, build_in_thread=False)
    assert await ctl.sync() and await ctl.sync()
    assert len(engine.tables) == 1 and ctl.generation == 2


class _Static:
    def __init__(self, objs: list[dict[str, Any]]) -> None:
        self.items = {f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}": o for o in objs}

    has_synced = True


async def test_default_classes_are_created_but_never_overwritten() -> None:
    api = FakeAPI()
    api.existing.add(("gatewayclasses", "fleet"))  # a user's (maybe edited) class stays
    await ensure_classes(api)
    assert [(b["kind"], b["metadata"]["name"]) for b in api.created] == [("IngressClass", "fleet")]
    cls = api.created[0]
    assert cls["spec"] == {"controller": "fleet.io/ingress"}
    assert cls["metadata"]["annotations"] == {"ingressclass.kubernetes.io/is-default-class": "true"}
    api.existing.add(("ingressclasses", "fleet"))
    api.created.clear()
    await ensure_classes(api)
    assert api.created == []


def test_the_default_certificate_is_made_once_with_a_private_key(tmp_path: Path) -> None:
    first = ensure_default_certificate(tmp_path / "ingress")
    key = tmp_path / "ingress" / "default.key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert first.hostnames == ("",) and b"BEGIN CERTIFICATE" in first.cert_pem
    assert ensure_default_certificate(tmp_path / "ingress") == first
    (tmp_path / "ingress" / "default.crt").write_text("garbage")
    remade = ensure_default_certificate(tmp_path / "ingress")
    assert remade.cert_pem != first.cert_pem and b"BEGIN CERTIFICATE" in remade.cert_pem


def test_conditions_keep_their_transition_time_and_other_controllers_parents() -> None:
    cond = {"type": "Accepted", "status": "True", "reason": "Accepted", "observedGeneration": 1}
    mine = {"parentRef": {"name": "gw"}, "controllerName": "fleet.io/gateway-controller",
            "conditions": [cond]}
    theirs = {"parentRef": {"name": "other"}, "controllerName": "example.com/gw", "conditions": []}
    current = {"status": {"parents": [theirs, {**mine, "conditions": [
        {**cond, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}}
    update = StatusUpdate("gateway.networking.k8s.io/v1", "HTTPRoute", "default", "r", {"parents": [mine]})
    want = desired_status(update, current, "fleet.io/gateway-controller", "2026-12-02T00:00:00Z")
    assert want == current["status"]  # nothing to write
    flipped = StatusUpdate("gateway.networking.k8s.io/v1", "HTTPRoute", "default", "r",
                           {"parents": [{**mine, "conditions": [{**cond, "status": "False"}]}]})
    want = desired_status(flipped, current, "fleet.io/gateway-controller", "2026-12-02T00:00:00Z")
    assert want["parents"][0] == theirs
    assert want["parents"][1]["conditions"][0]["lastTransitionTime"] == "2026-12-02T00:00:00Z"


def test_merge_patch_sends_removed_keys_as_null() -> None:
    assert merge_patch({"a": 1, "b": {"c": 1, "d": 2}}, {"b": {"c": 1, "d": 3}, "e": [1]}) == \
        {"a": None, "b": {"d": 3}, "e": [1]}


def test_event_deduper() -> None:
    d = EventDeduper()
    e1 = RouteEvent("Ingress", "ns", "a", "Warning", "ServiceNotFound", "x")
    e2 = RouteEvent("Ingress", "ns", "b", "Normal", "Sync", "y")
    assert d.new([e1, e1]) == [e1]
    assert d.new([e1, e2]) == [e2]
    assert d.new([]) == []
    assert d.new([e1]) == [e1]


@pytest.mark.parametrize("source", [Source("HTTPRoute", "prod", "canary"), None])
def test_observe_feeds_the_request_metrics(source: Source | None) -> None:
    labels = {"kind": source.kind, "namespace": source.namespace, "name": source.name} if source \
        else {"kind": "", "namespace": "", "name": ""}
    before = REGISTRY.get_sample_value("fleet_ingress_requests_total", {**labels, "code": "503"}) or 0.0
    observe(source, 503, 0.02)
    assert REGISTRY.get_sample_value("fleet_ingress_requests_total", {**labels, "code": "503"}) == before + 1
    assert (REGISTRY.get_sample_value("fleet_ingress_request_duration_seconds_count", labels) or 0) >= 1
    # The server's /metrics renders the process registry.
    from fleet.server.metrics import Metrics
    body, _ = Metrics(lambda: {}, lambda: 0).render()
    assert b"fleet_ingress_requests_total{" in body and b"fleet_ingress_sync_seconds" in body


def test_config_validation_and_addresses() -> None:
    cfg = ingress.IngressConfig(engine="haproxy")
    with pytest.raises(ValueError, match="builtin or nginx"):
        cfg.validate()
    with pytest.raises(ValueError, match="differ"):
        ingress.IngressConfig(http_port=8080, https_port=8080).validate()
    with pytest.raises(ValueError, match="not an IP address"):
        ingress.IngressConfig(bind_address="example.com").validate()
    ingress.IngressConfig(bind_address="::1", http_port=0).validate()
    assert not ingress.IngressConfig(http_port=0, https_port=0).active
    assert ingress.IngressConfig(bind_address="127.0.0.1").addresses() == ("127.0.0.1",)
    assert ingress.IngressConfig(advertise=["198.51.100.7"]).addresses() == ("198.51.100.7",)
    assert ingress.IngressConfig(server_address="203.0.113.5").addresses() == ("203.0.113.5",)


def test_only_tls_secrets_keep_their_data() -> None:
    tls = {"type": "kubernetes.io/tls", "metadata": {"name": "t"}, "data": {"tls.crt": "x"}}
    opaque = {"type": "Opaque", "metadata": {"name": "o"}, "data": {"password": "x"}}
    assert ingress.slim_secret(tls) == tls
    assert "data" not in ingress.slim_secret(opaque)


async def test_with_the_real_builder(autojump_clock: Any, tmp_path: Path) -> None:
    cfg = ingress.IngressConfig(advertise=["192.0.2.10"], data_dir=tmp_path)
    cert = ensure_default_certificate(cfg.ingress_dir())
    rule = {"host": "a.example", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {
        "service": {"name": "web", "port": {"number": 80}}}}]}}
    obj = ing("a", "web")
    obj["spec"] = {"ingressClassName": "fleet", "rules": [rule]}
    service = svc("web")
    service["spec"]["ports"] = [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
           "metadata": {"name": "web-1", "namespace": "default", "resourceVersion": "1",
                        "labels": {"kubernetes.io/service-name": "web"}},
           "ports": [{"port": 8080, "protocol": "TCP"}],
           "endpoints": [{"addresses": ["10.0.0.5"], "conditions": {"ready": True}}]}
    klass = ingress.default_ingress_class()
    klass["metadata"].update(uid="c1", resourceVersion="1")
    api = FakeAPI({"ingresses": [obj], "services": [service], "endpointslices": [eps],
                   "ingressclasses": [klass]})
    async with trio.open_nursery() as n:
        ctl, engine, rec = await start(n, api, build=ingress.default_build(cfg, cert))
        http = engine.tables[0].listener(8080)
        https = engine.tables[0].listener(8443)
        assert http is not None and https is not None and https.default_certificate == cert
        sel = engine.tables[0].select(8080, "a.example", "GET", "/x")
        assert sel is not None
        assert [(e.address, e.port) for e in sel.route.backends[0].endpoints] == [("10.0.0.5", 8080)]
        assert api.patches == [("ingresses", "a", "default",
                                {"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}})]
        assert rec.events == []
        n.cancel_scope.cancel()


async def test_an_ingress_we_stop_serving_is_released(autojump_clock: Any) -> None:
    theirs = ing("d", "web", status={"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}})
    theirs["spec"]["ingressClassName"] = "other"
    api = FakeAPI({"ingresses": [ing("a", "web", status=LB), theirs], "services": [svc("web")]})
    async with trio.open_nursery() as n:
        ctl, engine, _ = await start(n, api, addresses=("192.0.2.10",))
        assert api.patches == []  # a shows our address already; d is not ours and not showing it
        moved = ing("a", "web", 5, status=LB)
        moved["spec"]["ingressClassName"] = "other"
        api.push("ingresses", "MODIFIED", moved)
        await trio.sleep(1)
        assert api.patches == [("ingresses", "a", "default", {"status": {"loadBalancer": {"ingress": None}}})], api.patches
        assert engine.tables[-1].listeners[0].hosts == ()
        n.cancel_scope.cancel()


def test_a_removed_route_loses_its_request_series() -> None:
    gone, kept = Source("Ingress", "ns", "gone"), Source("Ingress", "ns", "kept")
    for src in (gone, kept, None):
        observe(src, 200, 0.01)
    ingress.forget_routes({("Ingress", "ns", "kept")})
    def count(name: str) -> float | None:
        return REGISTRY.get_sample_value("fleet_ingress_requests_total",
                                         {"kind": "Ingress", "namespace": "ns", "name": name, "code": "200"})
    assert count("gone") is None and count("kept") == 1.0
    assert REGISTRY.get_sample_value("fleet_ingress_requests_total",
                                     {"kind": "", "namespace": "", "name": "", "code": "200"})


class BusyPortEngine(FakeEngine):
    """An engine that cannot listen on `busy` (another process holds it)."""

    def __init__(self, busy: int) -> None:
        super().__init__()
        self.busy = busy
        self.refused = 0

    async def apply(self, table: RouteTable) -> None:
        if table.listener(self.busy) is not None:
            self.refused += 1
            raise EngineError(f"port {self.busy}: address in use", ports=(self.busy,))
        await super().apply(table)


async def test_a_port_the_engine_cannot_listen_on_is_left_out_reported_and_retried(
        autojump_clock: Any, tmp_path: Path) -> None:
    # A Gateway listener on a port another process holds must not hold up the other
    # routes: the table is built again without it, the listener says PortUnavailable,
    # and the port is tried again later.
    cfg = ingress.IngressConfig(advertise=["192.0.2.10"], data_dir=tmp_path, https_port=0)
    klass = ingress.default_gateway_class()
    klass["metadata"].update(uid="gc1", resourceVersion="1")
    gw = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
          "metadata": {"name": "gw", "namespace": "default", "uid": "g1", "resourceVersion": "1",
                       "generation": 1},
          "spec": {"gatewayClassName": "fleet", "listeners": [
              {"name": "web", "port": 8080, "protocol": "HTTP"},
              {"name": "busy", "port": 9999, "protocol": "HTTP"}]}}
    api = FakeAPI({"gatewayclasses": [klass], "gateways": [gw]})
    engine = BusyPortEngine(9999)
    async with trio.open_nursery() as n:
        ctl, _, _ = await start(n, api, engine=engine, build=ingress.default_build(cfg, None))
        assert [lst.port for lst in engine.tables[-1].listeners] == [8080]
        assert ctl.unavailable == {9999} and engine.refused == 1
        status = next(body["status"] for plural, name, _, body in api.patches
                      if plural == "gateways" and name == "gw")
        busy = next(ls for ls in status["listeners"] if ls["name"] == "busy")
        accepted = next(c for c in busy["conditions"] if c["type"] == "Accepted")
        assert (accepted["status"], accepted["reason"]) == ("False", "PortUnavailable")
        web = next(ls for ls in status["listeners"] if ls["name"] == "web")
        assert all(c["status"] == ("False" if c["type"] == "Conflicted" else "True")
                   for c in web["conditions"])
        # Later the port is tried again (still busy here: left out again, nothing flaps).
        await trio.sleep(ingress.UNAVAILABLE_RETRY + 1)
        assert engine.refused == 2 and ctl.unavailable == {9999}
        # Once free, the next try serves it.
        engine.busy = 0
        await trio.sleep(ingress.UNAVAILABLE_RETRY + 1)
        assert [lst.port for lst in engine.tables[-1].listeners] == [8080, 9999]
        assert ctl.unavailable == frozenset()
        n.cancel_scope.cancel()
