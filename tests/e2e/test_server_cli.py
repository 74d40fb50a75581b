"""`fleet server` as a process: kubeconfig, side-by-side servers, auth, bad databases,
health endpoints, metrics and clean shutdown."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DB_FILE_NAME, FleetServer, ServerFactory, create_namespace

pytestmark = pytest.mark.e2e


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def cm(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": name}}


def test_kubeconfig_written_and_path_printed(fleet_server_factory: ServerFactory) -> None:
    srv = fleet_server_factory.start()
    assert srv.kubeconfig.is_file()
    assert str(srv.kubeconfig) in srv.output(), srv.output()
    cfg = yaml.safe_load(srv.kubeconfig.read_text())
    assert cfg["kind"] == "Config" and cfg["apiVersion"] == "v1"
    ctx_name = cfg["current-context"]
    ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
    assert cluster["server"] in (f"https://127.0.0.1:{srv.port}", f"http://127.0.0.1:{srv.port}")
    if cluster["server"].startswith("https://"):
        # The CA that signed the serving certificate, so clients verify it.
        assert "BEGIN CERTIFICATE" in base64.b64decode(cluster["certificate-authority-data"]).decode()
        with httpx.Client(verify=srv.verify(), timeout=10) as c:
            assert c.get(cluster["server"] + "/readyz",
                         headers={"Authorization": f"Bearer {user['token']}"}).status_code == 200
    assert len(user["token"]) >= 16
    # The admin credential is not readable by other users.
    mode = stat.S_IMODE(os.stat(srv.kubeconfig).st_mode)
    assert mode & 0o077 == 0, oct(mode)


def test_two_servers_side_by_side(fleet_server_factory: ServerFactory) -> None:
    a = fleet_server_factory.start()
    b = fleet_server_factory.start()
    assert a.port != b.port and a.data_dir != b.data_dir
    assert a.proc and a.proc.poll() is None and b.proc and b.proc.poll() is None
    assert a.token != b.token, "each data dir gets its own admin token"
    create_namespace(a, "only-a")
    with a.client() as ca:
        assert ca.post("/api/v1/namespaces/only-a/configmaps", json=cm("x")).status_code == 201
        assert ca.get("/api/v1/namespaces/only-a/configmaps/x").status_code == 200
    with b.client() as cb:
        assert cb.get("/api/v1/namespaces/only-a/configmaps/x").status_code == 404
        assert cb.get("/api/v1/namespaces/only-a").status_code == 404
    # One server's token does not open the other.
    with b.client(token=a.token) as cb:
        assert cb.get("/api/v1/namespaces").status_code == 401
    assert a.db_path.exists() and b.db_path.exists()


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token", "Bearer", "Basic YWRtaW46YWRtaW4="])
def test_requests_without_a_valid_token_are_401(fleet_server: FleetServer, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    with httpx.Client(base_url=fleet_server.url, headers=headers, timeout=10,
                      verify=fleet_server.verify()) as c:
        for path in ("/api/v1/namespaces", "/api/v1/namespaces/default/configmaps/x", "/apis/apps/v1"):
            r = c.get(path)
            assert r.status_code == 401, (path, r.status_code, r.text)
            st = r.json()
            assert st["kind"] == "Status" and st["apiVersion"] == "v1"
            assert st["status"] == "Failure" and st["reason"] == "Unauthorized" and st["code"] == 401
        r = c.post("/api/v1/namespaces", json={"metadata": {"name": "sneaky"}})
        assert r.status_code == 401
    with fleet_server.client() as c:
        assert c.get("/api/v1/namespaces/sneaky").status_code == 404


def test_health_endpoints(fleet_server: FleetServer) -> None:
    with httpx.Client(base_url=fleet_server.url, timeout=10, verify=fleet_server.verify()) as c:
        # No credentials: anonymous requests are refused unless --anonymous-auth.
        for path in ("/healthz", "/livez", "/readyz", "/version"):
            r = c.get(path)
            assert r.status_code == 401, (path, r.status_code, r.text)
            assert r.json()["reason"] == "Unauthorized"
    with fleet_server.client() as c:
        for path in ("/healthz", "/livez", "/readyz"):
            r = c.get(path)
            assert r.status_code == 200, (path, r.status_code, r.text)
            assert r.text.strip() == "ok", (path, r.text)
        r = c.get("/readyz", params={"verbose": "1"})
        assert r.status_code == 200 and "ok" in r.text
        # kube-apiserver's healthz output and spellings (fleet/server/health.py), and the
        # status line's reason phrase (fleet/server/statusline.py; httpx speaks HTTP/1.1).
        assert r.reason_phrase == "OK" and r.headers["content-type"] == "text/plain; charset=utf-8"
        assert r.text.startswith("[+]ping ok\n") and r.text.endswith("readyz check passed\n"), r.text
        for path in ("/healthz/", "/livez/ping", "/readyz/etcd", "/readyz/informer-sync", "/version/"):
            assert c.get(path).status_code == 200, path
        r = c.get("/readyz/no-such-check")
        assert (r.status_code, r.reason_phrase) == (404, "Not Found")
    with fleet_server.client() as c:
        r = c.get("/version")
        assert r.status_code == 200
        v = r.json()
        assert v["major"] == "1" and v["gitVersion"].startswith("v1.")


def _start_expecting_failure(srv: FleetServer) -> tuple[int, str]:
    srv.spawn()
    rc = srv.wait_exit(timeout=30)
    if rc is None:
        srv.stop()
        raise AssertionError(f"server with a bad database kept running\n{srv.output()}")
    return rc, srv.output()


def test_corrupt_database_refused_and_untouched(fleet_server_factory: ServerFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = data / DB_FILE_NAME
    db.write_bytes(os.urandom(64 * 1024))
    digest, mtime = sha256(db), db.stat().st_mtime_ns
    srv = fleet_server_factory.new(data_dir=data)
    rc, out = _start_expecting_failure(srv)
    assert rc != 0, out
    assert str(db) in out, out
    # (The path is dropped first: it contains the test's name.)
    message = out.replace(str(db), "<db>").replace(str(tmp_path), "<tmp>")
    assert re.search(r"not a sqlite database|corrupt|malformed|damaged", message, re.I), out
    assert "refusing" in message or "untouched" in message or "not modified" in message, out
    assert "Traceback" not in out, "expected a clear error, not a traceback:\n" + out
    assert sha256(db) == digest and db.stat().st_mtime_ns == mtime
    assert not Path(str(db) + "-wal").exists() or Path(str(db) + "-wal").stat().st_size == 0
    with httpx.Client(timeout=2) as c, pytest.raises(httpx.TransportError):
        c.get(f"{srv.url}/readyz")


def test_foreign_sqlite_database_refused_and_untouched(fleet_server_factory: ServerFactory,
                                                       tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = data / DB_FILE_NAME
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('alice'), ('bob')")
    conn.commit()
    conn.close()
    digest = sha256(db)
    srv = fleet_server_factory.new(data_dir=data)
    rc, out = _start_expecting_failure(srv)
    assert rc != 0, out
    assert str(db) in out, out
    message = out.replace(str(db), "<db>").replace(str(tmp_path), "<tmp>")
    assert re.search(r"not a fleet|foreign|unknown schema|unexpected tables|not created by fleet",
                     message, re.I), out
    assert "Traceback" not in out, "expected a clear error, not a traceback:\n" + out
    assert sha256(db) == digest
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert tables == ["users"]
    finally:
        conn.close()


def test_empty_data_dir_is_initialised_and_reopened(fleet_server_factory: ServerFactory) -> None:
    srv = fleet_server_factory.start()
    token = srv.token
    create_namespace(srv, "keep")
    assert srv.stop() == 0, srv.output()[-3000:]
    srv.start()
    assert srv.token == token, "restarting on the same data dir keeps the admin token"
    with srv.client() as c:
        assert c.get("/api/v1/namespaces/keep").status_code == 200


def _families(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, []).extend(fam.samples)
    return out


def test_metrics(fleet_server: FleetServer, namespace: str) -> None:
    with fleet_server.client() as c:
        assert c.post(f"/api/v1/namespaces/{namespace}/configmaps", json=cm("m")).status_code == 201
        assert c.post(f"/api/v1/namespaces/{namespace}/configmaps", json=cm("m")).status_code == 409
        r = c.get(f"/api/v1/namespaces/{namespace}/configmaps")
        assert r.status_code == 200
        list_rv = int(r.json()["metadata"]["resourceVersion"])
        assert c.get(f"/api/v1/namespaces/{namespace}/configmaps/missing").status_code == 404
        with c.stream("GET", f"/api/v1/namespaces/{namespace}/configmaps",
                      params={"watch": "1", "timeoutSeconds": "30"}) as w:
            assert w.status_code == 200
            with httpx.Client(timeout=10) as m:
                r = m.get(fleet_server.metrics_url)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    fams = _families(r.text)

    # Request counters labelled by verb, resource and code, like apiserver_request_total.
    req = [s for s in fams.get("fleet_apiserver_request", []) if s.name == "fleet_apiserver_request_total"]
    assert req, sorted(fams)
    assert all({"verb", "resource", "code"} <= set(s.labels) for s in req), req

    def count(verb: str, code: str) -> float:
        return sum(s.value for s in req
                   if s.labels["verb"] == verb and s.labels["resource"] == "configmaps"
                   and s.labels["code"] == code)

    assert count("create", "201") >= 1, req
    assert count("list", "200") >= 1, req
    # Failed requests are counted under the Kubernetes verb and resource too.
    assert count("get", "404") >= 1, req
    assert count("create", "409") >= 1, req
    assert count("watch", "200") >= 1, req
    assert "fleet_apiserver_request_duration_seconds" in fams

    def gauge(name: str) -> float:
        assert name in fams, sorted(fams)
        return fams[name][0].value

    assert gauge("fleet_store_revision") >= list_rv
    assert gauge("fleet_store_db_bytes") > 0
    assert gauge("fleet_store_keys") >= 5  # four default namespaces, ours, the ConfigMap
    assert gauge("fleet_apiserver_watches") >= 1  # the watch open while scraping


def test_sigterm_exits_cleanly(fleet_server_factory: ServerFactory) -> None:
    srv = fleet_server_factory.start()
    with srv.client() as c, c.stream("GET", "/api/v1/namespaces", params={"watch": "1"}) as w:
        # An open watch must not hold up shutdown.
        assert w.status_code == 200
        rc = srv.stop(timeout=15)
    assert rc == 0, srv.output()[-3000:]


def test_cli_help_lists_server_flags() -> None:
    """`fleet server --help` through `python -m` and through the `fleet.py` script shim."""
    repo = Path(__file__).resolve().parents[2]
    for argv in ([sys.executable, "-m", "fleet.cli.main", "server", "--help"],
                 [sys.executable, str(repo / "fleet.py"), "server", "--help"]):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=str(repo),
                           env={**os.environ, "COLUMNS": "200"})
        assert p.returncode == 0, p.stderr
        for flag in ("--data-dir", "--port", "--metrics-port"):
            assert flag in p.stdout, (argv, p.stdout)


def test_bad_flag_is_a_usage_error(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "fleet.cli.main", "server", "--data-dir", str(tmp_path),
                        "--port", "not-a-number"], capture_output=True, text=True, timeout=60,
                       cwd=str(Path(__file__).resolve().parents[2]))
    assert p.returncode != 0
    assert "port" in (p.stdout + p.stderr).lower()
    assert not (tmp_path / DB_FILE_NAME).exists()
