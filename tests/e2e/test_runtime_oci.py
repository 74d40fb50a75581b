"""The oci driver end to end: real runc, overlay roots, cgroups, shims (root only).

The image is a layer directory made here from Debian's busybox-static (/bin/busybox
and a symlink per applet); the image store provides real layers later.  Each test
gets its own state dir and pod; the fixture removes every container (runc delete,
overlay unmount), the pod cgroup and the directories, also when the test failed, and
checks that nothing was left mounted.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from fleet.runtime import cgroups
from fleet.runtime.driver import (
    ContainerSpec,
    ContainerStatus,
    Mount,
    Resources,
    User,
)
from fleet.runtime.oci import OciDriver, find_runtime
from fleet.runtime.spec import MASKED_PATHS
from tests.e2e.test_runtime_process import (
    Collect,
    Env,
    check_echo,
    check_env_cwd,
    check_exec,
    check_exit_code,
    check_memory_oom,
    check_not_found,
    check_recovery,
    check_sigkill_at_grace,
    check_signal,
    check_sigterm,
    check_stats,
    check_stdin_fifo,
    cleanup_driver,
    log_text,
    sandbox_spec,
    wait_log,
)

BUSYBOX = shutil.which("busybox") or "/bin/busybox"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the oci driver runs runc)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(not os.path.exists(BUSYBOX), reason="needs busybox-static"),
]


def make_busybox_layer(dest: Path) -> Path:
    """A one-layer image: busybox + applet symlinks, /etc/passwd, empty mount points."""
    (dest / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, dest / "bin" / "busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for a in applets:
        if a != "busybox":
            os.symlink("busybox", dest / "bin" / a)
    for d in ("etc", "tmp", "proc", "sys", "dev", "root"):
        (dest / d).mkdir()
    os.chmod(dest / "tmp", 0o1777)
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                         "nobody:x:65534:65534:nobody:/:/bin/sh\n")
    (dest / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    return dest


@pytest.fixture(scope="module")
def busybox_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_busybox_layer(tmp_path_factory.mktemp("layer") / "busybox")


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(path))]


@pytest.fixture
def oci_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("oci")
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        # Last resort if the driver cleanup itself failed: nothing stays mounted.
        for m in sorted(mounts_under(base), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], check=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def oenv(oci_base: Path, busybox_layer: Path) -> AsyncIterator[Env]:
    driver = OciDriver(oci_base / "state")
    async with trio.open_nursery() as n:
        # Shims start through the warm launcher, as under the agent.
        await n.start(driver.serve)
        sb = await driver.create_sandbox(sandbox_spec(oci_base))
        try:
            yield Env(driver, sb, busybox_layer, oci_base, "oci")
        finally:
            problems = await cleanup_driver(driver)
            n.cancel_scope.cancel()
            left = mounts_under(oci_base)
            pod_cgroup_left = driver.cgroups.exists(sb.cgroup_parent)
            assert not problems, problems
            assert not left, f"still mounted: {left}"
            assert not pod_cgroup_left, f"pod cgroup {sb.cgroup_parent} left behind"


async def test_oci_echo_logs_and_exit(oenv: Env) -> None:
    await check_echo(oenv)


async def test_oci_command_not_found(oenv: Env) -> None:
    await check_not_found(oenv)


async def test_oci_exit_code(oenv: Env) -> None:
    await check_exit_code(oenv)


async def test_oci_stop_delivers_sigterm(oenv: Env) -> None:
    shared = oenv.base / "shared"
    shared.mkdir()
    oenv_mounts = [Mount(host_path=shared, container_path="/shared")]
    orig = oenv.spec

    def spec_with_mount(command: list[str], **kw: object):  # type: ignore[no-untyped-def]
        s = orig(command, **kw)
        s.mounts = oenv_mounts
        return s

    oenv.spec = spec_with_mount  # type: ignore[method-assign]
    await check_sigterm(oenv, shared, "/shared")


async def test_oci_stop_kills_at_grace_deadline(oenv: Env) -> None:
    await check_sigkill_at_grace(oenv)


async def test_oci_memory_limit_oom_killed(oenv: Env) -> None:
    await check_memory_oom(oenv)


async def test_oci_exec(oenv: Env) -> None:
    await check_exec(oenv)


async def test_oci_exec_in_stopped_container_refused(oenv: Env) -> None:
    h = await oenv.run(["true"])
    await oenv.driver.wait(h)
    with pytest.raises(Exception, match="not running"):
        await oenv.driver.exec(h, ["true"])


async def test_oci_env_and_working_dir(oenv: Env) -> None:
    await check_env_cwd(oenv, "/tmp")


async def test_oci_signal(oenv: Env) -> None:
    await check_signal(oenv)


async def test_oci_stdin_fifo(oenv: Env) -> None:
    await check_stdin_fifo(oenv)


async def test_oci_stats(oenv: Env) -> None:
    await check_stats(oenv)


async def test_oci_recovery_after_agent_sigkill(oenv: Env) -> None:
    await check_recovery(oenv, f"rec-{os.urandom(3).hex()}")


async def test_oci_read_only_root(oenv: Env) -> None:
    h = await oenv.run(["sh", "-c", "touch /newfile; echo rc=$?; touch /tmp/x; echo tmp=$?"],
                       read_only_root=True)
    st = await oenv.driver.wait(h)
    assert st.exit_code == 0
    out = log_text(h.log_path)
    assert "Read-only file system" in out and "rc=1" in out and "tmp=1" in out, out
    # without it the (overlay) root is writable, and the write lands in the upper dir
    h = await oenv.run(["sh", "-c", "touch /newfile && echo ok"], name="rw")
    await oenv.driver.wait(h)
    assert log_text(h.log_path) == "ok"
    assert (h.bundle / "upper" / "newfile").exists()
    assert not (oenv.layer / "newfile").exists()


async def test_oci_user(oenv: Env) -> None:
    h = await oenv.run(["sh", "-c", "id -u; id -g; grep CapEff /proc/self/status"],
                       user=User(uid=65534, gid=65534))
    await oenv.driver.wait(h)
    uid, gid, capeff = log_text(h.log_path).splitlines()
    assert (uid, gid) == ("65534", "65534")
    assert capeff.split()[1] == "0000000000000000"  # non-root: no effective capabilities


async def test_oci_capabilities(oenv: Env) -> None:
    # CAP_NET_RAW is in the default set (bit 13); dropping it removes it from the set.
    h = await oenv.run(["sh", "-c", "grep CapEff /proc/self/status"])
    await oenv.driver.wait(h)
    default = int(log_text(h.log_path).split()[1], 16)
    assert default & (1 << 13)
    h = await oenv.run(["sh", "-c", "grep CapEff /proc/self/status"], name="changed",
                       capabilities_drop=["NET_RAW"], capabilities_add=["SYS_TIME"])
    await oenv.driver.wait(h)
    changed = int(log_text(h.log_path).split()[1], 16)
    assert not changed & (1 << 13) and changed & (1 << 25)  # CAP_SYS_TIME = 25


async def test_oci_pids_limit(oenv: Env) -> None:
    h = await oenv.run(["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do "
                                    "sleep 2 & done; wait; echo done"],
                       resources=Resources(pids_limit=5))
    with trio.fail_after(20):
        await oenv.driver.wait(h)
    out = log_text(h.log_path)
    assert "can't fork" in out, out


async def test_oci_cpu_and_memory_limits_in_cgroup(oenv: Env) -> None:
    h = await oenv.run(["sh", "-c", "echo ready; sleep 1000 & wait"],
                       resources=Resources(cpu_request_millis=250, cpu_limit_millis=500,
                                           memory_limit_bytes=64 * 1024 * 1024,
                                           pids_limit=50))
    await wait_log(h, "ready")
    cg = oenv.driver.cgroups
    rel = f"{oenv.sandbox.cgroup_parent}/{h.id}"
    assert cg.exists(rel)
    assert h.pid in cg.pids(rel)
    if cg.version == 1:
        assert (cg._dir("cpu", rel) / "cpu.shares").read_text().strip() == "256"
        assert (cg._dir("cpu", rel) / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert (cg._dir("memory", rel) / "memory.limit_in_bytes").read_text().strip() == \
            str(64 * 1024 * 1024)
        assert (cg._dir("pids", rel) / "pids.max").read_text().strip() == "50"
    else:
        d = cg.root / rel
        assert (d / "cpu.max").read_text().split() == ["50000", "100000"]
        assert (d / "memory.max").read_text().strip() == str(64 * 1024 * 1024)
        assert (d / "pids.max").read_text().strip() == "50"
    stats = cg.stats(rel)
    assert stats.memory_limit_bytes == 64 * 1024 * 1024
    await oenv.driver.stop(h, grace=0)


async def test_oci_namespaces_host_network(oenv: Env) -> None:
    # A masked path this kernel has and that is not empty on the host.
    masked = next(p for p in MASKED_PATHS if os.path.isfile(p) and open(p, "rb").read(1))
    h = await oenv.run(["sh", "-c", f"echo $$; hostname; wc -c < {masked}; "
                                    "sh -c 'echo x > /proc/sys/kernel/domainname' 2>&1; "
                                    "echo rc=$?"])
    await oenv.driver.wait(h)
    lines = log_text(h.log_path, "stdout").splitlines()
    assert lines[0] == "1"  # own pid namespace
    assert lines[1] == socket.gethostname()  # hostNetwork pods see the node's name
    assert lines[2] == "0"  # masked: an empty bind over it
    assert "Read-only file system" in lines[3] and lines[4] == "rc=1"  # /proc/sys is ro


@pytest.fixture
def netns() -> Iterator[Path]:
    name = f"fleet-rt-{os.urandom(4).hex()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield Path("/run/netns") / name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


async def test_oci_pod_network_namespace(oci_base: Path, busybox_layer: Path,
                                         netns: Path) -> None:
    driver = OciDriver(oci_base / "state")
    spec = dataclasses.replace(sandbox_spec(oci_base, "web"), netns_path=netns,
                               hostname="web-0")
    sb = await driver.create_sandbox(spec)
    try:
        h = await driver.start(sb, ContainerSpec(name="c", layers=[busybox_layer], command=[
            "sh", "-c", "hostname; ls /sys/class/net; readlink /proc/self/ns/net"]))
        st = await driver.wait(h)
        assert st.exit_code == 0
        lines = log_text(h.log_path).splitlines()
        assert lines[0] == "web-0"
        assert lines[1] == "lo"  # a fresh netns has only loopback
        assert lines[2] == f"net:[{os.stat(netns).st_ino}]"
    finally:
        assert not await cleanup_driver(driver)


async def test_oci_tty_container(oenv: Env) -> None:
    h = await oenv.run(["sh", "-c", "tty; echo to-stderr >&2"], tty=True)
    st = await oenv.driver.wait(h)
    assert st.exit_code == 0
    lines = [(s, c) for s, c in ((r.split(" ", 3)[1], r.split(" ", 3)[3])
                                 for r in h.log_path.read_text().splitlines())]
    # one terminal: everything is "stdout", lines without the pty's \r
    assert lines == [("stdout", "/dev/pts/0"), ("stdout", "to-stderr")], lines


async def test_oci_exec_with_resize(oenv: Env) -> None:
    h = await oenv.run(["sh", "-c", "echo ready; sleep 1000 & wait"])
    await wait_log(h, "ready")
    send, recv = trio.open_memory_channel[tuple[int, int]](1)
    out = Collect()

    async def resizes() -> None:
        async with send:
            await send.send((100, 40))

    async with trio.open_nursery() as n:
        n.start_soon(resizes)
        # stty reads the container-side pty size once the resize has been applied.
        rc = await oenv.driver.exec(h, ["sh", "-c", "sleep 0.5; stty size"], tty=True,
                                    stdout=out, resize=recv)
    assert rc == 0
    assert b"40 100" in out.data, out.data
    await oenv.driver.stop(h, grace=0)


async def test_oci_remove_running_container(oenv: Env) -> None:
    h = await oenv.run(["sh", "-c", "echo ready; sleep 1000 & wait"])
    await wait_log(h, "ready")
    await oenv.driver.remove(h)
    assert not h.bundle.exists()
    assert not mounts_under(h.bundle)
    assert (await oenv.driver.recover()) == []
    state = subprocess.run([oenv.driver.runtime, "--root", str(oenv.driver.runtime_root),
                            "list", "-q"], capture_output=True, text=True)
    assert h.id not in state.stdout


async def test_oci_config(oenv: Env) -> None:
    assert isinstance(oenv.driver, OciDriver)
    h = await oenv.run(["true"], mounts=[Mount(host_path=oenv.base,
                                               container_path="/data", read_only=True)])
    await oenv.driver.wait(h)
    cfg = oenv.driver.bundle_config(h)
    assert cfg["linux"]["cgroupsPath"] == f"/{oenv.sandbox.cgroup_parent}/{h.id}"
    assert {"destination": "/data", "type": "bind", "source": str(oenv.base),
            "options": ["rbind", "rprivate", "ro"]} in cfg["mounts"]
    # host network (no netns path): no network namespace of its own
    assert "network" not in [ns["type"] for ns in cfg["linux"]["namespaces"]]


def test_cgroup_version_detected() -> None:
    cg = cgroups.Cgroups()
    assert cg.version == (2 if Path("/sys/fs/cgroup/cgroup.controllers").exists() else 1)
    assert cg.writable()


async def test_oci_sigkill_reports_signal(oenv: Env) -> None:
    h = await oenv.run(["sh", "-c", "echo ready; sleep 1000 & wait"])
    await wait_log(h, "ready")
    await oenv.driver.signal(h, signal.SIGKILL)
    st = await oenv.driver.wait(h)
    assert (st.exit_code, st.signal, st.oom_killed, st.reason) == (137, 9, False, "Error")
    assert (await oenv.driver.inspect(h)).status is ContainerStatus.EXITED
