"""Pod Security admission end to end: a real `fleet server`, real kubectl.

* `pod-security.kubernetes.io/enforce=restricted` on a namespace: a privileged pod is
  refused (403) and kubectl's error names every violated field;
* `warn=restricted`: the pod is admitted and kubectl prints `Warning: would violate
  PodSecurity "restricted:latest": ...`;
* `--pod-security-config`: the defaults apply to namespaces without labels, exempt
  namespaces are let through, and the audit event carries the violations;
* a bad label value is refused with Kubernetes' message.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServerFactory

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")

PRIVILEGED_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  containers:
  - name: c
    image: busybox
    securityContext:
      privileged: true
"""

RESTRICTED_VIOLATIONS = [
    'host namespaces (hostNetwork=true)',
    'privileged (container "c" must not set securityContext.privileged=true)',
    'allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false)',
    'unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"])',
    'runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true)',
    'seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or '
    '"Localhost")',
]


def test_enforce_refuses_and_warn_admits_with_kubectl(fleet_server_factory: ServerFactory) -> None:
    srv = fleet_server_factory.start()
    assert srv.kubectl("create", "namespace", "psa-enforce")[0] == 0
    rc, out, err = srv.kubectl("label", "ns", "psa-enforce", "pod-security.kubernetes.io/enforce=restricted")
    assert rc == 0, err
    rc, out, err = srv.kubectl("apply", "-n", "psa-enforce", "-f", "-", input=PRIVILEGED_POD.format(name="bad"))
    assert rc != 0, out
    assert 'pods "bad" is forbidden: violates PodSecurity "restricted:latest": ' + ", ".join(
        RESTRICTED_VIOLATIONS) in err, err
    rc, out, err = srv.kubectl("get", "pod", "bad", "-n", "psa-enforce")
    assert rc != 0 and "NotFound" in err

    assert srv.kubectl("create", "namespace", "psa-warn")[0] == 0
    assert srv.kubectl("label", "ns", "psa-warn", "pod-security.kubernetes.io/warn=restricted")[0] == 0
    rc, out, err = srv.kubectl("apply", "-n", "psa-warn", "-f", "-", input=PRIVILEGED_POD.format(name="loud"))
    assert rc == 0, err
    assert 'Warning: would violate PodSecurity "restricted:latest": ' + ", ".join(RESTRICTED_VIOLATIONS) in err, err
    assert srv.kubectl("get", "pod", "loud", "-n", "psa-warn")[0] == 0

    # Raising enforce on a namespace with a violating pod: kubectl prints which pods.
    rc, out, err = srv.kubectl("label", "ns", "psa-warn", "pod-security.kubernetes.io/enforce=baseline")
    assert rc == 0, err
    assert ('Warning: existing pods in namespace "psa-warn" violate the new PodSecurity enforce level '
            '"baseline:latest"') in err, err
    assert "Warning: loud: host namespaces, privileged\n" in err, err

    # A bad label value: refused with Kubernetes' message.
    rc, out, err = srv.kubectl("label", "ns", "psa-enforce", "--overwrite", "pod-security.kubernetes.io/enforce=strict")
    assert rc != 0
    assert ('metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "strict": must be one of '
            'privileged, baseline, restricted') in err, err

    # A Deployment is admitted with a warning (templates are never enforced).
    rc, out, err = srv.kubectl("create", "deployment", "web", "-n", "psa-warn", "--image", "busybox")
    assert rc == 0, err
    assert 'Warning: would violate PodSecurity "restricted:latest"' in err, err


CONFIG = """
apiVersion: pod-security.admission.config.k8s.io/v1
kind: PodSecurityConfiguration
defaults:
  enforce: baseline
  audit: restricted
  audit-version: v1.30
exemptions:
  namespaces: [psa-exempt]
"""


def _events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def test_config_defaults_exemptions_and_audit(fleet_server_factory: ServerFactory, tmp_path: Path) -> None:
    cfg = tmp_path / "psa.yaml"
    cfg.write_text(CONFIG)
    log = tmp_path / "audit.log"
    srv = fleet_server_factory.start(extra_args=["--pod-security-config", str(cfg), "--audit-log-path", str(log)])
    for ns in ("psa-default", "psa-exempt"):
        assert srv.kubectl("create", "namespace", ns)[0] == 0
    rc, out, err = srv.kubectl("apply", "-n", "psa-default", "-f", "-", input=PRIVILEGED_POD.format(name="bad"))
    assert rc != 0 and 'violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)' in err, err
    rc, out, err = srv.kubectl("apply", "-n", "psa-exempt", "-f", "-", input=PRIVILEGED_POD.format(name="ok"))
    assert rc == 0, err
    # A baseline-compliant pod in the defaulted namespace is admitted; its audit event
    # carries the restricted violations.
    rc, out, err = srv.kubectl("run", "plain", "-n", "psa-default", "--image", "busybox", "--restart", "Never")
    assert rc == 0, err
    deadline = time.monotonic() + 10
    while True:
        creates = [e for e in _events(log) if e.get("verb") == "create" and e.get("stage") == "ResponseComplete"
                   and (e.get("objectRef") or {}).get("resource") == "pods"]
        by_ns = {(e["objectRef"].get("namespace"), e["responseStatus"]["code"]): e for e in creates}
        if ("psa-default", 201) in by_ns and ("psa-exempt", 201) in by_ns or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    ann = by_ns[("psa-default", 201)].get("annotations", {})
    assert ann["pod-security.kubernetes.io/enforce-policy"] == "baseline:latest"
    assert ann["pod-security.kubernetes.io/audit-violations"].startswith(
        'would violate PodSecurity "restricted:v1.30": allowPrivilegeEscalation != false'), ann
    assert by_ns[("psa-exempt", 201)]["annotations"]["pod-security.kubernetes.io/exempt"] == "namespace"


def test_bad_config_stops_the_server(fleet_server_factory: ServerFactory, tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "psa.yaml"
    cfg.write_text(CONFIG.replace("enforce: baseline", "enforce: strict"))
    p = subprocess.run([sys.executable, "-m", "fleet.cli.main", "server", "--pod-security-config", str(cfg),
                        "--data-dir", str(tmp_path / "data"), "--no-agent"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0
    assert "--pod-security-config" in p.stderr and "must be one of privileged, baseline, restricted" in p.stderr
