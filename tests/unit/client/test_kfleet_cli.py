"""kfleet argument handling that needs no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.cli import kfleet
from fleet.cli.kfleet import base, nodes, resources


@pytest.mark.parametrize(
    ("args", "pairs"),
    [
        (["pods"], [("pods", [])]),
        (["pods", "a", "b"], [("pods", ["a", "b"])]),
        (["deploy,svc"], [("deploy", []), ("svc", [])]),
        (["pod/a", "svc/b", "pod/c"], [("pod", ["a", "c"]), ("svc", ["b"])]),
    ],
)
def test_split_type_args(args: list[str], pairs: list) -> None:
    assert resources._split_type_args(args) == (pairs, None)


@pytest.mark.parametrize("args", [[], ["pod/a", "b"], ["pod/"]])
def test_split_type_args_errors(args: list[str]) -> None:
    pairs, problem = resources._split_type_args(args)
    assert pairs == [] and problem


def test_missing_kubeconfig_is_a_clean_error(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc = kfleet.run(["get", "pods", "--kubeconfig", str(tmp_path / "none")])
    assert rc == 1
    assert capsys.readouterr().err.strip() == f"error: kubeconfig '{tmp_path / 'none'}' does not exist"


def test_leading_globals_are_merged(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_load(path: str | None, context: str | None) -> None:
        seen.update(path=path, context=context)
        raise base.KubeconfigError("stop here")

    monkeypatch.setattr(base, "load_kubeconfig", fake_load)
    assert kfleet.run(["--kubeconfig", "/k", "--context", "c1", "get", "pods"]) == 1
    assert seen == {"path": "/k", "context": "c1"}
    # an option after the command wins over the same option before it
    assert kfleet.run(["--context", "c1", "get", "pods", "--context", "c2"]) == 1
    assert seen == {"path": None, "context": "c2"}
    assert "stop here" in capsys.readouterr().err


def test_bad_manifest_fails_before_connecting(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ConfigMap\n")
    assert kfleet.run(["apply", "-f", str(bad)]) == 1
    assert "missing apiVersion or kind" in capsys.readouterr().err


def test_delete_needs_names_or_selector(capsys: pytest.CaptureFixture[str]) -> None:
    assert kfleet.run(["delete", "pods"]) == 1
    assert "no name was specified" in capsys.readouterr().err


def test_unknown_output_format_is_rejected() -> None:
    assert kfleet.run(["get", "pods", "-o", "xml"]) == 2


def test_drain_status_lines() -> None:
    doc = {"kind": "NodeDrain", "metadata": {"name": "n1"}, "phase": "Running",
           "options": {"ignoreDaemonSets": True, "force": False, "gracePeriodSeconds": 0, "timeoutSeconds": 0},
           "startTime": "2026-01-01T00:00:00Z", "completionTime": None, "evicted": ["a/p", "a/q"],
           "remaining": ["a/q"], "blockedByBudget": [], "skipped": ["a/ds"],
           "warnings": ["ignoring DaemonSet-managed Pods: a/ds"], "errors": []}
    lines = nodes._drain_lines(doc)
    assert lines[:9] == [
        "Node:              n1",
        "Phase:             Running",
        "Options:           ignoreDaemonSets, gracePeriodSeconds=0",
        "Started:           2026-01-01T00:00:00Z",
        "Completed:         <none>",
        "Evicted:           a/p, a/q",
        "Remaining:         a/q",
        "Blocked by budget: <none>",
        "Skipped:           a/ds",
    ]
    assert lines[9:] == ["Warnings:", "  ignoring DaemonSet-managed Pods: a/ds"]


def test_drain_refuses_a_bad_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    assert kfleet.run(["drain", "n1", "--timeout", "soon"]) == 1
    assert 'invalid duration "soon"' in capsys.readouterr().err
