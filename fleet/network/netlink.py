"""The few pyroute2 helpers every netlink user of `fleet.network` shares (the bridge
driver, the pod network across nodes): a socket bound to a namespace, a link by name,
a link's kind.

A pyroute2 `IPRoute` keeps thread-local state, so each one is opened, used and closed
inside one thread call; a socket for another namespace is opened after `enter_netns`
switched the thread there (a netlink socket stays bound to the namespace it was
created in).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from pyroute2 import IPRoute

from fleet.network.netns import enter_netns


@contextlib.contextmanager
def iproute(netns_path: str | None) -> Iterator[IPRoute]:
    """An IPRoute bound to `netns_path` (None: this thread's namespace), closed after."""
    with enter_netns(netns_path):
        ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


def lookup(ipr: IPRoute, ifname: str) -> int | None:
    """The index of interface `ifname`, or None."""
    found = ipr.link_lookup(ifname=ifname)
    return found[0] if found else None


def link_kind(link: Any) -> str | None:
    """"veth", "bridge", "vxlan", ... (None for plain devices)."""
    info = link.get_attr("IFLA_LINKINFO")
    return info.get_attr("IFLA_INFO_KIND") if info is not None else None


__all__ = ["iproute", "link_kind", "lookup"]
