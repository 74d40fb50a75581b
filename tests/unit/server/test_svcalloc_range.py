"""The service ranges and the order dynamic allocation tries their values in."""

from __future__ import annotations

import ipaddress
import random

import pytest

from fleet.server.svcalloc_range import PortRange, ServiceIPRange


@pytest.mark.parametrize(("cidr", "first", "last", "size"), [
    ("10.43.0.0/16", "10.43.0.1", "10.43.255.254", 65534),
    ("10.43.0.0/28", "10.43.0.1", "10.43.0.14", 14),
    ("10.96.0.5/24", "10.96.0.1", "10.96.0.254", 254),  # host bits are dropped, as kube does
    ("fd00:43::/112", "fd00:43::1", "fd00:43::fffe", 65534),
])
def test_range_bounds(cidr, first, last, size):
    r = ServiceIPRange(cidr)
    assert str(ipaddress.ip_address(r.first)) == first
    assert str(ipaddress.ip_address(r.last)) == last
    assert r.size == size
    assert r.kubernetes_ip == first
    assert r.contains(first) and r.contains(last)


@pytest.mark.parametrize(("ip", "inside"), [
    ("10.43.0.0", False),      # network address
    ("10.43.255.255", False),  # broadcast address
    ("10.43.0.1", True),
    ("10.43.200.7", True),
    ("10.44.0.1", False),
    ("fd00::1", False),        # other family
    ("not-an-ip", False),
])
def test_contains(ip, inside):
    assert ServiceIPRange("10.43.0.0/16").contains(ip) is inside


@pytest.mark.parametrize("cidr", ["10.43.0.0/31", "10.43.0.0/32", "fd00::/48", "bogus"])
def test_bad_ranges(cidr):
    with pytest.raises(ValueError):
        ServiceIPRange(cidr)


def test_candidates_cover_range_once_upper_band_first_never_kubernetes_ip():
    r = ServiceIPRange("10.43.0.0/24")  # 254 usable, lower band 16
    got = list(r.candidates(random.Random(7)))
    assert len(got) == len(set(got)) == 253  # all but .1
    assert "10.43.0.1" not in got
    upper = {f"10.43.0.{i}" for i in range(17, 255)}
    assert set(got[:len(upper)]) == upper  # the static lower band comes last
    assert set(got[len(upper):]) == {f"10.43.0.{i}" for i in range(2, 17)}


def test_candidates_start_at_random_offsets():
    r = ServiceIPRange("10.43.0.0/16")
    firsts = {next(r.candidates(random.Random(seed))) for seed in range(20)}
    assert len(firsts) > 15


def test_lower_band_of_a_16_keeps_dns_address_last():
    r = ServiceIPRange("10.43.0.0/16")
    it = r.candidates(random.Random(1))
    first_65k = [next(it) for _ in range(r.size - 256)]
    assert "10.43.0.10" not in first_65k  # the lower band (first 256) is only used when the rest is full


@pytest.mark.parametrize(("text", "base", "last"), [
    ("30000-32767", 30000, 32767), ("1000-1000", 1000, 1000), ("20000+99", 20000, 20099),
])
def test_port_range_parse(text, base, last):
    pr = PortRange.parse(text)
    assert (pr.base, pr.last, str(pr)) == (base, last, f"{base}-{last}")


@pytest.mark.parametrize("text", ["", "30000", "a-b", "32767-30000", "0-10", "65000-70000"])
def test_port_range_parse_errors(text):
    with pytest.raises(ValueError):
        PortRange.parse(text)


def test_port_candidates():
    pr = PortRange.parse("30000-30099")  # 100 ports, band 16
    got = list(pr.candidates(random.Random(3)))
    assert sorted(got) == list(range(30000, 30100))
    assert set(got[:84]) == set(range(30016, 30100))
    assert pr.out_of_range_message() == ("provided port is not in the valid range. "
                                         "The range of valid ports is 30000-30099")
