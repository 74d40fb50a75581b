"""The process driver end to end (runs as any user), plus the shim's log format.

Real `fleet shim` processes run real host commands; nothing is faked.  The helpers at the
top are shared with tests/e2e/test_runtime_oci.py, which runs the same lifecycle under
runc.  Every test cleans up through the `driver` fixture: containers still known to the
driver are killed and removed, sandboxes (and their cgroups) removed, state dirs deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from fleet.runtime import cgroups, crilog, shim
from fleet.runtime.driver import (
    ContainerHandle,
    ContainerSpec,
    ContainerStatus,
    Driver,
    Resources,
    Sandbox,
    SandboxSpec,
    ShimDriver,
    select_driver,
)
from fleet.runtime.process import ProcessDriver
from fleet.runtime.procfs import proc_start_time

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
IS_ROOT = os.geteuid() == 0


# ---------------------------------------------------------------------------------------
# Shared helpers (also imported by test_runtime_oci.py)


def parse_cri(path: Path) -> list[tuple[str, str, str, str]]:
    """(timestamp, stream, tag, content) per record of a CRI-format log."""
    out = []
    for line in path.read_text().splitlines():
        ts, stream, tag, content = (line.split(" ", 3) + [""])[:4]
        out.append((ts, stream, tag, content))
    return out


def log_text(path: Path, stream: str | None = None) -> str:
    try:
        return "\n".join(c for _, s, _, c in parse_cri(path) if stream in (None, s))
    except FileNotFoundError:
        return ""


async def wait_for(pred: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    with trio.move_on_after(timeout):
        while not pred():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}")


async def wait_log(handle: ContainerHandle, text: str, timeout: float = 10.0) -> None:
    await wait_for(lambda: text in log_text(handle.log_path), timeout,
                   f"{text!r} in the log {handle.log_path}")


class Collect:
    """An async output sink that keeps what it was given."""

    def __init__(self) -> None:
        self.data = b""

    async def __call__(self, chunk: bytes) -> None:
        self.data += chunk


# Tests keep their pod cgroups under their own parent, removed at the end of each test.
TEST_CGROUP_PARENT = "fleet-test"


def sandbox_spec(base: Path, name: str = "pod") -> SandboxSpec:
    uid = f"{name}-{os.urandom(4).hex()}"
    return SandboxSpec(pod_uid=uid, namespace="default", name=name, hostname=name,
                       log_dir=base / "logs" / uid, cgroup_parent=f"{TEST_CGROUP_PARENT}/{uid}")


async def cleanup_driver(driver: ShimDriver) -> list[str]:
    """Kill and remove every container and sandbox the driver knows; what failed."""
    problems = []
    with trio.fail_after(60):
        for h in await driver.recover():
            try:
                await driver.remove(h)
            except Exception as e:
                problems.append(f"container {h.id}: {e!r}")
        for sb in await driver.sandboxes():
            try:
                await driver.remove_sandbox(sb)
            except Exception as e:
                problems.append(f"sandbox {sb.id}: {e!r}")
        if driver.cgroups.version and driver.cgroups.writable():
            # Busy only while another test's pod still lives under it: then it stays.
            await trio.to_thread.run_sync(
                lambda: driver.cgroups.remove(TEST_CGROUP_PARENT, timeout=0.2))
    return problems


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# A stand-in agent for the recovery tests: starts the containers given on the command
# line, prints their handles, then waits to be killed.
AGENT_SCRIPT = r"""
import json, sys, trio
from pathlib import Path
from fleet.runtime.driver import ContainerSpec, SandboxSpec
from fleet.runtime.oci import OciDriver
from fleet.runtime.process import ProcessDriver

kind, state, layer, log_dir, uid, *commands = sys.argv[1:]

async def main():
  d = OciDriver(Path(state)) if kind == "oci" else ProcessDriver(Path(state))
  async with trio.open_nursery() as n:
    await n.start(d.serve)  # the warm shim launcher, as the agent runs it
    sb = await d.create_sandbox(SandboxSpec(pod_uid=uid, namespace="default", name="pod",
                                            log_dir=Path(log_dir),
                                            cgroup_parent=f"fleet-test/{uid}"))
    for i, cmd in enumerate(commands):
        h = await d.start(sb, ContainerSpec(name=f"c{i}", layers=[Path(layer)],
                                            command=["sh", "-c", cmd]))
        print(json.dumps(h.to_json()), flush=True)
    assert d.launcher.launched == len(commands), d.launcher.launched
    print("ready", flush=True)
    await trio.sleep_forever()

trio.run(main)
"""


def spawn_agent(kind: str, state: Path, layer: Path, log_dir: Path, uid: str,
                *commands: str) -> tuple[subprocess.Popen[str], list[ContainerHandle]]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-c", AGENT_SCRIPT, kind, str(state), str(layer),
                             str(log_dir), uid, *commands], stdout=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    handles = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "ready":
            break
        handles.append(ContainerHandle.from_json(json.loads(line)))
    else:
        proc.wait(10)
        raise AssertionError(f"agent exited with {proc.returncode} before starting")
    return proc, handles


def kill_agent(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


# ---------------------------------------------------------------------------------------
# Lifecycle tests, parametrized by a fixture that gives (driver, sandbox, layer).


class Env:
    def __init__(self, driver: ShimDriver, sandbox: Sandbox, layer: Path, base: Path,
                 kind: str) -> None:
        self.driver = driver
        self.sandbox = sandbox
        self.layer = layer
        self.base = base
        self.kind = kind

    def spec(self, command: list[str], **kw: object) -> ContainerSpec:
        return ContainerSpec(name=str(kw.pop("name", "c")), layers=[self.layer],
                             command=command, **kw)  # type: ignore[arg-type]

    async def run(self, command: list[str], **kw: object) -> ContainerHandle:
        return await self.driver.start(self.sandbox, self.spec(command, **kw))


@pytest.fixture
def base_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="fleet-rt-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def penv(base_dir: Path) -> AsyncIterator[Env]:
    driver = ProcessDriver(base_dir / "state")
    async with trio.open_nursery() as n:
        # Shims start through the warm launcher, as under the agent.
        await n.start(driver.serve)
        sb = await driver.create_sandbox(sandbox_spec(base_dir))
        try:
            yield Env(driver, sb, base_dir, base_dir, "process")
        finally:
            problems = await cleanup_driver(driver)
            n.cancel_scope.cancel()
            assert not problems, problems
            if driver._use_cgroups():
                assert not driver.cgroups.exists(sb.cgroup_parent), "pod cgroup left behind"


async def check_echo(env: Env) -> None:
    h = await env.run(["sh", "-c", "echo hello; echo oops >&2; printf 'no newline'"])
    st = await env.driver.wait(h)
    assert (st.exit_code, st.reason, st.signal, st.oom_killed) == (0, "Completed", None, False)
    records = parse_cri(h.log_path)
    assert [(s, t, c) for _, s, t, c in records if s == "stdout"] == [
        ("stdout", "F", "hello"), ("stdout", "F", "no newline")]
    assert [(s, t, c) for _, s, t, c in records if s == "stderr"] == [("stderr", "F", "oops")]
    for ts, *_ in records:
        assert len(ts) == 30 and ts.endswith("Z") and ts[10] == "T", ts
        time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")
    assert h.started_at <= st.finished_at
    state = await env.driver.inspect(h)
    assert state.status is ContainerStatus.EXITED and state.exit == st


async def check_not_found(env: Env) -> None:
    h = await env.run(["nope-not-a-command"])
    st = await env.driver.wait(h)
    assert st.exit_code != 0 and st.reason == "StartError"
    assert 'exec: "nope-not-a-command": executable file not found in $PATH' in st.message, \
        st.message
    assert h.pid == 0


async def check_exit_code(env: Env) -> None:
    h = await env.run(["sh", "-c", "exit 42"])
    st = await env.driver.wait(h)
    assert (st.exit_code, st.reason, st.signal) == (42, "Error", None)


async def check_sigterm(env: Env, shared: Path, inside: str) -> None:
    # The trap runs only once `wait` is interrupted, hence the background sleep.
    h = await env.run(["sh", "-c", f"trap 'echo got-term > {inside}/term; exit 0' TERM; "
                                   "echo ready; sleep 1000 & wait"])
    await wait_log(h, "ready")
    t0 = time.monotonic()
    st = await env.driver.stop(h, grace=10)
    assert time.monotonic() - t0 < 5
    assert (shared / "term").read_text() == "got-term\n"
    assert (st.exit_code, st.reason) == (0, "Completed")


async def check_sigkill_at_grace(env: Env) -> None:
    h = await env.run(["sh", "-c", "trap '' TERM; echo ready; sleep 1000 & wait"])
    await wait_log(h, "ready")
    t0 = time.monotonic()
    st = await env.driver.stop(h, grace=1.0)
    took = time.monotonic() - t0
    assert 0.9 <= took < 6, took
    assert (st.exit_code, st.signal, st.reason) == (137, signal.SIGKILL, "Error")


async def check_exec(env: Env) -> None:
    h = await env.run(["sh", "-c", "echo ready; sleep 1000 & wait"], env={"GREETING": "hi"})
    await wait_log(h, "ready")
    out, err = Collect(), Collect()
    rc = await env.driver.exec(h, ["sh", "-c", 'echo "$GREETING out"; echo err >&2; exit 7'],
                               stdout=out, stderr=err)
    assert (rc, out.data, err.data) == (7, b"hi out\n", b"err\n")
    # stdin as bytes, and as a trio stream
    out = Collect()
    rc = await env.driver.exec(h, ["cat"], stdin=b"line one\nline two\n", stdout=out)
    assert (rc, out.data) == (0, b"line one\nline two\n")
    send, recv = trio.testing.memory_stream_one_way_pair()
    out = Collect()

    async def writer() -> None:
        await send.send_all(b"streamed\n")
        await send.aclose()

    async with trio.open_nursery() as n:
        n.start_soon(writer)
        rc = await env.driver.exec(h, ["cat"], stdin=recv, stdout=out)
    assert (rc, out.data) == (0, b"streamed\n")
    # tty: the command sees a terminal; stdout and stderr arrive merged
    out = Collect()
    rc = await env.driver.exec(h, ["sh", "-c", "tty; echo e >&2; exit 3"], stdout=out,
                               tty=True)
    assert rc == 3
    assert b"/dev/pts/" in out.data and b"e\r\n" in out.data, out.data
    # A client that goes away mid-exec takes the exec'd process with it (not only the
    # runtime's `exec` process), with and without a tty.
    for tty in (False, True):
        marker = str(30000 + int.from_bytes(os.urandom(2), "big") % 30000)
        out = Collect()
        with trio.move_on_after(1.5):
            await env.driver.exec(h, ["sh", "-c", f"echo started; exec sleep {marker}"],
                                  stdout=out, tty=tty)
        assert b"started" in out.data, out.data
        await wait_for(lambda m=marker: not processes_with_argv(["sleep", m]), 10,
                       f"the abandoned exec (sleep {marker}, tty={tty}) to be killed")
    await env.driver.stop(h, grace=0)


def processes_with_argv(argv: list[str]) -> list[int]:
    want = b"\0".join(a.encode() for a in argv) + b"\0"
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes() == want:
                    found.append(int(d.name))
            except OSError:
                pass
    return found


async def check_env_cwd(env: Env, cwd: str) -> None:
    h = await env.run(["sh", "-c", 'echo "foo=$FOO"; pwd'], env={"FOO": "bar baz"},
                      working_dir=cwd)
    st = await env.driver.wait(h)
    assert st.exit_code == 0
    assert log_text(h.log_path) == f"foo=bar baz\n{cwd}"


async def check_signal(env: Env) -> None:
    h = await env.run(["sh", "-c", "trap 'echo got-usr1; exit 9' USR1; echo ready; "
                                   "sleep 1000 & wait"])
    await wait_log(h, "ready")
    await env.driver.signal(h, signal.SIGUSR1)
    st = await env.driver.wait(h)
    assert st.exit_code == 9
    assert "got-usr1" in log_text(h.log_path)


async def check_stdin_fifo(env: Env) -> None:
    h = await env.run(["sh", "-c", "echo ready; while read line; do echo \"got $line\"; done"],
                      stdin=True)
    await wait_log(h, "ready")
    fifo = env.driver.stdin_path(h)
    assert shim.is_fifo(fifo)

    def write() -> None:
        with open(fifo, "w") as f:
            f.write("one\ntwo\n")

    await trio.to_thread.run_sync(write)
    await wait_log(h, "got two")
    # stdin stays open after the writer left (not stdinOnce): still running
    assert (await env.driver.inspect(h)).status is ContainerStatus.RUNNING
    await env.driver.stop(h, grace=0)


async def check_stats(env: Env) -> None:
    h = await env.run(["sh", "-c", "echo ready; sleep 1000 & wait"])
    await wait_log(h, "ready")
    s = await env.driver.stats(h)
    assert s.memory_usage_bytes and s.memory_usage_bytes > 0
    assert s.pids is not None and s.pids >= 2  # sh and sleep
    assert s.cpu_usage_ns is not None and s.cpu_usage_ns >= 0
    await env.driver.stop(h, grace=0)


async def check_memory_oom(env: Env) -> None:
    # The shell's command substitution buffers all 64 MiB in anonymous memory.
    h = await env.run(["sh", "-c", 'x=$(head -c 67108864 /dev/zero | tr "\\0" a); '
                                   'echo survived'],
                      resources=Resources(memory_limit_bytes=32 * 1024 * 1024))
    with trio.fail_after(30):
        st = await env.driver.wait(h)
    assert st.oom_killed and st.reason == "OOMKilled", st
    assert st.exit_code != 0
    assert "survived" not in log_text(h.log_path)


async def check_recovery(env: Env, uid: str) -> None:
    """Start containers from a separate agent process, SIGKILL it, recover them."""
    state = env.driver.state_dir
    agent, handles = await trio.to_thread.run_sync(
        lambda: spawn_agent(env.kind, state, env.layer, env.base / "logs" / uid, uid,
                            "echo ready; sleep 1000 & wait", "sleep 0.5; exit 5"))
    try:
        running, exiting = handles
        await trio.to_thread.run_sync(kill_agent, agent)
        assert alive(running.pid) and alive(running.shim_pid)
        await wait_for(lambda: not alive(exiting.shim_pid), 10, "the second container to end")

        fresh = select_driver(state, prefer=env.kind)
        assert isinstance(fresh, ShimDriver)
        found = {h.id: h for h in await fresh.recover()}
        assert running.id in found and exiting.id in found
        again = found[running.id]
        assert (again.pid, again.shim_pid, again.name) == (running.pid, running.shim_pid, "c0")
        state0 = await fresh.inspect(again)
        assert state0.status is ContainerStatus.RUNNING and state0.pid == running.pid
        done = await fresh.inspect(found[exiting.id])
        assert done.status is ContainerStatus.EXITED and done.exit is not None
        assert done.exit.exit_code == 5

        # (an OCI container's init ignores SIGTERM without a trap: killed at the deadline)
        st = await fresh.stop(again, grace=1)
        assert st.exit_code in (143, 137), st
        assert not alive(running.pid)
        for h in found.values():
            await fresh.remove(h)
        assert not (await fresh.recover())
        for sb in await fresh.sandboxes():
            if sb.id == uid:
                await fresh.remove_sandbox(sb)
    finally:
        kill_agent(agent)


# ---------------------------------------------------------------------------------------
# The process driver


async def test_process_echo_logs_and_exit(penv: Env) -> None:
    await check_echo(penv)


async def test_process_command_not_found(penv: Env) -> None:
    await check_not_found(penv)


async def test_process_exit_code(penv: Env) -> None:
    await check_exit_code(penv)


async def test_process_stop_delivers_sigterm(penv: Env) -> None:
    shared = penv.base / "shared"
    shared.mkdir()
    await check_sigterm(penv, shared, str(shared))


async def test_process_stop_kills_at_grace_deadline(penv: Env) -> None:
    await check_sigkill_at_grace(penv)


async def test_process_exec(penv: Env) -> None:
    await check_exec(penv)


async def test_process_env_and_working_dir(penv: Env) -> None:
    wd = penv.base / "work dir"
    wd.mkdir()
    await check_env_cwd(penv, str(wd))


async def test_process_signal(penv: Env) -> None:
    await check_signal(penv)


async def test_process_stdin_fifo(penv: Env) -> None:
    await check_stdin_fifo(penv)


async def test_process_stats(penv: Env) -> None:
    await check_stats(penv)


async def test_process_recovery_after_agent_sigkill(penv: Env) -> None:
    await check_recovery(penv, f"rec-{os.urandom(3).hex()}")


async def test_process_group_killed_with_main_process(penv: Env) -> None:
    # A background child must not outlive the container's main process.
    h = await penv.run(["sh", "-c", "sleep 1000 & echo $! ; exit 0"])
    st = await penv.driver.wait(h)
    assert st.exit_code == 0
    child = int(log_text(h.log_path).strip())
    await wait_for(lambda: not alive(child), 5, "the background child to be killed")


async def test_process_without_cgroups(base_dir: Path) -> None:
    driver = ProcessDriver(base_dir / "state", use_cgroups=False)
    sb = await driver.create_sandbox(sandbox_spec(base_dir))
    try:
        h = await driver.start(sb, ContainerSpec(name="c", layers=[], command=[
            "sh", "-c", "echo ready; sleep 1000 & wait"]))
        await wait_for(lambda: "ready" in log_text(h.log_path), 10)
        s = await driver.stats(h)  # from /proc of the process group
        assert s.pids == 2 and s.memory_usage_bytes and s.cpu_usage_ns is not None
        assert shim.ShimConfig.load(h.bundle).cgroup is None
        st = await driver.stop(h, grace=5)
        assert st.signal == signal.SIGTERM and st.exit_code == 143
    finally:
        assert not await cleanup_driver(driver)


@pytest.mark.skipif(not (IS_ROOT and cgroups.Cgroups().writable()),
                    reason="needs root (a writable cgroup tree) for memory limits")
async def test_process_memory_limit_oom(penv: Env) -> None:
    await check_memory_oom(penv)


async def test_select_driver(base_dir: Path) -> None:
    assert isinstance(select_driver(base_dir / "a", prefer="process"), ProcessDriver)
    d = select_driver(base_dir / "b")
    assert isinstance(d, Driver)
    from fleet.runtime.oci import OciDriver, find_runtime
    expected = OciDriver if IS_ROOT and find_runtime() else ProcessDriver
    assert type(d) is expected


async def test_process_echo_logs_and_exit_through_launcher(penv: Env) -> None:
    await check_echo(penv)
    assert penv.driver.launcher.launched == 1


async def test_process_without_launcher_starts_shims_directly(base_dir: Path) -> None:
    """A driver whose launcher is not serving (used on its own) forks a `fleet shim`."""
    driver = ProcessDriver(base_dir / "state")
    sb = await driver.create_sandbox(sandbox_spec(base_dir))
    try:
        await check_echo(Env(driver, sb, base_dir, base_dir, "process"))
        assert driver.launcher.launched == 0
    finally:
        assert not await cleanup_driver(driver)


async def test_launcher_server_dying_falls_back(penv: Env) -> None:
    """Kill the launcher server: the driver notices and starts later shims directly."""
    launcher = penv.driver.launcher
    h = await penv.run(["sh", "-c", "echo first; sleep 1000 & wait"])
    await wait_log(h, "first")
    assert launcher.launched == 1 and launcher.pid is not None
    os.kill(launcher.pid, signal.SIGKILL)
    await wait_for(lambda: not launcher.running, 10, "the launcher to notice its server died")
    assert alive(h.pid), "a container started through the launcher must outlive it"
    h2 = await penv.run(["sh", "-c", "echo second"])
    st = await penv.driver.wait(h2)
    assert st.exit_code == 0 and "second" in log_text(h2.log_path)
    assert launcher.launched == 1
    await penv.driver.stop(h, grace=0)


async def test_launcher_server_reports_bad_requests(base_dir: Path) -> None:
    """Malformed requests and a wrong bundle get an answer each; the server keeps going."""
    bundle = base_dir / "b"
    bundle.mkdir()
    shim.ShimConfig(mode="process", id="abc", log_path=str(base_dir / "l.log"),
                    argv=["true"]).save(bundle)
    reqs = (b'not json\n' + json.dumps({"req": 7, "bundle": str(bundle), "id": "other"}).encode()
            + b"\n")
    res = await trio.run_process([sys.executable, "-m", "fleet.cli.shim", "--serve"],
                                 stdin=reqs, capture_stdout=True, capture_stderr=True,
                                 env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    lines = res.stdout.decode().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("null ") and '"ok": false' in lines[0]
    assert lines[1].startswith("7 ") and "not other" in lines[1]


async def test_shim_refuses_wrong_id(base_dir: Path) -> None:
    bundle = base_dir / "b"
    bundle.mkdir()
    shim.ShimConfig(mode="process", id="abc", log_path=str(base_dir / "l.log"),
                    argv=["true"]).save(bundle)
    res = await trio.run_process([sys.executable, "-m", "fleet.cli.shim", "--bundle",
                                  str(bundle), "--id", "other"], check=False,
                                 capture_stdout=True, capture_stderr=True,
                                 env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert res.returncode == 1 and b"not other" in res.stdout + res.stderr


# ---------------------------------------------------------------------------------------
# The log format (pure)


@pytest.mark.parametrize(("chunks", "expected"), [
    ([b"a\nb\n"], [("F", b"a"), ("F", b"b")]),
    ([b"par", b"tial\n"], [("F", b"partial")]),
    ([b"crlf\r\n"], [("F", b"crlf")]),
    ([b"\n"], [("F", b"")]),
    ([b"end"], [("F", b"end")]),
    ([b"x" * (crilog.MAX_LINE + 5) + b"\n"],
     [("P", b"x" * crilog.MAX_LINE), ("F", b"x" * 5)]),
    # the end of the output finishes the line
    ([b"y" * (2 * crilog.MAX_LINE)], [("P", b"y" * crilog.MAX_LINE), ("F", b"y" * crilog.MAX_LINE)]),
])
def test_split_lines(chunks: list[bytes], expected: list[tuple[str, bytes]]) -> None:
    buf = bytearray()
    got = []
    for c in chunks:
        buf += c
        got += crilog.split_lines(buf, final=False)
    got += crilog.split_lines(buf, final=True)
    assert got == expected


def test_cri_timestamp() -> None:
    assert crilog.cri_timestamp(1_795_968_000_123_456_789) == "2026-11-29T16:00:00.123456789Z"
    assert crilog.cri_timestamp(5) == "1970-01-01T00:00:00.000000005Z"


def test_status_file_roundtrip(tmp_path: Path) -> None:
    assert shim.read_status(tmp_path) is None
    rec = shim.StatusRecord(exit_code=137, signal=9, oom_killed=True, started_at=1.0,
                            finished_at=2.5, reason="OOMKilled", message="m")
    shim.write_status(tmp_path, rec)
    assert shim.read_status(tmp_path) == rec
    assert [p.name for p in tmp_path.iterdir()] == [shim.STATUS_FILE]


def test_pid_identity(tmp_path: Path) -> None:
    start = shim.write_pid_file(tmp_path / "p", os.getpid())
    assert shim.read_pid_file(tmp_path / "p") == (os.getpid(), start)
    assert start == proc_start_time(os.getpid()) and start > 0
    assert proc_start_time(2**22 + 12345) is None
