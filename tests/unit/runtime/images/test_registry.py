"""The registry client against an in-memory registry (httpx.MockTransport): protocol,
platform selection, verification, auth flows and pull policy."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from fleet.runtime.images import (
    Credentials,
    ImagePullError,
    ImageStore,
    Platform,
    RegistryClient,
    is_insecure,
    pull,
)
from fleet.testing.oci_image import OciImage, build_index, build_layer
from tests.unit.runtime.images.fakeregistry import FakeRegistry

AMD64 = Platform("linux", "amd64")
ARM64 = Platform("linux", "arm64", "v8")


def image(platform: Platform = AMD64, files: dict | None = None, cmd: str = "amd") -> OciImage:
    layers = [build_layer({"bin/base": b"base"}), build_layer(files or {"app": cmd.encode()})]
    config = {"architecture": platform.architecture, "os": platform.os, "config": {"Cmd": [cmd]}}
    return OciImage(layers=layers, config=config, platform=platform)


def blob_gets(reg: FakeRegistry) -> list[str]:
    return [p for p in reg.paths() if "/blobs/" in p]


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "images")


async def test_anonymous_pull_over_https(store: ImageStore) -> None:
    reg = FakeRegistry()
    img = image()
    reg.add_image("team/app", "v1", img)
    async with RegistryClient(store, platform=AMD64, transport=reg.transport) as c:
        rec = await c.pull("registry.test/team/app:v1")
    assert rec.ref == "registry.test/team/app:v1"
    assert rec.manifest_digest == rec.repo_digest == img.manifest_digest
    assert rec.config_digest == img.config_digest
    assert [la.diff_id for la in rec.layers] == [la.diff_id for la in img.layers]
    assert rec.platform == "linux/amd64"
    assert all(p.startswith(("GET https://", "HEAD https://")) for p in reg.paths())
    accept = reg.requests[0].headers["accept"]
    for mt in ("oci.image.index", "manifest.list.v2", "oci.image.manifest", "manifest.v2"):
        assert mt in accept
    layers = await store.layers_for(rec.ref)
    assert (layers[0] / "bin/base").read_bytes() == b"base"
    assert (layers[1] / "app").read_bytes() == b"amd"
    assert await store.image_config(rec.ref) == {"Cmd": ["amd"]}
    # Pinning by digest resolves offline-equal content and verifies the manifest.
    async with RegistryClient(store, platform=AMD64, transport=reg.transport) as c:
        pinned = await c.pull(f"registry.test/team/app@{img.manifest_digest}")
    assert pinned.manifest_digest == img.manifest_digest


async def test_index_selects_the_node_platform_and_skips_present_blobs(store: ImageStore) -> None:
    reg = FakeRegistry()
    amd, arm = image(AMD64, cmd="amd"), image(ARM64, cmd="arm")
    for img in (amd, arm):
        for data in img.blobs().values():
            reg.add_blob(data)
        reg.add_manifest("app", None, img.manifest_bytes, "application/vnd.oci.image.manifest.v1+json")
    index = build_index([amd, arm])
    index_digest = reg.add_manifest("app", "multi", index, "application/vnd.oci.image.index.v1+json")

    rec = await pull(store, "registry.test/app:multi", platform=ARM64, transport=reg.transport)
    assert rec.repo_digest == index_digest and rec.manifest_digest == arm.manifest_digest
    assert await store.image_config(rec.ref) == {"Cmd": ["arm"]}
    assert rec.platform == "linux/arm64"
    assert store.has_blob(index_digest), "the index is kept so the ref can be re-resolved"
    first = len(blob_gets(reg))
    assert first == 3  # config + two layers

    # The amd64 image shares the base layer: only its config and app layer are fetched.
    reg.requests.clear()
    rec2 = await pull(store, "registry.test/app:multi", policy="Always", platform="linux/amd64",
                      transport=reg.transport)
    assert rec2.manifest_digest == amd.manifest_digest
    assert len(blob_gets(reg)) == 2

    with pytest.raises(ImagePullError, match="no matching manifest for linux/s390x"):
        await pull(store, "registry.test/app:multi", policy="Always", platform="linux/s390x",
                   transport=reg.transport)


async def test_missing_tag_carries_the_registry_message(store: ImageStore) -> None:
    reg = FakeRegistry()
    with pytest.raises(ImagePullError) as info:
        await pull(store, "registry.test/app:nope", transport=reg.transport)
    assert info.value.reason == "ErrImagePull"
    assert info.value.status == 404
    assert "manifest unknown" in info.value.message
    assert "registry.test/app:nope" in info.value.message


async def test_corrupt_blob_is_refused_and_nothing_recorded(store: ImageStore) -> None:
    reg = FakeRegistry()
    img = image()
    reg.add_image("app", "v1", img)
    reg.corrupt.add(img.layers[1].digest)
    with pytest.raises(ImagePullError, match="hashes to"):
        await pull(store, "registry.test/app:v1", platform=AMD64, transport=reg.transport)
    assert store.list() == []
    assert not store.has_blob(img.layers[1].digest)


async def test_corrupt_manifest_digest_is_refused(store: ImageStore) -> None:
    reg = FakeRegistry()
    img = image()
    reg.add_image("app", "v1", img)
    # Serve some other manifest under the digest the client asks for.
    reg.manifests[("app", img.manifest_digest)] = (b'{"other": 1}', "application/vnd.oci.image.manifest.v1+json")
    with pytest.raises(ImagePullError, match="manifest hashes to"):
        await pull(store, f"registry.test/app@{img.manifest_digest}", transport=reg.transport)


async def test_basic_auth(store: ImageStore) -> None:
    reg = FakeRegistry(auth="basic")
    reg.add_image("app", "v1", image())
    for creds in (None, Credentials("alice", "wrong")):
        with pytest.raises(ImagePullError) as info:
            await pull(store, "registry.test/app:v1", auth=creds, transport=reg.transport)
        assert info.value.status == 401
        assert "unauthorized: authentication required" in info.value.message
    rec = await pull(store, "registry.test/app:v1", auth=Credentials("alice", "secret"),
                     platform=AMD64, transport=reg.transport)
    assert rec.ref == "registry.test/app:v1"


async def test_bearer_token_auth(store: ImageStore) -> None:
    reg = FakeRegistry(auth="bearer")
    reg.add_image("team/app", "v1", image())
    rec = await pull(store, "registry.test/team/app:v1", auth=Credentials("alice", "secret"),
                     platform=AMD64, transport=reg.transport)
    assert rec.config_digest
    # One token serves the manifest and every blob of the pull.
    assert reg.tokens_issued == 1
    token_requests = [r for r in reg.requests if r.url.host == "auth.test"]
    assert token_requests[0].url.params["scope"] == "repository:team/app:pull"
    assert token_requests[0].url.params["service"] == "registry.test"
    assert token_requests[0].headers["authorization"].startswith("Basic ")


async def test_bearer_anonymous_and_refused(store: ImageStore) -> None:
    reg = FakeRegistry(auth="bearer", anonymous_tokens=True)
    reg.add_image("app", "v1", image())
    assert await pull(store, "registry.test/app:v1", platform=AMD64, transport=reg.transport)
    assert "authorization" not in [r for r in reg.requests if r.url.host == "auth.test"][0].headers

    strict = FakeRegistry(auth="bearer")
    strict.add_image("app", "v1", image())
    with pytest.raises(ImagePullError) as info:
        await pull(store, "registry.test/app:v2", auth=Credentials("alice", "nope"),
                   transport=strict.transport)
    assert info.value.status == 401
    assert "incorrect username or password" in info.value.message


async def test_docker_hub_goes_to_registry_1(store: ImageStore) -> None:
    reg = FakeRegistry(host="registry-1.docker.io")
    reg.add_image("library/busybox", "latest", image())
    rec = await pull(store, "busybox", platform=AMD64, transport=reg.transport)
    assert rec.ref == "docker.io/library/busybox:latest"
    assert reg.paths()[0] == "GET https://registry-1.docker.io/v2/library/busybox/manifests/latest"


async def test_loopback_falls_back_to_plain_http(store: ImageStore) -> None:
    reg = FakeRegistry(host="127.0.0.1:5000", tls=False)
    reg.add_image("app", "v1", image())
    await pull(store, "127.0.0.1:5000/app:v1", platform=AMD64, transport=reg.transport)
    paths = reg.paths()
    assert paths[0] == "GET https://127.0.0.1/v2/"  # the TLS probe, refused
    assert all(p.startswith(("GET http://", "HEAD http://")) for p in paths[1:])


async def test_pull_policy(store: ImageStore) -> None:
    reg = FakeRegistry()
    reg.add_image("app", "v1", image())
    with pytest.raises(ImagePullError) as info:
        await pull(store, "registry.test/app:v1", policy="Never", transport=reg.transport)
    assert info.value.reason == "ErrImageNeverPull"
    assert reg.requests == []
    await pull(store, "registry.test/app:v1", policy="IfNotPresent", platform=AMD64,
               transport=reg.transport)
    reg.requests.clear()
    rec = await pull(store, "registry.test/app:v1", policy="IfNotPresent", transport=reg.transport)
    assert reg.requests == [] and rec.ref == "registry.test/app:v1"
    await pull(store, "registry.test/app:v1", policy="Never", transport=reg.transport)
    assert reg.requests == []
    await pull(store, "registry.test/app:v1", policy="Always", platform=AMD64,
               transport=reg.transport)
    assert [p for p in reg.paths() if "/manifests/" in p] and not blob_gets(reg)


async def test_unreachable_registry(store: ImageStore) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ImagePullError, match="unreachable: connection refused") as info:
        await pull(store, "registry.test/app:v1", transport=httpx.MockTransport(refuse))
    assert info.value.reason == "ErrImagePull"


async def test_invalid_name(store: ImageStore) -> None:
    with pytest.raises(ImagePullError) as info:
        await pull(store, "Not A Name")
    assert info.value.reason == "InvalidImageName"


async def test_config_layer_count_mismatch(store: ImageStore) -> None:
    reg = FakeRegistry()
    img = image()
    # A config that lists one diff_id for the manifest's two layers.
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [img.layers[0].diff_id]}}).encode()
    manifest = json.loads(img.manifest_bytes)
    manifest["config"] = {"mediaType": "application/vnd.oci.image.config.v1+json",
                          "digest": reg.add_blob(config), "size": len(config)}
    for la in img.layers:
        reg.add_blob(la.gz)
    reg.add_manifest("app", "v1", json.dumps(manifest).encode(),
                     "application/vnd.oci.image.manifest.v1+json")
    with pytest.raises(ImagePullError, match="1 diff_ids for 2 layers"):
        await pull(store, "registry.test/app:v1", transport=reg.transport)
    assert store.list() == []


@pytest.mark.parametrize(
    ("host", "insecure", "want"),
    [
        ("127.0.0.1:5000", (), True),
        ("127.1.2.3", (), True),
        ("localhost:5000", (), True),
        ("[::1]:5000", (), True),
        ("registry.test", (), False),
        ("registry.test:5000", ("registry.test:5000",), True),
        ("registry.test:5000", ("registry.test",), True),
        ("registry.test", ("registry.test:5000",), False),
        ("10.1.2.3:5000", ("10.0.0.0/8",), True),
        ("192.168.1.1:5000", ("10.0.0.0/8",), False),
        ("registry.test", ("http://registry.test/",), True),
    ],
)
def test_is_insecure(host: str, insecure: tuple[str, ...], want: bool) -> None:
    assert is_insecure(host, insecure) is want
