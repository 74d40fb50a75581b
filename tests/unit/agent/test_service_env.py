"""Service-link variables: the kubelet's names, values and which Services count."""

from __future__ import annotations

from typing import Any

from fleet.agent.service_env import env_for_service, service_link_env


def svc(name: str, ns: str, ip: str | None, *ports: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"ports": list(ports)}
    if ip is not None:
        spec["clusterIP"] = ip
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


def test_one_service_gives_the_kubelets_variables() -> None:
    s = svc("redis-primary", "app", "10.43.0.7", {"name": "redis", "port": 6379, "protocol": "TCP"},
            {"name": "metrics", "port": 9121, "protocol": "TCP"})
    assert env_for_service(s) == {
        "REDIS_PRIMARY_SERVICE_HOST": "10.43.0.7",
        "REDIS_PRIMARY_SERVICE_PORT": "6379",
        "REDIS_PRIMARY_SERVICE_PORT_REDIS": "6379",
        "REDIS_PRIMARY_SERVICE_PORT_METRICS": "9121",
        "REDIS_PRIMARY_PORT": "tcp://10.43.0.7:6379",
        "REDIS_PRIMARY_PORT_6379_TCP": "tcp://10.43.0.7:6379",
        "REDIS_PRIMARY_PORT_6379_TCP_PROTO": "tcp",
        "REDIS_PRIMARY_PORT_6379_TCP_PORT": "6379",
        "REDIS_PRIMARY_PORT_6379_TCP_ADDR": "10.43.0.7",
        "REDIS_PRIMARY_PORT_9121_TCP": "tcp://10.43.0.7:9121",
        "REDIS_PRIMARY_PORT_9121_TCP_PROTO": "tcp",
        "REDIS_PRIMARY_PORT_9121_TCP_PORT": "9121",
        "REDIS_PRIMARY_PORT_9121_TCP_ADDR": "10.43.0.7",
    }


def test_udp_and_ipv6_addresses() -> None:
    env = env_for_service(svc("dns", "x", "fd00::a", {"port": 53, "protocol": "UDP"}))
    assert env["DNS_PORT"] == "udp://[fd00::a]:53"
    assert env["DNS_PORT_53_UDP_PROTO"] == "udp"


def test_headless_external_name_and_portless_services_give_nothing() -> None:
    assert env_for_service(svc("h", "x", "None", {"port": 80})) == {}
    assert env_for_service(svc("e", "x", None)) == {}
    assert env_for_service(svc("p", "x", "10.43.0.9")) == {}


def test_which_services_count() -> None:
    kube = svc("kubernetes", "default", "10.43.0.1", {"name": "https", "port": 443})
    mine = svc("web", "app", "10.43.0.5", {"port": 80})
    other = svc("db", "elsewhere", "10.43.0.6", {"port": 5432})
    env = service_link_env([kube, mine, other], "app")
    assert env["KUBERNETES_SERVICE_HOST"] == "10.43.0.1"
    assert env["KUBERNETES_SERVICE_PORT_HTTPS"] == "443"
    assert env["WEB_SERVICE_HOST"] == "10.43.0.5"
    assert not any(k.startswith("DB_") for k in env)
    # enableServiceLinks: false keeps only the master service.
    env = service_link_env([kube, mine, other], "app", enable_service_links=False)
    assert "KUBERNETES_SERVICE_HOST" in env and "WEB_SERVICE_HOST" not in env


def test_a_namespace_service_named_kubernetes_wins_over_the_masters() -> None:
    kube = svc("kubernetes", "default", "10.43.0.1", {"port": 443})
    local = svc("kubernetes", "app", "10.43.0.99", {"port": 8443})
    assert service_link_env([kube, local], "app")["KUBERNETES_SERVICE_HOST"] == "10.43.0.99"
    assert service_link_env([local, kube], "app")["KUBERNETES_SERVICE_HOST"] == "10.43.0.99"
