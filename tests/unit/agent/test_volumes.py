"""Pod volumes: every type, the atomic layout and its updates, mounts, teardown."""

from __future__ import annotations

import base64
import os
import socket
import stat
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.agent.volumes import (
    DATA_DIR_NAME,
    VolumeError,
    VolumeManager,
    mounts_for,
    mounts_under,
    write_atomic,
)
from fleet.runtime.driver import Mount


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


class Objects:
    """A mutable fake API: lookup(kind, namespace, name) -> object or None."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str, str, str], dict[str, Any]] = {}

    async def __call__(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objs.get((kind, namespace, name))


@pytest.fixture
def pod_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "pod"
    yield d
    # A failing test must not leave a tmpfs behind.
    for mp in mounts_under(tmp_path):
        subprocess.run(["umount", "-l", str(mp)], check=False)


def pod(volumes: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                         "labels": {"app": "web"}},
            "spec": {"volumes": volumes,
                     "containers": [{"name": "c", "resources": {"limits": {"memory": "64Mi"}}}],
                     **spec}}


def listing(vol: Path) -> dict[str, str]:
    """What a container sees: visible names → content (through the symlinks)."""
    out = {}
    for dirpath, _dirs, files in os.walk(vol, followlinks=True):
        rel_dir = Path(dirpath).relative_to(vol)
        if any(part.startswith("..") for part in rel_dir.parts):
            continue
        for f in files:
            if not f.startswith(".."):
                out[str(rel_dir / f)] = (Path(dirpath) / f).read_text()
    return out


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


# -- emptyDir / hostPath -------------------------------------------------------------------


async def test_empty_dir_is_world_writable(pod_dir: Path) -> None:
    vm = VolumeManager(pod_dir, Objects())
    paths = await vm.setup(pod([{"name": "scratch", "emptyDir": {}}]))
    assert paths == {"scratch": pod_dir / "volumes" / "scratch"}
    assert paths["scratch"].is_dir() and mode(paths["scratch"]) == 0o777
    await vm.teardown()
    assert not pod_dir.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
async def test_memory_empty_dir_is_a_sized_tmpfs(pod_dir: Path) -> None:
    vm = VolumeManager(pod_dir, Objects(), {"memory": "1Gi"})
    spec = pod([{"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "4Mi"}}])
    paths = await vm.setup(spec)
    mp = paths["mem"]
    assert os.path.ismount(mp)
    st = os.statvfs(mp)
    assert st.f_blocks * st.f_frsize == 4 * 2**20
    (mp / "f").write_text("x")
    # Idempotent: a second setup (agent restart) does not stack another mount.
    await vm.setup(spec)
    assert mounts_under(pod_dir) == [mp]
    await vm.teardown()
    assert mounts_under(pod_dir) == [] and not pod_dir.exists()


async def test_memory_empty_dir_without_root_falls_back(pod_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("fleet.agent.volumes._may_mount", lambda: False)
    vm = VolumeManager(pod_dir, Objects())
    paths = await vm.setup(pod([{"name": "mem", "emptyDir": {"medium": "Memory"}}]))
    assert paths["mem"].is_dir() and not os.path.ismount(paths["mem"])
    assert "needs root" in caplog.text
    await vm.teardown()


async def test_host_path_types(tmp_path: Path, pod_dir: Path) -> None:
    vm = VolumeManager(pod_dir, Objects())
    existing_file = tmp_path / "file"
    existing_file.write_text("hi")
    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        paths = await vm.setup(pod([
            {"name": "made", "hostPath": {"path": str(tmp_path / "new/dir"), "type": "DirectoryOrCreate"}},
            {"name": "file", "hostPath": {"path": str(existing_file), "type": "File"}},
            {"name": "newfile", "hostPath": {"path": str(tmp_path / "nf"), "type": "FileOrCreate"}},
            {"name": "sock", "hostPath": {"path": str(sock_path), "type": "Socket"}},
            {"name": "any", "hostPath": {"path": str(tmp_path / "whatever")}},
            {"name": "dev", "hostPath": {"path": "/dev/null", "type": "CharDevice"}},
        ]))
    finally:
        sock.close()
    assert paths["made"] == tmp_path / "new/dir" and paths["made"].is_dir()
    assert paths["file"] == existing_file
    assert paths["newfile"].is_file() and paths["newfile"].read_text() == ""
    assert paths["any"] == tmp_path / "whatever"
    # teardown never touches host paths
    await vm.teardown()
    assert existing_file.read_text() == "hi" and (tmp_path / "new/dir").is_dir()


@pytest.mark.parametrize(("spec", "message"), [
    ({"path": "{tmp}/missing", "type": "Directory"}, "is not a directory"),
    ({"path": "{tmp}/afile", "type": "Directory"}, "is not a directory"),
    ({"path": "{tmp}", "type": "File"}, "is not a file"),
    ({"path": "{tmp}/afile", "type": "Socket"}, "is not a socket file"),
    ({"path": "{tmp}/afile", "type": "BlockDevice"}, "is not a block device"),
    ({"path": "{tmp}/no/parent", "type": "FileOrCreate"}, "is not a directory"),
    ({"path": "relative", "type": ""}, "must be an absolute path"),
    ({"path": "{tmp}", "type": "Bogus"}, "not supported"),
])
async def test_host_path_type_check_failures(tmp_path: Path, pod_dir: Path,
                                             spec: dict[str, str], message: str) -> None:
    (tmp_path / "afile").write_text("")
    spec = {k: v.replace("{tmp}", str(tmp_path)) for k, v in spec.items()}
    with pytest.raises(VolumeError) as info:
        await VolumeManager(pod_dir, Objects()).setup(pod([{"name": "h", "hostPath": spec}]))
    assert info.value.reason == "FailedMount"
    assert message in info.value.message
    assert 'MountVolume.SetUp failed for volume "h"' in info.value.message


# -- configMap / secret ----------------------------------------------------------------


async def test_config_map_all_keys_atomic_layout(pod_dir: Path) -> None:
    objs = Objects()
    objs.objs["ConfigMap", "ns", "cfg"] = {"data": {"a.conf": "A1", "b.conf": "B1"},
                                            "binaryData": {"bin": base64.b64encode(b"\x00\x01").decode()}}
    vm = VolumeManager(pod_dir, objs)
    paths = await vm.setup(pod([{"name": "cfg", "configMap": {"name": "cfg"}}]))
    vol = paths["cfg"]
    assert listing(vol) == {"a.conf": "A1", "b.conf": "B1", "bin": "\x00\x01"}
    data = vol / DATA_DIR_NAME
    assert data.is_symlink() and os.readlink(data).startswith("..20")
    assert os.readlink(vol / "a.conf") == "..data/a.conf"
    assert mode(vol / "a.conf") == 0o644
    await vm.teardown()


async def test_items_modes_and_nested_paths(pod_dir: Path) -> None:
    objs = Objects()
    objs.objs["Secret", "ns", "tls"] = {"data": {"tls.key": b64("KEY"), "tls.crt": b64("CRT"),
                                                 "unused": b64("-")}}
    vm = VolumeManager(pod_dir, objs)
    paths = await vm.setup(pod([{"name": "tls", "secret": {
        "secretName": "tls", "defaultMode": 0o440,
        "items": [{"key": "tls.key", "path": "private/server.key", "mode": 0o400},
                  {"key": "tls.crt", "path": "server.crt"}]}}]))
    vol = paths["tls"]
    assert listing(vol) == {"private/server.key": "KEY", "server.crt": "CRT"}
    assert mode(vol / "private/server.key") == 0o400
    assert mode(vol / "server.crt") == 0o440
    assert os.readlink(vol / "private") == "..data/private"
    await vm.teardown()


async def test_secret_is_decoded(pod_dir: Path) -> None:
    objs = Objects()
    objs.objs["Secret", "ns", "s"] = {"data": {"password": b64("hunter2")}}
    vm = VolumeManager(pod_dir, objs)
    paths = await vm.setup(pod([{"name": "s", "secret": {"secretName": "s"}}]))
    assert (paths["s"] / "password").read_text() == "hunter2"
    # As root, secrets live on a tmpfs so they never reach the node's disk.
    assert os.path.ismount(paths["s"]) == (os.geteuid() == 0)
    await vm.teardown()
    assert mounts_under(pod_dir.parent) == []


@pytest.mark.parametrize(("volume", "message"), [
    ({"configMap": {"name": "gone"}}, 'configmap "gone" not found'),
    ({"secret": {"secretName": "gone"}}, 'secret "gone" not found'),
    ({"configMap": {"name": "cfg", "items": [{"key": "nokey", "path": "x"}]}},
     "configmap references non-existent config key: nokey"),
    ({"projected": {"sources": [{"secret": {"name": "gone"}}]}}, 'secret "gone" not found'),
    ({"configMap": {"name": "cfg", "items": [{"key": "a", "path": "../escape"}]}},
     "must be relative"),
    ({"downwardAPI": {"items": [{"path": "x", "fieldRef": {"fieldPath": "spec.bogus"}}]}},
     "unsupported fieldPath"),
])
async def test_missing_or_bad_references_raise_volume_error(pod_dir: Path, volume: dict[str, Any],
                                                            message: str) -> None:
    objs = Objects()
    objs.objs["ConfigMap", "ns", "cfg"] = {"data": {"a": "1"}}
    with pytest.raises(VolumeError) as info:
        await VolumeManager(pod_dir, objs).setup(pod([{"name": "v", **volume}]))
    assert info.value.reason == "FailedMount"
    assert message in info.value.message


async def test_optional_missing_object_and_key(pod_dir: Path) -> None:
    objs = Objects()
    objs.objs["ConfigMap", "ns", "cfg"] = {"data": {"a": "1"}}
    vm = VolumeManager(pod_dir, objs)
    paths = await vm.setup(pod([
        {"name": "none", "configMap": {"name": "gone", "optional": True}},
        {"name": "some", "configMap": {"name": "cfg", "optional": True,
                                       "items": [{"key": "a", "path": "a"},
                                                 {"key": "missing", "path": "m"}]}},
    ]))
    assert listing(paths["none"]) == {}
    assert listing(paths["some"]) == {"a": "1"}
    await vm.teardown()


# -- refresh ---------------------------------------------------------------------------


async def test_refresh_swaps_content_atomically(pod_dir: Path) -> None:
    objs = Objects()
    objs.objs["ConfigMap", "ns", "cfg"] = {"data": {"old": "1", "both": "v1"}}
    vm = VolumeManager(pod_dir, objs)
    spec = pod([{"name": "cfg", "configMap": {"name": "cfg"}}, {"name": "e", "emptyDir": {}}])
    vol = (await vm.setup(spec))["cfg"]
    first_dir = os.readlink(vol / DATA_DIR_NAME)
    assert await vm.refresh(spec) == []  # unchanged: nothing rewritten
    assert os.readlink(vol / DATA_DIR_NAME) == first_dir

    # A reader holding the old directory open keeps a consistent old view.
    objs.objs["ConfigMap", "ns", "cfg"] = {"data": {"new": "2", "both": "v2"}}
    assert await vm.refresh(spec) == ["cfg"]
    second_dir = os.readlink(vol / DATA_DIR_NAME)
    assert second_dir != first_dir
    assert listing(vol) == {"new": "2", "both": "v2"}
    assert not (vol / "old").exists() and not os.path.lexists(vol / "old")
    assert not (vol / first_dir).exists()  # the old generation is gone
    hidden = sorted(p.name for p in vol.iterdir() if p.name.startswith(".."))
    assert hidden == sorted([DATA_DIR_NAME, second_dir])
    await vm.teardown()


async def test_refresh_keeps_old_content_when_object_deleted(pod_dir: Path) -> None:
    objs = Objects()
    objs.objs["ConfigMap", "ns", "cfg"] = {"data": {"k": "v"}}
    objs.objs["Secret", "ns", "s"] = {"data": {"k": b64("1")}}
    vm = VolumeManager(pod_dir, objs)
    spec = pod([{"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "s", "secret": {"secretName": "s"}}])
    paths = await vm.setup(spec)
    del objs.objs["ConfigMap", "ns", "cfg"]
    objs.objs["Secret", "ns", "s"] = {"data": {"k": b64("2")}}
    with pytest.raises(VolumeError, match='configmap "cfg" not found'):
        await vm.refresh(spec)
    assert listing(paths["cfg"]) == {"k": "v"}
    assert listing(paths["s"]) == {"k": "2"}  # the other volume was still updated
    await vm.teardown()


async def test_reader_never_sees_a_mixed_set(tmp_path: Path) -> None:
    """Readers racing many updates always see one generation: all files agree."""
    target = tmp_path / "vol"
    from fleet.agent.volumes import FileContent

    def payload(gen: int) -> dict[str, FileContent]:
        return {f"k{i}": FileContent(str(gen).encode(), 0o644) for i in range(5)}

    write_atomic(target, payload(0))
    seen: set[int] = set()
    done = False

    def reader() -> None:
        while not done:
            try:
                # Read through ..data once resolved, as a program opening a config dir does.
                real = target / os.readlink(target / DATA_DIR_NAME)
                values = {(real / f"k{i}").read_text() for i in range(5)}
            except FileNotFoundError:
                continue  # that generation was removed after we resolved it: retry
            assert len(values) == 1, values
            seen.add(int(values.pop()))

    async with trio.open_nursery() as n:
        n.start_soon(trio.to_thread.run_sync, reader)
        try:
            for gen in range(1, 40):
                await trio.to_thread.run_sync(write_atomic, target, payload(gen))
        finally:
            done = True
    assert listing(target) == {f"k{i}": "39" for i in range(5)}
    assert seen


# -- downwardAPI / projected -----------------------------------------------------------


async def test_downward_api_volume(pod_dir: Path) -> None:
    vm = VolumeManager(pod_dir, Objects(), {"cpu": "2"})
    spec = pod([{"name": "info", "downwardAPI": {"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}, "mode": 0o600},
        {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory",
                                             "divisor": "1Mi"}},
        {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}},
    ]}}])
    vol = (await vm.setup(spec))["info"]
    assert listing(vol) == {"labels": 'app="web"', "name": "p", "mem": "64", "cpu": "2"}
    assert mode(vol / "name") == 0o600
    spec["metadata"]["labels"]["tier"] = "db"
    assert await vm.refresh(spec) == ["info"]
    assert (vol / "labels").read_text() == 'app="web"\ntier="db"'
    await vm.teardown()


async def test_projected_volume(pod_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    objs = Objects()
    objs.objs["ConfigMap", "ns", "cfg"] = {"data": {"c": "cm"}}
    objs.objs["Secret", "ns", "s"] = {"data": {"s": b64("sec")}}
    calls: list[tuple[str, int]] = []

    async def tokens(p: Mapping[str, Any], audience: str, expiration: int) -> str:
        calls.append((audience, expiration))
        return "tok-123"

    spec = pod([{"name": "all", "projected": {"defaultMode": 0o640, "sources": [
        {"configMap": {"name": "cfg", "items": [{"key": "c", "path": "conf/c"}]}},
        {"secret": {"name": "s"}},
        {"secret": {"name": "absent", "optional": True}},
        {"downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
        {"serviceAccountToken": {"path": "token", "audience": "api", "expirationSeconds": 600}},
    ]}}])
    vm = VolumeManager(pod_dir, objs, token_source=tokens)
    vol = (await vm.setup(spec))["all"]
    assert listing(vol) == {"conf/c": "cm", "s": "sec", "ns": "ns", "token": "tok-123"}
    assert mode(vol / "s") == 0o640
    assert calls == [("api", 600)]
    await vm.teardown()

    # Without a token source the rest is still written, and the log says why not the token.
    vm = VolumeManager(pod_dir, objs)
    vol = (await vm.setup(spec))["all"]
    assert "token" not in listing(vol) and "s" in listing(vol)
    assert "no service-account token source" in caplog.text
    await vm.teardown()


# -- mounts ----------------------------------------------------------------------------


async def test_mounts_for_volume_mounts(pod_dir: Path, tmp_path: Path) -> None:
    objs = Objects()
    objs.objs["ConfigMap", "ns", "cfg"] = {"data": {"app.conf": "x"}}
    vm = VolumeManager(pod_dir, objs)
    paths = await vm.setup(pod([{"name": "data", "emptyDir": {}},
                                {"name": "cfg", "configMap": {"name": "cfg"}},
                                {"name": "host", "hostPath": {"path": str(tmp_path)}}]))
    container = {"name": "c", "volumeMounts": [
        {"name": "data", "mountPath": "/data"},
        {"name": "data", "mountPath": "/logs", "subPath": "logs/app", "readOnly": True},
        {"name": "data", "mountPath": "/per-pod", "subPathExpr": "$(POD_NAME)"},
        {"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf"},
        {"name": "cfg", "mountPath": "/etc/app"},
        {"name": "host", "mountPath": "/host", "mountPropagation": "HostToContainer"},
    ]}
    mounts = vm.mounts_for(container, env={"POD_NAME": "p"})
    data = paths["data"]
    cfg_file = Path(os.path.realpath(paths["cfg"] / "app.conf"))
    assert mounts == [
        Mount(data, "/data"),
        Mount(data / "logs/app", "/logs", read_only=True),
        Mount(data / "p", "/per-pod"),
        # configMap content is always read-only; a subPath pins the current file
        Mount(cfg_file, "/etc/app.conf", read_only=True),
        Mount(paths["cfg"], "/etc/app", read_only=True),
        Mount(tmp_path, "/host", propagation="host-to-container"),
    ]
    assert (data / "logs/app").is_dir() and (data / "p").is_dir()
    with pytest.raises(VolumeError, match="does not exist in volume 'cfg'"):
        vm.mounts_for({"volumeMounts": [{"name": "cfg", "mountPath": "/x", "subPath": "nokey"}]})
    await vm.teardown()


@pytest.mark.parametrize(("vm_spec", "message"), [
    ({"name": "nope", "mountPath": "/x"}, 'volume "nope" not found'),
    ({"name": "data", "mountPath": "/x", "subPath": "../../etc"}, "without '..'"),
    ({"name": "data", "mountPath": "/x", "subPath": "/etc"}, "without '..'"),
    ({"name": "data", "mountPath": "/x", "subPath": "escape"}, "resolves outside volume"),
    ({"name": "data", "mountPath": "/x", "mountPropagation": "Sideways"}, "mountPropagation"),
])
def test_mounts_for_rejects_bad_mounts(tmp_path: Path, vm_spec: dict[str, Any],
                                       message: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    # A symlink planted by the container pointing out of the volume.
    (data / "escape").symlink_to("/etc")
    with pytest.raises(VolumeError, match=message.replace("(", r"\(")):
        mounts_for({"volumeMounts": [vm_spec]}, {"data": data})


async def test_teardown_refuses_to_delete_through_a_remaining_mount(
        pod_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vm = VolumeManager(pod_dir, Objects())
    await vm.setup(pod([{"name": "e", "emptyDir": {}}]))
    fake = pod_dir / "volumes" / "e"
    monkeypatch.setattr("fleet.agent.volumes.mounts_under", lambda root: [fake])
    monkeypatch.setattr("fleet.agent.volumes._umount", lambda p: None)
    with pytest.raises(VolumeError, match="still mounted"):
        await vm.teardown()
    assert fake.is_dir()
    monkeypatch.undo()
    await vm.teardown()
    assert not pod_dir.exists()
