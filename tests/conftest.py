"""Shared fixtures: a real `fleet server` subprocess and a kubectl runner.

The end-to-end tests talk to the server only the way real users do: over HTTP on
127.0.0.1, with the bearer token from the admin kubeconfig the server writes.

`fleet_server` (module scope) is one server shared by the tests of a module; those
tests stay out of each other's way by each working in its own namespace (the
`namespace` fixture).  `fleet_server_factory` starts servers a test controls
itself (kill -9, restart on the same data dir, several side by side, a data dir
with a bad database).  Every server is stopped by pid at teardown — SIGTERM, then
SIGKILL after a deadline — and its combined output is kept so a failing test can
show what the server said.
"""

from __future__ import annotations

import base64
import itertools
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import settings

# Hypothesis' default 200 ms deadline measures this shared 2-core machine's load,
# not the code: every property test runs without one (what each checks is unchanged).
settings.register_profile("fleet", deadline=None)
settings.load_profile("fleet")

KUBECTL = shutil.which("kubectl")
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
REPO_ROOT = Path(__file__).resolve().parent.parent

# The database file the server keeps in its data dir.
DB_FILE_NAME = "fleet.db"
KUBECONFIG_NAME = "admin.kubeconfig"


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (bind to 0, then release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_env() -> dict[str, str]:
    env = dict(os.environ)
    # Run the checkout under test, whatever the current directory is.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


def terminate(proc: subprocess.Popen, timeout: float) -> int | None:
    """End a process this test started: SIGTERM, then SIGKILL after `timeout`; its exit code."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    return proc.returncode


@dataclass
class FleetServer:
    """One `fleet server` subprocess and how to reach it."""

    data_dir: Path
    port: int
    metrics_port: int
    log_path: Path
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    token: str = ""
    _log_file: Any = None

    # -- addresses ---------------------------------------------------------
    @property
    def url(self) -> str:
        """The API URL from the admin kubeconfig (https with the server's CA, or http)."""
        return self._kubeconfig_cluster().get("server") or f"http://127.0.0.1:{self.port}"

    def _kubeconfig_cluster(self) -> dict[str, Any]:
        try:
            cfg = yaml.safe_load(self.kubeconfig.read_text()) or {}
        except FileNotFoundError:
            return {}
        clusters = cfg.get("clusters") or []
        return (clusters[0].get("cluster") or {}) if clusters else {}

    def verify(self) -> ssl.SSLContext | bool:
        """What httpx should verify the API's certificate with: the kubeconfig's CA."""
        ca = self._kubeconfig_cluster().get("certificate-authority-data")
        if not ca:
            return True
        return ssl.create_default_context(cadata=base64.b64decode(ca).decode())

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / KUBECONFIG_NAME

    @property
    def db_path(self) -> Path:
        return self.data_dir / DB_FILE_NAME

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "fleet.cli.main", "server",
            "--data-dir", str(self.data_dir),
            "--port", str(self.port),
            "--metrics-port", str(self.metrics_port),
            # The API tests need no node; a test that wants the built-in agent
            # passes --agent-port PORT in extra_args.
            *(["--no-agent"] if not any(a == "--agent-port" for a in self.extra_args) else []),
            # Nor an ingress (it would listen on 8080/8443): a test that wants one
            # passes its --ingress-* flags.
            *(["--no-ingress"] if not any(a.startswith("--ingress") for a in self.extra_args) else []),
            *self.extra_args,
        ]

    # -- lifecycle ---------------------------------------------------------
    def spawn(self) -> None:
        """Start the process (no waiting).  Output is appended to `log_path`."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file.write(f"\n===== start {' '.join(self.argv())}\n".encode())
        self._log_file.flush()
        self.proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=_server_env(),
            cwd=str(self.data_dir.parent),
            start_new_session=True,
        )

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code once the process ends, or None after `timeout` seconds."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Poll /readyz until 200 "ok"; fail early, with the output, if the process exits."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            rc = self.proc.poll() if self.proc else None
            if rc is not None:
                raise AssertionError(
                    f"fleet server exited with {rc} before it was ready\n{self.output()}"
                )
            if not self.kubeconfig.exists():
                time.sleep(0.1)
                continue
            try:
                token = self._read_token()
                with httpx.Client(timeout=2.0, verify=self.verify(),
                                  headers={"Authorization": f"Bearer {token}"}) as c:
                    r = c.get(self.url + "/readyz")  # anonymous requests are refused by default
                if r.status_code == 200 and r.text.strip() == "ok":
                    self.token = token
                    assert self.token, f"no bearer token in {self.kubeconfig}"
                    return
                last = f"{r.status_code} {r.text[:200]!r}"
            except (httpx.TransportError, OSError, yaml.YAMLError, ssl.SSLError) as e:
                last = repr(e)
            time.sleep(0.1)
        raise AssertionError(
            f"fleet server not ready after {timeout}s (last: {last})\n{self.output()}"
        )

    def start(self, timeout: float = READY_TIMEOUT) -> FleetServer:
        self.spawn()
        self.wait_ready(timeout)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would; waits for the process to be gone."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT)
        self._close_log()

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        if self.proc is None:
            return None
        code = terminate(self.proc, timeout)
        self._close_log()
        return code

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    # -- talking to it -----------------------------------------------------
    def _read_token(self) -> str:
        """The admin bearer token: the data dir's static token (`<data-dir>/token`, which
        the server accepts for system:admin), else the kubeconfig's."""
        static = self.data_dir / "token"
        if static.exists() and static.read_text().strip():
            return static.read_text().strip()
        cfg = yaml.safe_load(self.kubeconfig.read_text()) or {}
        users = cfg.get("users") or []
        if not users:
            return ""
        return (users[0].get("user") or {}).get("token") or ""

    def client(self, *, token: str | None = None, timeout: float = 10.0) -> httpx.Client:
        """An httpx client for the API (bearer token from the kubeconfig by default)."""
        tok = self.token if token is None else token
        headers = {"Authorization": f"Bearer {tok}"} if tok else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=self.verify())

    def kubectl(
        self, *args: str, input: str | None = None, timeout: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> tuple[int, str, str]:
        """Run kubectl against this server; returns (rc, stdout, stderr)."""
        return run_kubectl(self, *args, input=input, timeout=timeout, env=env)


def run_kubectl(
    server: FleetServer, *args: str, input: str | None = None, timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    assert KUBECTL, "kubectl not found"
    # A discovery cache per server: ports get reused between runs and kubectl keys its
    # cache by host:port, so a shared cache could serve another server's discovery.
    cache_dir = server.data_dir.parent / "kubectl-cache"
    argv = [KUBECTL, "--kubeconfig", str(server.kubeconfig), "--cache-dir", str(cache_dir), *args]
    full_env = dict(os.environ)
    full_env.pop("KUBECONFIG", None)
    if env:
        full_env.update(env)
    try:
        p = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, env=full_env
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise AssertionError(
            f"kubectl {' '.join(args)} timed out after {timeout}s\nstdout:{out}\nstderr:{err}"
        ) from None
    return p.returncode, p.stdout, p.stderr


class ServerFactory:
    """Creates servers in fresh temp dirs and stops all of them at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.servers: list[FleetServer] = []
        self._n = itertools.count()

    def new(self, data_dir: Path | None = None, extra_args: list[str] | None = None) -> FleetServer:
        """A server (not started) with fresh ports; a fresh data dir unless one is given."""
        n = next(self._n)
        root = self.base / f"server{n}"
        root.mkdir(parents=True, exist_ok=True)
        if data_dir is None:
            data_dir = root / "data"
            data_dir.mkdir()
        port = free_port()
        metrics_port = free_port()
        while metrics_port == port:
            metrics_port = free_port()
        srv = FleetServer(
            data_dir=data_dir, port=port, metrics_port=metrics_port,
            log_path=root / "server.log", extra_args=list(extra_args or []),
        )
        self.servers.append(srv)
        return srv

    def start(self, data_dir: Path | None = None, **kw: Any) -> FleetServer:
        return self.new(data_dir, **kw).start()

    def stop_all(self) -> list[str]:
        problems = []
        for s in self.servers:
            try:
                s.stop()
            except Exception as e:  # keep stopping the others
                problems.append(f"{s.url}: {e!r}")
        return problems


def _make_base(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


@pytest.fixture
def fleet_server_factory() -> Iterator[ServerFactory]:
    """Start servers under a test's control; all are stopped and removed afterwards."""
    base = _make_base("fleet-e2e-")
    factory = ServerFactory(base)
    try:
        yield factory
    finally:
        problems = factory.stop_all()
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


@pytest.fixture(scope="module")
def fleet_server(request: pytest.FixtureRequest) -> Iterator[FleetServer]:
    """One running server shared by the tests of a module (each test uses its own namespace)."""
    base = _make_base("fleet-e2e-mod-")
    factory = ServerFactory(base)
    try:
        srv = factory.start()
        yield srv
    finally:
        problems = factory.stop_all()
        failed = getattr(request.node, "_fleet_failed", False)
        if failed and factory.servers:
            # Show what the server said when something in this module went wrong.
            sys.stderr.write(
                f"\n----- fleet server output ({factory.servers[0].log_path}) -----\n"
                + factory.servers[0].output()[-20000:]
            )
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        # Flag the module so the module-scoped server dumps its log at teardown.
        mod = item.getparent(pytest.Module)
        if mod is not None:
            mod._fleet_failed = True  # type: ignore[attr-defined]


def create_namespace(srv: FleetServer, name: str) -> None:
    with srv.client() as c:
        r = c.post(
            "/api/v1/namespaces",
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        assert r.status_code == 201, (r.status_code, r.text)


@pytest.fixture
def namespace(fleet_server: FleetServer, request: pytest.FixtureRequest) -> str:
    """A fresh namespace (created through the API) for one test."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())
    name = f"{base[:40].strip('-')}-{uuid.uuid4().hex[:6]}"
    create_namespace(fleet_server, name)
    return name


@pytest.fixture
def kubectl(fleet_server: FleetServer):  # type: ignore[no-untyped-def]
    """`kubectl(*args, input=..., timeout=...) -> (rc, stdout, stderr)` against `fleet_server`."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")

    def run(*args: str, **kw: Any) -> tuple[int, str, str]:
        return run_kubectl(fleet_server, *args, **kw)

    return run
