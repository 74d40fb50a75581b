"""Secrets sealed at rest, end to end: a real `fleet server` with
--encryption-provider-config whose kms v2 provider is the test KMS (a separate
process on a unix socket).  The Secret's plaintext and base64 are nowhere in
the database file, its WAL or a backup; kubectl still reads it; `fleet secrets
rotate` moves every Secret to a new key added at the front; with the KMS stopped
the server refuses to start, naming the provider.

Fleet has no backup command of its own: a backup is SQLite's online backup of
`fleet.db` (what `sqlite3 fleet.db .backup` does), taken here while the server runs.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KUBECTL, ServerFactory, _server_env

pytestmark = pytest.mark.skipif(not KUBECTL, reason="kubectl not found")

VALUES = {f"s{i}": f"swordfish-{i}-{os.getpid()}-plaintext" for i in range(3)}


def _config(path: Path, providers: list[dict]) -> Path:
    path.write_text(json.dumps({"apiVersion": "apiserver.config.k8s.io/v1",
                                "kind": "EncryptionConfiguration",
                                "resources": [{"resources": ["secrets"], "providers": providers}]}))
    return path


@pytest.fixture
def kms_proc(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    sock = Path(f"/tmp/fleet-e2e-kms-{os.getpid()}.sock")
    sock.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "fleet.testing.kms", "--socket", str(sock),
                             "--key-dir", str(tmp_path / "kms-keys")],
                            env=_server_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert proc.poll() is None, "the test KMS exited"
            assert time.monotonic() < deadline, "the test KMS did not start"
            time.sleep(0.05)
        yield proc, f"unix://{sock}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        sock.unlink(missing_ok=True)


def _disk_bytes(*paths: Path) -> bytes:
    return b"".join(p.read_bytes() for p in paths if p.exists())


def _live_secret_rows(db: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT v.key, l.value FROM live v JOIN log l ON l.revision = v.revision"
                            " WHERE v.key >= '/core/secrets/' AND v.key < '/core/secrets0'").fetchall()
    finally:
        conn.close()


def test_secrets_sealed_at_rest_rotation_and_fail_closed(
        fleet_server_factory: ServerFactory, kms_proc: tuple[subprocess.Popen[bytes], str],
        tmp_path: Path) -> None:
    proc, endpoint = kms_proc
    kms1 = {"kms": {"apiVersion": "v2", "name": "kms1", "endpoint": endpoint, "timeout": "3s"}}
    cfg1 = _config(tmp_path / "enc1.yaml", [kms1])
    srv = fleet_server_factory.start(extra_args=["--encryption-provider-config", str(cfg1)])

    for name, value in VALUES.items():
        rc, out, err = srv.kubectl("create", "secret", "generic", name, f"--from-literal=password={value}")
        assert rc == 0, err
    for name, value in VALUES.items():
        rc, out, err = srv.kubectl("get", "secret", name, "-o", "jsonpath={.data.password}")
        assert rc == 0, err
        assert base64.b64decode(out).decode() == value

    backup = tmp_path / "backup.db"
    src = sqlite3.connect(f"file:{srv.db_path}?mode=ro", uri=True)
    dst = sqlite3.connect(backup)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    raw = _disk_bytes(srv.db_path, Path(f"{srv.db_path}-wal"), backup)
    assert raw, "no database bytes read"
    for value in VALUES.values():
        for needle in (value, base64.b64encode(value.encode()).decode()):
            assert needle.encode() not in raw, f"{needle!r} is on disk"
    rows = _live_secret_rows(srv.db_path)
    assert {k.rsplit("/", 1)[1] for k, _ in rows} >= set(VALUES)
    assert all(v.startswith("k8s:enc:kms:v2:kms1:") for _, v in rows), rows[:1]

    # Rotation: a new key (kms2, a local key file) at the front; kms1 still reads.
    keyfile = tmp_path / "kek2"
    keyfile.write_text(base64.b64encode(os.urandom(32)).decode())
    kms2 = {"kms": {"apiVersion": "v2", "name": "kms2", "endpoint": f"file://{keyfile}"}}
    cfg2 = _config(tmp_path / "enc2.yaml", [kms2, kms1])
    srv.stop()
    srv2 = fleet_server_factory.start(data_dir=srv.data_dir,
                                      extra_args=["--encryption-provider-config", str(cfg2)])
    rotate = subprocess.run([sys.executable, "-m", "fleet.cli.main", "secrets", "rotate",
                             "--kubeconfig", str(srv2.kubeconfig),
                             "--encryption-provider-config", str(cfg2)],
                            capture_output=True, text=True, timeout=60, env=_server_env())
    assert rotate.returncode == 0, rotate.stderr
    assert "secrets:" in rotate.stdout and "rewritten" in rotate.stdout
    rows = _live_secret_rows(srv2.db_path)
    assert rows and all(v.startswith("k8s:enc:kms:v2:kms2:") for _, v in rows), \
        [v[:24] for _, v in rows]
    for name, value in VALUES.items():
        rc, out, err = srv2.kubectl("get", "secret", name, "-o", "jsonpath={.data.password}")
        assert rc == 0, err
        assert base64.b64decode(out).decode() == value
    srv2.stop()

    # The KMS stopped: the server refuses to start, naming the provider.
    proc.kill()
    proc.wait(timeout=10)
    srv3 = fleet_server_factory.new(data_dir=srv.data_dir,
                                    extra_args=["--encryption-provider-config", str(cfg2)])
    srv3.spawn()
    rc = srv3.wait_exit(60)
    assert rc not in (None, 0), srv3.output()
    assert 'kms provider "kms1"' in srv3.output() and "unreachable" in srv3.output()


def test_invalid_encryption_config_refuses_to_start(fleet_server_factory: ServerFactory,
                                                    tmp_path: Path) -> None:
    cfg = _config(tmp_path / "bad.yaml", [{"aesgcm": {"keys": [{"name": "k", "secret": "c2hvcnQ="}]}}])
    srv = fleet_server_factory.new(extra_args=["--encryption-provider-config", str(cfg)])
    srv.spawn()
    rc = srv.wait_exit(60)
    assert rc not in (None, 0)
    assert "--encryption-provider-config" in srv.output() and "key of length 5 is invalid" in srv.output()
