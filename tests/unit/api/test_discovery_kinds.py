"""EndpointSlice (discovery.k8s.io/v1): validation causes and kubectl's table cells."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.api.kinds.discovery import (
    ENDPOINT_SLICE,
    format_endpoints,
    format_ports,
    validate_endpoint_slice,
)


def slice_(**kw: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "web-abc", "namespace": "default"}, "addressType": "IPv4"}
    obj.update(kw)
    return obj


def fields(causes: list[dict[str, str]]) -> list[str]:
    return [c["field"] for c in causes]


def test_a_valid_slice_has_no_causes() -> None:
    obj = slice_(endpoints=[{"addresses": ["10.42.0.5"], "conditions": {"ready": True}, "hostname": "web-0",
                             "nodeName": "n1"}],
                 ports=[{"name": "http", "port": 80, "protocol": "TCP"}])
    assert validate_endpoint_slice(obj, None) == []


@pytest.mark.parametrize("obj, field", [
    (slice_(addressType=None), "addressType"),
    (slice_(addressType="IPv5"), "addressType"),
    (slice_(endpoints=[{"addresses": []}]), "endpoints[0].addresses"),
    (slice_(endpoints=[{"addresses": ["not-an-ip"]}]), "endpoints[0].addresses[0]"),
    (slice_(endpoints=[{"addresses": ["fd00::1"]}]), "endpoints[0].addresses[0]"),
    (slice_(endpoints=[{"addresses": ["10.0.0.1"], "hostname": "Bad_Host"}]), "endpoints[0].hostname"),
    (slice_(ports=[{"name": "a", "port": 1}, {"name": "a", "port": 2}]), "ports[1].name"),
    (slice_(ports=[{"port": 70000}]), "ports[0].port"),
    (slice_(ports=[{"port": 80, "protocol": "ICMP"}]), "ports[0].protocol"),
])
def test_bad_slices_name_the_field(obj: dict[str, Any], field: str) -> None:
    assert field in fields(validate_endpoint_slice(obj, None))


def test_address_type_is_immutable() -> None:
    old = slice_()
    assert "addressType" in fields(validate_endpoint_slice(slice_(addressType="IPv6"), old))


def test_table_cells_cut_at_three() -> None:
    obj = slice_(endpoints=[{"addresses": [f"10.0.0.{i}"]} for i in range(5)],
                 ports=[{"port": 80}, {"name": "dns"}, {}])
    assert format_endpoints(obj) == "10.0.0.0,10.0.0.1,10.0.0.2 + 2 more..."
    assert format_ports(obj) == "80,dns,*"
    assert format_endpoints(slice_()) == "<unset>"
    assert format_ports(slice_()) == "<unset>"
    assert [c.name for c in ENDPOINT_SLICE.table_columns()] == ["Name", "AddressType", "Ports", "Endpoints", "Age"]
