"""The bridge driver's pure parts: names, options, the nftables table it renders."""

from __future__ import annotations

import pytest

from fleet.network.bridge import BridgeDriver, BridgeOptions, host_veth_name, render_nat_table
from fleet.network.driver import NetworkConfig


@pytest.mark.parametrize("uid", ["a", "0f8d6c1e-4b2a-4c59-9a57-3e3f7d1c2b11", "x" * 300])
def test_host_veth_names_fit_the_kernel_limit_and_are_stable(uid: str) -> None:
    name = host_veth_name(uid)
    assert len(name) == 15 and name.startswith("veth")
    int(name[4:], 16)
    assert host_veth_name(uid) == name


def test_host_veth_names_differ_per_pod() -> None:
    names = {host_veth_name(f"pod-{i}") for i in range(5000)}
    assert len(names) == 5000


def test_nat_table_masquerades_only_traffic_leaving_the_cluster() -> None:
    body = render_nat_table("10.42.3.0/24", "10.42.0.0/16")
    assert "type nat hook postrouting priority 100; policy accept;" in body
    assert "ip saddr 10.42.3.0/24 ip daddr != 10.42.0.0/16 masquerade" in body


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"bridge": "this-name-is-too-long"}, "invalid bridge name"),
        ({"bridge": ""}, "invalid bridge name"),
        ({"colour": "blue"}, "unknown bridge driver options"),
        ({"backend": "flat"}, "unknown pod network backend"),
    ],
)
def test_bad_options_are_refused(options: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        BridgeOptions.from_mapping(options)


def test_driver_defaults_and_cidr_checks(tmp_path: object) -> None:
    d = BridgeDriver(NetworkConfig(pod_cidr="10.42.3.0/24", state_dir="/tmp/x"))
    assert (d.bridge_name, d.nft_table, str(d.gateway)) == ("fleet0", "fleet", "10.42.3.1")
    assert str(d.cluster_cidr) == "10.42.3.0/24"
    assert d.state_path.name == "ipam-fleet0.json"
    with pytest.raises(ValueError, match="not inside cluster CIDR"):
        BridgeDriver(NetworkConfig(pod_cidr="10.43.0.0/24", state_dir="/tmp/x", cluster_cidr="10.42.0.0/16"))


def test_the_driver_routes_to_peers_only_when_it_knows_its_node() -> None:
    base = NetworkConfig(pod_cidr="10.42.1.0/24", state_dir="/nonexistent-unused",
                         cluster_cidr="10.42.0.0/16")
    assert BridgeDriver(base).router is None and BridgeDriver(base).peer_annotations() == {}
    cfg = NetworkConfig(pod_cidr="10.42.1.0/24", state_dir="/nonexistent-unused",
                        cluster_cidr="10.42.0.0/16", node_name="n1", node_address="198.18.1.10",
                        options={"bridge": "fn0", "backend": "vxlan"})
    d = BridgeDriver(cfg)
    assert d.router is not None and d.router.backend == "vxlan"
    # The bridge is ours, not a network peers live on.
    assert "fn0" in d.router.exclude
    # The address makes it a peer of the others; no VTEP until a peer needs one.
    assert d.peer_annotations() == {"network.fleet.dev/public-ip": "198.18.1.10"}
    d.router.vtep_mac = "0a:00:00:00:00:01"
    assert d.peer_annotations() == {
        "network.fleet.dev/backend-data": '{"VNI":1,"VtepMAC":"0a:00:00:00:00:01"}',
        "network.fleet.dev/public-ip": "198.18.1.10"}
