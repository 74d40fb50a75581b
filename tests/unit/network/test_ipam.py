"""IPAM: the allocation rules, the state file, and a property test of interleavings."""

from __future__ import annotations

import ipaddress
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleet.network.ipam import IPAM, IPAMError, IPAMExhausted, write_json_atomic

A = ipaddress.IPv4Address


@pytest.mark.parametrize(
    ("cidr", "gateway", "first", "capacity"),
    [
        ("10.42.3.0/24", "10.42.3.1", "10.42.3.2", 253),
        ("10.42.0.0/16", "10.42.0.1", "10.42.0.2", 65533),
        ("192.168.5.16/28", "192.168.5.17", "192.168.5.18", 13),
        ("10.0.0.0/30", "10.0.0.1", "10.0.0.2", 1),
    ],
)
def test_gateway_first_address_and_capacity(cidr: str, gateway: str, first: str, capacity: int) -> None:
    ipam = IPAM(cidr)
    assert ipam.gateway == A(gateway)
    assert ipam.allocate("p1") == A(first)
    assert ipam.capacity == capacity


@pytest.mark.parametrize(
    ("cidr", "message"),
    [
        ("10.0.0.0/31", "too small"),
        ("10.0.0.1/32", "too small"),
        ("10.0.0.1/24", "invalid pod CIDR"),  # host bits set
        ("not-a-cidr", "invalid pod CIDR"),
        ("fd00::/64", "invalid pod CIDR"),  # IPv6 pools are not supported yet
    ],
)
def test_bad_cidrs_are_refused(cidr: str, message: str) -> None:
    with pytest.raises(IPAMError, match=message):
        IPAM(cidr)


def test_allocation_is_idempotent_per_owner() -> None:
    ipam = IPAM("10.42.3.0/24")
    ip = ipam.allocate("pod-a")
    assert ipam.allocate("pod-a") == ip
    assert ipam.lookup("pod-a") == ip
    assert ipam.allocate("pod-b") != ip
    with pytest.raises(ValueError):
        ipam.allocate("")


def test_release_is_idempotent_and_reuse_is_next_fit() -> None:
    ipam = IPAM("10.42.3.0/29")  # .2 .. .6 usable
    got = [ipam.allocate(f"p{i}") for i in range(3)]
    assert got == [A("10.42.3.2"), A("10.42.3.3"), A("10.42.3.4")]
    assert ipam.release("p0") == A("10.42.3.2")
    assert ipam.release("p0") is None
    assert ipam.release("never") is None
    # The freed .2 is the last candidate: .5 and .6 come first, then the wrap-around.
    assert [ipam.allocate(o) for o in ("q1", "q2", "q3")] == [
        A("10.42.3.5"), A("10.42.3.6"), A("10.42.3.2"),
    ]


def test_exhaustion_is_a_clear_error() -> None:
    ipam = IPAM("10.42.3.0/29")
    for i in range(5):
        ipam.allocate(f"p{i}")
    with pytest.raises(IPAMExhausted, match=r"10\.42\.3\.0/29: all 5 in use"):
        ipam.allocate("one-too-many")
    # Existing owners still get theirs; a release makes room.
    assert ipam.allocate("p3") == A("10.42.3.5")
    ipam.release("p3")
    assert ipam.allocate("one-too-many") == A("10.42.3.5")


def test_reserved_addresses_are_never_handed_out() -> None:
    ipam = IPAM("10.42.3.0/29", reserved=["10.42.3.2", "10.42.3.3"])
    assert ipam.capacity == 3
    assert {ipam.allocate(f"p{i}") for i in range(3)} == {A("10.42.3.4"), A("10.42.3.5"), A("10.42.3.6")}
    with pytest.raises(IPAMExhausted):
        ipam.allocate("x")


def test_state_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ipam.json"
    ipam = IPAM("10.42.3.0/24", path)
    a, b = ipam.allocate("a"), ipam.allocate("b")
    ipam.release("a")
    again = IPAM("10.42.3.0/24", path)
    assert again.allocations() == {"b": b}
    # The next-fit cursor survives too: the restarted pool does not hand out `a` first.
    assert again.allocate("c") not in (a, b)
    doc = json.loads(path.read_text())
    assert doc["cidr"] == "10.42.3.0/24" and doc["version"] == 1
    assert set(doc["allocations"]) == {"b", "c"}
    assert [p.name for p in path.parent.iterdir()] == ["ipam.json"]  # no temp files left


def test_retain_keeps_the_live_and_releases_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "ipam.json"
    ipam = IPAM("10.42.3.0/24", path)
    ips = {o: ipam.allocate(o) for o in ("a", "b", "c")}
    released = ipam.retain(["a", "c", "unknown"])
    assert released == {"b": ips["b"]}
    assert IPAM("10.42.3.0/24", path).allocations() == {"a": ips["a"], "c": ips["c"]}
    assert ipam.retain(["a", "c"]) == {}


def test_a_state_file_for_another_cidr_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ipam.json"
    IPAM("10.42.3.0/24", path).allocate("a")
    with pytest.raises(IPAMError, match="holds allocations for pod CIDR 10.42.3.0/24.*10.42.4.0/24"):
        IPAM("10.42.4.0/24", path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "unreadable IPAM state"),
        ('{"version": 9, "cidr": "10.42.3.0/24", "allocations": {}}', "unknown IPAM state version"),
        ('{"version": 1, "cidr": "10.42.3.0/24"}', "unreadable IPAM state"),
        ('{"version": 1, "cidr": "10.42.3.0/24", "allocations": {"a": "10.42.3.1"}}',
         "unusable address 10.42.3.1"),
        ('{"version": 1, "cidr": "10.42.3.0/24", "allocations": {"a": "10.42.3.255"}}',
         "unusable address"),
        ('{"version": 1, "cidr": "10.42.3.0/24", "allocations": {"a": "10.9.9.9"}}',
         "unusable address"),
        ('{"version": 1, "cidr": "10.42.3.0/24", "allocations": {"a": "10.42.3.7", "b": "10.42.3.7"}}',
         "allocated to both"),
    ],
)
def test_damaged_state_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "ipam.json"
    path.write_text(content)
    with pytest.raises(IPAMError, match=message):
        IPAM("10.42.3.0/24", path)


def test_a_failed_write_leaves_memory_and_file_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ipam.json"
    ipam = IPAM("10.42.3.0/24", path)
    a = ipam.allocate("a")
    before = path.read_text()

    def boom(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("fleet.network.ipam.write_json_atomic", boom)
    with pytest.raises(OSError, match="disk full"):
        ipam.allocate("b")
    with pytest.raises(OSError, match="disk full"):
        ipam.release("a")
    assert ipam.allocations() == {"a": a}
    assert path.read_text() == before
    monkeypatch.undo()
    # The failed allocation did not move the cursor either.
    assert ipam.allocate("b") == A("10.42.3.3")


def test_write_json_atomic_replaces_whole(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"b": [1, 2]})
    assert json.loads(path.read_text()) == {"b": [1, 2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


# -- property: any interleaving of allocate / release / restart --------------------

OWNERS = st.sampled_from([f"pod-{i}" for i in range(20)])
CIDR = "10.42.3.16/28"  # 14 hosts: the gateway + 13 pods, so exhaustion is reachable


class IPAMMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-ipam-"))
        self.path = self.dir / "ipam.json"
        self.ipam = IPAM(CIDR, self.path)
        self.model: dict[str, ipaddress.IPv4Address] = {}
        self.net = ipaddress.IPv4Network(CIDR)

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(owner=OWNERS)
    def allocate(self, owner: str) -> None:
        if owner in self.model:
            assert self.ipam.allocate(owner) == self.model[owner]
        elif len(self.model) == self.ipam.capacity:
            with pytest.raises(IPAMExhausted):
                self.ipam.allocate(owner)
        else:
            self.model[owner] = self.ipam.allocate(owner)

    @rule(owner=OWNERS)
    def release(self, owner: str) -> None:
        assert self.ipam.release(owner) == self.model.pop(owner, None)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def retain_some(self, data: st.DataObject) -> None:
        keep = data.draw(st.sets(st.sampled_from(sorted(self.model))))
        released = self.ipam.retain(keep)
        assert released == {o: ip for o, ip in self.model.items() if o not in keep}
        self.model = {o: ip for o, ip in self.model.items() if o in keep}

    @rule()
    def restart(self) -> None:
        self.ipam = IPAM(CIDR, self.path)

    @invariant()
    def live_addresses_are_distinct_and_usable(self) -> None:
        allocs = self.ipam.allocations()
        assert allocs == self.model
        ips = list(allocs.values())
        assert len(set(ips)) == len(ips)
        forbidden = {self.net.network_address, self.net.network_address + 1, self.net.broadcast_address}
        for ip in ips:
            assert ip in self.net and ip not in forbidden


IPAMMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestIPAMInterleavings = IPAMMachine.TestCase
