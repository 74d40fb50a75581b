"""Run a kopf operator (kopf from PyPI, unchanged) as a subprocess against a test server.

`run_kopf(srv, source, tmp_path, ...)` writes the operator's Python source to a file,
starts `python -m kopf run <file> --verbose [--standalone | --peering=NAME] -n NS` with
KUBECONFIG pointing at the server's admin kubeconfig, and on exit stops it by pid
(SIGTERM, then SIGKILL after a deadline).  The operator's combined output is kept in a
log file so a failing test can show what kopf said; `KopfProcess.problems()` lists the
lines where kopf reported an API failure it hit (tracebacks, unexpected watch errors).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import FleetServer, terminate

STOP_TIMEOUT = 15.0

# What kopf logs when the API does something it did not expect: unprocessable
# watch errors, failed patches/posts, a watcher crash.  None of these may appear.
PROBLEM_MARKERS = (
    "Traceback",
    "Error in the watch-stream",
    "Ignoring an unsupported event type",
    "Patching failed",
    "Failed to post an event",
    "APIError",
    "Unprocessable",
    "is not allowed",
)


@dataclass
class KopfProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def digest(self, limit: int = 20000) -> str:
        """The log without the timers' chatter, for a failing test's output."""
        lines = [ln for ln in self.output().splitlines() if "Timer '" not in ln]
        return f"----- kopf output ({self.log_path}) -----\n" + "\n".join(lines)[-limit:]

    def problems(self) -> list[str]:
        return [ln for ln in self.output().splitlines() if any(m in ln for m in PROBLEM_MARKERS)]

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM (kopf stops its daemons and exits), then SIGKILL after `timeout`."""
        return terminate(self.proc, timeout)


def kopf_env(srv: FleetServer, kubeconfig: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["KUBECONFIG"] = str(kubeconfig or srv.kubeconfig)
    env["PYTHONUNBUFFERED"] = "1"
    # The operator file imports only kopf and the official client: keep the checkout
    # under test off its path so nothing of Fleet's leaks into the "real operator".
    env.pop("PYTHONPATH", None)
    return env


def kopf_argv(operator_file: Path, *, namespaces: Sequence[str] = (), all_namespaces: bool = False,
              standalone: bool = True, peering: str | None = None,
              priority: int | None = None) -> list[str]:
    argv = [sys.executable, "-m", "kopf", "run", str(operator_file), "--verbose"]
    if standalone:
        argv.append("--standalone")
    if peering is not None:
        argv.append(f"--peering={peering}")
    if priority is not None:
        argv.append(f"--priority={priority}")
    if all_namespaces:
        argv.append("--all-namespaces")
    for ns in namespaces:
        argv += ["-n", ns]
    return argv


@contextmanager
def run_kopf(srv: FleetServer, source: str, workdir: Path, *, name: str = "operator",
             kubeconfig: Path | None = None, **argv_kw: object) -> Iterator[KopfProcess]:
    """Start a kopf operator from `source`; stopped by pid when the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    operator_file = workdir / f"{name}.py"
    operator_file.write_text(source)
    log_path = workdir / f"{name}.log"
    argv = kopf_argv(operator_file, **argv_kw)  # type: ignore[arg-type]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=kopf_env(srv, kubeconfig), cwd=str(workdir), start_new_session=True)
    kp = KopfProcess(proc, log_path)
    try:
        yield kp
    finally:
        kp.stop()


def wait_logged(kp: KopfProcess, text: str, *, timeout: float = 30.0, count: int = 1) -> None:
    """Wait (bounded) until the operator's log contains `text` (`count` times); fail early
    if kopf exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if kp.output().count(text) >= count:
            return
        if not kp.alive():
            raise AssertionError(f"kopf exited ({kp.proc.returncode}) before logging {text!r}:\n"
                                 + kp.digest(8000))
        time.sleep(0.1)
    raise AssertionError(f"kopf did not log {text!r} within {timeout}s:\n" + kp.digest(8000))


def service_account_kubeconfig(srv: FleetServer, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig for ServiceAccount `namespace/name`: the admin one's cluster, with a
    token from the TokenRequest API (what `kubectl create token` asks for)."""
    with srv.client() as c:
        r = c.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                   json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 3600}})
    assert r.status_code == 201, (r.status_code, r.text)
    cfg = yaml.safe_load(srv.kubeconfig.read_text())
    cfg["users"] = [{"name": name, "user": {"token": r.json()["status"]["token"]}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = name
    path.write_text(yaml.safe_dump(cfg))
    return path


# -- CustomResourceDefinitions: kopf's peering kinds (as in kopf's docs/peering.yaml) and
#    the test operators' own kind (kopf's examples/crd.yaml, with a status subresource). ---

def _crd(plural: str, kind: str, *, scope: str = "Namespaced", short_names: Sequence[str] = (),
         status_subresource: bool = False, spec: bool = False) -> dict[str, Any]:
    props: dict[str, Any] = {"status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    if spec:
        props["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    version: dict[str, Any] = {"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": props}}}
    if status_subresource:
        version["subresources"] = {"status": {}}
    if spec:
        version["additionalPrinterColumns"] = [
            {"name": "Field", "type": "string", "jsonPath": ".spec.field"}]
    names: dict[str, Any] = {"kind": kind, "plural": plural, "singular": kind.lower()}
    if short_names:
        names["shortNames"] = list(short_names)
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.kopf.dev"},
            "spec": {"group": "kopf.dev", "scope": scope, "names": names, "versions": [version]}}


PEERING_CRDS = (
    _crd("clusterkopfpeerings", "ClusterKopfPeering", scope="Cluster"),
    _crd("kopfpeerings", "KopfPeering"),
)
EXAMPLE_CRD = _crd("kopfexamples", "KopfExample", short_names=("kopfexes", "kex"),
                   status_subresource=True, spec=True)
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def ensure_crds(srv: FleetServer, *crds: dict[str, Any], timeout: float = 30.0) -> None:
    """Create the CRDs (an existing one is kept) and wait until each is Established."""
    with srv.client() as c:
        for crd in crds:
            r = c.post(CRD_PATH, json=crd)
            assert r.status_code in (201, 409), (r.status_code, r.text)
        deadline = time.monotonic() + timeout
        for crd in crds:
            while True:
                r = c.get(f"{CRD_PATH}/{crd['metadata']['name']}")
                conds = {x["type"]: x["status"] for x in (r.json().get("status") or {}).get("conditions") or []}
                if conds.get("Established") == "True":
                    break
                assert time.monotonic() < deadline, f"{crd['metadata']['name']} not Established: {r.text}"
                time.sleep(0.1)
