"""A machine-shaped pair of network namespaces for dataplane tests without a server.

    "outside" netns                    "node" netns
    ext0 <outside_ip>/24 ── veth ──    up0 <node_ip>/24   (+ pod netns under `pod_dir`)

`node_and_outside(prefix, pod_dir, node_ip=..., outside_ip=...)` creates both (named
`<prefix>-<random>-node` / `-out`; both veth ends are made inside them, so nothing
appears on the host) and yields their /run/netns paths.  On exit it deletes every pod
namespace pinned under `pod_dir`, unmounts `pod_dir`, and deletes the two namespaces —
which takes the bridge, veths and nft tables in them along — failing on anything that
could not be removed.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from fleet.network.netns import delete_netns_sync, list_netns


def sh(*argv: str) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout


@contextlib.contextmanager
def node_and_outside(prefix: str, pod_dir: Path, *, node_ip: str, outside_ip: str,
                     default_route: bool = False) -> Iterator[tuple[str, str]]:
    tag = uuid.uuid4().hex[:6]
    node_name, out_name = f"{prefix}-{tag}-node", f"{prefix}-{tag}-out"
    created: list[str] = []
    try:
        for name in (node_name, out_name):
            sh("ip", "netns", "add", name)
            created.append(name)
        sh("ip", "-n", node_name, "link", "add", "up0", "type", "veth",
           "peer", "name", "ext0", "netns", out_name)
        for ns, dev, addr in ((node_name, "up0", node_ip), (out_name, "ext0", outside_ip)):
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        if default_route:
            sh("ip", "-n", node_name, "route", "add", "default", "via", outside_ip)
        yield f"/run/netns/{node_name}", f"/run/netns/{out_name}"
    finally:
        problems = []
        for path in list_netns(pod_dir):
            try:
                delete_netns_sync(path)
            except OSError as e:
                problems.append(repr(e))
        if pod_dir.exists():
            # create_pod_netns made the directory a (shared) mount of itself.
            subprocess.run(["umount", "-l", str(pod_dir)], capture_output=True)
        for name in reversed(created):
            p = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
            if p.returncode != 0:
                problems.append(p.stderr)
        assert not problems, problems
