"""Pod lifecycle through a real `fleet server --no-agent` and a separate `fleet agent`.

Graceful deletion (SIGTERM, then SIGKILL at the grace deadline), the memory limit
(OOMKilled), configMap volumes updated in place after `kubectl apply`, a volume of a
missing ConfigMap, an image that cannot be pulled — with the `oci` driver (runc) — and
the basic Never / OnFailure lifecycle with the `process` driver.

The oci tests share one server and one agent (a namespace each); the process driver
gets its own.  Cleanup as in test_agent.py: pods are deleted through the API, the agent
must remove its containers, then anything left is force-removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.runtime.images import ImageStore, import_archive_sync
from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import build_busybox_image, busybox_problem, write_oci_archive
from tests.conftest import (
    KUBECTL,
    FleetServer,
    ServerFactory,
    _server_env,
    create_namespace,
    free_port,
    run_kubectl,
)
from tests.e2e.helpers import wait_until
from tests.e2e.leaks import delete_pods_and_wait_clean, finish
from tests.e2e.test_agent import IMAGE, create, get, pod, pod_status

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the oci driver runs runc)")
needs_runc = pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun")
needs_busybox = pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")

HOST_BUSYBOX = shutil.which("busybox") or "/bin/busybox"


class Agent:
    """One `fleet agent` subprocess with a given driver."""

    def __init__(self, srv: FleetServer, base: Path, driver: str) -> None:
        self.srv = srv
        self.driver = driver
        self.data_dir = base / f"agent-{driver}"
        self.node = f"node-{driver}-{uuid.uuid4().hex[:6]}"
        self.port = free_port()
        self.log_path = base / f"agent-{driver}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "fleet.cli.main", "agent", "--kubeconfig",
                str(self.srv.kubeconfig), "--data-dir", str(self.data_dir),
                "--node-name", self.node, "--port", str(self.port), "--driver", self.driver,
                "--network", "none", "--address", "127.0.0.1"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=_server_env(),
                                         start_new_session=True)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-12000:]
        except FileNotFoundError:
            return ""

    def containers(self) -> list[Path]:
        d = self.data_dir / "runtime" / "containers"
        return list(d.iterdir()) if d.is_dir() else []


@contextlib.contextmanager
def running_cluster(driver: str, failed: Any) -> Iterator[tuple[FleetServer, Agent]]:
    """A server (no in-process agent) and one agent of `driver`, with busybox imported.

    `failed()` says at teardown whether to show the agent's output."""
    base = Path(tempfile.mkdtemp(prefix=f"fleet-lifecycle-{driver}-"))
    factory = ServerFactory(base)
    agent: Agent | None = None
    try:
        srv = factory.start()
        agent = Agent(srv, base, driver)
        archive = write_oci_archive(build_busybox_image(), base / "busybox.tar", IMAGE)
        import_archive_sync(ImageStore(agent.data_dir / "images"), archive, IMAGE)
        agent.start()
        wait_until(lambda: _node_ready(srv, agent.node), timeout=30, what="node Ready")
        yield srv, agent
    finally:
        leaked: list[str] = []
        try:
            if agent is not None:
                leaked = _delete_all_pods(factory.servers[0] if factory.servers else None, agent)
        finally:
            if agent is not None:
                agent.stop()
                if failed():
                    sys.stderr.write(f"\n----- {driver} agent output -----\n{agent.output()}\n")
                finish(agent.data_dir, leaked, agent.output())
            problems = factory.stop_all()
            shutil.rmtree(base, ignore_errors=True)
            assert not problems, problems


def _node_ready(srv: FleetServer, node: str) -> bool:
    code, body = get(srv, f"/api/v1/nodes/{node}")
    conds = {c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or []} \
        if code == 200 else {}
    return conds.get("Ready") == "True"


def _delete_all_pods(srv: FleetServer | None, agent: Agent) -> list[str]:
    """Delete every pod (all namespaces) and wait for the agent to remove everything of
    them; what it left behind (tests/e2e/leaks.py)."""
    if srv is None or agent.proc is None or agent.proc.poll() is not None:
        return []
    return delete_pods_and_wait_clean(srv, agent.data_dir, timeout=30)


@pytest.fixture(scope="module")
def oci_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[FleetServer, Agent]]:
    with running_cluster("oci", lambda: getattr(request.node, "_fleet_failed", False)) as c:
        yield c


@pytest.fixture
def env(oci_cluster: tuple[FleetServer, Agent]) -> Iterator[tuple[FleetServer, Agent, str]]:
    srv, agent = oci_cluster
    ns = f"life-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    yield srv, agent, ns
    with srv.client() as c:
        r = c.get(f"/api/v1/namespaces/{ns}/pods")
        for p in r.json().get("items", []) if r.status_code == 200 else []:
            c.delete(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}")
    wait_until(lambda: (r := get(srv, f"/api/v1/namespaces/{ns}/pods"))[0] == 200
               and not r[1]["items"], timeout=30, what=f"the pods of {ns} to be gone")


def _phase(srv: FleetServer, ns: str, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
    return wait_until(lambda: (s := pod_status(srv, ns, name)).get("phase") == phase and s,
                      timeout=timeout, what=f"pod {name} {phase}")


def _cs(st: dict[str, Any]) -> dict[str, Any]:
    return (st.get("containerStatuses") or [{}])[0]


def _delete(srv: FleetServer, ns: str, name: str) -> None:
    with srv.client() as c:
        r = c.delete(f"/api/v1/namespaces/{ns}/pods/{name}")
    assert r.status_code in (200, 202), r.text


def _gone(srv: FleetServer, ns: str, name: str) -> bool:
    return get(srv, f"/api/v1/namespaces/{ns}/pods/{name}")[0] == 404


def _kubectl(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=30)
    assert rc == 0, f"kubectl {' '.join(args)}: rc={rc}\n{out}\n{err}"
    return out


def _configmap_yaml(ns: str, name: str, value: str) -> str:
    return (f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\n"
            f"data:\n  key: {value}\n")


# -- graceful deletion -----------------------------------------------------------------------
@needs_root
@needs_runc
@needs_busybox
def test_delete_sends_sigterm_then_sigkill_at_deadline(
    env: tuple[FleetServer, Agent, str], tmp_path: Path
) -> None:
    srv, agent, ns = env
    out = tmp_path / "out"
    out.mkdir()
    vol = [{"name": "out", "hostPath": {"path": str(out), "type": "Directory"}}]
    mount = [{"name": "out", "mountPath": "/mnt/out"}]

    trap = pod("trap", agent.node, ["sh", "-c",
               "trap 'echo got-term > /mnt/out/term; exit 0' TERM; echo up > /mnt/out/up; "
               "while true; do sleep 0.2; done"], grace=30)
    deaf = pod("deaf", agent.node, ["sh", "-c",
               "trap '' TERM; echo up > /mnt/out/deaf-up; while true; do sleep 0.2; done"],
               grace=2)
    for p in (trap, deaf):
        p["spec"]["volumes"] = vol
        p["spec"]["containers"][0]["volumeMounts"] = mount
        create(srv, ns, p)
    for name in ("trap", "deaf"):
        _phase(srv, ns, name, "Running")
    # The traps are set before these files are written.
    wait_until(lambda: (out / "up").exists() and (out / "deaf-up").exists(), timeout=20,
               what="both containers to have set their TERM traps")

    # TERM is delivered, the trap records it and exits: gone long before the 30 s grace.
    t0 = time.monotonic()
    _delete(srv, ns, "trap")
    wait_until(lambda: _gone(srv, ns, "trap"), timeout=25, what="pod trap gone")
    elapsed = time.monotonic() - t0
    assert (out / "term").read_text().strip() == "got-term"
    assert elapsed < 15, f"pod trap took {elapsed:.1f}s to go (its TERM trap exits at once)"

    # TERM ignored: the container is killed at the 2 s deadline, then the pod is removed.
    t0 = time.monotonic()
    _delete(srv, ns, "deaf")
    wait_until(lambda: _gone(srv, ns, "deaf"), timeout=20, interval=0.05, what="pod deaf gone")
    elapsed = time.monotonic() - t0
    assert 1.5 <= elapsed < 15, f"pod deaf went after {elapsed:.1f}s (grace period 2 s)"
    wait_until(lambda: not agent.containers(), timeout=15, what="the containers removed")


# -- memory limit ----------------------------------------------------------------------------
@needs_root
@needs_runc
@needs_busybox
def test_memory_limit_oom_killed(env: tuple[FleetServer, Agent, str]) -> None:
    srv, agent, ns = env
    # The shell's command substitution holds all 64 MiB in anonymous memory.
    p = pod("hog", agent.node, ["sh", "-c", 'x=$(head -c 67108864 /dev/zero | tr "\\0" a); '
                                "echo survived"], restart="Never", grace=1)
    p["spec"]["containers"][0]["resources"] = {"limits": {"memory": "32Mi"}}
    create(srv, ns, p)
    st = _phase(srv, ns, "hog", "Failed", timeout=40)
    term = _cs(st)["state"]["terminated"]
    assert term["reason"] == "OOMKilled", term
    assert term["exitCode"] != 0, term
    rc, logs, err = run_kubectl(srv, "logs", "-n", ns, "hog") if KUBECTL else (0, "", "")
    assert rc == 0 and "survived" not in logs, (logs, err)


# -- configMap volumes -----------------------------------------------------------------------
@needs_root
@needs_runc
@needs_busybox
@needs_kubectl
def test_configmap_volume_updated_in_place(env: tuple[FleetServer, Agent, str]) -> None:
    srv, agent, ns = env
    _kubectl(srv, "apply", "-f", "-", input=_configmap_yaml(ns, "conf", "first-value"))
    p = pod("reader", agent.node, ["sh", "-c",
            "while true; do cat /cfg/key; echo; sleep 0.5; done"], grace=1)
    p["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "conf"}}]
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/cfg"}]
    create(srv, ns, p)
    st = _phase(srv, ns, "reader", "Running")
    container_id = _cs(st)["containerID"]
    assert _kubectl(srv, "exec", "-n", ns, "reader", "--", "cat", "/cfg/key") == "first-value"

    _kubectl(srv, "apply", "-f", "-", input=_configmap_yaml(ns, "conf", "second-value"))

    def updated() -> bool:
        rc, out, _ = run_kubectl(srv, "exec", "-n", ns, "reader", "--", "cat", "/cfg/key",
                                 timeout=15)
        return rc == 0 and out == "second-value"

    wait_until(updated, timeout=30, interval=0.5, what="/cfg/key to show the new value")
    # Seen by the running process too (its loop prints the file), and not restarted.
    wait_until(lambda: "second-value" in _kubectl(srv, "logs", "-n", ns, "reader"),
               timeout=10, interval=0.5, what="the container's loop to print the new value")
    st = pod_status(srv, ns, "reader")
    assert st["phase"] == "Running"
    assert _cs(st)["restartCount"] == 0 and _cs(st)["containerID"] == container_id, _cs(st)


@needs_root
@needs_runc
@needs_busybox
def test_missing_configmap_waits_then_starts(env: tuple[FleetServer, Agent, str]) -> None:
    srv, agent, ns = env
    p = pod("waiter", agent.node, ["sh", "-c", "cat /cfg/key; echo; exec sleep 3600"], grace=1)
    p["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "later"}}]
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/cfg"}]
    create(srv, ns, p)

    def says_missing() -> dict[str, Any] | None:
        st = pod_status(srv, ns, "waiter")
        text = f"{st.get('message', '')} {(_cs(st).get('state') or {}).get('waiting')}"
        return st if 'configmap "later" not found' in text else None

    st = wait_until(says_missing, timeout=20, what="the pod to report the missing configmap")
    assert st.get("phase") == "Pending", st
    assert "waiting" in _cs(st).get("state", {"waiting": {}}), st
    # Still not running a moment later: it waits, it does not start without the volume.
    time.sleep(1)
    assert pod_status(srv, ns, "waiter").get("phase") == "Pending"

    def failed_mount() -> list[dict[str, Any]] | None:
        with srv.client() as c:
            r = c.get(f"/api/v1/namespaces/{ns}/events",
                      params={"fieldSelector": "involvedObject.name=waiter"})
        evs = [e for e in r.json().get("items") or [] if e.get("reason") == "FailedMount"
               and 'configmap "later" not found' in e.get("message", "")]
        return evs or None

    evs = wait_until(failed_mount, timeout=10, what="a FailedMount event for the pod")
    assert evs[0]["type"] == "Warning" and evs[0]["source"]["host"] == agent.node, evs

    with srv.client() as c:
        r = c.post(f"/api/v1/namespaces/{ns}/configmaps",
                   json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "later"},
                         "data": {"key": "arrived"}})
    assert r.status_code == 201, r.text
    st = _phase(srv, ns, "waiter", "Running", timeout=40)
    assert _cs(st)["restartCount"] == 0
    # The waiting message is gone once the pod runs.
    assert not st.get("message"), st
    assert _kubectl(srv, "logs", "-n", ns, "waiter").strip() == "arrived" if KUBECTL else True


# -- image pull failure ----------------------------------------------------------------------
@needs_root
@needs_runc
@needs_busybox
def test_missing_image_err_image_pull(env: tuple[FleetServer, Agent, str]) -> None:
    srv, agent, ns = env
    image = "127.0.0.1:1/nope/nope:1"
    p = pod("nope", agent.node, ["true"], grace=1)
    p["spec"]["containers"][0].update(image=image, imagePullPolicy="Always")
    create(srv, ns, p)

    def pull_failed() -> dict[str, Any] | None:
        w = (_cs(pod_status(srv, ns, "nope")).get("state") or {}).get("waiting") or {}
        return w if w.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    waiting = wait_until(pull_failed, timeout=30, what="ErrImagePull / ImagePullBackOff")
    assert waiting.get("message"), waiting
    assert pod_status(srv, ns, "nope").get("phase") == "Pending"
    # It keeps failing (then backs off): never a started container.
    waiting = wait_until(lambda: (w := pull_failed()) and w["reason"] == "ImagePullBackOff" and w,
                         timeout=30, what="ImagePullBackOff")
    assert image in waiting["message"], waiting
    st = pod_status(srv, ns, "nope")
    assert st.get("phase") == "Pending" and not _cs(st).get("containerID"), st


# -- logs --previous, describe and events through kubectl, on a real container -----------
@needs_root
@needs_runc
@needs_busybox
@needs_kubectl
def test_kubectl_logs_previous_describe_and_events_of_a_restarting_pod(
        env: tuple[FleetServer, Agent, str]) -> None:
    srv, agent, ns = env
    # Each run prints a line of its own, then fails: the kubelet rules restart it
    # with back-off, so the previous run's log is a different line than the current.
    create(srv, ns, pod("crash", agent.node, ["sh", "-c", "echo run $(date +%s%N); exit 3"], grace=1))
    wait_until(lambda: _cs(pod_status(srv, ns, "crash")).get("restartCount", 0) >= 1, timeout=60,
               what="a restart")

    def logs_of_one_restart() -> tuple[str, str] | None:
        before = _cs(pod_status(srv, ns, "crash")).get("restartCount", 0)
        previous = _kubectl(srv, "-n", ns, "logs", "crash", "--previous")
        current = _kubectl(srv, "-n", ns, "logs", "crash")
        after = _cs(pod_status(srv, ns, "crash")).get("restartCount", 0)
        return (previous, current) if before == after and current.strip() else None

    previous, current = wait_until(logs_of_one_restart, timeout=60, what="logs of one restart")
    assert previous.startswith("run ") and current.startswith("run ") and previous != current, (previous, current)
    last = _cs(pod_status(srv, ns, "crash")).get("lastState", {}).get("terminated", {})
    assert last.get("exitCode") == 3, last

    def described() -> str | None:
        out = _kubectl(srv, "-n", ns, "describe", "pod", "crash")
        return out if "BackOff" in out else None

    out = wait_until(described, timeout=60, what="a BackOff event in kubectl describe")
    assert "Events:" in out and "Started" in out and "Created" in out, out
    assert "Back-off restarting failed container" in out, out
    events = _kubectl(srv, "-n", ns, "get", "events", "--field-selector", "involvedObject.name=crash")
    for reason in ("Created", "Started", "BackOff"):
        assert reason in events, events
    assert "pod/crash" in events, events


# -- process driver --------------------------------------------------------------------------
@pytest.fixture
def process_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[FleetServer, Agent]]:
    with running_cluster("process", lambda: getattr(request.node.getparent(pytest.Module),
                                                    "_fleet_failed", False)) as c:
        yield c


@needs_busybox
@pytest.mark.skipif(not os.path.exists(HOST_BUSYBOX), reason="needs busybox on the host")
def test_process_driver_lifecycle(process_cluster: tuple[FleetServer, Agent]) -> None:
    srv, agent = process_cluster
    ns = f"proc-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    sh = [HOST_BUSYBOX, "sh", "-c"]
    create(srv, ns, pod("fail", agent.node, [*sh, "exit 3"], restart="Never"))
    create(srv, ns, pod("ok", agent.node, [*sh, "exit 0"], restart="OnFailure"))
    create(srv, ns, pod("run", agent.node, [*sh, "while true; do sleep 0.2; done"], grace=2))

    st = _phase(srv, ns, "fail", "Failed")
    term = _cs(st)["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error", term
    st = _phase(srv, ns, "ok", "Succeeded")
    term = _cs(st)["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed", term
    assert _cs(st)["restartCount"] == 0

    st = _phase(srv, ns, "run", "Running")
    assert _cs(st)["restartCount"] == 0
    _delete(srv, ns, "run")
    wait_until(lambda: _gone(srv, ns, "run"), timeout=20, what="pod run gone")


# -- kubectl exec -it / attach -it on a real terminal ---------------------------------------
class Terminal:
    """kubectl running on the slave side of a pty, as it runs in a user's terminal."""

    def __init__(self, srv: FleetServer, *args: str, rows: int = 45, cols: int = 123) -> None:
        import fcntl
        import struct
        import termios

        assert KUBECTL
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        self.proc = subprocess.Popen(
            [KUBECTL, "--kubeconfig", str(srv.kubeconfig), "--cache-dir",
             str(srv.data_dir.parent / "kubectl-cache"), *args],
            stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
        self.slave = slave
        self.out = b""

    def resize(self, rows: int, cols: int) -> None:
        """What a terminal emulator does when its window changes: set the size, SIGWINCH."""
        import fcntl
        import struct
        import termios

        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc.send_signal(signal.SIGWINCH)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def expect(self, text: str, timeout: float = 20, then: str | None = None) -> None:
        """Read until `text` shows up; `then` is typed again every second meanwhile (a
        resize travels apart from the keystrokes, so a command may run before it lands)."""
        import select

        deadline = time.monotonic() + timeout
        next_retry = time.monotonic() + 1
        while text.encode() not in self.out:
            now = time.monotonic()
            if now > deadline:
                raise AssertionError(f"{text!r} not seen on the terminal; got {self.out[-2000:]!r}")
            if then is not None and now > next_retry:
                self.type(then)
                next_retry = now + 1
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.out += os.read(self.master, 65536)
                except OSError:  # EIO: kubectl closed the terminal
                    break
        assert text.encode() in self.out, self.out[-2000:]

    def wait(self, timeout: float = 20) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for fd in (self.master, self.slave):
            with contextlib.suppress(OSError):
                os.close(fd)


@needs_root
@needs_runc
@needs_busybox
@needs_kubectl
def test_kubectl_exec_it_and_attach_it_on_a_terminal(env: tuple[FleetServer, Agent, str]) -> None:
    srv, agent, ns = env
    create(srv, ns, pod("shell", agent.node, ["sleep", "3600"], grace=1))
    term_pod = pod("tty", agent.node, ["sh"], grace=1)
    term_pod["spec"]["containers"][0].update({"stdin": True, "tty": True})
    create(srv, ns, term_pod)
    for name in ("shell", "tty"):
        _phase(srv, ns, name, "Running")

    # exec -it: an interactive shell in a terminal of the user's size, resized live,
    # whose exit code comes back as kubectl's.
    t = Terminal(srv, "exec", "-it", "-n", ns, "shell", "--", "sh", rows=45, cols=123)
    try:
        # As with Kubernetes, the size travels apart from the stream: a command run at
        # the very first prompt may still see the terminal's initial size; ask again.
        t.expect("# ", then="\n")
        t.type("stty size\n")
        t.expect("45 123", then="stty size\n")
        t.resize(30, 100)
        t.type("stty size\n")
        t.expect("30 100", then="stty size\n")
        t.type("tty; exit 7\n")
        t.expect("/dev/pts/")
        assert t.wait() == 7, t.out[-2000:]
    finally:
        t.close()

    # attach -it to the container's own terminal (its shell runs on the pty the shim
    # owns): keystrokes reach it, and the window size follows the user's terminal.
    t = Terminal(srv, "attach", "-it", "-n", ns, "tty", rows=40, cols=111)
    try:
        t.type("stty size\n")
        try:
            t.expect("40 111", then="stty size\n")
        except AssertionError as e:
            raise AssertionError(f"{e}\npod: {pod_status(srv, ns, 'tty')}") from None
        t.resize(20, 90)
        t.type("stty size\n")
        t.expect("20 90", then="stty size\n")
    finally:
        t.close()
    # Detaching (kubectl gone) leaves the container running.
    assert _cs(pod_status(srv, ns, "tty")).get("state", {}).get("running"), pod_status(srv, ns, "tty")
