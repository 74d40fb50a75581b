"""Encryption at rest: the EncryptionConfiguration parser, the aesgcm and kms v2
providers (against the test KMS on a unix socket), and the store seam (no
plaintext in the file or its WAL; every read path gives plaintext back)."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.store import encryption as enc
from fleet.store import open_store
from fleet.store.encryption import (
    DecryptError,
    EncryptionCodec,
    EncryptionConfigError,
    load_codec,
    parse_config,
)
from fleet.store.kms import KMSError, LocalKeyFile, OAuth2ClientCredentials, RemoteKMS
from fleet.testing.kms import TestKMS

KEY1 = base64.b64encode(b"1" * 32).decode()
KEY2 = base64.b64encode(b"2" * 32).decode()
SECRET_VALUE = "hunter2-very-secret-value"
SECRET_B64 = base64.b64encode(SECRET_VALUE.encode()).decode()


def config(providers: list[dict[str, Any]], resources: list[str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "EncryptionConfiguration",
            "resources": [{"resources": resources or ["secrets"], "providers": providers}]}


def aesgcm(*keys: tuple[str, str]) -> dict[str, Any]:
    return {"aesgcm": {"keys": [{"name": n, "secret": s} for n, s in keys]}}


@pytest.fixture
def kms(tmp_path: Path) -> Any:
    # A short path: unix socket paths are limited to ~100 bytes.
    sock = Path(f"/tmp/fleet-kms-test-{os.getpid()}-{id(tmp_path)}.sock")
    with TestKMS(sock) as k:
        yield k


def kms_provider(k: TestKMS, name: str = "kms1") -> dict[str, Any]:
    return {"kms": {"apiVersion": "v2", "name": name, "endpoint": k.endpoint, "timeout": "2s"}}


# ---- the config


@pytest.mark.parametrize("doc, message", [
    ({"kind": "EncryptionConfiguration"}, "apiVersion"),
    (config([]), "at least one provider"),
    (config([{"aescbc": {"keys": []}}]), "'aescbc' is not supported"),
    (config([aesgcm(("k", base64.b64encode(b"short").decode()))]), "key of length 5 is invalid"),
    (config([aesgcm(("k", "not base64!!"))]), "not valid base64"),
    (config([aesgcm(("a:b", KEY1))]), "without ':'"),
    (config([aesgcm(("k", KEY1), ("k", KEY2))]), "used twice"),
    (config([{"kms": {"apiVersion": "v1", "name": "x", "endpoint": "unix:///x"}}]), "only apiVersion v2"),
    (config([{"kms": {"apiVersion": "v2", "name": "x", "endpoint": "tcp://x"}}]), "must be unix"),
    (config([{"kms": {"apiVersion": "v2", "name": "x", "endpoint": "unix:///x", "timeout": "soon"}}]),
     "not a positive duration"),
    (config([{"kms": {"apiVersion": "v2", "name": "x", "endpoint": "unix:///x"}},
             {"kms": {"apiVersion": "v2", "name": "x", "endpoint": "unix:///y"}}]), "must be unique"),
    (config([{"identity": {}}], ["*"]), "use '\\*\\.'"),
    (config([{"identity": {}}], ["secrets", "secrets"]), "listed twice"),
    (config([{"rot13": {}}]), "unknown provider type 'rot13'"),
])
def test_invalid_configs_are_refused_with_the_field_named(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(EncryptionConfigError, match=message):
        parse_config(doc)


def test_resource_matching_first_entry_wins() -> None:
    doc = config([{"identity": {}}], ["events"])
    doc["resources"] += [{"resources": ["secrets", "*.apps"], "providers": [aesgcm(("k1", KEY1))]},
                         {"resources": ["*.*"], "providers": [aesgcm(("k2", KEY2))]}]
    codec = EncryptionCodec(parse_config(doc))
    names = {k: type(codec.providers_for(k)[0]).__name__ + getattr(codec.providers_for(k)[0], "name", "")
             for k in ("/core/events/ns/e", "/core/secrets/ns/s", "/apps/deployments/ns/d",
                       "/core/configmaps/ns/c")}
    assert names == {"/core/events/ns/e": "Identityidentity", "/core/secrets/ns/s": "AESGCMKeyk1",
                     "/apps/deployments/ns/d": "AESGCMKeyk1", "/core/configmaps/ns/c": "AESGCMKeyk2"}
    only_secrets = EncryptionCodec(parse_config(config([aesgcm(("k", KEY1))])))
    assert only_secrets.providers_for("/core/configmaps/ns/c") is None
    assert only_secrets.seal("/core/configmaps/ns/c", "{}") == "{}"


# ---- the providers


def test_aesgcm_prefix_roundtrip_and_key_bound_to_its_storage_key() -> None:
    codec = EncryptionCodec(parse_config(config([aesgcm(("key1", KEY1))])))
    text = json.dumps({"data": {"password": SECRET_B64}})
    stored = codec.seal("/core/secrets/ns/a", text)
    assert stored.startswith("k8s:enc:aesgcm:v1:key1:")
    assert SECRET_B64 not in stored
    assert codec.open("/core/secrets/ns/a", stored) == text
    # The storage key is authenticated data: a value moved under another key fails.
    with pytest.raises(DecryptError, match="cannot decrypt"):
        codec.open("/core/secrets/ns/b", stored)


def test_provider_order_first_writes_all_read_and_identity_reads_plaintext() -> None:
    old = EncryptionCodec(parse_config(config([aesgcm(("key1", KEY1))])))
    v1 = old.seal("/core/secrets/ns/a", '{"a":1}')
    new = EncryptionCodec(parse_config(config([aesgcm(("key2", KEY2), ("key1", KEY1))])))
    assert new.open("/core/secrets/ns/a", v1) == '{"a":1}'
    assert new.seal("/core/secrets/ns/a", '{"a":1}').startswith("k8s:enc:aesgcm:v1:key2:")
    # Plaintext (written before encryption was on) reads only with identity listed.
    with pytest.raises(DecryptError, match="no provider can read"):
        new.open("/core/secrets/ns/a", '{"a":1}')
    migrating = EncryptionCodec(parse_config(config([aesgcm(("key2", KEY2)), {"identity": {}}])))
    assert migrating.open("/core/secrets/ns/a", '{"a":1}') == '{"a":1}'
    # A key removed from the config: refused, naming what is stored.
    only2 = EncryptionCodec(parse_config(config([aesgcm(("key2", KEY2))])))
    with pytest.raises(DecryptError, match="k8s:enc:aesgcm:v1:key1"):
        only2.open("/core/secrets/ns/a", v1)


def test_kms_v2_envelope_wraps_one_seed_and_derives_a_key_per_write(kms: TestKMS) -> None:
    codec = load_codec_from(config([kms_provider(kms)]))
    values = [codec.seal(f"/core/secrets/ns/s{i}", json.dumps({"v": SECRET_VALUE})) for i in range(20)]
    assert all(v.startswith("k8s:enc:kms:v2:kms1:") for v in values)
    assert not any(SECRET_VALUE in v for v in values)
    salts = {json.loads(v[len("k8s:enc:kms:v2:kms1:"):])["s"] for v in values}
    assert len(salts) == 20  # a fresh key derivation per write
    assert kms.calls.count("wrap") == 1  # one seed wrapped for all of them
    # A second process (empty cache) unwraps once, then reads everything.
    reader = load_codec_from(config([kms_provider(kms)]))
    assert [json.loads(reader.open(f"/core/secrets/ns/s{i}", v))["v"] for i, v in enumerate(values)] \
        == [SECRET_VALUE] * 20
    assert kms.calls.count("unwrap") == 1
    with pytest.raises(DecryptError):
        reader.open("/core/secrets/ns/other", values[0])


def test_kms_kek_rotation_in_the_kms_gets_a_new_seed(kms: TestKMS, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(enc, "STATUS_INTERVAL", 0.0)
    codec = load_codec_from(config([kms_provider(kms)]))
    first = codec.seal("/core/secrets/ns/a", "{}")
    new_kid = kms.rotate()
    second = codec.seal("/core/secrets/ns/a", "{}")
    assert json.loads(first.split(":", 5)[5])["k"] != new_kid
    assert json.loads(second.split(":", 5)[5])["k"] == new_kid
    assert codec.open("/core/secrets/ns/a", first) == "{}"  # the old KEK still unwraps


def test_unreachable_kms_fails_closed_naming_the_provider(tmp_path: Path) -> None:
    cfg = tmp_path / "enc.yaml"
    cfg.write_text(json.dumps(config([{"kms": {"apiVersion": "v2", "name": "vault",
                                                "endpoint": f"unix://{tmp_path}/none.sock"}}])))
    with pytest.raises(EncryptionConfigError, match='kms provider "vault": KMS plugin at unix://.*unreachable'):
        load_codec(cfg)


def test_local_key_file_plugin(tmp_path: Path) -> None:
    keyfile = tmp_path / "kek"
    keyfile.write_text(KEY1)
    plugin = LocalKeyFile(keyfile)
    wrapped, kid = plugin.wrap(b"d" * 32)
    assert plugin.status() == kid and plugin.unwrap(wrapped, kid) == b"d" * 32
    codec = load_codec_from(config([{"kms": {"apiVersion": "v2", "name": "dev",
                                             "endpoint": f"file://{keyfile}"}}]))
    assert codec.open("/core/secrets/n/x", codec.seal("/core/secrets/n/x", "{}")) == "{}"
    keyfile.write_text(KEY2)
    with pytest.raises(KMSError, match="not"):
        plugin.unwrap(wrapped, kid)


def test_oauth2_client_credentials_token_is_fetched_once_and_sent(tmp_path: Path) -> None:
    seen: list[str] = []

    class TokenHandler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = json.dumps({"access_token": "tok-123", "token_type": "Bearer",
                               "expires_in": 3600}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), TokenHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    sock = Path(f"/tmp/fleet-kms-oauth-{os.getpid()}.sock")
    try:
        with TestKMS(sock, token="tok-123") as k:
            with pytest.raises(KMSError, match="401"):
                RemoteKMS(k.endpoint).status()
            creds = OAuth2ClientCredentials(token_url=f"http://127.0.0.1:{httpd.server_port}/token",
                                            client_id="fleet", client_secret="s3cret")
            remote = RemoteKMS(k.endpoint, oauth2=creds)
            wrapped, kid = remote.wrap(b"x" * 32)
            assert remote.unwrap(wrapped, kid) == b"x" * 32 and remote.status() == kid
            assert creds.fetches == 1
            assert seen == ["Basic " + base64.b64encode(b"fleet:s3cret").decode()]
    finally:
        httpd.shutdown()
        httpd.server_close()


def load_codec_from(doc: dict[str, Any]) -> EncryptionCodec:
    codec = EncryptionCodec(parse_config(doc))
    codec.check()
    return codec


# ---- the store seam


def _secret(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "ns"},
            "data": {"password": SECRET_B64}}


def _file_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())


async def test_store_holds_only_ciphertext_and_every_read_path_gives_plaintext(
        tmp_path: Path, kms: TestKMS) -> None:
    codec = load_codec_from(config([kms_provider(kms)]))
    db = tmp_path / "fleet.db"
    async with open_store(db, codec=codec, checkpoint_pages=1) as store:
        # (The configmap first: a watch from revision 0 would mean "from now".)
        await store.create("/core/configmaps/ns/c", {"metadata": {"name": "c"}, "data": {"x": "plain-cm"}})
        w = await store.watch("/core/secrets/", from_revision=0)
        created = await store.create("/core/secrets/ns/a", _secret("a"))
        assert created["data"]["password"] == SECRET_B64
        obj = dict(created)
        obj["data"] = {"password": SECRET_B64, "more": SECRET_B64}
        await store.update("/core/secrets/ns/a", obj)
        # Live watch, get, list, list at an old revision, and a watch replaying history.
        with trio.fail_after(5):
            ev = await w.__anext__()
        await w.aclose()
        assert ev.obj["data"]["password"] == SECRET_B64
        assert (await store.get("/core/secrets/ns/a"))["data"]["more"] == SECRET_B64
        listed = await store.list("/core/secrets/")
        assert listed.items[0]["data"]["more"] == SECRET_B64
        old = await store.list("/core/secrets/", revision=int(created["metadata"]["resourceVersion"]))
        assert old.items[0]["data"] == {"password": SECRET_B64}
        replay = await store.watch("/core/secrets/", from_revision=int(created["metadata"]["resourceVersion"]) - 1)
        with trio.fail_after(5):
            e1 = await replay.__anext__()
            e2 = await replay.__anext__()
        await replay.aclose()
        assert e1.obj["data"]["password"] == SECRET_B64 and e2.prev["data"] == {"password": SECRET_B64}
        raw = _file_bytes(db)
        assert SECRET_B64.encode() not in raw and SECRET_VALUE.encode() not in raw
        assert b"k8s:enc:kms:v2:kms1:" in raw
        assert b"plain-cm" in raw  # configmaps are not in the config
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT value FROM log WHERE key LIKE '/core/secrets/%'").fetchall()
    finally:
        conn.close()
    assert rows and all(r[0].startswith("k8s:enc:kms:v2:kms1:") for r in rows)
    # Reopened by a new process (fresh caches), the data still reads.
    async with open_store(db, codec=load_codec_from(config([kms_provider(kms)]))) as store:
        assert (await store.get("/core/secrets/ns/a"))["data"]["more"] == SECRET_B64


_texts = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                      max_leaves=12).map(lambda v: json.dumps(v, separators=(",", ":")))


@settings(max_examples=60, deadline=None)
@given(text=_texts, name=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=30))
def test_seal_then_open_is_the_identity_and_never_shows_the_text(text: str, name: str) -> None:
    codec = EncryptionCodec(parse_config(config([aesgcm(("key2", KEY2), ("key1", KEY1))])))
    key = f"/core/secrets/ns/{name}"
    stored = codec.seal(key, text)
    assert stored.startswith("k8s:enc:aesgcm:v1:key2:")
    assert codec.open(key, stored) == text
    if len(text) >= 8:
        assert text not in stored


def test_https_kms_with_ca_file_and_oauth2_from_the_config(tmp_path: Path) -> None:
    class TokenHandler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.dumps({"access_token": "tls-tok", "expires_in": 600}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), TokenHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    secret_file = tmp_path / "client-secret"
    secret_file.write_text("s3cret\n")
    try:
        with TestKMS(tls_dir=tmp_path / "tls", token="tls-tok") as k:
            assert k.endpoint.startswith("https://127.0.0.1:")
            entry = {"kms": {"apiVersion": "v2", "name": "remote", "endpoint": k.endpoint,
                             "caFile": str(k.ca_file),
                             "oauth2": {"tokenURL": f"http://127.0.0.1:{httpd.server_port}/token",
                                        "clientID": "fleet", "clientSecretFile": str(secret_file)}}}
            codec = load_codec_from(config([entry]))
            stored = codec.seal("/core/secrets/ns/x", '{"v":1}')
            assert stored.startswith("k8s:enc:kms:v2:remote:")
            assert load_codec_from(config([entry])).open("/core/secrets/ns/x", stored) == '{"v":1}'
            # Without the CA the server's certificate is not trusted: fail closed.
            del entry["kms"]["caFile"]
            with pytest.raises(EncryptionConfigError, match='kms provider "remote".*unreachable'):
                load_codec_from(config([entry]))
    finally:
        httpd.shutdown()
        httpd.server_close()
