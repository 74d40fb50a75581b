"""The node's NetworkPolicy loop (fleet.agent.netpolicy) with a recording applier: which
pods it re-programs, how it coalesces, and what strict and non-strict modes do when a
pod's rules cannot be programmed.  The rules themselves come from the real engine and
renderer (fleet.network.policy, fleet.network.policy_nft); times under MockClock."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from fleet.agent.netpolicy import (
    Desired,
    EnforcerConfig,
    PolicyEnforcer,
    local_targets,
    namespace_change_matters,
    plan_applies,
    pod_change_matters,
)
from fleet.network.nft import NftError
from fleet.network.policy_nft import deny_all

NODE = "n1"
NETNS_DIR = "/run/fleet-test-netns"


def pod(name: str, uid: str, *, ns: str = "default", node: str = NODE, ip: str = "10.42.0.9",
        labels: dict[str, str] | None = None, host_network: bool = False,
        phase: str = "Running") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "labels": labels or {}},
            "spec": {"nodeName": node, "hostNetwork": host_network,
                     "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}],
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def deny_ingress(name: str = "deny", ns: str = "default", selector: dict[str, str] | None = None,
                 ingress: list[Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"podSelector": {"matchLabels": selector or {}}, "policyTypes": ["Ingress"],
                     "ingress": ingress or []}}


def path(uid: str) -> str:
    return f"{NETNS_DIR}/{uid}"


class Recorder:
    """The applier: records (netns, script); fails for netns in `fail` (or only for
    scripts other than deny-all in `fail_rules`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail: set[str] = set()
        self.fail_rules: set[str] = set()

    async def __call__(self, script: str, netns: str) -> None:
        await trio.sleep(0)
        if netns in self.fail or (netns in self.fail_rules and script != DENY):
            raise NftError("nft -f - failed (exit 1)", "Error: Could not process rule: Operation not permitted")
        self.calls.append((netns, script))

    def netns_applied(self) -> list[str]:
        return [n for n, _ in self.calls]


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    async def record(self, pod: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.recorded.append((pod["metadata"]["name"], type_, reason, message))


ALWAYS = ("10.42.0.1", "192.168.1.10")
DENY = deny_all(always_allow=ALWAYS)


@pytest.fixture
def world() -> dict[str, Any]:
    return {"policies": [], "pods": [pod("a", "ua", labels={"app": "a"}),
                                     pod("b", "ub", labels={"app": "b"}, ip="10.42.0.10"),
                                     pod("remote", "ur", node="n2", ip="10.42.1.5")],
            "namespaces": [{"metadata": {"name": "default", "labels": {}}}],
            "services": [], "slices": [], "netns": {path("ua"), path("ub")}}


async def no_table(netns: str) -> bool:
    return False


def enforcer(world: dict[str, Any], *, strict: bool = False, **kw: Any) -> tuple[PolicyEnforcer, Recorder, Events]:
    rec, ev = Recorder(), Events()
    table_exists = kw.pop("table_exists", no_table)
    cfg = EnforcerConfig(node_name=NODE, netns_dir=NETNS_DIR, strict=strict, always_allow=ALWAYS,
                         min_sync_interval=0.1, resync_interval=kw.pop("resync_interval", 1e6), **kw)
    e = PolicyEnforcer(cfg, apply=rec, events=ev, netns_exists=lambda p: p in world["netns"],
                       table_exists=table_exists, plan_in_thread=False)
    for key in ("policies", "pods", "namespaces", "services", "slices"):
        e.sources[key] = lambda key=key: world[key]
    return e, rec, ev


# -- pure decisions ---------------------------------------------------------------------

def test_a_status_heartbeat_is_not_a_change_but_labels_and_ips_are() -> None:
    old = pod("a", "ua", labels={"app": "a"})
    beat = copy.deepcopy(old)
    beat["status"]["conditions"][0]["lastProbeTime"] = "now"
    assert not pod_change_matters(old, beat)
    for mutate in (lambda p: p["metadata"]["labels"].update(app="x"),
                   lambda p: p["status"].update(podIPs=[{"ip": "10.42.0.77"}], podIP="10.42.0.77"),
                   lambda p: p["status"].update(phase="Succeeded"),
                   lambda p: p["spec"]["containers"][0]["ports"][0].update(name="web")):
        new = copy.deepcopy(old)
        mutate(new)
        assert pod_change_matters(old, new)
    ns = {"metadata": {"name": "x", "labels": {"team": "a"}, "resourceVersion": "1"}}
    assert not namespace_change_matters(ns, {**ns, "status": {"phase": "Active"}})
    assert namespace_change_matters(ns, {"metadata": {"name": "x", "labels": {"team": "b"}}})


def test_local_targets_are_this_nodes_pods_with_a_netns() -> None:
    pods = [pod("a", "ua"), pod("host", "uh", host_network=True), pod("other", "uo", node="n2"),
            pod("done", "ud", phase="Succeeded"), pod("early", "ue")]
    got = local_targets(pods, NODE, NETNS_DIR, lambda p: p != path("ue"))
    assert [(t.uid, t.netns) for t in got] == [("ua", path("ua"))]


def test_plan_applies_skips_unchanged_and_backing_off() -> None:
    desired = {"a": "A2", "b": "B", "c": "C", "d": None}
    applied = {"a": "A1", "b": "B"}
    due, wake = plan_applies(desired, applied, {"c": 12.0}, now=10.0)
    assert due == ["a", "d"] and wake == 12.0
    due, wake = plan_applies(desired, applied, {"c": 12.0}, now=12.0)
    assert due == ["a", "c", "d"] and wake is None


# -- the loop -----------------------------------------------------------------------------

async def test_only_pods_whose_script_changed_are_reapplied(world: dict[str, Any]) -> None:
    e, rec, _ = enforcer(world)
    report, _ = await e.sync()
    assert sorted(report.applied) == ["ua", "ub"] and sorted(rec.netns_applied()) == [path("ua"), path("ub")]
    assert "policy accept" in rec.calls[0][1]  # no policy: not isolated
    rec.calls.clear()
    await e.sync()
    assert rec.calls == []  # nothing changed: no nft at all
    # A policy selecting b only re-programs b.
    world["policies"].append(deny_ingress(selector={"app": "b"}))
    await e.sync()
    assert rec.netns_applied() == [path("ub")] and "policy drop" in rec.calls[0][1]
    rec.calls.clear()
    # An allow rule naming a peer by label: relabelling the (remote) peer changes b's rules.
    world["policies"].append(deny_ingress("allow", selector={"app": "b"},
                                          ingress=[{"from": [{"podSelector": {"matchLabels": {"role": "c"}}}]}]))
    await e.sync()
    rec.calls.clear()
    world["pods"][2]["metadata"]["labels"] = {"role": "c"}
    await e.sync()
    assert rec.netns_applied() == [path("ub")] and "10.42.1.5" in rec.calls[0][1]
    assert e.passes == 5


async def test_a_burst_of_changes_is_one_pass(world: dict[str, Any], autojump_clock: Any) -> None:
    e, rec, _ = enforcer(world)
    async with trio.open_nursery() as n:
        n.start_soon(e.loop)
        await trio.sleep(1)
        assert e.passes == 1
        for i in range(5):  # five changes inside the coalescing window
            world["pods"][0]["metadata"]["labels"] = {"app": f"a{i}"}
            e.wake()
            await trio.sleep(0.01)
        await trio.sleep(1)
        assert e.passes == 2
        n.cancel_scope.cancel()


async def test_non_strict_failure_keeps_previous_rules_warns_and_retries(
        world: dict[str, Any], autojump_clock: Any) -> None:
    e, rec, ev = enforcer(world)
    await e.sync()
    before = e.applied["ub"]
    rec.fail.add(path("ub"))
    world["policies"].append(deny_ingress(selector={"app": "b"}))
    report, wake = await e.sync()
    assert report.failed == ["ub"] and report.fenced == []
    assert e.applied["ub"] == before  # the old table is still what the kernel holds
    assert [(n, t, r) for n, t, r, _ in ev.recorded] == [("b", "Warning", "NetworkPolicyFailed")]
    assert "previous rules stay in force" in ev.recorded[0][3]
    assert "Operation not permitted" in ev.recorded[0][3]
    assert wake == pytest.approx(trio.current_time() + 1.0)
    # Backing off: the next pass does not retry yet.
    rec.calls.clear()
    await e.sync()
    assert rec.calls == []
    # Due: retried, fails again, back-off doubles.
    await trio.sleep(1.0)
    _, wake = await e.sync()
    assert wake == pytest.approx(trio.current_time() + 2.0)
    rec.fail.clear()
    await trio.sleep(2.0)
    report, wake = await e.sync()
    assert report.applied == ["ub"] and wake is None and "policy drop" in e.applied["ub"]


async def test_different_rules_are_tried_at_once_despite_the_back_off(
        world: dict[str, Any], autojump_clock: Any) -> None:
    e, rec, _ = enforcer(world)
    await e.sync()
    rec.fail_rules.add(path("ub"))
    world["policies"].append(deny_ingress(selector={"app": "b"}))
    report, _ = await e.sync()
    assert report.failed == ["ub"]
    rec.fail_rules.clear()
    world["policies"][0]["spec"]["ingress"] = [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]
    report, wake = await e.sync()  # no time has passed: not the script that failed
    assert report.applied == ["ub"] and wake is None and e.retry == {}


async def test_a_pod_never_programmed_says_its_traffic_is_not_filtered(world: dict[str, Any]) -> None:
    e, rec, ev = enforcer(world)
    rec.fail.add(path("ua"))
    await e.sync()
    assert "ua" not in e.applied
    assert "not filtered" in ev.recorded[0][3]


async def test_strict_failure_fences_the_pod_with_deny_all(world: dict[str, Any]) -> None:
    e, rec, ev = enforcer(world, strict=True)
    await e.sync()
    rec.fail_rules.add(path("ub"))  # nft refuses b's real rules, not deny-all
    world["policies"].append(deny_ingress(selector={"app": "b"}))
    report, _ = await e.sync()
    assert report.failed == ["ub"] and report.fenced == ["ub"]
    assert rec.calls[-1] == (path("ub"), DENY) and e.applied["ub"] == DENY
    assert "strict mode: the pod gets no traffic" in ev.recorded[-1][3]
    # If even deny-all fails, the Event says so and nothing is assumed about the kernel.
    rec.fail.add(path("ua"))
    world["pods"][0]["metadata"]["labels"] = {"app": "changed"}
    world["policies"].append(deny_ingress("d2", selector={"app": "changed"}))
    await e.sync()
    assert "ua" not in e.applied
    assert "deny-all could not be installed either" in ev.recorded[-1][3]


async def test_strict_render_failure_fences_too(world: dict[str, Any]) -> None:
    e, rec, ev = enforcer(world, strict=True)

    def broken(targets: Any, **kw: Any) -> dict[str, Desired]:
        return {t.uid: Desired(None, error="ValueError: bad rules") for t in targets}

    e.compute = broken
    report, _ = await e.sync()
    assert sorted(report.fenced) == ["ua", "ub"]
    assert all(script == DENY for _, script in rec.calls)
    assert "bad rules" in ev.recorded[0][3]


async def test_an_engine_failure_is_every_pods_failure_not_a_crash(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import fleet.agent.netpolicy as netpolicy

    def broken(view: Any) -> Any:
        raise RuntimeError("engine bug")

    monkeypatch.setattr(netpolicy, "PolicyIndex", broken)
    e, rec, ev = enforcer(world, strict=True)
    report, _ = await e.sync()
    assert sorted(report.fenced) == ["ua", "ub"] and all("engine bug" in m for *_, m in ev.recorded)


async def test_prepare_netns_fences_first_then_waits_for_the_rules(
        world: dict[str, Any], autojump_clock: Any) -> None:
    e, rec, _ = enforcer(world, strict=True)
    world["netns"].add(path("un"))
    new = pod("new", "un", labels={"app": "new"}, ip="10.42.0.20")
    world["pods"].append(new)
    async with trio.open_nursery() as n:
        n.start_soon(e.loop)
        await trio.sleep(1)
        rec.calls.clear()
        e.applied.pop("un")  # as if the netns had only just appeared
        t0 = trio.current_time()
        await e.prepare_netns(new, path("un"))
        assert rec.calls[0] == (path("un"), DENY)  # fenced before anything else
        assert rec.calls[1][0] == path("un") and rec.calls[1][1] != DENY  # then its rules
        assert trio.current_time() - t0 < 1.0
        n.cancel_scope.cancel()


async def test_prepare_netns_fails_the_setup_when_even_deny_all_fails(world: dict[str, Any]) -> None:
    e, rec, _ = enforcer(world, strict=True)
    rec.fail.add(path("ua"))
    with pytest.raises(NftError):
        await e.prepare_netns(world["pods"][0], path("ua"))


async def test_an_adopted_pod_keeps_its_table_on_agent_restart(world: dict[str, Any]) -> None:
    async def present(netns: str) -> bool:
        return True

    e, rec, _ = enforcer(world, strict=True, table_exists=present)
    await e.prepare_netns(world["pods"][0], path("ua"))
    assert rec.calls == [] and "ua" not in e.applied  # no fence; the first pass replaces it


async def test_prepare_netns_in_non_strict_mode_does_not_fence(
        world: dict[str, Any], autojump_clock: Any) -> None:
    e, rec, _ = enforcer(world, first_program_timeout=2.0)
    # The loop has not started: no wait at all, nothing applied.
    t0 = trio.current_time()
    await e.prepare_netns(world["pods"][0], path("ua"))
    assert rec.calls == [] and trio.current_time() == t0
    # Once it has run, a set-up waits for its pass — bounded (here no pass comes).
    e.synced.set()
    t0 = trio.current_time()
    await e.prepare_netns(world["pods"][0], path("ua"))
    assert trio.current_time() - t0 == pytest.approx(2.0)


async def test_unenforceable_driver_warns_once_per_selected_pod(world: dict[str, Any]) -> None:
    e, rec, ev = enforcer(world, strict=True, enforceable=False, driver="process")
    world["policies"].append(deny_ingress(selector={"app": "b"}))
    await e.sync()
    await e.sync()
    assert rec.calls == []
    assert [(n, r) for n, _, r, _ in ev.recorded] == [("b", "NetworkPolicyFailed")]
    msg = ev.recorded[0][3]
    assert "default/deny" in msg and "process" in msg and "unprotected" in msg
    await e.prepare_netns(world["pods"][1], path("ub"))  # no fence either: it would not hold
    assert rec.calls == []


async def test_deleted_pods_are_forgotten_and_lost_tables_come_back(
        world: dict[str, Any], autojump_clock: Any) -> None:
    present = {path("ua"): True, path("ub"): False}

    async def table_exists(netns: str) -> bool:
        return present[netns]

    e, rec, _ = enforcer(world, resync_interval=5.0, table_exists=table_exists)
    async with trio.open_nursery() as n:
        n.start_soon(e.loop)
        await trio.sleep(1)
        rec.calls.clear()
        await trio.sleep(5)  # the periodic check: b's table went, only b is re-applied
        assert rec.netns_applied() == [path("ub")]
        world["netns"].discard(path("ua"))
        world["pods"].pop(0)
        e.wake()
        await trio.sleep(1)
        assert "ua" not in e.applied and "ub" in e.applied
        n.cancel_scope.cancel()


class FakeClient:
    """list_all + watch for the informers, fed through memory channels."""

    def __init__(self, objs: dict[str, list[dict[str, Any]]]) -> None:
        self.objs = objs
        self.send: dict[str, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._recv: dict[str, trio.MemoryReceiveChannel[dict[str, Any]]] = {}
        for plural in objs:
            self.send[plural], self._recv[plural] = trio.open_memory_channel(100)

    async def list_all(self, api_version: str, plural: str, namespace: str | None = None,
                       **kw: Any) -> dict[str, Any]:
        return {"items": copy.deepcopy(self.objs[plural]), "metadata": {"resourceVersion": "1"}}

    async def watch(self, api_version: str, plural: str, namespace: str | None = None,
                    **kw: Any) -> AsyncIterator[dict[str, Any]]:
        async for event in self._recv[plural]:
            yield event


async def test_run_reacts_to_informer_events_but_not_to_heartbeats(
        world: dict[str, Any], autojump_clock: Any) -> None:
    e, rec, _ = enforcer(world)
    e.sources = {}
    for p in world["pods"]:
        p["metadata"]["resourceVersion"] = "1"
    client = FakeClient({"networkpolicies": [], "pods": world["pods"],
                         "namespaces": world["namespaces"], "services": [], "endpointslices": []})
    async with trio.open_nursery() as n:
        await n.start(lambda task_status: e.run(client, task_status=task_status))
        assert sorted(rec.netns_applied()) == [path("ua"), path("ub")]
        passes = e.passes
        beat = copy.deepcopy(world["pods"][1])
        beat["metadata"]["resourceVersion"] = "2"
        beat["status"]["conditions"][0]["lastProbeTime"] = "t"
        await client.send["pods"].send({"type": "MODIFIED", "object": beat})
        await trio.sleep(1)
        assert e.passes == passes  # a heartbeat wakes nobody
        pol = deny_ingress(selector={"app": "b"})
        pol["metadata"].update(uid="p1", resourceVersion="3")
        await client.send["networkpolicies"].send({"type": "ADDED", "object": pol})
        await trio.sleep(1)
        assert e.passes == passes + 1 and rec.calls[-1][0] == path("ub")
        assert "policy drop" in rec.calls[-1][1]
        n.cancel_scope.cancel()


async def test_the_new_pod_fence_never_lands_after_its_rules(
        world: dict[str, Any], autojump_clock: Any) -> None:
    """nft commits a ruleset before its process exits: if a pass's `nft` for the new pod
    commits, then the fence commits, then the pass notes its rules as applied, the kernel
    holds deny-all while the enforcer believes otherwise.  The fence waits for the pass."""
    kernel: dict[str, str] = {}

    async def apply(script: str, netns: str) -> None:
        if script == DENY:
            kernel[netns] = script
            return
        await trio.sleep(0.3)
        kernel[netns] = script  # committed...
        await trio.sleep(0.5)  # ...but nft has not exited yet

    e, _, _ = enforcer(world, strict=True)
    e._apply = apply
    async with trio.open_nursery() as n:
        n.start_soon(e.loop)
        await trio.sleep(0.5)  # the first pass is loading a's rules
        await e.prepare_netns(world["pods"][0], path("ua"))
        await trio.sleep(2)
        assert kernel[path("ua")] != DENY and kernel[path("ua")] == e.applied["ua"]
        n.cancel_scope.cancel()


# -- configuration ------------------------------------------------------------------------

def test_strict_mode_flags_reach_the_agent_config(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import fleet.agent.run as agent_run
    import fleet.cli.main as cli
    import fleet.server.run as server_run

    seen: list[Any] = []
    with monkeypatch.context() as m:  # partial(supervise, "agent", partial(run, cfg), ...)
        m.setattr(cli.trio, "run", lambda fn, *a: seen.append(fn.args[1].args[0]))
        for args, strict in (([], False), (["--network-policy-strict"], True)):
            cli.app(["agent", "--server", "https://127.0.0.1:1", "--data-dir", str(tmp_path), *args],
                    result_action="return_value")
            assert seen.pop().network_policy_strict is strict

    async def fake_server(cfg: Any, **kw: Any) -> None:
        seen.append(cfg)
        raise OSError("recorded, not started")

    monkeypatch.setattr(server_run, "run", fake_server)
    with pytest.raises(SystemExit):
        cli.app(["server", "--data-dir", str(tmp_path), "--network-policy-strict"])
    server_cfg = seen.pop()
    assert server_cfg.agent_network_policy_strict is True

    async def fake_agent(cfg: Any, **kw: Any) -> None:
        seen.append(cfg)

    monkeypatch.setattr(agent_run, "run", fake_agent)
    from fleet.client import ClientConfig

    trio.run(lambda: server_run._run_agent(server_cfg, "https://127.0.0.1:1", "n1",
                                           ClientConfig(server="https://127.0.0.1:1")))
    assert seen.pop().network_policy_strict is True


def test_the_process_driver_is_not_enforceable(tmp_path: Any) -> None:
    from fleet.agent.config import AgentConfig
    from fleet.agent.run import make_policy_enforcer

    class Net:
        gateway = "10.42.0.1"

    class Process:
        name, joins_pod_netns = "process", False

    class Oci:
        name = "oci"

    cfg = AgentConfig(node_name=NODE, network_policy_strict=True)
    e = make_policy_enforcer(cfg, Process(), Net(), "192.168.1.10", None)
    assert not e.cfg.enforceable and e.cfg.strict and e.cfg.driver == "process"
    e = make_policy_enforcer(cfg, Oci(), Net(), "192.168.1.10", None)
    assert e.cfg.enforceable and e.cfg.always_allow == ("10.42.0.1", "192.168.1.10")


def test_the_slim_pod_the_enforcer_caches_gives_the_same_rules_and_facts() -> None:
    # The enforcer caches every pod of the cluster through `slim_pod`: the rules of a
    # pod, and of its peers, must not change for what was dropped.
    from fleet.agent.netpolicy import pod_policy_facts, slim_pod
    from fleet.network.policy import PolicyView, rules_for

    full = [pod("web", "u1", labels={"app": "web"}), pod("cli", "u2", ip="10.42.1.5", labels={"app": "cli"})]
    for p in full:
        p["spec"]["containers"][0].update(image="busybox", env=[{"name": "A", "value": "b"}],
                                          resources={"limits": {"cpu": "1"}})
        p["spec"]["initContainers"] = [{"name": "side", "image": "x", "restartPolicy": "Always",
                                        "ports": [{"name": "metrics", "containerPort": 9100}]}]
        p["metadata"]["annotations"] = {"big": "x" * 1000}
    slim = [slim_pod(copy.deepcopy(p)) for p in full]
    assert "image" not in slim[0]["spec"]["containers"][0] and "annotations" not in slim[0]["metadata"]
    pol = deny_ingress(ingress=[{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}],
                                 "ports": [{"port": "http"}, {"port": "metrics"}]}])
    view_full = PolicyView([pol], full, [], [], [])
    view_slim = PolicyView([pol], slim, [], [], [])
    for f, s in zip(full, slim, strict=True):
        assert rules_for(s, view_slim) == rules_for(f, view_full)
        assert pod_policy_facts(s) == pod_policy_facts(f)
    # the sidecar's named port is one of the pod's ports
    changed = copy.deepcopy(full[0])
    changed["spec"]["initContainers"][0]["ports"][0]["containerPort"] = 9200
    assert pod_change_matters(full[0], changed)
