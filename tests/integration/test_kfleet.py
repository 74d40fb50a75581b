"""kfleet against a real `fleet server` subprocess.

Each test works in its own namespace so the module can share one server.
Output is checked the way a user reads it (kubectl's wording) and the stored
objects are checked over plain HTTP, so a kfleet bug cannot hide behind
another kfleet bug.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .conftest import KfleetServer

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def namespace_doc(name: str) -> str:
    return f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n---\n"


def deployment_doc(ns: str, *, image: str = "nginx:1.25", replicas: int = 2,
                   extra_label: str | None = None) -> str:
    labels = {"app": "web"}
    if extra_label:
        labels["tier"] = extra_label
    doc = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": image}]}}},
    }
    return yaml.safe_dump(doc)


def configmap_doc(name: str, ns: str | None = None, **data: str) -> str:
    md: dict = {"name": name, "labels": {"kind": "cfg"}}
    if ns:
        md["namespace"] = ns
    return yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": md,
                           "data": data})


def stored(server: KfleetServer, path: str) -> dict | None:
    with server.http() as h:
        r = h.get(path)
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    return r.json()


def test_version_and_api_resources(kfleet_server: KfleetServer) -> None:
    rc, out, err = kfleet_server.run("version")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "Client Version: v0.1.0"
    assert lines[1].startswith("Server Version: v1.")

    rc, out, err = kfleet_server.run("api-resources")
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    by_name: dict[str, list[str]] = {}
    for r in rows[1:]:
        by_name.setdefault(r[0], r)  # metrics.k8s.io serves `nodes` and `pods` too, later
    assert by_name["pods"][1:] == ["po", "v1", "true", "Pod"]
    assert by_name["deployments"][1:] == ["deploy", "apps/v1", "true", "Deployment"]
    assert by_name["namespaces"][-2:] == ["false", "Namespace"]


def test_apply_create_configure_unchanged(kfleet_server: KfleetServer, tmp_path: Path) -> None:
    ns = "kf-apply"
    manifest = tmp_path / "app.yaml"
    manifest.write_text(namespace_doc(ns) + deployment_doc(ns) + "---\n"
                        + configmap_doc("settings", ns, a="1"))
    rc, out, err = kfleet_server.run("apply", "-f", str(manifest))
    assert rc == 0, err
    assert out.splitlines() == [f"namespace/{ns} created", "deployment.apps/web created",
                                "configmap/settings created"]
    live = stored(kfleet_server, f"/apis/apps/v1/namespaces/{ns}/deployments/web")
    assert live is not None
    remembered = json.loads(live["metadata"]["annotations"][LAST_APPLIED])
    assert remembered["spec"]["replicas"] == 2
    assert remembered["metadata"]["namespace"] == ns

    rc, out, err = kfleet_server.run("apply", "-f", str(manifest))
    assert rc == 0, err
    assert out.splitlines() == [f"namespace/{ns} unchanged", "deployment.apps/web unchanged",
                                "configmap/settings unchanged"]

    manifest.write_text(deployment_doc(ns, image="nginx:1.26", replicas=3, extra_label="fe"))
    rc, out, err = kfleet_server.run("apply", "-f", str(manifest))
    assert rc == 0, err
    assert out.strip() == "deployment.apps/web configured"
    live = stored(kfleet_server, f"/apis/apps/v1/namespaces/{ns}/deployments/web")
    assert live["spec"]["replicas"] == 3
    assert live["metadata"]["labels"] == {"app": "web", "tier": "fe"}
    assert live["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.26"

    # Dropping a field from the manifest removes it from the live object.
    manifest.write_text(deployment_doc(ns, image="nginx:1.26", replicas=3))
    rc, out, err = kfleet_server.run("apply", "-f", str(manifest))
    assert rc == 0, err
    live = stored(kfleet_server, f"/apis/apps/v1/namespaces/{ns}/deployments/web")
    assert live["metadata"]["labels"] == {"app": "web"}


def test_apply_directory_stdin_and_default_namespace(kfleet_server: KfleetServer,
                                                     tmp_path: Path) -> None:
    ns = "kf-dir"
    kfleet_server.run("apply", "-f", "-", stdin=namespace_doc(ns))
    (tmp_path / "a.yaml").write_text(configmap_doc("one", a="1"))
    (tmp_path / "b.json").write_text(json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "two"}}]}))
    (tmp_path / "skip.txt").write_text("ignored")
    rc, out, err = kfleet_server.run("apply", "-n", ns, "-f", str(tmp_path))
    assert rc == 0, err
    assert out.splitlines() == ["configmap/one created", "configmap/two created"]
    assert stored(kfleet_server, f"/api/v1/namespaces/{ns}/configmaps/two") is not None
    # global options before the command work too
    rc, out, err = kfleet_server.run("-n", ns, "apply", "-f", "-",
                                     stdin=configmap_doc("three"))
    assert (rc, out.strip()) == (0, "configmap/three created"), err
    assert stored(kfleet_server, f"/api/v1/namespaces/{ns}/configmaps/three") is not None


def test_apply_error_is_reported(kfleet_server: KfleetServer) -> None:
    bad = configmap_doc("orphan", "kf-no-such-namespace")
    rc, out, err = kfleet_server.run("apply", "-f", "-", stdin=bad)
    assert rc == 1
    assert err.startswith("Error from server (NotFound): error when creating \"STDIN\": ")
    assert "kf-no-such-namespace" in err


def test_get_tables_and_formats(kfleet_server: KfleetServer) -> None:
    ns = "kf-get"
    kfleet_server.run("apply", "-f", "-", stdin=namespace_doc(ns) + deployment_doc(ns)
                      + "---\n" + configmap_doc("c1", ns, a="1") + "---\n"
                      + configmap_doc("c2", ns))

    rc, out, err = kfleet_server.run("get", "deployments", "-n", ns)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split()[0] == "NAME" and lines[0].split()[-1] == "AGE"
    assert lines[1].split()[0] == "web"
    assert len(lines) == 2

    rc, out, err = kfleet_server.run("get", "cm", "c1", "-n", ns, "--show-labels")
    assert rc == 0, err
    header, row = out.splitlines()
    assert header.split()[0] == "NAME" and header.split()[-1] == "LABELS"
    assert row.split()[0] == "c1" and row.split()[-1] == "kind=cfg"

    rc, out, err = kfleet_server.run("get", "configmap/c2", "-n", ns, "-o", "yaml")
    assert rc == 0, err
    obj = yaml.safe_load(out)
    assert (obj["kind"], obj["metadata"]["name"]) == ("ConfigMap", "c2")

    rc, out, err = kfleet_server.run("get", "configmaps", "-n", ns, "-o", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["kind"] == "List"
    names = {i["metadata"]["name"] for i in doc["items"]}
    assert {"c1", "c2"} <= names
    assert all(i["kind"] == "ConfigMap" for i in doc["items"])

    rc, out, err = kfleet_server.run("get", "deploy,cm", "-n", ns, "-o", "name")
    assert rc == 0, err
    assert "deployment.apps/web" in out.splitlines()
    assert "configmap/c1" in out.splitlines()

    # several types: one table each, kind-prefixed names, blank line between
    rc, out, err = kfleet_server.run("get", "deployments,configmaps", "-n", ns)
    assert rc == 0, err
    blocks = out.split("\n\n")
    assert len(blocks) == 2
    assert blocks[0].splitlines()[1].split()[0] == "deployment.apps/web"
    assert blocks[1].splitlines()[1].split()[0].startswith("configmap/")

    rc, out, err = kfleet_server.run("get", "cm", "-n", ns, "-l", "kind=cfg", "--no-headers")
    assert rc == 0, err
    assert sorted(line.split()[0] for line in out.splitlines()) == ["c1", "c2"]

    rc, out, err = kfleet_server.run("get", "cm", "-n", ns, "--field-selector",
                                     "metadata.name=c2", "-o", "name")
    assert (rc, out.splitlines()) == (0, ["configmap/c2"]), err

    rc, out, err = kfleet_server.run("get", "deployments", "-A")
    assert rc == 0, err
    header = out.splitlines()[0].split()
    assert header[:2] == ["NAMESPACE", "NAME"]
    assert any(line.split()[:2] == [ns, "web"] for line in out.splitlines()[1:])

    rc, out, err = kfleet_server.run("get", "deployments", "-n", ns, "-o", "wide")
    assert rc == 0, err
    assert len(out.splitlines()[0].split()) >= len(lines[0].split())


def test_get_empty_missing_and_unknown(kfleet_server: KfleetServer) -> None:
    kfleet_server.run("apply", "-f", "-", stdin=namespace_doc("kf-empty"))
    rc, out, err = kfleet_server.run("get", "pods", "-n", "kf-empty")
    assert (rc, out) == (0, "")
    assert err.strip() == "No resources found in kf-empty namespace."

    rc, out, err = kfleet_server.run("get", "deployment", "nope", "-n", "kf-empty")
    assert rc == 1
    assert err.startswith("Error from server (NotFound): ")
    assert "nope" in err

    rc, out, err = kfleet_server.run("get", "flurbs")
    assert rc == 1
    assert err.strip() == 'error: the server doesn\'t have a resource type "flurbs"'


def test_describe(kfleet_server: KfleetServer) -> None:
    ns = "kf-describe"
    kfleet_server.run("apply", "-f", "-", stdin=namespace_doc(ns) + deployment_doc(ns))
    rc, out, err = kfleet_server.run("describe", "deployment", "web", "-n", ns)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["Name:", "web"]
    assert lines[1].split() == ["Namespace:", ns]
    assert ["Labels:", "app=web"] == lines[2].split()
    assert "Spec:" in lines
    assert any(line.split() == ["Replicas:", "2"] for line in lines)
    assert any(line.startswith("Events:") for line in lines)
    assert LAST_APPLIED not in out


def test_delete_by_name_file_and_selector(kfleet_server: KfleetServer, tmp_path: Path) -> None:
    ns = "kf-delete"
    manifest = tmp_path / "d.yaml"
    manifest.write_text(deployment_doc(ns) + "---\n" + configmap_doc("x", ns))
    kfleet_server.run("apply", "-f", "-", stdin=namespace_doc(ns))
    kfleet_server.run("apply", "-f", str(manifest))

    rc, out, err = kfleet_server.run("delete", "deployment", "web", "-n", ns)
    assert rc == 0, err
    assert out.strip() == 'deployment.apps "web" deleted'
    assert stored(kfleet_server, f"/apis/apps/v1/namespaces/{ns}/deployments/web") is None

    kfleet_server.run("apply", "-f", str(manifest))
    rc, out, err = kfleet_server.run("delete", "-f", str(manifest), "--cascade", "foreground")
    assert rc == 0, err
    assert out.splitlines() == ['deployment.apps "web" deleted', 'configmap "x" deleted']
    assert stored(kfleet_server, f"/api/v1/namespaces/{ns}/configmaps/x") is None

    kfleet_server.run("apply", "-n", ns, "-f", "-",
                      stdin=configmap_doc("l1") + "---\n" + configmap_doc("l2"))
    rc, out, err = kfleet_server.run("delete", "cm", "-l", "kind=cfg", "-n", ns)
    assert rc == 0, err
    assert sorted(out.splitlines()) == ['configmap "l1" deleted', 'configmap "l2" deleted']

    rc, out, err = kfleet_server.run("delete", "cm/gone", "-n", ns)
    assert rc == 1 and err.startswith("Error from server (NotFound): ")
    rc, out, err = kfleet_server.run("delete", "cm/gone", "-n", ns, "--ignore-not-found")
    assert rc == 0


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            ch = os.read(proc.stdout.fileno(), 1)
            if not ch:
                break
            if ch == b"\n":
                return buf.decode()
            buf += ch
    raise AssertionError(f"no line from kfleet within {timeout}s (got {buf!r})")


# The SIGINT state kfleet starts with, set in a tiny exec wrapper, so what the test
# checks does not depend on how pytest itself was started: a non-interactive shell
# runs a background job (`bash .ci/run &`, many CI runners) with SIGINT ignored,
# and every child inherits that through exec.
_SIGINT_SETUP = {
    "default": "signal.signal(signal.SIGINT, signal.SIG_DFL)",
    "ignored": "signal.signal(signal.SIGINT, signal.SIG_IGN)",
    "blocked": ("signal.signal(signal.SIGINT, signal.SIG_DFL); "
                "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})"),
}


# The console scripts that reach kfleet: `kfleet ...` and `fleet ctl ...`.
_ENTRY = {
    "kfleet": ["-c", "from fleet.cli.kfleet import main; main()"],
    "fleet ctl": ["-c", "from fleet.cli.main import main; main()", "ctl"],
}


def _start_kfleet(server: KfleetServer, *argv: str, sigint: str = "default",
                  entry: str = "kfleet") -> subprocess.Popen[bytes]:
    """kfleet's console script as a process, started with SIGINT as `sigint` says."""
    wrapper = (f"import os, signal, sys; {_SIGINT_SETUP[sigint]}; "
               "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
    return subprocess.Popen(
        [sys.executable, "-c", wrapper, *_ENTRY[entry], *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=server.env(),
        start_new_session=True,
    )


def _interrupt(proc: subprocess.Popen[bytes], timeout: float = 10) -> int | None:
    """SIGINT like a user's Ctrl-C; the exit code, or None (then killed) if it did not end."""
    os.kill(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        return None


def _stderr(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stderr is not None
    if proc.poll() is None:
        return "(still running)"
    return proc.stderr.read().decode(errors="replace")[-2000:]


def test_console_script_and_watch(kfleet_server: KfleetServer) -> None:
    ns = "kf-watch"
    kfleet_server.run("apply", "-f", "-", stdin=namespace_doc(ns) + configmap_doc("w0", ns))
    proc = _start_kfleet(kfleet_server, "get", "configmaps", "-n", ns, "-w")
    try:
        header = _read_line(proc, 20)
        assert header.split()[0] == "NAME"
        names = {_read_line(proc, 10).split()[0]}
        while "w0" not in names:
            names.add(_read_line(proc, 10).split()[0])
        rc, _, err = kfleet_server.run("apply", "-f", "-", stdin=configmap_doc("w1", ns))
        assert rc == 0, err
        row = _read_line(proc, 10).split()
        while row[0] != "w1":
            row = _read_line(proc, 10).split()
        # later watch events carry no column definitions; rows must still print whole
        assert len(row) == len(header.split())
        rc, _, err = kfleet_server.run("delete", "cm", "w1", "-n", ns)
        assert rc == 0, err
        deleted_row = _read_line(proc, 10).split()
        assert deleted_row[0] == "w1" and len(deleted_row) == len(header.split())
        assert proc.poll() is None, f"the watch ended on its own: {_stderr(proc)}"
    finally:
        rc = _interrupt(proc) if proc.poll() is None else proc.returncode
    assert rc == 130, f"kfleet get -w after Ctrl-C: exit {rc} (None: still running after 10s)"


@pytest.mark.parametrize(("entry", "sigint"), [
    ("kfleet", "ignored"), ("kfleet", "blocked"), ("fleet ctl", "ignored"),
])
def test_watch_ends_on_ctrl_c_when_the_parent_ignored_sigint(
        kfleet_server: KfleetServer, entry: str, sigint: str) -> None:
    """A parent that ignored (a non-interactive shell's background job) or blocked SIGINT
    passes that on through exec; `kfleet get -w` must still stop on Ctrl-C with 130."""
    ns = f"kf-watch-{sigint}-{entry.replace(' ', '-')}"
    kfleet_server.run("apply", "-f", "-", stdin=namespace_doc(ns) + configmap_doc("s0", ns))
    proc = _start_kfleet(kfleet_server, "get", "configmaps", "-n", ns, "-w", sigint=sigint,
                         entry=entry)
    try:
        assert _read_line(proc, 20).split()[0] == "NAME"
        while _read_line(proc, 10).split()[0] != "s0":
            pass
        assert proc.poll() is None, f"the watch ended on its own: {_stderr(proc)}"
    finally:
        rc = _interrupt(proc) if proc.poll() is None else proc.returncode
    assert rc == 130, f"kfleet get -w after Ctrl-C: exit {rc} (None: still running after 10s)"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_apply_interoperates_with_kubectl(kfleet_server: KfleetServer, tmp_path: Path) -> None:
    """kubectl and kfleet write the same last-applied annotation, byte for byte."""
    ns = "kf-kubectl"
    kfleet_server.run("apply", "-f", "-", stdin=namespace_doc(ns))
    first = tmp_path / "first.yaml"
    first.write_text(configmap_doc("by-kubectl", ns, a="1"))
    second = tmp_path / "second.yaml"
    second.write_text(deployment_doc(ns))

    def kubectl(*argv: str) -> str:
        done = subprocess.run(["kubectl", *argv], env=kfleet_server.env(), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert kubectl("apply", "-f", str(first)) == "configmap/by-kubectl created"
    rc, out, err = kfleet_server.run("apply", "-f", str(first))
    assert (rc, out.strip()) == (0, "configmap/by-kubectl unchanged"), err

    rc, out, err = kfleet_server.run("apply", "-f", str(second))
    assert (rc, out.strip()) == (0, "deployment.apps/web created"), err
    assert kubectl("apply", "-f", str(second)) == "deployment.apps/web unchanged"
