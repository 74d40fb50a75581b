"""Controllers running inside a real `fleet server` (the controller manager)."""

from __future__ import annotations

import uuid

from tests.conftest import FleetServer
from tests.e2e.helpers import wait_until


def test_every_namespace_gets_a_default_service_account(fleet_server: FleetServer) -> None:
    ns = f"sa-{uuid.uuid4().hex[:6]}"
    with fleet_server.client() as c:
        assert c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": ns}}).status_code == 201
        path = f"/api/v1/namespaces/{ns}/serviceaccounts/default"
        wait_until(lambda: c.get(path).status_code == 200, timeout=20,
                   what="the default ServiceAccount")
        # Deleted: it comes back, as in Kubernetes.
        assert c.delete(path).status_code == 200
        wait_until(lambda: c.get(path).status_code == 200, timeout=20,
                   what="the default ServiceAccount to be re-created")
        # The built-in namespaces have one too.
        for builtin in ("default", "kube-system"):
            wait_until(lambda b=builtin: c.get(f"/api/v1/namespaces/{b}/serviceaccounts/default")
                       .status_code == 200, timeout=20, what=f"{builtin}'s default ServiceAccount")
