"""OCI config generation (fleet.runtime.spec): pure, table-driven."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.runtime.driver import (
    ContainerSpec,
    Device,
    Mount,
    Resources,
    Sandbox,
    SandboxSpec,
    User,
)
from fleet.runtime.spec import (
    ALL_CAPABILITIES,
    DEFAULT_CAPABILITIES,
    MASKED_PATHS,
    READONLY_PATHS,
    SpecError,
    build_config,
    normalize_capability,
    resolve_capabilities,
)

ROOTFS = Path("/state/containers/abc/rootfs")


def sandbox(netns: str | None = "/run/netns/pod", **kw: object) -> Sandbox:
    spec = SandboxSpec(pod_uid="uid1", namespace="ns", name="web", hostname="web-0",
                       log_dir=Path("/logs"), netns_path=Path(netns) if netns else None,
                       **kw)  # type: ignore[arg-type]
    return Sandbox(id="uid1", spec=spec, cgroup_parent="fleet/poduid1",
                   state_dir=Path("/state/sandboxes/uid1"))


def container(**kw: object) -> ContainerSpec:
    kw.setdefault("command", ["/bin/app"])
    return ContainerSpec(name="app", layers=[Path("/l1")], **kw)  # type: ignore[arg-type]


def config(c: ContainerSpec | None = None, sb: Sandbox | None = None, **kw: object) -> dict:
    return build_config(c or container(), sb or sandbox(), rootfs=ROOTFS,
                        cgroups_path="fleet/poduid1/abc", **kw)  # type: ignore[arg-type]


def test_defaults() -> None:
    cfg = config(container(args=["--port", "80"], env={"A": "1"}))
    p = cfg["process"]
    assert p["args"] == ["/bin/app", "--port", "80"]
    assert p["env"][0] == "A=1" and any(e.startswith("PATH=") for e in p["env"])
    assert "HOSTNAME=web-0" in p["env"]
    assert p["cwd"] == "/" and p["terminal"] is False and p["noNewPrivileges"] is False
    assert p["user"] == {"uid": 0, "gid": 0}
    assert p["capabilities"]["bounding"] == list(DEFAULT_CAPABILITIES)
    assert p["capabilities"]["effective"] == list(DEFAULT_CAPABILITIES)
    assert p["capabilities"]["inheritable"] == [] and p["capabilities"]["ambient"] == []
    assert cfg["root"] == {"path": str(ROOTFS), "readonly": False}
    assert cfg["hostname"] == "web-0"
    linux = cfg["linux"]
    assert linux["cgroupsPath"] == "/fleet/poduid1/abc"
    assert linux["maskedPaths"] == list(MASKED_PATHS)
    assert linux["readonlyPaths"] == list(READONLY_PATHS)
    assert linux["resources"]["devices"] == [{"allow": False, "access": "rwm"}]
    dests = [m["destination"] for m in cfg["mounts"]]
    assert dests == ["/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys",
                     "/sys/fs/cgroup"]
    sysfs = next(m for m in cfg["mounts"] if m["destination"] == "/sys")
    assert "ro" in sysfs["options"]


@pytest.mark.parametrize(("netns", "expected", "hostname"), [
    ("/run/netns/pod", [{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}, {"type": "uts"},
                        {"type": "network", "path": "/run/netns/pod"}], "web-0"),
    # host network: the node's network and UTS namespaces (and hostname)
    (None, [{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}], None),
])
def test_namespaces(netns: str | None, expected: list[dict], hostname: str | None) -> None:
    cfg = config(sb=sandbox(netns))
    assert cfg["linux"]["namespaces"] == expected
    assert cfg.get("hostname") == hostname
    assert any(e.startswith("HOSTNAME=") for e in cfg["process"]["env"]) == bool(hostname)


@pytest.mark.parametrize(("resources", "swap", "expected"), [
    (Resources(), False, {"cpu": {"shares": 2}}),
    (Resources(cpu_request_millis=250), False, {"cpu": {"shares": 256}}),
    (Resources(cpu_request_millis=1000, cpu_limit_millis=1500), False,
     {"cpu": {"shares": 1024, "quota": 150000, "period": 100000}}),
    # the quota never goes under 1 ms per period
    (Resources(cpu_limit_millis=1), False,
     {"cpu": {"shares": 2, "quota": 1000, "period": 100000}}),
    (Resources(memory_limit_bytes=32 << 20), False,
     {"cpu": {"shares": 2}, "memory": {"limit": 32 << 20}}),
    (Resources(memory_limit_bytes=32 << 20), True,
     {"cpu": {"shares": 2}, "memory": {"limit": 32 << 20, "swap": 32 << 20}}),
    (Resources(pids_limit=100), False, {"cpu": {"shares": 2}, "pids": {"limit": 100}}),
])
def test_resources(resources: Resources, swap: bool, expected: dict) -> None:
    res = config(container(resources=resources), swap_accounting=swap)["linux"]["resources"]
    res.pop("devices")
    assert res == expected


@pytest.mark.parametrize(("add", "drop", "expected"), [
    ([], [], list(DEFAULT_CAPABILITIES)),
    (["NET_ADMIN"], [], [*DEFAULT_CAPABILITIES, "CAP_NET_ADMIN"]),
    (["CAP_NET_ADMIN", "net_admin"], [], [*DEFAULT_CAPABILITIES, "CAP_NET_ADMIN"]),
    ([], ["NET_RAW", "MKNOD"],
     [c for c in DEFAULT_CAPABILITIES if c not in ("CAP_NET_RAW", "CAP_MKNOD")]),
    (["NET_BIND_SERVICE"], ["ALL"], ["CAP_NET_BIND_SERVICE"]),
    ([], ["ALL"], []),
    (["ALL"], [], list(ALL_CAPABILITIES)),
    (["ALL"], ["SYS_ADMIN"], [c for c in ALL_CAPABILITIES if c != "CAP_SYS_ADMIN"]),
    # a named drop beats the same add, as in Docker
    (["NET_ADMIN"], ["NET_ADMIN"], list(DEFAULT_CAPABILITIES)),
])
def test_capabilities(add: list[str], drop: list[str], expected: list[str]) -> None:
    assert resolve_capabilities(add, drop) == expected


def test_unknown_capability() -> None:
    with pytest.raises(SpecError, match="unknown capability"):
        normalize_capability("FLY")
    with pytest.raises(SpecError):
        config(container(capabilities_add=["NOPE"]))


def test_non_root_user_gets_bounding_caps_only() -> None:
    p = config(container(user=User(uid=1000, gid=1000, additional_gids=(5, 6))))["process"]
    assert p["user"] == {"uid": 1000, "gid": 1000, "additionalGids": [5, 6]}
    caps = p["capabilities"]
    assert caps["bounding"] == list(DEFAULT_CAPABILITIES)
    assert caps["effective"] == caps["permitted"] == caps["inheritable"] == []


def test_mounts_and_propagation() -> None:
    c = container(mounts=[
        Mount(Path("/var/data"), "/data"),
        Mount(Path("/etc/cfg"), "/cfg", read_only=True, propagation="host-to-container"),
    ], read_only_root=True, working_dir="/srv", tty=True)
    sb = sandbox(dns_file=Path("/pods/uid1/resolv.conf"), hosts_file=Path("/pods/uid1/hosts"))
    cfg = config(c, sb)
    binds = [m for m in cfg["mounts"] if m["type"] == "bind"]
    assert binds == [
        {"destination": "/etc/resolv.conf", "type": "bind", "source": "/pods/uid1/resolv.conf",
         "options": ["rbind", "rprivate", "rw"]},
        {"destination": "/etc/hosts", "type": "bind", "source": "/pods/uid1/hosts",
         "options": ["rbind", "rprivate", "rw"]},
        {"destination": "/data", "type": "bind", "source": "/var/data",
         "options": ["rbind", "rprivate", "rw"]},
        {"destination": "/cfg", "type": "bind", "source": "/etc/cfg",
         "options": ["rbind", "rslave", "ro"]},
    ]
    assert cfg["linux"]["rootfsPropagation"] == "rslave"
    assert cfg["root"]["readonly"] is True
    assert cfg["process"]["cwd"] == "/srv" and cfg["process"]["terminal"] is True
    assert "TERM=xterm" in cfg["process"]["env"]
    bidi = config(container(mounts=[Mount(Path("/x"), "/x", propagation="bidirectional")]))
    assert bidi["linux"]["rootfsPropagation"] == "rshared"
    assert bidi["mounts"][-1]["options"] == ["rbind", "rshared", "rw"]
    assert "rootfsPropagation" not in config()["linux"]


@pytest.mark.parametrize("bad", [
    container(command=[]),
    container(working_dir="relative"),
    container(mounts=[Mount(Path("/x"), "relative")]),
    container(mounts=[Mount(Path("/x"), "/x", propagation="sideways")]),  # type: ignore[arg-type]
])
def test_invalid(bad: ContainerSpec) -> None:
    with pytest.raises(SpecError):
        config(bad)


def test_env_overrides_defaults() -> None:
    env = config(container(env={"PATH": "/opt/bin", "HOSTNAME": "custom"}))["process"]["env"]
    assert "PATH=/opt/bin" in env and "HOSTNAME=custom" in env
    assert sum(e.startswith("PATH=") for e in env) == 1


def test_volume_devices_are_created_and_allowed_by_number() -> None:
    cfg = config(container(devices=[
        Device(host_path=Path("/pods/u/volumeDevices/raw"), container_path="/dev/xvda",
               major=7, minor=3),
        Device(host_path=Path("/pods/u/volumeDevices/ro"), container_path="/dev/xvdb",
               major=7, minor=4, read_only=True)]))
    linux = cfg["linux"]
    assert linux["devices"] == [
        {"path": "/dev/xvda", "type": "b", "major": 7, "minor": 3, "fileMode": 0o660,
         "uid": 0, "gid": 0},
        {"path": "/dev/xvdb", "type": "b", "major": 7, "minor": 4, "fileMode": 0o660,
         "uid": 0, "gid": 0}]
    assert linux["resources"]["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "b", "major": 7, "minor": 3, "access": "rwm"},
        {"allow": True, "type": "b", "major": 7, "minor": 4, "access": "rm"}]
    assert "devices" not in config()["linux"]
    with pytest.raises(SpecError, match="not absolute"):
        config(container(devices=[Device(Path("/x"), "dev/x", 1, 1)]))
