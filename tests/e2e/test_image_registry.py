"""End to end: a real image built from busybox-static, a real registry, the real store.

Each module-scoped fixture starts Debian's `docker-registry` (distribution 2.x) on
127.0.0.1 with its own config in a temp dir — one anonymous, one behind htpasswd
Basic auth — pushes the busybox image with the registry's upload API, and the
tests pull it back through `fleet.runtime.images`, check the unpacked rootfs and
config, import both archive formats, and garbage-collect.  Registries are stopped
by pid (SIGTERM, then SIGKILL) and their directories removed.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import ssl
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from fleet.runtime.images import (
    ImagePullError,
    ImageStore,
    Platform,
    credentials_for,
    flatten_layers,
    import_archive,
    parse_reference,
    pull,
)
from fleet.testing.oci_image import (
    OciImage,
    build_busybox_image,
    busybox_problem,
    push,
    push_index,
    write_docker_archive,
    write_oci_archive,
)
from tests.conftest import free_port

pytestmark = pytest.mark.e2e

REGISTRY_BIN = shutil.which("docker-registry")
START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
USER, PASSWORD = "fleet", "s3cret-pw"
IS_ROOT = os.geteuid() == 0


def _skip_unless_tools() -> None:
    if REGISTRY_BIN is None:
        pytest.skip("needs docker-registry (Debian package docker-registry)")
    problem = busybox_problem()
    if problem:
        pytest.skip(f"needs busybox-static: {problem}")


@dataclass
class Registry:
    """One docker-registry subprocess on loopback."""

    base: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    # "info" logs every request served (tests that check which registry served a pull).
    log_level: str = "warn"
    # (certificate, key): serve HTTPS instead of plain HTTP.
    tls: tuple[Path, Path] | None = None
    # (client CA, a client certificate, its key): with `tls`, demand client certificates
    # signed by that CA; the pair is what the readiness check presents.
    client_auth: tuple[Path, Path, Path] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}"

    def output(self) -> str:
        return (self.base / "registry.log").read_text(errors="replace")[-5000:]

    def start(self, htpasswd: str | None = None) -> Registry:
        auth = ""
        if htpasswd is not None:
            (self.base / "htpasswd").write_text(htpasswd)
            auth = f"auth:\n  htpasswd:\n    realm: fleet-test\n    path: {self.base / 'htpasswd'}\n"
        config = self.base / "config.yml"
        config.write_text(
            "version: 0.1\n"
            f"log:\n  level: {self.log_level}\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.base / 'data'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
            + (f"  tls:\n    certificate: {self.tls[0]}\n    key: {self.tls[1]}\n" if self.tls else "")
            + (f"    clientcas:\n      - {self.client_auth[0]}\n" if self.tls and self.client_auth else "")
            + auth
        )
        log = open(self.base / "registry.log", "wb")  # noqa: SIM115 - the child keeps it
        try:
            self.proc = subprocess.Popen(
                [str(REGISTRY_BIN), "serve", str(config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"docker-registry exited early:\n{self.output()}")
            try:
                r = httpx.get(f"{self.url}/v2/", timeout=1.0, verify=self._readiness_verify())
                if r.status_code in (200, 401):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"docker-registry not ready in {START_TIMEOUT}s:\n{self.output()}")

    def _readiness_verify(self) -> ssl.SSLContext | bool:
        if not self.tls:
            return True
        # Readiness only (no certificate check): the tests check certificates themselves.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if self.client_auth:
            ctx.load_cert_chain(self.client_auth[1], self.client_auth[2])
        return ctx

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=STOP_TIMEOUT)


def _htpasswd_line(user: str, password: str) -> str:
    """A bcrypt htpasswd entry (the only hash distribution's htpasswd auth accepts)."""
    try:
        import bcrypt
    except ImportError:
        tool = shutil.which("htpasswd")
        if tool is None:
            pytest.skip("needs the bcrypt Python package or htpasswd (apache2-utils)")
        out = subprocess.run([tool, "-nbB", user, password], capture_output=True, text=True,
                             check=True, timeout=30)
        return out.stdout.strip() + "\n"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()
    return f"{user}:{hashed}\n"


@pytest.fixture(scope="module")
def busybox() -> OciImage:
    _skip_unless_tools()
    return build_busybox_image(cmd=["sh", "-c", "echo hello from busybox"],
                               exposed_ports=["8080/tcp"])


def _registry(htpasswd: str | None) -> Iterator[Registry]:
    _skip_unless_tools()
    base = Path(tempfile.mkdtemp(prefix="fleet-registry-"))
    reg = Registry(base, free_port())
    try:
        yield reg.start(htpasswd)
    finally:
        reg.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def registry() -> Iterator[Registry]:
    yield from _registry(None)


@pytest.fixture(scope="module")
def auth_registry() -> Iterator[Registry]:
    _skip_unless_tools()
    yield from _registry(_htpasswd_line(USER, PASSWORD))


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "images")


def _check_busybox_rootfs(layer: Path) -> None:
    assert (layer / "bin/busybox").is_file()
    assert os.stat(layer / "bin/busybox").st_mode & stat.S_IXUSR
    assert os.readlink(layer / "bin/sh") == "busybox"
    assert "nobody:x:65534" in (layer / "etc/passwd").read_text()
    assert stat.S_IMODE(os.stat(layer / "tmp").st_mode) == 0o1777


async def test_push_and_pull_anonymous(registry: Registry, busybox: OciImage, store: ImageStore,
                                       tmp_path: Path) -> None:
    await push(busybox, registry.url, "fleet/busybox", "v1")
    ref = f"{registry.host}/fleet/busybox:v1"
    rec = await pull(store, ref, policy="IfNotPresent")
    assert rec.manifest_digest == busybox.manifest_digest
    assert rec.config_digest == busybox.config_digest
    assert rec.platform == str(Platform.host())
    layers = await store.layers_for(ref)
    assert len(layers) == 1
    _check_busybox_rootfs(layers[0])
    config = await store.image_config(ref)
    assert config["Cmd"] == ["sh", "-c", "echo hello from busybox"]
    assert config["ExposedPorts"] == {"8080/tcp": {}}
    assert any(e.startswith("PATH=") for e in config["Env"])

    # The same content by digest is already here: no second download.
    pinned = await pull(store, f"{registry.host}/fleet/busybox@{busybox.manifest_digest}",
                        policy="IfNotPresent")
    assert pinned.ref == ref

    chroot = shutil.which("chroot")
    if IS_ROOT and chroot:
        # The image really runs: its own /bin/sh, no host libraries.
        rootfs = tmp_path / "rootfs"
        await trio.to_thread.run_sync(flatten_layers, layers, rootfs)
        with trio.fail_after(30):
            out = await trio.run_process([chroot, str(rootfs), *config["Cmd"]],
                                         capture_stdout=True, capture_stderr=True, check=False,
                                         env={"PATH": "/bin"})
        assert out.returncode == 0 and out.stdout == b"hello from busybox\n", out


async def test_missing_tag_is_manifest_unknown(registry: Registry, busybox: OciImage,
                                               store: ImageStore) -> None:
    await push(busybox, registry.url, "fleet/busybox", "v1")
    with pytest.raises(ImagePullError) as info:
        await pull(store, f"{registry.host}/fleet/busybox:no-such-tag")
    assert info.value.reason == "ErrImagePull"
    assert info.value.status == 404
    assert "manifest unknown" in info.value.message
    assert store.list() == []


async def test_basic_auth_with_pull_secret(auth_registry: Registry, busybox: OciImage,
                                           store: ImageStore) -> None:
    await push(busybox, auth_registry.url, "private/busybox", "v1", auth=(USER, PASSWORD))
    ref = f"{auth_registry.host}/private/busybox:v1"
    secret = {"auths": {auth_registry.host: {
        "auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}
    creds = credentials_for(parse_reference(ref).domain, [{"auths": {}}, secret])
    assert creds is not None
    rec = await pull(store, ref, auth=creds)
    assert rec.manifest_digest == busybox.manifest_digest
    _check_busybox_rootfs((await store.layers_for(ref))[0])


async def test_wrong_or_missing_credentials_are_refused(auth_registry: Registry,
                                                        busybox: OciImage,
                                                        store: ImageStore) -> None:
    await push(busybox, auth_registry.url, "private/busybox", "v1", auth=(USER, PASSWORD))
    ref = f"{auth_registry.host}/private/busybox:v1"
    for creds in (None, credentials_for(auth_registry.host, [
        {"auths": {auth_registry.host: {"username": USER, "password": "wrong"}}}
    ])):
        with pytest.raises(ImagePullError) as info:
            await pull(store, ref, auth=creds)
        assert info.value.reason == "ErrImagePull"
        assert info.value.status == 401
        # The registry's own words.
        assert "unauthorized: authentication required" in info.value.message
    assert store.list() == []


async def test_multi_platform_index(registry: Registry, busybox: OciImage,
                                    store: ImageStore) -> None:
    host = Platform.host()
    other = Platform("linux", "s390x" if host.architecture != "s390x" else "amd64")
    foreign = build_busybox_image(cmd=["echo", "foreign"], platform=other)
    index_digest = await push_index([busybox, foreign], registry.url, "fleet/multi", "v1")
    ref = f"{registry.host}/fleet/multi:v1"
    rec = await pull(store, ref)
    assert rec.repo_digest == index_digest
    assert rec.manifest_digest == busybox.manifest_digest
    assert (await store.image_config(ref))["Cmd"] == busybox.config["config"]["Cmd"]
    theirs = await pull(store, ref, policy="Always", platform=other)
    assert theirs.manifest_digest == foreign.manifest_digest
    assert (await store.image_config(ref))["Cmd"] == ["echo", "foreign"]


async def test_layer_deletions_apply_through_overlayfs(registry: Registry,
                                                       store: ImageStore) -> None:
    _skip_unless_tools()
    img = build_busybox_image(extra_layers=[{"bin/wget": None, "etc/motd": b"layer two\n"}])
    await push(img, registry.url, "fleet/layered", "v1")
    ref = f"{registry.host}/fleet/layered:v1"
    await pull(store, ref)
    layers = await store.layers_for(ref)
    assert len(layers) == 2
    if not IS_ROOT:
        assert (layers[1] / "bin/.wh.wget").exists()
        pytest.skip("needs root to mount overlayfs (OCI-format whiteouts checked above)")
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to mount overlayfs in a private namespace")
    work = store.root.parent / "ovl"
    (work / "upper").mkdir(parents=True)
    (work / "work").mkdir()
    (work / "merged").mkdir()
    lower = ":".join(str(p) for p in reversed(layers))  # overlayfs lists the top layer first
    script = (
        f"mount -t overlay overlay -o lowerdir={lower},upperdir={work}/upper,"
        f"workdir={work}/work {work}/merged && ls {work}/merged/bin && cat {work}/merged/etc/motd"
    )
    # A private mount namespace: the mount disappears with the process, whatever happens.
    with trio.fail_after(30):
        out = await trio.run_process(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            capture_stdout=True, capture_stderr=True, check=False,
        )
    stdout, stderr = out.stdout.decode(), out.stderr.decode()
    if out.returncode != 0 and "unknown filesystem type" in stderr:
        pytest.skip("needs overlayfs in the kernel")
    assert out.returncode == 0, stderr
    listed = stdout.split()
    assert "busybox" in listed and "sh" in listed
    assert "wget" not in listed, "the upper layer's whiteout hides the lower file"
    assert "layer two" in stdout


async def test_import_oci_and_docker_archives(busybox: OciImage, store: ImageStore,
                                              tmp_path: Path) -> None:
    oci = write_oci_archive(busybox, tmp_path / "busybox-oci.tar", "example.test/busybox:oci")
    refs = await import_archive(store, oci)
    assert refs == ["example.test/busybox:oci"]
    assert store.get(refs[0]).manifest_digest == busybox.manifest_digest  # type: ignore[union-attr]
    _check_busybox_rootfs((await store.layers_for(refs[0]))[0])

    saved = write_docker_archive(busybox, tmp_path / "busybox-save.tar", ["busybox:saved"])
    refs2 = await import_archive(store, saved)
    assert refs2 == ["docker.io/library/busybox:saved"]
    assert (await store.image_config("busybox:saved"))["Cmd"] == busybox.config["config"]["Cmd"]
    layers = await store.layers_for("busybox:saved")
    # Same layer content, same diff_id: both archives share one unpacked directory.
    assert layers == await store.layers_for(refs[0])
    assert {r.ref for r in store.list()} == {refs[0], refs2[0]}


async def test_gc_removes_unused_image(registry: Registry, busybox: OciImage,
                                       store: ImageStore) -> None:
    extra = build_busybox_image(extra_layers=[{"opt/blob": os.urandom(200_000)}])
    await push(busybox, registry.url, "fleet/busybox", "v1")
    await push(extra, registry.url, "fleet/extra", "v1")
    used = f"{registry.host}/fleet/busybox:v1"
    unused = f"{registry.host}/fleet/extra:v1"
    await pull(store, unused)
    await pull(store, used)
    extra_layers = await store.layers_for(unused)
    base_layers = await store.layers_for(used)
    before = store.disk_usage()

    freed = await store.gc(keep={used}, bytes_to_free=100_000)
    assert freed >= 200_000
    assert store.get(unused) is None and store.get(used) is not None
    assert not extra_layers[1].exists()
    assert not store.has_blob(extra.layers[1].digest)
    # The base layer is shared with the kept image, so it stays.
    assert base_layers[0].exists() and extra_layers[0] == base_layers[0]
    assert store.disk_usage() == before - freed
    assert await store.gc(keep={used}) == 0
