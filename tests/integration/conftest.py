"""A real `fleet server` for the kfleet integration tests.

Kept local to tests/integration (tests/conftest.py belongs to the e2e
fixtures): one server subprocess per module on free ports and a private data
dir, waited for on /readyz, stopped by pid (SIGTERM, then SIGKILL) at the end.
`kfleet_server.run(*argv)` runs kfleet in-process against it and returns
(exit code, stdout, stderr); `kfleet_server.client()` is an async
`fleet.client.Client` for checking what the server really stored.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fleet.cli import kfleet
from fleet.client import Client, KubeconfigError, load_kubeconfig
from fleet.client.rest import ssl_context

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 40.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class KfleetServer:
    proc: subprocess.Popen[bytes]
    data_dir: Path
    port: int
    log_path: Path

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "admin.kubeconfig"

    @property
    def url(self) -> str:
        return load_kubeconfig(str(self.kubeconfig)).server

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH"))
                                            if p)
        return env

    def run(self, *argv: str, stdin: str | None = None) -> tuple[int, str, str]:
        """kfleet in-process with --kubeconfig set; (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        old_stdin = sys.stdin
        if stdin is not None:
            sys.stdin = io.StringIO(stdin)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = kfleet.run(["--kubeconfig", str(self.kubeconfig), *argv])
        finally:
            sys.stdin = old_stdin
        return rc, out.getvalue(), err.getvalue()

    def client(self) -> Client:
        return Client(load_kubeconfig(str(self.kubeconfig)))

    def http(self) -> httpx.Client:
        """A plain sync HTTP client with the admin credentials (checks bypass kfleet)."""
        cfg = load_kubeconfig(str(self.kubeconfig))
        return httpx.Client(base_url=cfg.server, timeout=10, verify=ssl_context(cfg),
                            headers={"Authorization": f"Bearer {cfg.token}"} if cfg.token else {})

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def _wait_ready(server: KfleetServer) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    last = ""
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise AssertionError(f"fleet server exited early:\n{server.output()}")
        if not server.kubeconfig.exists():
            last = "no kubeconfig yet"
            time.sleep(0.1)
            continue
        try:
            with server.http() as h:
                r = h.get("/readyz")
            if r.status_code == 200 and r.text.strip() == "ok":
                return
            last = f"{r.status_code} {r.text[:100]}"
        except (httpx.TransportError, OSError, ValueError, KubeconfigError) as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise AssertionError(f"fleet server not ready ({last}):\n{server.output()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def kfleet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KfleetServer]:
    base = tmp_path_factory.mktemp("kfleet-server")
    data_dir = base / "data"
    port = _free_port()
    log_path = base / "server.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli.main", "server", "--data-dir", str(data_dir),
             "--port", str(port), "--metrics-port", str(_free_port()), "--no-agent", "--no-ingress"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=str(base), start_new_session=True,
        )
    server = KfleetServer(proc, data_dir, port, log_path)
    try:
        _wait_ready(server)
        yield server
    finally:
        _stop(proc)
