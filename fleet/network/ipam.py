"""Host-local IP address management: pod addresses out of the node's pod CIDR.

The server gives each node a slice of the cluster CIDR (say 10.42.3.0/24); this module
hands out its addresses, one per pod uid.  It owns the rules and the state file, and
nothing else — no netlink, no Trio — so it can be tested exhaustively.

Rules:

* the first host address (.1) is the gateway, held by the node's bridge; the network
  and broadcast addresses are never handed out, nor any address the caller reserves;
* allocation is idempotent per owner (pod uid): a retried setup gets the same address;
* addresses are handed out *next-fit* — the search starts after the last address
  given — so a just-released address is the last to be reused.  A pod that died a
  moment ago may still have conntrack entries, ARP cache entries in its neighbours and
  clients holding its address; reusing it at once would send that traffic to a
  stranger (CNI's host-local plugin does the same);
* every change is written to a small JSON file atomically (write a temp file, fsync,
  rename, fsync the directory) before it is acknowledged, so an agent killed at any
  moment restarts with the allocations its pods really have;
* running out is an `IPAMExhausted` error naming the CIDR and how many are in use.

The class is thread-safe (one lock), because the driver calls it from worker threads.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

STATE_VERSION = 1


class IPAMError(Exception):
    """The address pool cannot do what was asked (bad CIDR, unreadable state)."""


class IPAMExhausted(IPAMError):
    """Every usable address of the pool is allocated."""


class IPAM:
    """Allocations of one IPv4 pod CIDR, optionally persisted to `state_path`."""

    def __init__(
        self,
        cidr: str,
        state_path: str | os.PathLike[str] | None = None,
        *,
        reserved: Iterable[str] = (),
    ) -> None:
        try:
            self.network = ipaddress.IPv4Network(cidr, strict=True)
        except ValueError as e:
            raise IPAMError(f"invalid pod CIDR {cidr!r}: {e}") from e
        # /31 and /32 have no room for a gateway plus a pod.
        if self.network.prefixlen > 30:
            raise IPAMError(f"pod CIDR {cidr} is too small: need at least a /30")
        self.gateway = self.network.network_address + 1
        self._first = int(self.network.network_address) + 1
        self._last = int(self.network.broadcast_address) - 1
        self._reserved = {self.gateway}
        for r in reserved:
            self._reserved.add(ipaddress.IPv4Address(r))
        self.state_path = Path(state_path) if state_path is not None else None
        self._lock = threading.Lock()
        self._by_owner: dict[str, ipaddress.IPv4Address] = {}
        self._owner_of: dict[ipaddress.IPv4Address, str] = {}
        # The last address handed out; next-fit starts after it.
        self._cursor = int(self.gateway)
        if self.state_path is not None:
            self._load()

    # -- queries -------------------------------------------------------------
    @property
    def prefix_length(self) -> int:
        return self.network.prefixlen

    @property
    def capacity(self) -> int:
        """How many pod addresses the pool has in all."""
        return sum(
            1
            for i in range(self._first, self._last + 1)
            if ipaddress.IPv4Address(i) not in self._reserved
        )

    def lookup(self, owner: str) -> ipaddress.IPv4Address | None:
        """The address `owner` holds, if any."""
        with self._lock:
            return self._by_owner.get(owner)

    def allocations(self) -> dict[str, ipaddress.IPv4Address]:
        """A copy of owner → address."""
        with self._lock:
            return dict(self._by_owner)

    # -- changes -------------------------------------------------------------
    def allocate(self, owner: str) -> ipaddress.IPv4Address:
        """The address of `owner`, allocating one first if it has none."""
        if not owner:
            raise ValueError("an allocation needs an owner (the pod uid)")
        with self._lock:
            held = self._by_owner.get(owner)
            if held is not None:
                return held
            ip = self._next_free()
            self._by_owner[owner] = ip
            self._owner_of[ip] = owner
            prev_cursor, self._cursor = self._cursor, int(ip)
            try:
                self._save()
            except BaseException:
                # Not on disk means not given: undo, so memory and file agree.
                del self._by_owner[owner]
                del self._owner_of[ip]
                self._cursor = prev_cursor
                raise
            return ip

    def release(self, owner: str) -> ipaddress.IPv4Address | None:
        """Free `owner`'s address; returns it, or None if it held none (idempotent)."""
        with self._lock:
            ip = self._by_owner.pop(owner, None)
            if ip is None:
                return None
            del self._owner_of[ip]
            try:
                self._save()
            except BaseException:
                self._by_owner[owner] = ip
                self._owner_of[ip] = owner
                raise
            return ip

    def retain(self, owners: Iterable[str]) -> dict[str, ipaddress.IPv4Address]:
        """Keep only the allocations of `owners`; returns the released ones.

        Used after an agent restart: the live pods keep their addresses, the rest
        (pods deleted while the agent was down) give theirs back.
        """
        keep = set(owners)
        with self._lock:
            gone = {o: ip for o, ip in self._by_owner.items() if o not in keep}
            if not gone:
                return {}
            for o, ip in gone.items():
                del self._by_owner[o]
                del self._owner_of[ip]
            try:
                self._save()
            except BaseException:
                for o, ip in gone.items():
                    self._by_owner[o] = ip
                    self._owner_of[ip] = o
                raise
            return gone

    # -- internals -----------------------------------------------------------
    def _next_free(self) -> ipaddress.IPv4Address:
        span = self._last - self._first + 1
        start = self._cursor + 1
        for k in range(span):
            i = self._first + (start - self._first + k) % span
            ip = ipaddress.IPv4Address(i)
            if ip not in self._owner_of and ip not in self._reserved:
                return ip
        raise IPAMExhausted(
            f"no free address in pod CIDR {self.network}: all {self.capacity} in use"
        )

    def _state(self) -> dict[str, object]:
        return {
            "version": STATE_VERSION,
            "cidr": str(self.network),
            "last": str(ipaddress.IPv4Address(self._cursor)),
            "allocations": {o: str(ip) for o, ip in sorted(self._by_owner.items())},
        }

    def _save(self) -> None:
        if self.state_path is None:
            return
        write_json_atomic(self.state_path, self._state())

    def _load(self) -> None:
        assert self.state_path is not None
        try:
            raw = self.state_path.read_text()
        except FileNotFoundError:
            return
        try:
            data = json.loads(raw)
            if data.get("version") != STATE_VERSION:
                raise IPAMError(f"unknown IPAM state version {data.get('version')!r}")
            cidr = ipaddress.IPv4Network(data["cidr"])
            allocations = {
                str(o): ipaddress.IPv4Address(ip) for o, ip in data["allocations"].items()
            }
            last = ipaddress.IPv4Address(data.get("last", str(self.gateway)))
        except IPAMError as e:
            raise IPAMError(f"{self.state_path}: {e}") from e
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise IPAMError(f"{self.state_path}: unreadable IPAM state: {e}") from e
        if cidr != self.network:
            # The pods on this node hold addresses of the old range; silently dropping
            # them would hand the same addresses out twice.
            raise IPAMError(
                f"{self.state_path} holds allocations for pod CIDR {cidr}, but this node's "
                f"pod CIDR is {self.network}; drain the node and remove the file to change it"
            )
        for owner, ip in allocations.items():
            if ip not in self.network or ip in self._reserved or int(ip) > self._last \
                    or int(ip) < self._first:
                raise IPAMError(f"{self.state_path}: {owner} holds unusable address {ip}")
            if ip in self._owner_of:
                raise IPAMError(
                    f"{self.state_path}: {ip} allocated to both {self._owner_of[ip]} and {owner}"
                )
            self._by_owner[owner] = ip
            self._owner_of[ip] = owner
        if last in self.network:
            self._cursor = int(last)


def write_json_atomic(path: str | os.PathLike[str], data: object) -> None:
    """Replace `path` with `data` as JSON so a reader sees the old or the new file, whole.

    The temp file is fsynced before the rename and the directory after it, so the
    change also survives a power cut once this returns.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


__all__ = ["IPAM", "IPAMError", "IPAMExhausted", "write_json_atomic"]
