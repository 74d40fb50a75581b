"""The pod worker against an in-memory Driver and API client, under Trio's MockClock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from fleet.agent.images import ImageInfo
from fleet.agent.worker import PodWorker, WorkerEnv
from fleet.runtime.driver import (
    ContainerHandle,
    ContainerState,
    ContainerStatus,
    ExitStatus,
    RuntimeDriverError,
    Sandbox,
)


def _exit(code: int) -> ExitStatus:
    return ExitStatus(exit_code=code, signal=None, oom_killed=False,
                      finished_at=datetime.now(UTC), reason="Completed" if code == 0 else "Error")


@dataclass
class FakeDriver:
    """Containers "run" for a scripted time, then exit with a scripted code."""

    script: list[tuple[float, int]]  # (seconds running, exit code) per start, in order
    ignore_term: bool = False
    # exec: argv -> (seconds it takes, exit code); the default is a 1 s success.
    exec_fn: Callable[[list[str]], tuple[float, int]] = lambda argv: (1, 0)
    name: str = "fake"
    state_dir: Path = Path("/nonexistent")
    events: list[tuple[float, str]] = field(default_factory=list)
    _exits: dict[str, trio.Event] = field(default_factory=dict)
    _codes: dict[str, int] = field(default_factory=dict)
    n: int = 0
    # Set once the worker built the sandbox: its set-up writes files in a worker thread,
    # during which MockClock's autojump may move time, so tests measure from here.
    sandbox_made: trio.Event = field(default_factory=trio.Event)

    def log(self, what: str) -> None:
        self.events.append((trio.current_time(), what))

    async def create_sandbox(self, spec: Any) -> Sandbox:
        self.log("sandbox")
        self.sandbox_made.set()
        return Sandbox(id=spec.pod_uid, spec=spec, cgroup_parent="x", state_dir=Path("/x"))

    async def start(self, sandbox: Sandbox, c: Any) -> ContainerHandle:
        cid = f"c{self.n}"
        run_for, code = self.script[min(self.n, len(self.script) - 1)]
        self.n += 1
        self.log(f"start {c.name} attempt={c.attempt}")
        ev = trio.Event()
        self._exits[cid] = ev

        async def live() -> None:
            await trio.sleep(run_for)
            self._codes.setdefault(cid, code)
            ev.set()
        self._nursery.start_soon(live)
        return ContainerHandle(id=cid, name=c.name, sandbox_id=sandbox.id, pid=1, shim_pid=1,
                               started_at=datetime.now(UTC), bundle=Path("/x"),
                               log_path=Path("/x"), attempt=c.attempt, labels=c.labels)

    async def wait(self, h: ContainerHandle) -> ExitStatus:
        await self._exits[h.id].wait()
        return _exit(self._codes[h.id])

    async def stop(self, h: ContainerHandle, grace: float) -> ExitStatus:
        self.log("TERM")
        if not self.ignore_term:
            self._codes.setdefault(h.id, 143)
            self._exits[h.id].set()
        with trio.move_on_after(grace):
            await self._exits[h.id].wait()
        if not self._exits[h.id].is_set():
            self.log("KILL")
            self._codes.setdefault(h.id, 137)
            self._exits[h.id].set()
        return await self.wait(h)

    async def exec(self, h: ContainerHandle, argv: Any, **kw: Any) -> int:
        self.log(f"exec {' '.join(argv)}")
        if self._exits[h.id].is_set():
            raise RuntimeDriverError(f"container {h.id} is not running")
        seconds, code = self.exec_fn(list(argv))
        await trio.sleep(seconds)
        return code

    async def inspect(self, h: ContainerHandle) -> ContainerState:
        done = self._exits[h.id].is_set()
        return ContainerState(ContainerStatus.EXITED if done else ContainerStatus.RUNNING, 1,
                              h.started_at, _exit(self._codes[h.id]) if done else None)

    async def remove(self, h: ContainerHandle) -> None:
        self.log(f"remove {h.id}")

    async def remove_sandbox(self, sb: Sandbox) -> None:
        self.log("remove_sandbox")


class FakeImages:
    async def ensure(self, image: str, policy: Any, secrets: Any) -> ImageInfo:
        return ImageInfo(ref=image, image_id="sha256:abc", layers=[Path("/l")], config={})


class FakeClient:
    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver
        self.statuses: list[dict[str, Any]] = []
        self.deletes: list[dict[str, Any]] = []

    async def patch(self, *a: Any, **kw: Any) -> dict[str, Any]:
        self.statuses.append(a[3]["status"])
        return {}

    async def delete(self, *a: Any, body: Any = None, **kw: Any) -> dict[str, Any]:
        self.driver.log("delete")
        self.deletes.append(body)
        return {}

    async def get_object(self, *a: Any, **kw: Any) -> dict[str, Any]:
        raise AssertionError("not used")


def make_pod(restart: str = "Always", grace: int = 30, pre_stop: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "app", "image": "img", "command": ["run"]}
    if pre_stop:
        c["lifecycle"] = {"preStop": {"exec": {"command": ["cleanup"]}}}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "uid1"},
            "spec": {"nodeName": "n", "restartPolicy": restart,
                     "terminationGracePeriodSeconds": grace, "hostNetwork": True,
                     "containers": [c]}}


async def start_worker(tmp_path: Path, driver: FakeDriver, pod: dict[str, Any],
                       nursery: trio.Nursery) -> tuple[PodWorker, FakeClient]:
    driver._nursery = nursery  # type: ignore[attr-defined]
    client = FakeClient(driver)
    env = WorkerEnv(client=client, driver=driver, images=FakeImages(), data_dir=tmp_path,
                    host_ip="10.0.0.1", status_min_interval=0)
    w = PodWorker(pod, env)
    nursery.start_soon(w.run)
    await driver.sandbox_made.wait()
    return w, client


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def _starts(driver: FakeDriver) -> list[float]:
    return [t for t, e in driver.events if e.startswith("start")]


def test_crash_loop_backoff_doubles_and_caps(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(1, 1)])

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, make_pod("Always"), n)
            await trio.sleep(1500)
            c = w.apps[0]
            assert c.view.state.get("waiting", {}).get("reason") == "CrashLoopBackOff" or \
                "running" in c.view.state
            assert c.view.last_state["terminated"]["exitCode"] == 1
            assert c.view.restart_count == len(_starts(driver)) - 1
            reported = client.statuses[-1]
            assert reported["phase"] == "Running"
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    starts = _starts(driver)
    gaps = [round(b - a) for a, b in zip(starts, starts[1:], strict=False)]
    # Each run lasts 1s, then back-off 10, 20, 40, 80, 160, 300, 300...
    assert gaps[:7] == [11, 21, 41, 81, 161, 301, 301]


def test_never_pod_fails_with_exit_code(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(5, 3)])

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, make_pod("Never"), n)
            await trio.sleep(100)
            assert w.finished.is_set()
            st = client.statuses[-1]
            assert st["phase"] == "Failed"
            cs = st["containerStatuses"][0]
            assert cs["state"]["terminated"]["exitCode"] == 3 and cs["restartCount"] == 0
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert len(_starts(driver)) == 1


def test_onfailure_success_and_retry(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(1, 2), (1, 0)])

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, make_pod("OnFailure"), n)
            await trio.sleep(100)
            st = client.statuses[-1]
            assert st["phase"] == "Succeeded"
            assert st["containerStatuses"][0]["restartCount"] == 1
            assert st["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 0
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)


def test_graceful_deletion_order(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(10_000, 0)], ignore_term=True)

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, make_pod(grace=30, pre_stop=True), n)
            await trio.sleep(5)
            pod = make_pod(grace=30, pre_stop=True)
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            pod["metadata"]["deletionGracePeriodSeconds"] = 20
            t0 = trio.current_time()
            w.update(pod)
            await w.done.wait()
            assert client.deletes == [{"apiVersion": "v1", "kind": "DeleteOptions",
                                       "gracePeriodSeconds": 0,
                                       "preconditions": {"uid": "uid1"}}]
            kinds = [e for _, e in driver.events if not e.startswith(("start", "sandbox"))]
            assert kinds == ["exec cleanup", "TERM", "KILL", "remove c0", "remove_sandbox",
                             "delete"]
            times = {e: t for t, e in driver.events}
            assert times["TERM"] - t0 == pytest.approx(1)  # after the 1s preStop hook
            assert times["KILL"] - t0 == pytest.approx(20)  # at the deletion's grace period
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)


def test_object_gone_tears_down_without_delete(tmp_path: Path,
                                               clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(10_000, 0)])

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, make_pod(grace=5), n)
            await trio.sleep(5)
            w.gone()
            await w.done.wait()
            assert client.deletes == []
            assert [e for _, e in driver.events][-3:] == ["TERM", "remove c0", "remove_sandbox"]
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)


# ---------------------------------------------------------------------------------------
# Probes and lifecycle hooks


def probe_pod(restart: str = "Always", grace: int = 5, **container: Any) -> dict[str, Any]:
    pod = make_pod(restart, grace)
    pod["spec"]["containers"][0].update(container)
    return pod


def exec_probe(cmd: str, **kw: Any) -> dict[str, Any]:
    return {"exec": {"command": [cmd]}, "periodSeconds": 1, **kw}


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def test_liveness_failure_restarts_with_backoff(tmp_path: Path,
                                                clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(10_000, 0)],
                        exec_fn=lambda argv: (0, 1 if argv == ["alive?"] else 0))
    pod = probe_pod(livenessProbe=exec_probe("alive?", initialDelaySeconds=3,
                                             failureThreshold=1))

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, pod, n)
            await trio.sleep(100)
            c = w.apps[0]
            assert c.view.restart_count == len(_starts(driver)) - 1 >= 3
            term = c.view.last_state["terminated"]
            assert term["exitCode"] == 143
            assert term["message"].startswith("Liveness probe failed: command ['alive?'] "
                                              "exited with 1")
            assert "container app failed liveness probe, will be restarted" in term["message"]
            reported = client.statuses[-1]["containerStatuses"][0]
            assert reported["restartCount"] == c.view.restart_count
            assert reported["lastState"]["terminated"]["exitCode"] == 143
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    starts = _starts(driver)
    gaps = [round(b - a) for a, b in zip(starts, starts[1:], strict=False)]
    # Killed 3 s after each start (initialDelaySeconds), then back-off 10, 20, 40.
    assert gaps[:3] == [13, 23, 43]
    # Each kill is a TERM right at the failed probe, never a SIGKILL (it obeys TERM).
    terms = [t for t, e in driver.events if e == "TERM"]
    assert [round(t - s) for s, t in zip(starts, terms, strict=False)][:3] == [3, 3, 3]


def test_liveness_failure_with_restart_never_fails_the_pod(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(10_000, 0)], exec_fn=lambda argv: (0, 1))
    pod = probe_pod("Never", livenessProbe=exec_probe("alive?", failureThreshold=2))

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, pod, n)
            await trio.sleep(60)
            assert w.finished.is_set()
            st = client.statuses[-1]
            assert st["phase"] == "Failed"
            assert st["containerStatuses"][0]["restartCount"] == 0
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert len(_starts(driver)) == 1
    # failureThreshold 2, period 1: the second failed probe (t=1) kills it.
    assert [round(t) for t, e in driver.events if e == "TERM"] == \
        [round(_starts(driver)[0] + 1)]


def test_readiness_flips_ready_and_the_ready_condition(tmp_path: Path,
                                                      clock: trio.testing.MockClock) -> None:
    ready = {"now": False}
    driver = FakeDriver(script=[(10_000, 0)],
                        exec_fn=lambda argv: (0, 0 if ready["now"] else 1))
    pod = probe_pod(readinessProbe=exec_probe("ready?", failureThreshold=1))

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, pod, n)
            await trio.sleep(5.5)
            c = w.apps[0]
            assert "running" in c.view.state and c.view.started and not c.view.ready
            st = client.statuses[-1]
            assert st["phase"] == "Running"
            assert conditions(st)["ContainersReady"] == "False"
            assert conditions(st)["Ready"] == "False"
            assert st["containerStatuses"][0]["ready"] is False

            ready["now"] = True
            await trio.sleep(1)
            assert c.view.ready
            st = client.statuses[-1]
            assert conditions(st)["ContainersReady"] == "True"
            assert conditions(st)["Ready"] == "True"
            assert st["containerStatuses"][0]["ready"] is True

            ready["now"] = False
            await trio.sleep(1)
            assert not c.view.ready
            assert conditions(client.statuses[-1])["Ready"] == "False"
            # Readiness never restarts a container.
            assert len(_starts(driver)) == 1 and c.view.restart_count == 0
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)


def test_container_without_probes_is_ready_when_running(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(10_000, 0)])

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, make_pod(), n)
            await trio.sleep(1)
            cs = client.statuses[-1]["containerStatuses"][0]
            assert cs["ready"] is True and cs["started"] is True
            assert conditions(client.statuses[-1])["Ready"] == "True"
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert not any(e.startswith("exec") for _, e in driver.events)


def test_startup_probe_gates_readiness(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    started_after = 5.0
    t0: list[float] = []

    def exec_fn(argv: list[str]) -> tuple[float, int]:
        if argv == ["started?"]:
            return 0, 0 if trio.current_time() - t0[0] >= started_after else 1
        return 0, 0

    driver = FakeDriver(script=[(10_000, 0)], exec_fn=exec_fn)
    pod = probe_pod(startupProbe=exec_probe("started?", failureThreshold=30),
                    readinessProbe=exec_probe("ready?"))

    async def main() -> None:
        async with trio.open_nursery() as n:
            t0.append(trio.current_time())
            w, client = await start_worker(tmp_path, driver, pod, n)
            await trio.sleep(3.5)
            c = w.apps[0]
            assert "running" in c.view.state
            assert not c.view.started and not c.view.ready
            cs = client.statuses[-1]["containerStatuses"][0]
            assert cs["started"] is False and cs["ready"] is False
            assert not any(e == "exec ready?" for _, e in driver.events)
            await trio.sleep(5)
            assert c.view.started and c.view.ready
            assert conditions(client.statuses[-1])["Ready"] == "True"
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    first_ready = min(t for t, e in driver.events if e == "exec ready?")
    last_startup = max(t for t, e in driver.events if e == "exec started?")
    # Readiness probing began only after the startup probe had succeeded (and stopped).
    assert first_ready >= last_startup
    assert len(_starts(driver)) == 1


def test_startup_probe_failure_restarts(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(10_000, 0)], exec_fn=lambda argv: (0, 1))
    pod = probe_pod(startupProbe=exec_probe("started?", failureThreshold=3,
                                            terminationGracePeriodSeconds=1))

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, _ = await start_worker(tmp_path, driver, pod, n)
            await trio.sleep(20)
            term = w.apps[0].view.last_state["terminated"]
            assert term["message"].startswith("Startup probe failed:")
            assert w.apps[0].view.restart_count == 1
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)


def test_probe_grace_period_overrides_the_pods(tmp_path: Path,
                                               clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(10_000, 0)], ignore_term=True, exec_fn=lambda argv: (0, 1))
    pod = probe_pod(grace=30, livenessProbe=exec_probe(
        "alive?", failureThreshold=1, terminationGracePeriodSeconds=4))

    async def main() -> None:
        async with trio.open_nursery() as n:
            await start_worker(tmp_path, driver, pod, n)
            await trio.sleep(10)
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    times = {e: t for t, e in reversed(driver.events)}  # first occurrence of each
    assert times["KILL"] - times["TERM"] == pytest.approx(4)


def test_post_start_failure_kills_and_restarts(tmp_path: Path,
                                              clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(10_000, 0)],
                        exec_fn=lambda argv: (2, 7) if argv == ["hook"] else (0, 0))
    pod = probe_pod(lifecycle={"postStart": {"exec": {"command": ["hook"]}}})

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, pod, n)
            c = w.apps[0]
            await trio.sleep(1)
            # Not Running while its postStart handler runs.
            assert c.view.state == {"waiting": {"reason": "ContainerCreating"}}
            await trio.sleep(30)
            term = c.view.last_state["terminated"]
            assert term["reason"] == "FailedPostStartHook"
            assert "Exec lifecycle hook (['hook'])" in term["message"]
            assert "exited with 7" in term["message"]
            assert c.view.restart_count >= 1
            assert client.statuses[-1]["phase"] == "Running"  # crash-looping, as k8s
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    starts = _starts(driver)
    terms = [t for t, e in driver.events if e == "TERM"]
    # Killed when the 2 s hook failed; restarted after the 10 s back-off.
    assert round(terms[0] - starts[0]) == 2
    assert round(starts[1] - starts[0]) == 12


def test_post_start_success_then_running(tmp_path: Path,
                                         clock: trio.testing.MockClock) -> None:
    driver = FakeDriver(script=[(10_000, 0)], exec_fn=lambda argv: (2, 0))
    pod = probe_pod(lifecycle={"postStart": {"exec": {"command": ["hook"]}}})

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, _ = await start_worker(tmp_path, driver, pod, n)
            await trio.sleep(3)
            assert "running" in w.apps[0].view.state and w.apps[0].view.ready
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert "TERM" not in [e for _, e in driver.events]


def test_pre_stop_runs_before_term_and_is_bounded(tmp_path: Path,
                                                  clock: trio.testing.MockClock) -> None:
    # preStop hangs; the grace period (10 s) cuts it off, TERM follows at once and the
    # kubelet's 2 s minimum separates TERM from KILL.
    driver = FakeDriver(script=[(10_000, 0)], ignore_term=True,
                        exec_fn=lambda argv: (1_000, 0))
    pod = make_pod(grace=10, pre_stop=True)

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, pod, n)
            await trio.sleep(5)
            t0 = trio.current_time()
            w.terminate(10)
            await w.done.wait()
            times = {e: t - t0 for t, e in driver.events}
            kinds = [e for _, e in driver.events if not e.startswith(("start", "sandbox"))]
            assert kinds[:3] == ["exec cleanup", "TERM", "KILL"]
            assert times["exec cleanup"] == pytest.approx(0)
            assert times["TERM"] == pytest.approx(10)
            assert times["KILL"] == pytest.approx(12)
            term = client.statuses[-1]["containerStatuses"][0]["state"]["terminated"]
            assert term["exitCode"] == 137
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)


def test_status_rewritten_by_someone_else_is_reasserted(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """The node lifecycle controller marks pods NotReady on an unreachable node; once
    the agent sees that version of the pod it writes its own (Ready) view again."""
    driver = FakeDriver(script=[(10_000, 0)])

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, make_pod(), n)
            await trio.sleep(1)
            ours = client.statuses[-1]
            assert conditions(ours)["Ready"] == "True"
            writes = len(client.statuses)
            # Our own write coming back through the watch changes nothing.
            w.update({**make_pod(), "status": ours})
            await trio.sleep(1)
            assert len(client.statuses) == writes
            marked = {**ours, "conditions": [
                {**c, "status": "False"} if c["type"] == "Ready" else c
                for c in ours["conditions"]]}
            w.update({**make_pod(), "status": marked})
            await trio.sleep(1)
            assert len(client.statuses) == writes + 1
            assert conditions(client.statuses[-1])["Ready"] == "True"
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)


# ---------------------------------------------------------------------------------------
# Teardown: errors never vanish, the pod is finalized only once its resources are gone


class RecordingEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    async def record(self, pod: Any, type_: str, reason: str, message: str,
                     path: str | None = None) -> None:
        self.events.append((type_, reason, message))

    def forget(self, uid: str) -> None:
        pass


def test_teardown_retries_until_the_pod_is_gone_then_finalizes(
        tmp_path: Path, clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.agent import inventory

    # A container bundle of the pod that the driver fails to remove twice.
    bundle = tmp_path / "runtime" / "containers" / "c0"
    bundle.mkdir(parents=True)
    (bundle / "meta.json").write_text('{"id": "c0", "sandbox_id": "uid1"}')
    driver = FakeDriver(script=[(10_000, 0)])
    calls = []

    async def remove_sandbox(sb: Sandbox) -> None:
        calls.append(trio.current_time())
        if len(calls) < 3:
            raise RuntimeDriverError("device or resource busy")
        await trio.to_thread.run_sync(lambda: __import__("shutil").rmtree(bundle))

    driver.remove_sandbox = remove_sandbox  # type: ignore[method-assign]
    # The forced fallback cannot help either (so the retry is what is tested).
    monkeypatch.setattr(inventory, "remove_pod", lambda *a, **kw: inventory.Report(
        errors=["container c0: still busy"]))
    before = inventory.failures("teardown", "sandbox")
    events = RecordingEvents()

    async def main() -> None:
        async with trio.open_nursery() as n:
            w, client = await start_worker(tmp_path, driver, make_pod(grace=5), n)
            w.env.events = events
            await trio.sleep(5)
            pod = make_pod(grace=5)
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            w.update(pod)
            await trio.sleep(1.5)
            # Not finalized while the container is still on the machine.
            assert client.deletes == [] and not w.done.is_set()
            await w.done.wait()
            assert len(client.deletes) == 1
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert len(calls) == 3
    # Back-off between attempts: 1 s, then 2 s.  (MockClock's autojump may move time
    # while a worker thread lists the leftovers, so the first gap is only a lower bound.)
    gaps = [round(b - a) for a, b in zip(calls, calls[1:], strict=False)]
    assert gaps[0] >= 1 and gaps[1] == 2, gaps
    failed_kill = [e for e in events.events if e[1] == "FailedKillPod"]
    assert len(failed_kill) == 2 and all(e[0] == "Warning" for e in failed_kill)
    assert "device or resource busy" in failed_kill[0][2]
    assert "container c0 still there" in failed_kill[0][2]
    assert inventory.failures("teardown", "sandbox") == before + 2
    assert not bundle.exists()


def test_config_read_refused_at_first_is_retried(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """A 403 reading a configMap volume's ConfigMap (the Node authorizer's graph has not
    seen the pod's binding yet) is a set-up failure retried with back-off, not the end
    of the pod's worker.  (A configMap volume: a secret one would be a tmpfs mount.)"""
    from fleet.agent import volumes
    from fleet.client import ApiException

    driver = FakeDriver(script=[(10_000, 0)])
    reads: list[float] = []

    class RefusingOnce(FakeClient):
        async def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None,
                             **kw: Any) -> dict[str, Any]:
            assert (plural, name, namespace) == ("configmaps", "creds", "ns")
            reads.append(trio.current_time())
            if len(reads) == 1:
                raise ApiException({"code": 403, "reason": "Forbidden", "message": "configmaps is forbidden: ... "
                                    "no relationship found between node 'n' and this object"})
            return {"metadata": {"name": "creds"}, "data": {"k": "v"}}

    pod = make_pod()
    pod["spec"]["volumes"] = [{"name": "s", "configMap": {"name": "creds"}}]
    # Jump the clock only when the run has been idle a little while in real time: the
    # set-up's file writes in worker threads must not count as idle (they would let the
    # clock race past the deadline below on a busy machine).
    clock.autojump_threshold = 0.05

    async def main() -> None:
        async with trio.open_nursery() as n:
            driver._nursery = n  # type: ignore[attr-defined]
            env = WorkerEnv(client=RefusingOnce(driver), driver=driver, images=FakeImages(), data_dir=tmp_path,
                            host_ip="10.0.0.1", status_min_interval=0, volumes=volumes)
            w = PodWorker(pod, env)
            n.start_soon(w.run)
            # Set-up writes files in worker threads, during which MockClock's autojump
            # moves time: wait for the outcome, bounded, rather than a fixed while.
            with trio.fail_after(600):
                while not _starts(driver):
                    await trio.sleep(0.5)
            assert (tmp_path / "pods" / "uid1" / "volumes" / "s" / "k").read_text() == "v"
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert str(tmp_path) not in Path("/proc/mounts").read_text()
    assert len(reads) >= 2 and reads[1] - reads[0] >= 1.0  # retried after the back-off
