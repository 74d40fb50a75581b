"""The ranges Services are given ClusterIPs and NodePorts from, and the order of picking.

Pure: no store, no I/O.  `ServiceIPRange` is the service CIDR minus its network
and broadcast addresses; `PortRange` is `--service-node-port-range`.  Both follow
Kubernetes' split of a range into a small *static* lower band and the rest
(KEP-3070 for ClusterIPs, KEP-3668 for NodePorts): dynamic allocation walks the
upper band first, from a random offset, and falls back to the lower band only
when the upper one is full — so addresses people pick by hand (`.10` for cluster
DNS) stay free of random Services.  The first address (`.1`) is the `kubernetes`
Service's and is never handed out dynamically.

The caller (`svcalloc.py`) checks each candidate against what is already
allocated and makes it its own with an atomic store create; this module only
says which candidates, in which order.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Iterator
from dataclasses import dataclass

DEFAULT_SERVICE_CIDR = "10.43.0.0/16"
DEFAULT_NODE_PORT_RANGE = "30000-32767"


def _band(size: int, *, divisor: int, lo: int, hi: int) -> int:
    """Size of the static lower band: size/divisor, at least `lo`, at most `hi`."""
    return min(max(lo, size // divisor), hi)


def _walk(first: int, last: int, rng: random.Random) -> Iterator[int]:
    """Every integer in [first, last] once, starting at a random one and wrapping."""
    if last < first:
        return
    n = last - first + 1
    start = rng.randrange(n)
    for i in range(n):
        yield first + (start + i) % n


@dataclass(frozen=True)
class ServiceIPRange:
    """An IPv4 or IPv6 service CIDR."""

    cidr: str

    def __post_init__(self) -> None:
        net = ipaddress.ip_network(self.cidr, strict=False)
        if net.num_addresses < 4:
            raise ValueError(f"the service CIDR {self.cidr} is too small: at least 4 addresses are needed")
        if net.version == 6 and net.prefixlen < 64:
            # kube caps IPv6 service ranges at /64 of allocation too; ours walks
            # integers, so bound it to what a walk can finish.
            raise ValueError(f"the IPv6 service CIDR {self.cidr} is too large: at most /64 bits of hosts")
        object.__setattr__(self, "cidr", str(net))

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(self.cidr)

    @property
    def family(self) -> str:
        return "IPv4" if self.network.version == 4 else "IPv6"

    @property
    def first(self) -> int:
        """The first usable address (the network address is never used)."""
        return int(self.network.network_address) + 1

    @property
    def last(self) -> int:
        """The last usable address (the broadcast address is never used)."""
        return int(self.network.broadcast_address) - 1

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def nth(self, n: int) -> str:
        """The n-th usable address, from 1: `nth(1)` is the `kubernetes` Service's."""
        return str(ipaddress.ip_address(self.first + n - 1))

    @property
    def kubernetes_ip(self) -> str:
        return self.nth(1)

    def contains(self, ip: str) -> bool:
        """Whether `ip` is a usable address of the range (not network, not broadcast)."""
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return addr.version == self.network.version and self.first <= int(addr) <= self.last

    def out_of_range_message(self, ip: str) -> str:
        return (f"the provided IP ({ip}) is not in the valid range. The range of valid IPs is {self.cidr}")

    def candidates(self, rng: random.Random | None = None) -> Iterator[str]:
        """Addresses for dynamic allocation, in the order to try them: the upper band
        from a random offset, then the lower band (never the `kubernetes` address)."""
        rng = rng or random.Random()
        band = _band(self.size, divisor=16, lo=16, hi=256)
        upper_first = min(self.first + band, self.last)
        for i in _walk(upper_first, self.last, rng):
            yield str(ipaddress.ip_address(i))
        for i in _walk(self.first + 1, upper_first - 1, rng):
            yield str(ipaddress.ip_address(i))


@dataclass(frozen=True)
class PortRange:
    """An inclusive port range, `30000-32767` by default."""

    base: int = 30000
    size: int = 2768

    @classmethod
    def parse(cls, text: str) -> PortRange:
        """`lo-hi` (or `lo+count`, as kube's PortRange flag accepts)."""
        text = text.strip()
        try:
            if "+" in text:
                lo_s, n_s = text.split("+", 1)
                lo, n = int(lo_s), int(n_s) + 1
            else:
                lo_s, hi_s = text.split("-", 1)
                lo, n = int(lo_s), int(hi_s) - int(lo_s) + 1
        except ValueError:
            raise ValueError(f"invalid port range {text!r}: want LOW-HIGH, e.g. {DEFAULT_NODE_PORT_RANGE}") from None
        if not (1 <= lo and n >= 1 and lo + n - 1 <= 65535):
            raise ValueError(f"invalid port range {text!r}: ports must be within 1-65535, low <= high")
        return cls(lo, n)

    @property
    def last(self) -> int:
        return self.base + self.size - 1

    def __str__(self) -> str:
        return f"{self.base}-{self.last}"

    def contains(self, port: int) -> bool:
        return self.base <= port <= self.last

    def out_of_range_message(self) -> str:
        return f"provided port is not in the valid range. The range of valid ports is {self}"

    def candidates(self, rng: random.Random | None = None) -> Iterator[int]:
        """Ports for dynamic allocation: upper band from a random offset, then the lower band."""
        rng = rng or random.Random()
        band = _band(self.size, divisor=32, lo=16, hi=128)
        upper_first = min(self.base + band, self.last)
        yield from _walk(upper_first, self.last, rng)
        yield from _walk(self.base, upper_first - 1, rng)
