"""exec and signal as an audited SSH replacement, end to end: `fleet server --hardened`
(the ProcessControl consent gate on, an audit log) with its built-in agent running a
runc pod whose shell traps SIGHUP and writes a file.

Checked with real kubectl and kfleet, as user `pc-alice` (impersonated by the admin,
so RBAC decides for her exactly as for a real user):
- without the RBAC verb `signal` on pods/signal, a signal is refused by RBAC;
- with RBAC but no ProcessControl: exec and signal → 403 naming the missing consent;
- with a ProcessControl: `kubectl exec` works, `kfleet signal ... SIGHUP` reaches the
  container's shell (its trap writes the file the test reads back through exec), a
  signal the object does not list is refused, and the audit log has the events saying
  who ran what in which container.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import busybox_problem
from tests.conftest import (
    KUBECTL,
    REPO_ROOT,
    FleetServer,
    ServerFactory,
    _make_base,
    _server_env,
    free_port,
    run_kubectl,
)
from tests.e2e.helpers import wait_until
from tests.e2e.leaks import finish, wait_clean

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the built-in agent runs runc)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
    pytest.mark.skipif(KUBECTL is None, reason="needs kubectl"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables"),
]

BRIDGE = "fpc-br0"
CLUSTER_CIDR = "10.193.0.0/16"
NS = "fpc-shop"
USER = "pc-alice"
POD = "fpc-web"

MANIFEST = f"""
apiVersion: v1
kind: Pod
metadata: {{name: {POD}, namespace: {NS}, labels: {{app: web}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: docker.io/library/busybox:fleet
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'echo got-hup >> /tmp/hup' HUP; echo ready > /tmp/ready;
              while true; do sleep 0.2; done"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: exec-only, namespace: {NS}}}
rules:
- {{apiGroups: [""], resources: [pods], verbs: [get, list]}}
- {{apiGroups: [""], resources: [pods/exec], verbs: [create]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: exec-only, namespace: {NS}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: exec-only}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {USER}}}]
"""

SIGNAL_ROLE = f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: signaller, namespace: {NS}}}
rules:
- {{apiGroups: [""], resources: [pods/signal], verbs: [signal]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: signaller, namespace: {NS}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: signaller}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {USER}}}]
"""

CONSENT = f"""
apiVersion: fleet.dev/v1
kind: ProcessControl
metadata: {{name: oncall, namespace: {NS}}}
spec:
  subjects: [{{kind: User, name: {USER}}}]
  actions: [exec, signal]
  signals: [SIGHUP]
  podSelector: {{matchLabels: {{app: web}}}}
  containers: [web]
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[FleetServer]:
    base = _make_base("fleet-e2e-pc-")
    factory = ServerFactory(base)
    srv = factory.start(extra_args=[
        "--agent-port", str(free_port()), "--agent-network", "bridge", "--agent-bridge", BRIDGE,
        "--cluster-cidr", CLUSTER_CIDR, "--hardened", "--audit-log-path", str(base / "audit.log")])
    leaked: list[str] = []
    try:
        image = base / "busybox-fleet.tar"
        env = _server_env()
        subprocess.run([sys.executable, str(REPO_ROOT / "packaging" / "build_example_image.py"),
                        str(image)], check=True, capture_output=True, env=env, timeout=120)
        subprocess.run([sys.executable, "-m", "fleet.cli.kfleet", "--kubeconfig", str(srv.kubeconfig),
                        "image", "import", str(image)], check=True, capture_output=True, env=env,
                       timeout=120)
        assert run_kubectl(srv, "create", "namespace", NS)[0] == 0
        (base / "pod.yaml").write_text(MANIFEST)
        rc, out, err = run_kubectl(srv, "apply", "-f", str(base / "pod.yaml"))
        assert rc == 0, (out, err)
        rc, out, err = run_kubectl(srv, "wait", "-n", NS, f"pod/{POD}", "--for=condition=Ready",
                                   "--timeout=120s", timeout=150)
        assert rc == 0, (out, err)
        srv.audit_path = base / "audit.log"  # type: ignore[attr-defined]
        srv.base = base  # type: ignore[attr-defined]
        yield srv
    finally:
        try:
            run_kubectl(srv, "delete", "namespace", NS, "--timeout=120s", timeout=150)
            leaked = wait_clean(srv.data_dir / "agent", timeout=40)
        finally:
            factory.stop_all()
            finish(srv.data_dir / "agent", leaked, srv.output())
            shutil.rmtree(base, ignore_errors=True)


def kfleet_signal(srv: FleetServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleet.cli.kfleet", "--kubeconfig", str(srv.kubeconfig),
                           "-n", NS, "signal", *args], capture_output=True, text=True,
                          env=_server_env(), timeout=60)


def raw_signal(srv: FleetServer, body: dict[str, str], *, as_user: str = USER) -> tuple[int, str, str]:
    path = Path(srv.base) / "signal.json"  # type: ignore[attr-defined]
    path.write_text(json.dumps(body))
    return run_kubectl(srv, "create", "--raw", f"/api/v1/namespaces/{NS}/pods/{POD}/signal",
                       "-f", str(path), f"--as={as_user}")


def exec_as(srv: FleetServer, *cmd: str, as_user: str = USER) -> tuple[int, str, str]:
    return run_kubectl(srv, "exec", "-n", NS, POD, "-c", "web", f"--as={as_user}", "--", *cmd)


def audit_events(srv: FleetServer) -> list[dict]:  # type: ignore[type-arg]
    lines = Path(srv.audit_path).read_text().splitlines()  # type: ignore[attr-defined]
    return [json.loads(line) for line in lines if line.strip()]


def test_consent_rbac_signal_and_audit(cluster: FleetServer) -> None:
    srv = cluster
    # Gate 1, RBAC: pc-alice may exec but has no `signal` verb (create does not imply it).
    rc, out, err = raw_signal(srv, {"container": "web", "signal": "SIGHUP"})
    assert rc != 0 and 'cannot signal resource "pods/signal"' in err, (out, err)

    # Gate 2, consent: RBAC allows exec, but no ProcessControl exists in the namespace.
    rc, out, err = exec_as(srv, "cat", "/tmp/ready")
    assert rc != 0
    assert (f'pods "{POD}" is forbidden: no ProcessControl in namespace "{NS}" allows user "{USER}" '
            f'to exec in container "web"') in err, err
    base = Path(srv.base)  # type: ignore[attr-defined]
    (base / "signal-role.yaml").write_text(SIGNAL_ROLE)
    assert run_kubectl(srv, "apply", "-f", str(base / "signal-role.yaml"))[0] == 0
    rc, out, err = raw_signal(srv, {"container": "web", "signal": "SIGHUP"})
    assert rc != 0 and "no ProcessControl" in err and "to send SIGHUP to container" in err, err

    # With consent: exec works, and the admin's kfleet signal delivers SIGHUP.
    (base / "consent.yaml").write_text(CONSENT)
    rc, out, err = run_kubectl(srv, "apply", "-f", str(base / "consent.yaml"))
    assert rc == 0, (out, err)
    rc, out, err = run_kubectl(srv, "get", "pctl", "-n", NS)
    assert rc == 0 and "oncall" in out and "User/pc-alice" in out, (out, err)
    rc, out, err = exec_as(srv, "cat", "/tmp/ready")
    assert rc == 0 and out.strip() == "ready", (out, err)
    # The admin (system:masters) needs consent too: the object names only pc-alice.
    r = kfleet_signal(srv, POD, "SIGHUP")
    assert r.returncode != 0 and "no ProcessControl" in r.stderr, (r.stdout, r.stderr)
    # pc-alice's signal through the raw API, and an unlisted one refused.
    rc, out, err = raw_signal(srv, {"container": "web", "signal": "SIGHUP"})
    assert rc == 0, (out, err)
    wait_until(lambda: exec_as(srv, "cat", "/tmp/hup")[1].strip() == "got-hup", timeout=20,
               what="the container's HUP trap to write its file")
    rc, out, err = raw_signal(srv, {"container": "web", "signal": "SIGTERM"})
    assert rc != 0 and "to send SIGTERM" in err, err
    rc, out, err = raw_signal(srv, {"container": "web", "signal": "SIGNOPE"})
    assert rc != 0 and "unknown signal" in err, err
    rc, out, err = raw_signal(srv, {"container": "nope", "signal": "SIGHUP"})
    assert rc != 0 and "container nope is not valid for pod" in err, err

    # The audit log: who ran what in which container, and who was refused.
    def exec_events() -> list[dict]:  # type: ignore[type-arg]
        return [e for e in audit_events(srv) if (e.get("objectRef") or {}).get("subresource") == "exec"
                and e.get("stage") == "ResponseComplete"]

    events = wait_until(exec_events, timeout=10, what="exec audit events")
    ok = [e for e in events if e["responseStatus"]["code"] == 101]
    refused = [e for e in events if e["responseStatus"]["code"] == 403]
    assert ok and refused, events
    ann = ok[-1]["annotations"]
    assert ok[-1]["impersonatedUser"]["username"] == USER
    assert ann["processcontrol.fleet.dev/container"] == "web"
    assert json.loads(ann["processcontrol.fleet.dev/command"]) == ["cat", "/tmp/hup"]
    assert ann["processcontrol.fleet.dev/consent"] == "oncall"
    assert refused[0]["annotations"]["processcontrol.fleet.dev/consent"] == "none"
    signals = [e for e in audit_events(srv) if (e.get("objectRef") or {}).get("subresource") == "signal"
               and e.get("stage") == "ResponseComplete" and e["responseStatus"]["code"] == 200]
    assert signals and signals[0]["verb"] == "signal", signals
    assert signals[0]["annotations"]["processcontrol.fleet.dev/signal"] == "SIGHUP"
    assert signals[0]["objectRef"]["name"] == POD


def test_kfleet_signal_delivers_sighup(cluster: FleetServer) -> None:
    srv = cluster
    base = Path(srv.base)  # type: ignore[attr-defined]
    # Consent for the admin as well (system:masters is a group like any other).
    (base / "admin-consent.yaml").write_text(CONSENT.replace("name: oncall", "name: admins").replace(
        f"subjects: [{{kind: User, name: {USER}}}]", "subjects: [{kind: Group, name: 'system:masters'}]"))
    rc, out, err = run_kubectl(srv, "apply", "-f", str(base / "admin-consent.yaml"))
    assert rc == 0, (out, err)
    before = run_kubectl(srv, "exec", "-n", NS, POD, "--", "sh", "-c", "cat /tmp/hup 2>/dev/null | wc -l")[1]
    r = kfleet_signal(srv, POD, "-c", "web", "SIGHUP")
    assert r.returncode == 0 and "signalled (SIGHUP, container web)" in r.stdout, (r.stdout, r.stderr)
    wait_until(lambda: run_kubectl(srv, "exec", "-n", NS, POD, "--", "sh", "-c",
                                   "cat /tmp/hup | wc -l")[1].strip() == str(int(before.strip() or 0) + 1),
               timeout=20, what="one more line from the HUP trap")
