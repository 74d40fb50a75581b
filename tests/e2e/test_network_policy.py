"""NetworkPolicy across two real nodes (tests/e2e/multinode.py): each agent programs the
rules of its pods inside their network namespaces (fleet.agent.netpolicy), servers on one
machine, clients on the other, as a user meets it:

* a default-deny ingress policy blocks; an allow rule by namespace label admits the
  labelled namespace's pods only; a rule by pod label follows a peer's relabelling
  within seconds; a named port admits that port and no other;
* egress limited to an ipBlock (with an `except`); cluster DNS (10.43.0.10, the server's
  resolver through the Service rules) blocked under egress isolation and admitted by the
  usual "UDP/TCP 53 to k8s-app=kube-dns in kube-system" rule;
* strict mode (`--network-policy-strict` on both agents): a pod whose rules `nft`
  refuses gets no traffic at all — not even what the policy allows — and a
  `NetworkPolicyFailed` Event says why; once the rules can be programmed, traffic flows,
  and still does, with the same verdicts, after the node's agent restarts.
  The refusal is controlled: the agents run with an `nft` wrapper first on PATH that
  rejects any ruleset naming port 31337 (and passes everything else to the real nft).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port
from tests.e2e.helpers import wait_until
from tests.e2e.multinode import MultiNodeCluster, multinode_cluster, problem

pytestmark = [pytest.mark.e2e]

POISON_PORT = 31337
SERVE = ("mkdir -p /www; echo ok > /www/index.html; httpd -p 8080 -h /www; "
         "httpd -p 9090 -h /www; trap 'exit 0' TERM; while true; do sleep 1; done")
SLEEP = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]

NFT_WRAPPER = """#!/bin/sh
# Test double (tests/e2e/test_network_policy.py): refuse any ruleset naming port {port},
# pass everything else to the real nft.
if [ "$1" = "-f" ] && [ "$2" = "-" ]; then
    script=$(cat)
    case "$script" in
        *{port}*) echo "Error: refused by the test's nft wrapper (port {port})" >&2; exit 1 ;;
    esac
    printf '%s\\n' "$script" | exec {real} "$@"
fi
exec {real} "$@"
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[MultiNodeCluster]:
    """Two strict-mode agents with the nft wrapper, and a server answering cluster DNS."""
    why = problem()
    if why:
        pytest.skip(f"multi-node cluster: {why}")
    real = shutil.which("nft")
    if real is None:
        pytest.skip("nft is not installed")
    with tempfile.TemporaryDirectory(prefix="fleet-np-") as base, pytest.MonkeyPatch.context() as mp:
        bin_dir = Path(base) / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "nft"
        wrapper.write_text(NFT_WRAPPER.format(port=POISON_PORT, real=real))
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        # The agents inherit this PATH (tests/conftest.py `_server_env`).
        mp.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        with multinode_cluster(Path(base) / "c", nodes=2, agent_args=["--network-policy-strict"],
                               server_args=["--cluster-dns-bind", f"0.0.0.0:{free_port()}",
                                            "--cluster-dns-allow",
                                            "127.0.0.0/8,10.0.0.0/8,198.18.0.0/15"]) as c:
            yield c


def policy(cluster: MultiNodeCluster, ns: str, name: str, spec: dict[str, Any]) -> None:
    cluster.post(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
         {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": {"name": name}, "spec": spec})


def delete_policy(cluster: MultiNodeCluster, ns: str, name: str) -> None:
    with cluster.client() as c:
        r = c.delete(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}")
    assert r.status_code == 200, r.text


def http_server(cluster: MultiNodeCluster, ns: str, name: str, labels: dict[str, str]) -> None:
    """busybox httpd on 8080 ("http") and 9090 ("admin"), on the second machine."""
    manifest = cluster.pod(name, cluster.nodes[1], ["sh", "-c", SERVE], grace=1)
    manifest["metadata"]["labels"] = labels
    manifest["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8080},
                                                  {"name": "admin", "containerPort": 9090}]
    cluster.create_pod(ns, manifest)


def client(cluster: MultiNodeCluster, ns: str, name: str, labels: dict[str, str] | None = None) -> None:
    """A pod that only sleeps, on the first machine."""
    manifest = cluster.pod(name, cluster.nodes[0], SLEEP, grace=1)
    manifest["metadata"]["labels"] = labels or {}
    cluster.create_pod(ns, manifest)


def reaches(cluster: MultiNodeCluster, ns: str, pod: str, ip: str, port: int) -> bool:
    """One HTTP GET from inside `pod` (2 s to connect and answer; busybox wget's own -T
    crashes this busybox build, hence `timeout`)."""
    rc, out, err = cluster.kubectl("-n", ns, "exec", pod, "--", "sh", "-c",
                                   f"timeout 2 wget -q -O - http://{ip}:{port}/ >/dev/null 2>&1 "
                                   "&& echo PASS || echo DROP")
    assert rc == 0, (rc, out, err)
    return out.strip() == "PASS"


def expect(cluster: MultiNodeCluster, ns: str, pod: str, ip: str, port: int, allowed: bool,
           timeout: float = 15.0) -> float:
    """Wait until `pod` → ip:port is `allowed` (or not); seconds it took."""
    t0 = time.monotonic()
    try:
        wait_until(lambda: reaches(cluster, ns, pod, ip, port) == allowed, timeout=timeout,
                   interval=0.3, what=f"{pod} -> {ip}:{port} {'allowed' if allowed else 'blocked'}")
    except AssertionError as e:
        logs = "\n".join(line for n in cluster.nodes for line in n.output(200_000).splitlines()
                         if "policy" in line or "ERROR" in line or "sandbox" in line)
        raise AssertionError(f"{e}\nagents' policy log lines:\n{logs[-6000:]}") from None
    return time.monotonic() - t0


def ready_ip(cluster: MultiNodeCluster, ns: str, name: str) -> str:
    return cluster.wait_pod_ready(ns, name)["status"]["podIP"]


def test_ingress_default_deny_namespace_label_pod_label_and_named_port(cluster: MultiNodeCluster) -> None:
    ns = cluster.create_namespace()
    friends = cluster.create_namespace()
    cluster.merge_patch(f"/api/v1/namespaces/{friends}", {"metadata": {"labels": {"team": "friends"}}})
    http_server(cluster, ns, "web", {"app": "web"})
    client(cluster, ns, "local")
    client(cluster, friends, "friend")
    web = ready_ip(cluster, ns, "web")
    for where, pod in ((ns, "local"), (friends, "friend")):
        cluster.wait_pod_ready(where, pod)
        assert expect(cluster, where, pod, web, 8080, True) < 15  # no policy: default allow

    # Default-deny ingress for the server: nobody gets in.
    policy(cluster, ns, "deny", {"podSelector": {}, "policyTypes": ["Ingress"]})
    expect(cluster, ns, "local", web, 8080, False)
    assert not reaches(cluster, friends, "friend", web, 8080)

    # Allow by namespace label: the friends' pod is admitted, the local one still not.
    policy(cluster, ns, "friends", {
        "podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "friends"}}}]}]})
    expect(cluster, friends, "friend", web, 8080, True)
    assert not reaches(cluster, ns, "local", web, 8080)

    # Allow by pod label, on the named port "http" only: relabelling the peer flips the
    # verdict within seconds, and the other port stays closed.
    policy(cluster, ns, "trusted", {
        "podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "trusted"}}}],
                     "ports": [{"port": "http"}]}]})
    assert not reaches(cluster, ns, "local", web, 8080)
    cluster.merge_patch(f"/api/v1/namespaces/{ns}/pods/local", {"metadata": {"labels": {"role": "trusted"}}})
    took = expect(cluster, ns, "local", web, 8080, True)
    assert took < 10, took
    assert not reaches(cluster, ns, "local", web, 9090)  # "admin" is not named by the rule
    assert reaches(cluster, friends, "friend", web, 9090)  # the namespace rule has no ports
    cluster.merge_patch(f"/api/v1/namespaces/{ns}/pods/local", {"metadata": {"labels": {"role": None}}})
    took = expect(cluster, ns, "local", web, 8080, False)
    assert took < 10, took


def _resolves(cluster: MultiNodeCluster, ns: str, pod: str) -> bool:
    rc, out, err = cluster.kubectl("-n", ns, "exec", pod, "--", "sh", "-c",
                                   "timeout 3 nslookup kubernetes.default.svc.cluster.local "
                                   "2>&1; true")
    # The answer's address line (the "Server:" lines name 10.43.0.10 either way).
    return re.search(r"^Address:\s*10\.43\.0\.1\s*$", out, re.M) is not None


def test_egress_ip_block_and_cluster_dns(cluster: MultiNodeCluster) -> None:
    ns = cluster.create_namespace()
    http_server(cluster, ns, "allowed", {"app": "srv"})
    http_server(cluster, ns, "other", {"app": "srv"})
    client(cluster, ns, "out", {"app": "out"})
    allowed, other = ready_ip(cluster, ns, "allowed"), ready_ip(cluster, ns, "other")
    cluster.wait_pod_ready(ns, "out")
    expect(cluster, ns, "out", other, 8080, True)
    wait_until(lambda: _resolves(cluster, ns, "out"), timeout=30, interval=0.5,
               what="cluster DNS before any policy")

    # Egress only to the pod range minus the other server.
    policy(cluster, ns, "egress", {
        "podSelector": {"matchLabels": {"app": "out"}}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "10.42.0.0/16", "except": [f"{other}/32"]}}],
                    "ports": [{"protocol": "TCP", "port": 8080}]}]})
    expect(cluster, ns, "out", other, 8080, False)
    assert reaches(cluster, ns, "out", allowed, 8080)
    assert not reaches(cluster, ns, "out", allowed, 9090)  # the rule names 8080 only
    # DNS through the ClusterIP is egress too: blocked until a rule admits kube-dns.
    wait_until(lambda: not _resolves(cluster, ns, "out"), timeout=15, interval=0.5,
               what="cluster DNS blocked")
    policy(cluster, ns, "dns", {
        "podSelector": {}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"namespaceSelector": {"matchLabels": {
                               "kubernetes.io/metadata.name": "kube-system"}},
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]})
    wait_until(lambda: _resolves(cluster, ns, "out"), timeout=15, interval=0.5,
               what="cluster DNS admitted by the kube-dns rule")
    assert not reaches(cluster, ns, "out", other, 8080)


def _events(cluster: MultiNodeCluster, ns: str, pod: str) -> list[dict[str, Any]]:
    code, body = cluster.get(f"/api/v1/namespaces/{ns}/events")
    assert code == 200, body
    return [e for e in body["items"] if (e.get("involvedObject") or {}).get("name") == pod]


def test_strict_mode_fences_a_pod_whose_rules_cannot_be_programmed(cluster: MultiNodeCluster) -> None:
    ns = cluster.create_namespace()
    http_server(cluster, ns, "fenced", {"app": "fenced"})
    client(cluster, ns, "peer")
    ip = ready_ip(cluster, ns, "fenced")
    cluster.wait_pod_ready(ns, "peer")
    expect(cluster, ns, "peer", ip, 8080, True)

    # A policy that allows 8080 — and 31337, which the nft wrapper refuses: the agent
    # cannot program it, and in strict mode the pod gets nothing, 8080 included.
    policy(cluster, ns, "poisoned", {
        "podSelector": {"matchLabels": {"app": "fenced"}},
        "ingress": [{"ports": [{"port": 8080}, {"port": POISON_PORT}]}]})
    expect(cluster, ns, "peer", ip, 8080, False)
    event = wait_until(lambda: next((e for e in _events(cluster, ns, "fenced")
                                     if e.get("reason") == "NetworkPolicyFailed"), None),
                       timeout=15, what="a NetworkPolicyFailed event")
    assert event["type"] == "Warning"
    assert "strict mode" in event["message"] and "no traffic" in event["message"], event
    assert "refused by the test's nft wrapper" in event["message"], event

    # Rules that can be programmed: the same policy without the poisoned port.
    delete_policy(cluster, ns, "poisoned")
    policy(cluster, ns, "fine", {"podSelector": {"matchLabels": {"app": "fenced"}},
                                 "ingress": [{"ports": [{"port": 8080}]}]})
    expect(cluster, ns, "peer", ip, 8080, True)
    assert not reaches(cluster, ns, "peer", ip, 9090)

    # An agent restart re-adopts the pod and the fresh agent keeps the same verdicts.
    # (That strict mode does not fence an adopted pod again is shown by the unit test
    # test_an_adopted_pod_keeps_its_table_on_agent_restart.)
    cluster.restart_node(1)
    assert reaches(cluster, ns, "peer", ip, 8080)
    assert not reaches(cluster, ns, "peer", ip, 9090)
