"""A real `fleet server` on 127.0.0.1, attacked the way the review did (issue 9).

- `DELETE .../configmaps/%2F` must delete nothing (it deleted the namespace's
  every ConfigMap when the decoded path was split);
- slow clients are dropped or answered within bounded time: a header
  slowloris, a partial body, a huge Content-Length, a 2^64 chunk size, an idle
  TCP connection to the TLS port and to the metrics port — while a normal
  client keeps being served;
- and a watch whose timeoutSeconds is longer than all those timeouts still
  streams (the bounds are on requests arriving, never on responses).

The server runs with 2 s timeouts (`--keep-alive-timeout` etc.).  Every wait
in here is bounded by a socket timeout or a deadline.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from fleet.client import load_kubeconfig

from .conftest import REPO_ROOT, KfleetServer, _free_port, _stop, _wait_ready

TIMEOUT = 2.0  # every server-side bound, in seconds
SLACK = 6.0  # what a loaded 2-core machine may add before the server acts
CM = "/api/v1/namespaces/default/configmaps"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KfleetServer, int]]:
    base = tmp_path_factory.mktemp("hardening")
    data_dir = base / "data"
    port, metrics_port = _free_port(), _free_port()
    log_path = base / "server.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli.main", "server", "--data-dir", str(data_dir),
             "--port", str(port), "--metrics-port", str(metrics_port), "--no-agent", "--no-scheduler", "--no-ingress",
             "--keep-alive-timeout", str(TIMEOUT), "--tls-handshake-timeout", str(TIMEOUT),
             "--request-body-timeout", str(TIMEOUT)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=str(base), start_new_session=True,
        )
    srv = KfleetServer(proc, data_dir, port, log_path)
    try:
        _wait_ready(srv)
        yield srv, metrics_port
    finally:
        _stop(proc)


# ------------------------------------------------------------------ raw sockets
def _tls_context(srv: KfleetServer) -> ssl.SSLContext:
    cfg = load_kubeconfig(str(srv.kubeconfig))
    ctx = ssl.create_default_context(cadata=(cfg.ca_data or b"").decode())
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _connect(srv: KfleetServer) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    return _tls_context(srv).wrap_socket(raw, server_hostname="127.0.0.1")


def _token(srv: KfleetServer) -> str:
    return load_kubeconfig(str(srv.kubeconfig)).token or ""


def _head(srv: KfleetServer, method: str, path: str, extra: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {_token(srv)}\r\n"
            f"{extra}\r\n").encode()


def _read_response(sock: socket.socket, deadline: float) -> bytes:
    """Everything the server sends until it closes or a full response is in."""
    data = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except (ConnectionError, ssl.SSLError, OSError):
            break
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:") and len(body) >= int(line.split(b":")[1]):
                    return data
    return data


def _closed_within(sock: socket.socket, seconds: float, poke: Callable[[], None] | None = None) -> float | None:
    """Seconds until the server closed `sock` (None: still open after `seconds`).
    `poke` is called every 0.5 s (a slowloris sending one more header byte)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            if poke is not None:
                poke()
            sock.settimeout(0.5)
            if sock.recv(65536) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except (ConnectionError, ssl.SSLError, OSError):
            return time.monotonic() - t0
    return None


def _status(resp: bytes) -> int:
    return int(resp.split(b" ", 2)[1]) if resp.startswith(b"HTTP/1.1 ") else 0


def _json_body(resp: bytes) -> dict:
    return json.loads(resp.partition(b"\r\n\r\n")[2] or b"{}")


# ------------------------------------------------------------------------ tests
def test_delete_of_encoded_slash_deletes_none(server: tuple[KfleetServer, int]) -> None:
    srv, _ = server
    with srv.http() as h:
        for n in ("h1", "h2", "h3"):
            r = h.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n}})
            assert r.status_code == 201, r.text
    for path in (f"{CM}/%2F", f"{CM}/%2f", f"{CM}/..", f"{CM}//"):
        with _connect(srv) as s:
            s.sendall(_head(srv, "DELETE", path, "Content-Length: 0\r\n"))
            resp = _read_response(s, time.monotonic() + 10)
        assert _status(resp) in (400, 404), (path, resp[:300])
        assert _json_body(resp)["kind"] == "Status"
    with _connect(srv) as s:
        s.sendall(_head(srv, "DELETE", f"{CM}/%2F", "Content-Length: 0\r\n"))
        body = _json_body(_read_response(s, time.monotonic() + 10))
    assert body["reason"] == "BadRequest" and body["message"] == (
        """invalid resource name "/": [may not contain '/']""")
    with srv.http() as h:
        names = {i["metadata"]["name"] for i in h.get(CM).json()["items"]}
    assert {"h1", "h2", "h3"} <= names


def test_slow_clients_are_dropped_while_others_are_served(server: tuple[KfleetServer, int]) -> None:
    srv, metrics_port = server
    results: dict[str, object] = {}

    def slowloris() -> None:
        with _connect(srv) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            results["slowloris"] = _closed_within(s, TIMEOUT + SLACK, poke=lambda: s.sendall(b"a"))

    def partial_body() -> None:
        with _connect(srv) as s:
            s.sendall(_head(srv, "POST", CM, "Content-Type: application/json\r\nContent-Length: 100\r\n")
                      + b'{"apiVersion"')
            t0 = time.monotonic()
            resp = _read_response(s, t0 + TIMEOUT + SLACK)
            results["partial_body"] = (_status(resp), time.monotonic() - t0)

    def huge_length() -> None:
        # 10^20 has more digits than h11 takes (it answers 400 itself); 10^19 reaches
        # FleetASGI, which must refuse it by its declared length, before reading.
        for length, key in (("100000000000000000000", "huge_length_h11"), ("10000000000000000000", "huge_length")):
            with _connect(srv) as s:
                s.sendall(_head(srv, "POST", CM, "Content-Type: application/json\r\n"
                                                 f"Content-Length: {length}\r\n") + b"{")
                t0 = time.monotonic()
                resp = _read_response(s, t0 + TIMEOUT + SLACK)
                results[key] = (_status(resp), time.monotonic() - t0)

    def huge_chunk() -> None:
        with _connect(srv) as s:
            s.sendall(_head(srv, "POST", CM, "Content-Type: application/json\r\n"
                                             "Transfer-Encoding: chunked\r\n") + b"10000000000000000\r\n{")
            t0 = time.monotonic()
            resp = _read_response(s, t0 + TIMEOUT + SLACK)
            results["huge_chunk"] = (_status(resp), time.monotonic() - t0)

    def idle_tls() -> None:  # connect, never handshake
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            results["idle_tls"] = _closed_within(s, TIMEOUT + SLACK)

    def idle_metrics() -> None:
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=10) as s:
            results["idle_metrics"] = _closed_within(s, TIMEOUT + SLACK)

    threads = [threading.Thread(target=f, daemon=True)
               for f in (slowloris, partial_body, huge_length, huge_chunk, idle_tls, idle_metrics)]
    for t in threads:
        t.start()
    # Meanwhile a normal client keeps being served, promptly.
    served = 0
    with srv.http() as h:
        t0 = time.monotonic()
        while time.monotonic() - t0 < TIMEOUT + 1 and served < 20:
            r = h.get(CM, timeout=5)
            assert r.status_code == 200
            served += 1
            time.sleep(0.1)
    for t in threads:
        t.join(timeout=TIMEOUT + SLACK + 10)
    assert served >= 5

    bound = TIMEOUT + SLACK
    assert results["slowloris"] is not None, "a header slowloris was never dropped"
    assert results["idle_tls"] is not None, "an idle TCP connection to the TLS port was never dropped"
    assert results["idle_metrics"] is not None, "an idle connection to the metrics port was never dropped"
    code, took = results["partial_body"]  # type: ignore[misc]
    assert code == 408 and took < bound, results
    code, took = results["huge_length"]  # type: ignore[misc]
    assert code == 413 and took < TIMEOUT, results  # at once, without waiting for the body
    code, took = results["huge_length_h11"]  # type: ignore[misc]
    assert code in (400, 413) and took < TIMEOUT, results
    code, took = results["huge_chunk"]  # type: ignore[misc]
    assert code in (408, 413) and took < bound, results


def test_watch_outlives_the_request_timeouts(server: tuple[KfleetServer, int]) -> None:
    srv, _ = server
    cfg = load_kubeconfig(str(srv.kubeconfig))
    ctx = _tls_context(srv)
    headers = {"Authorization": f"Bearer {cfg.token}"}
    watch_for = 3 * TIMEOUT + 1
    events: list[tuple[float, str]] = []
    with httpx.Client(base_url=cfg.server, verify=ctx, headers=headers, timeout=watch_for + SLACK) as h:
        rv = h.get(CM).json()["metadata"]["resourceVersion"]

        def create_late() -> None:
            time.sleep(2 * TIMEOUT + 0.5)  # past every server-side bound
            with httpx.Client(base_url=cfg.server, verify=ctx, headers=headers, timeout=10) as c:
                c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}})

        t0 = time.monotonic()
        creator = threading.Thread(target=create_late, daemon=True)
        creator.start()
        with h.stream("GET", CM, params={"watch": "1", "resourceVersion": rv,
                                         "timeoutSeconds": str(int(watch_for))}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.strip():
                    ev = json.loads(line)
                    events.append((time.monotonic() - t0, ev["object"]["metadata"]["name"]))
        ended = time.monotonic() - t0
        creator.join(timeout=10)
    assert [n for _, n in events] == ["late"]
    assert events[0][0] > 2 * TIMEOUT  # streamed after the timeouts would have cut it
    assert watch_for - 1 <= ended < watch_for + SLACK  # ended by timeoutSeconds, not earlier


def test_server_log_has_no_tracebacks(server: tuple[KfleetServer, int]) -> None:
    srv, _ = server
    out = Path(srv.log_path).read_text(errors="replace")
    assert "Traceback" not in out, out[-3000:]
