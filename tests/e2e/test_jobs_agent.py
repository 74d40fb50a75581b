"""An Indexed Job on a real agent (runc, busybox): each pod sees its own index.

`fleet server --no-agent` (scheduler and Job controller inside) and one `fleet agent`
with the oci driver, as in test_pod_lifecycle.py.  The Job's pods echo
$JOB_COMPLETION_INDEX, which the agent resolves through the downward API from the
pod's `batch.kubernetes.io/job-completion-index` annotation; the pods' logs must
show every index exactly once.  Root-only (runc); skipped cleanly otherwise.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import FleetServer, create_namespace
from tests.e2e.helpers import wait_until
from tests.e2e.test_agent import IMAGE, get
from tests.e2e.test_pod_lifecycle import (
    Agent,
    needs_busybox,
    needs_root,
    needs_runc,
    running_cluster,
)

COMPLETIONS = 3


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[FleetServer, Agent]]:
    with running_cluster("oci", lambda: getattr(request.node, "_fleet_failed", False)) as c:
        yield c


@needs_root
@needs_runc
@needs_busybox
def test_indexed_job_pods_echo_their_index(cluster: tuple[FleetServer, Agent]) -> None:
    srv, _agent = cluster
    ns = f"jobs-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "echo"},
           "spec": {"completions": COMPLETIONS, "parallelism": COMPLETIONS, "completionMode": "Indexed",
                    "template": {"spec": {
                        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": IMAGE,
                                        "command": ["sh", "-c", "echo index=$JOB_COMPLETION_INDEX"]}]}}}}
    path = f"/apis/batch/v1/namespaces/{ns}/jobs"
    with srv.client() as c:
        r = c.post(path, json=job)
        assert r.status_code == 201, r.text
        def complete() -> dict | None:
            body = get(srv, f"{path}/echo")[1]
            conds = (body.get("status") or {}).get("conditions") or []
            return body if any(x["type"] == "Complete" and x["status"] == "True" for x in conds) else None

        done = wait_until(complete, timeout=180, what="the Indexed Job to complete")
        assert done["status"]["completedIndexes"] == f"0-{COMPLETIONS - 1}"
        pods = c.get(f"/api/v1/namespaces/{ns}/pods",
                     params={"labelSelector": "batch.kubernetes.io/job-name=echo"}).json()["items"]
        assert len(pods) == COMPLETIONS, [p["metadata"]["name"] for p in pods]
        seen = []
        for p in pods:
            name = p["metadata"]["name"]
            ix = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            assert name.startswith(f"echo-{ix}-") and p["status"]["phase"] == "Succeeded"
            log = c.get(f"/api/v1/namespaces/{ns}/pods/{name}/log")
            assert log.status_code == 200, log.text
            assert log.text.strip() == f"index={ix}", (name, log.text)
            seen.append(int(ix))
        assert sorted(seen) == list(range(COMPLETIONS))
        # Clean up: the Job (its pods go with it or are deleted here) and the namespace.
        c.delete(f"{path}/echo", params={"propagationPolicy": "Background"})
        for p in pods:
            c.delete(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}")
        wait_until(lambda: not c.get(f"/api/v1/namespaces/{ns}/pods").json()["items"], timeout=60,
                   what="the Job's pods to be gone")
        c.delete(f"/api/v1/namespaces/{ns}")
