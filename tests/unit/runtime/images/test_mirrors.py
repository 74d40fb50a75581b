"""registries.yaml: parsing and validation (table of good and bad files), the endpoint
resolver `endpoints_for` (table), and pulls through mirrors with fall-back, rewrites and
per-host credentials against in-memory registries."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet.agent.config import registries_config
from fleet.runtime.images import (
    Credentials,
    ImagePullError,
    ImageStore,
    Platform,
    RegistriesConfig,
    RegistriesConfigError,
    endpoints_for,
    load_registries,
    parse_registries_yaml,
    pull,
)
from fleet.runtime.images.mirrors import TLSConfig
from fleet.testing.oci_image import OciImage, build_layer
from tests.unit.runtime.images.fakeregistry import FakeRegistry

AMD64 = Platform("linux", "amd64")


def cfg(yaml_text: str, **kw: Any) -> RegistriesConfig:
    return parse_registries_yaml(textwrap.dedent(yaml_text), **kw)


# ---------------------------------------------------------------------------------------
# Parsing


def test_full_file_parses() -> None:
    c = cfg("""
        mirrors:
          docker.io:
            endpoint: ["http://127.0.0.1:5000", "mirror.example.com:8443/", "https://m2.example.com:443/v2/"]
            rewrite:
              "^library/(.*)": "mirror/$1"
          "*":
            endpoint: ["https://catch-all.example.com/prefix/v2/"]
        configs:
          mirror.example.com:8443:
            auth: {username: u, password: p}
            tls: {ca_file: /etc/ca.pem, insecure_skip_verify: false}
          "registry.example.com":
            auth: {auth: B64}
          tok.example.com:
            auth: {identity_token: refresh-me}
          "*":
            tls: {insecure_skip_verify: true}
        """.replace("B64", base64.b64encode(b"alice:pw:with:colons").decode()))
    hub = c.mirrors["docker.io"]
    assert hub.endpoints == ("http://127.0.0.1:5000/v2", "https://mirror.example.com:8443/v2",
                             "https://m2.example.com/v2")
    assert [r.apply("library/busybox") for r in hub.rewrites] == ["mirror/busybox"]
    assert c.mirrors["*"].endpoints == ("https://catch-all.example.com/prefix/v2",)
    assert c.configs["mirror.example.com:8443"].auth == Credentials("u", "p")
    assert c.configs["mirror.example.com:8443"].tls == TLSConfig(ca_file="/etc/ca.pem")
    assert c.configs["registry.example.com"].auth == Credentials("alice", "pw:with:colons")
    assert c.configs["tok.example.com"].auth == Credentials("", "", identity_token="refresh-me")
    assert c.configs["*"].tls == TLSConfig(insecure_skip_verify=True)


@pytest.mark.parametrize("text", ["", "mirrors: {}\n", "configs:\n", "mirrors:\n  docker.io:\n"])
def test_empty_files_mean_no_mirrors(text: str) -> None:
    c = cfg(text)
    assert all(not m.endpoints for m in c.mirrors.values()) and not c.configs
    assert row("busybox", c) == [("https://registry-1.docker.io/v2", "library/busybox", False,
                                  None, False)]


def test_hub_aliases_are_docker_io() -> None:
    c = cfg("mirrors:\n  index.docker.io:\n    endpoint: [http://127.0.0.1:1]\n")
    assert list(c.mirrors) == ["docker.io"]


BAD: list[tuple[str, str]] = [
    ("mirrors: [a, b]\n", "mirrors: must be a mapping"),
    ("mirror:\n  docker.io: {}\n", "mirror: unknown field"),
    ("mirrors:\n  docker.io:\n    endpoints: [http://x.example]\n",
     "mirrors['docker.io'].endpoints: unknown field"),
    ("mirrors:\n  docker.io:\n    endpoint: [ftp://x.example]\n",
     "mirrors['docker.io'].endpoint[0]: 'ftp://x.example': the scheme must be http or https"),
    ("mirrors:\n  docker.io:\n    endpoint: [http://127.0.0.1:5000, 'http://:9']\n",
     "mirrors['docker.io'].endpoint[1]: 'http://:9' has no host"),
    ("mirrors:\n  docker.io:\n    endpoint: ['http://u:p@x.example']\n",
     "no query, fragment or user info"),
    ("mirrors:\n  docker.io:\n    endpoint: ['http://x.example:99999']\n", "is not a URL"),
    ("mirrors:\n  docker.io:\n    endpoint: http://x.example\n    rewrite: {'(': x}\n",
     "mirrors['docker.io'].rewrite['(']: bad regular expression"),
    ("mirrors:\n  docker.io:\n    rewrite: {'^a/(.*)': 'b/$2'}\n",
     "replacement refers to $2"),
    ("mirrors:\n  https://docker.io:\n    endpoint: [http://x.example]\n",
     "mirrors['https://docker.io']: 'https://docker.io' is a URL or path"),
    ("mirrors:\n  myregistry:\n    endpoint: [http://x.example]\n",
     "'myregistry' is not a registry host"),
    ("mirrors:\n  docker.io: {}\n  index.docker.io: {}\n", "docker.io is listed twice"),
    ("configs:\n  x.example:\n    auth: {username: u, pasword: p}\n",
     "configs['x.example'].auth.pasword: unknown field"),
    ("configs:\n  x.example:\n    auth: {}\n", "needs username/password, auth or identity_token"),
    ("configs:\n  x.example:\n    auth: {auth: '!!notbase64'}\n", "auth.auth: not base64"),
    ("configs:\n  x.example:\n    auth: {auth: " + base64.b64encode(b"nocolon").decode() + "}\n",
     "has no ':'"),
    ("configs:\n  x.example:\n    auth: {auth: dTpw, username: u}\n", "not both"),
    ("configs:\n  x.example:\n    auth: {username: 5}\n", "auth.username: must be a string"),
    ("configs:\n  x.example:\n    tls: {insecure_skip_verify: 'yes'}\n",
     "tls.insecure_skip_verify: must be true or false"),
    ("configs:\n  x.example:\n    tls: {key_file: /k.pem}\n", "tls.key_file: needs cert_file"),
    ("configs:\n  x.example:\n    tls: {ca-file: /ca.pem}\n", "tls.ca-file: unknown field"),
    ("mirrors: {docker.io: {endpoint: [x]\n", "not valid YAML"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_bad_files_name_the_field(text: str, message: str) -> None:
    with pytest.raises(RegistriesConfigError) as info:
        parse_registries_yaml(text, source="/etc/fleet/registries.yaml")
    assert str(info.value).startswith("/etc/fleet/registries.yaml: ")
    assert message in str(info.value)


def test_load_checks_tls_files(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    f = tmp_path / "registries.yaml"
    f.write_text(f"configs:\n  x.example:\n    tls: {{ca_file: {ca}}}\n")
    with pytest.raises(RegistriesConfigError, match=r"configs\['x.example'\].tls.ca_file: .*no such file"):
        load_registries(f)
    ca.write_text("not checked for content here")
    assert load_registries(f).configs["x.example"].tls == TLSConfig(ca_file=str(ca))
    with pytest.raises(RegistriesConfigError, match="cannot read"):
        load_registries(tmp_path / "missing.yaml")


def test_agent_default_file_is_in_the_state_dir(tmp_path: Path) -> None:
    assert registries_config(None, tmp_path) is None
    (tmp_path / "registries.yaml").write_text("mirrors:\n  docker.io:\n    endpoint: [http://127.0.0.1:1]\n")
    c = registries_config(None, tmp_path, disable_default_endpoint=True)
    assert c is not None and c.disable_default_endpoint
    assert c.mirrors["docker.io"].endpoints == ("http://127.0.0.1:1/v2",)
    with pytest.raises(RegistriesConfigError, match="cannot read"):
        registries_config(tmp_path / "nope.yaml", tmp_path)


# ---------------------------------------------------------------------------------------
# The resolver

FILE_TEXT = """
    mirrors:
      docker.io:
        endpoint: ["http://127.0.0.1:5000", "https://mirror.example.com", "https://registry-1.docker.io"]
        rewrite:
          "^library/(.*)": "hub/$1"
          "^(.*)/(.*)$": "${2}-of-${1}"
      quay.example.com:
        endpoint: ["https://10.0.0.9:8443/quay/v2"]
      "*":
        endpoint: ["http://all.example.com:5000"]
    configs:
      mirror.example.com: {auth: {username: m, password: mp}}
      docker.io: {auth: {username: hub, password: hp}}
      10.0.0.9:8443: {tls: {ca_file: /ca.pem}}
      "*": {auth: {username: any, password: ap}}
    """
FILE = cfg(FILE_TEXT)
FILE_OFF = cfg(FILE_TEXT, disable_default_endpoint=True)


def row(image: str, config: RegistriesConfig | None = FILE, **kw: Any) -> list[tuple[Any, ...]]:
    return [(e.url, e.repository, e.mirror, e.credentials.username if e.credentials else None,
             e.plain_http_fallback) for e in endpoints_for(image, config, **kw)]


RESOLVE: list[tuple[str, dict[str, Any], list[tuple[Any, ...]]]] = [
    # docker.io: mirrors in order (the default endpoint listed as a mirror is only
    # tried once, last, unrewritten); the first rewrite that changes the path wins.
    ("busybox", {}, [
        ("http://127.0.0.1:5000/v2", "hub/busybox", True, "any", False),
        ("https://mirror.example.com/v2", "hub/busybox", True, "m", False),
        ("https://registry-1.docker.io/v2", "library/busybox", False, "hub", False)]),
    ("docker.io/team/app:v1", {}, [
        ("http://127.0.0.1:5000/v2", "app-of-team", True, "any", False),
        ("https://mirror.example.com/v2", "app-of-team", True, "m", False),
        ("https://registry-1.docker.io/v2", "team/app", False, "hub", False)]),
    # An override path; a host's own config entry (TLS only) replaces "*" as a whole;
    # a host without one gets the "*" entry.
    ("quay.example.com/org/img@sha256:" + "a" * 64, {}, [
        ("https://10.0.0.9:8443/quay/v2", "org/img", True, None, False),
        ("https://quay.example.com/v2", "org/img", False, "any", False)]),
    # No mirror of its own: the "*" mirror.
    ("ghcr.example.com/o/i", {}, [
        ("http://all.example.com:5000/v2", "o/i", True, "any", False),
        ("https://ghcr.example.com/v2", "o/i", False, "any", False)]),
    # The default endpoint can be switched off for mirrored registries.
    ("busybox", {"config": FILE_OFF}, [
        ("http://127.0.0.1:5000/v2", "hub/busybox", True, "any", False),
        ("https://mirror.example.com/v2", "hub/busybox", True, "m", False)]),
    # Loopback registries keep Docker's https→http probe on their own endpoint only.
    ("127.0.0.1:5001/x/y", {"config": None}, [
        ("https://127.0.0.1:5001/v2", "x/y", False, None, True)]),
    # A named insecure https mirror may fall back to plain HTTP.
    ("busybox", {"insecure": ["mirror.example.com"]}, [
        ("http://127.0.0.1:5000/v2", "hub/busybox", True, "any", False),
        ("https://mirror.example.com/v2", "hub/busybox", True, "m", True),
        ("https://registry-1.docker.io/v2", "library/busybox", False, "hub", False)]),
    ("example.com/a/b", {"config": None}, [("https://example.com/v2", "a/b", False, None, False)]),
    ("example.com/a/b", {"config": None, "insecure": ["example.com"]},
     [("https://example.com/v2", "a/b", False, None, True)]),
]


@pytest.mark.parametrize("image,opts,want", RESOLVE)
def test_endpoints_for(image: str, opts: dict[str, Any], want: list[tuple[Any, ...]]) -> None:
    config = opts.get("config", FILE)
    assert row(image, config, insecure_registries=opts.get("insecure", ())) == want


def test_config_key_with_the_default_port_matches() -> None:
    c = cfg("mirrors:\n  docker.io:\n    endpoint: [https://m.example.com:443, http://h.example.com]\n"
            "configs:\n  m.example.com:443: {auth: {username: a, password: b}}\n"
            "  h.example.com:80: {auth: {username: c, password: d}}\n")
    assert [r[3] for r in row("busybox", c)] == ["a", "c", None]


def test_disabled_default_still_serves_unmirrored_registries() -> None:
    c = cfg("mirrors:\n  docker.io:\n    endpoint: [http://127.0.0.1:5000]\n",
            disable_default_endpoint=True)
    assert row("example.com/a/b", c) == [("https://example.com/v2", "a/b", False, None, False)]


def test_rewrite_to_an_invalid_name_is_a_pull_error() -> None:
    c = cfg("mirrors:\n  docker.io:\n    endpoint: [http://127.0.0.1:5000]\n"
            "    rewrite: {'^library/(.*)': 'UPPER/$1'}\n")
    with pytest.raises(ImagePullError, match="rewrite '\\^library/\\(\\.\\*\\)' turns"):
        endpoints_for("busybox", c)


def test_go_replacement_syntax() -> None:
    c = cfg("""
        mirrors:
          docker.io:
            endpoint: [http://127.0.0.1:5000]
            rewrite: {'^(?P<org>[a-z]+)/(.*)$': 'x$$${org}-$2$$9'}
        """)
    # As Go's Regexp.Expand: $$ is a literal dollar, ${name} and $n are groups (a group
    # the pattern lacks is refused at parse time); tested on apply() since "$" is no name.
    assert c.mirrors["docker.io"].rewrites[0].apply("team/app") == "x$team-app$9"


# ---------------------------------------------------------------------------------------
# Pulls through mirrors (in-memory registries on several hosts)


def image(cmd: str = "hi") -> OciImage:
    return OciImage(layers=[build_layer({"bin/x": cmd.encode()})],
                    config={"architecture": "amd64", "os": "linux", "config": {"Cmd": [cmd]}},
                    platform=AMD64)


class Hosts:
    """Several FakeRegistry objects behind one transport, routed by host; unknown hosts
    (the internet) refuse the connection and are recorded."""

    def __init__(self, *regs: FakeRegistry) -> None:
        self.regs = {r.host.split(":")[0]: r for r in regs}
        # Bearer registries' token realm is https://auth.test/token.
        for r in regs:
            if r.auth == "bearer":
                self.regs.setdefault("auth.test", r)
        self.refused: list[str] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        reg = self.regs.get(request.url.host)
        if reg is None:
            self.refused.append(str(request.url))
            raise httpx.ConnectError("connection refused", request=request)
        return reg.handle(request)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "images")


async def test_mirror_serves_docker_hub_image_under_its_own_name(store: ImageStore) -> None:
    mirror = FakeRegistry(host="mirror.test", tls=False)
    img = image()
    mirror.add_image("library/busybox", "latest", img)
    net = Hosts(mirror)
    c = cfg("mirrors:\n  docker.io:\n    endpoint: ['http://mirror.test']\n")
    rec = await pull(store, "busybox", platform=AMD64, registries=c, transport=net.transport)
    assert rec.ref == "docker.io/library/busybox:latest"
    assert rec.manifest_digest == img.manifest_digest
    assert mirror.paths()[0] == "GET http://mirror.test/v2/library/busybox/manifests/latest"
    assert net.refused == []  # docker.io was never needed


async def test_falls_back_through_mirrors_to_the_registry(store: ImageStore) -> None:
    empty = FakeRegistry(host="empty.test")
    upstream = FakeRegistry(host="registry.test")
    img = image("up")
    upstream.add_image("team/app", "v1", img)
    net = Hosts(empty, upstream)
    c = cfg("mirrors:\n  registry.test:\n    endpoint: ['https://down.test', 'https://empty.test']\n")
    rec = await pull(store, "registry.test/team/app:v1", platform=AMD64, registries=c,
                     transport=net.transport)
    assert rec.manifest_digest == img.manifest_digest
    assert net.refused == ["https://down.test/v2/team/app/manifests/v1"]
    assert empty.paths() == ["GET https://empty.test/v2/team/app/manifests/v1"]


async def test_every_endpoint_failing_says_why_for_each(store: ImageStore) -> None:
    empty = FakeRegistry(host="empty.test")
    net = Hosts(empty)
    c = cfg("mirrors:\n  docker.io:\n    endpoint: ['https://empty.test']\n")
    with pytest.raises(ImagePullError) as info:
        await pull(store, "busybox", platform=AMD64, registries=c, transport=net.transport)
    msg = info.value.message
    assert msg.startswith('pulling "docker.io/library/busybox:latest": every endpoint failed: ')
    assert "mirror https://empty.test/v2: pulling manifest of" in msg and "manifest unknown" in msg
    assert msg.endswith("; registry registry-1.docker.io unreachable: connection refused")
    assert info.value.status == 404 and info.value.reason == "ErrImagePull"
    assert store.list() == []


async def test_rewrite_and_mirror_credentials(store: ImageStore) -> None:
    mirror = FakeRegistry(host="mirror.test", auth="bearer", username="m", password="mp")
    img = image()
    mirror.add_image("mirrored/library/busybox", "1.36", img)
    net = Hosts(mirror)
    c = cfg("""
        mirrors:
          docker.io:
            endpoint: ['https://mirror.test']
            rewrite: {'^(.*)$': 'mirrored/$1'}
        configs:
          mirror.test: {auth: {username: m, password: mp}}
        """, disable_default_endpoint=True)
    # The pod's pull secret is for docker.io: it does not go to the mirror.
    rec = await pull(store, "busybox:1.36", platform=AMD64, registries=c,
                     auth=Credentials("hub-user", "hub-pw"), transport=net.transport)
    assert rec.ref == "docker.io/library/busybox:1.36"
    assert mirror.tokens_issued >= 1
    assert any("/v2/mirrored/library/busybox/manifests/1.36" in p for p in mirror.paths())
    assert net.refused == []


async def test_registry_credentials_from_the_file(store: ImageStore) -> None:
    upstream = FakeRegistry(host="registry.test", auth="basic", username="f", password="fp")
    upstream.add_image("team/app", "v1", image())
    net = Hosts(upstream)
    c = cfg("configs:\n  registry.test: {auth: {username: f, password: fp}}\n")
    with pytest.raises(ImagePullError, match="authentication required"):
        await pull(store, "registry.test/team/app:v1", platform=AMD64, transport=net.transport)
    rec = await pull(store, "registry.test/team/app:v1", platform=AMD64, registries=c,
                     transport=net.transport)
    assert rec.ref == "registry.test/team/app:v1"
    # A pull secret for the registry wins over the file (the kubelet's credentials first).
    with pytest.raises(ImagePullError, match="authentication required"):
        await pull(store, "registry.test/team/app:v1", policy="Always", platform=AMD64,
                   registries=c, auth=Credentials("f", "wrong"), transport=net.transport)


async def test_identity_token_is_exchanged_at_the_token_realm(store: ImageStore) -> None:
    upstream = FakeRegistry(host="registry.test", auth="bearer", identity_token="refresh-xyz")
    upstream.add_image("team/app", "v1", image())
    net = Hosts(upstream)
    c = cfg("configs:\n  registry.test: {auth: {identity_token: refresh-xyz}}\n")
    rec = await pull(store, "registry.test/team/app:v1", platform=AMD64, registries=c,
                     transport=net.transport)
    assert rec.ref == "registry.test/team/app:v1"
    assert upstream.tokens_issued >= 1
    posts = [r for r in upstream.requests if r.method == "POST"]
    assert posts and b"grant_type=refresh_token" in posts[0].content


async def test_tls_file_gone_since_start_is_a_pull_error_naming_it(store: ImageStore,
                                                                    tmp_path: Path) -> None:
    mirror = FakeRegistry(host="mirror.test")
    net = Hosts(mirror)
    c = cfg(f"mirrors:\n  docker.io:\n    endpoint: ['https://mirror.test']\n"
            f"configs:\n  mirror.test: {{tls: {{ca_file: {tmp_path / 'gone.pem'}}}}}\n",
            disable_default_endpoint=True)
    with pytest.raises(ImagePullError, match=f"ca_file {tmp_path / 'gone.pem'}"):
        await pull(store, "busybox", platform=AMD64, registries=c, transport=net.transport)
    assert mirror.requests == []
