"""kubeconfig discovery order and parsing."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from fleet.client import kubeconfig as kc
from fleet.client.kubeconfig import KubeconfigError, load_kubeconfig, parse_kubeconfig


def write_config(path: Path, server: str, *, token: str = "tok", namespace: str | None = None,
                 extra_user: dict | None = None) -> Path:
    ctx: dict = {"cluster": "c", "user": "u"}
    if namespace:
        ctx["namespace"] = namespace
    doc = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token, **(extra_user or {})}}],
        "contexts": [{"name": "main", "context": ctx}],
        "current-context": "main",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME, no KUBECONFIG, a non-root user and a private XDG data dir."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "xdg"))
    monkeypatch.setattr(kc.os, "geteuid", lambda: 1000)
    return home


def test_default_data_dir_root_and_user(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert kc.default_data_dir() == home / "xdg" / "fleet"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert kc.default_data_dir() == home / ".local" / "share" / "fleet"
    monkeypatch.setattr(kc.os, "geteuid", lambda: 0)
    assert kc.default_data_dir() == Path("/var/lib/fleet")


def test_resolution_order(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KubeconfigError, match="no kubeconfig found"):
        load_kubeconfig()

    write_config(home / ".kube" / "config", "http://home:1")
    assert load_kubeconfig().server == "http://home:1"

    write_config(home / "xdg" / "fleet" / "admin.kubeconfig", "http://fleet:2")
    assert load_kubeconfig().server == "http://fleet:2"

    env_file = write_config(tmp_path / "env.kubeconfig", "http://env:3")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{env_file}")
    assert load_kubeconfig().server == "http://env:3"

    explicit = write_config(tmp_path / "explicit", "http://explicit:4/")
    cfg = load_kubeconfig(str(explicit))
    assert cfg.server == "http://explicit:4"  # trailing slash dropped
    assert cfg.source == str(explicit.resolve())


def test_explicit_missing_path_does_not_fall_through(home: Path) -> None:
    write_config(home / ".kube" / "config", "http://home:1")
    with pytest.raises(KubeconfigError, match="does not exist"):
        load_kubeconfig(str(home / "nope"))


def test_namespace_and_token(home: Path, tmp_path: Path) -> None:
    cfg = load_kubeconfig(str(write_config(tmp_path / "a", "http://x", namespace="team")))
    assert (cfg.namespace, cfg.namespace_from_context, cfg.token) == ("team", True, "tok")
    cfg = load_kubeconfig(str(write_config(tmp_path / "b", "http://x")))
    assert (cfg.namespace, cfg.namespace_from_context) == ("default", False)


def test_tls_fields_and_relative_files(tmp_path: Path) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n"
    (tmp_path / "tokenfile").write_text("filetoken\n")
    doc = {
        "clusters": [{"name": "c", "cluster": {
            "server": "https://h:6443",
            "certificate-authority-data": base64.b64encode(pem).decode(),
        }}, {"name": "d", "cluster": {"server": "https://d", "insecure-skip-tls-verify": True,
                                       "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": {
            "client-certificate-data": base64.b64encode(b"CERT").decode(),
            "client-key-data": base64.b64encode(b"KEY").decode()}},
            {"name": "v", "user": {"tokenFile": "tokenfile", "client-certificate": "c.crt",
                                   "client-key": "/abs/c.key"}}],
        "contexts": [{"name": "one", "context": {"cluster": "c", "user": "u"}},
                     {"name": "two", "context": {"cluster": "d", "user": "v", "namespace": "n"}}],
        "current-context": "one",
    }
    src = tmp_path / "cfg"
    one = parse_kubeconfig(doc, source=src)
    assert one.ca_data == pem and one.client_cert_data == b"CERT"
    assert one.client_key_data == b"KEY" and one.token is None
    assert not one.insecure_skip_tls_verify and one.context == "one"

    two = parse_kubeconfig(doc, context="two", source=src)
    assert two.token == "filetoken"
    assert two.ca_file == str(tmp_path / "ca.crt")
    assert two.client_cert_file == str(tmp_path / "c.crt")
    assert two.client_key_file == "/abs/c.key"
    assert two.insecure_skip_tls_verify and two.namespace == "n"


def test_unknown_context_and_missing_server() -> None:
    doc = {"clusters": [{"name": "c", "cluster": {}}],
           "contexts": [{"name": "x", "context": {"cluster": "c"}}], "current-context": "x"}
    with pytest.raises(KubeconfigError, match="no context named 'nope'"):
        parse_kubeconfig(doc, context="nope")
    with pytest.raises(KubeconfigError, match="has no server"):
        parse_kubeconfig(doc)


def test_single_context_without_current_context() -> None:
    doc = {"clusters": [{"name": "c", "cluster": {"server": "http://s"}}],
           "contexts": [{"name": "only", "context": {"cluster": "c"}}]}
    cfg = parse_kubeconfig(doc)
    assert cfg.server == "http://s" and cfg.context == "only" and cfg.token is None
