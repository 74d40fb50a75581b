"""kubectl-style table, name and describe output."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fleet.cli import printing
from fleet.cli.printing import TableOptions, format_table


def pod_table() -> dict[str, Any]:
    def row(ns: str, name: str, ready: str, node: str | None, labels: dict | None) -> dict:
        md: dict[str, Any] = {"name": name, "namespace": ns}
        if labels is not None:
            md["labels"] = labels
        return {"cells": [name, ready, "Running", 0, "5m", node],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                           "metadata": md}}

    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "priority": 0},
            {"name": "Ready", "type": "string", "format": "", "priority": 0},
            {"name": "Status", "type": "string", "format": "", "priority": 0},
            {"name": "Restarts", "type": "integer", "format": "", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "priority": 0},
            {"name": "Node", "type": "string", "format": "", "priority": 1},
        ],
        "rows": [row("default", "web-1", "1/1", "n1", {"app": "web", "tier": "fe"}),
                 row("kube-system", "dns", "0/1", None, None)],
    }


def test_default_columns_skip_wide_only_ones() -> None:
    assert format_table(pod_table()).splitlines() == [
        "NAME    READY   STATUS    RESTARTS   AGE",
        "web-1   1/1     Running   0          5m",
        "dns     0/1     Running   0          5m",
    ]


def test_wide_adds_priority_columns_and_none() -> None:
    lines = format_table(pod_table(), TableOptions(wide=True)).splitlines()
    assert lines[0] == "NAME    READY   STATUS    RESTARTS   AGE   NODE"
    assert lines[1].endswith("5m    n1")
    assert lines[2].endswith("5m    <none>")


def test_all_namespaces_puts_namespace_first() -> None:
    lines = format_table(pod_table(), TableOptions(all_namespaces=True)).splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[1].startswith("default       web-1 ")
    assert lines[2].startswith("kube-system   dns ")


def test_show_labels_and_kind_prefix_and_no_headers() -> None:
    opts = TableOptions(show_labels=True, name_prefix="pod", no_headers=True)
    lines = format_table(pod_table(), opts).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("pod/web-1 ")
    assert lines[0].endswith("app=web,tier=fe")
    assert lines[1].endswith("<none>")
    header = format_table(pod_table(), TableOptions(show_labels=True)).splitlines()[0]
    assert header.split()[-1] == "LABELS"


def test_min_width_and_last_column_not_padded() -> None:
    table = {"columnDefinitions": [{"name": "A", "priority": 0}, {"name": "B", "priority": 0}],
             "rows": [{"cells": ["x", "y"]}]}
    assert format_table(table).splitlines() == ["A     B", "x     y"]


def test_format_cell() -> None:
    assert printing.format_cell(None) == "<none>"
    assert printing.format_cell(True) == "true"
    assert printing.format_cell(3.0) == "3"
    assert printing.format_cell(["a", "b"]) == "a,b"
    assert printing.format_cell([]) == "<none>"


def test_pad_row_keeps_widths_for_watch_rows() -> None:
    widths = printing.column_widths([["NAME", "AGE"], ["web", "1s"]])
    assert widths == [7, 6]
    wider = printing.column_widths([["a-much-longer-name", "2s"]], widths)
    assert printing.pad_row(["a-much-longer-name", "2s"], wider) == "a-much-longer-name   2s"


def test_as_list_and_name() -> None:
    doc = printing.as_list([{"kind": "Pod"}])
    assert doc["kind"] == "List" and doc["items"] == [{"kind": "Pod"}]
    assert printing.object_name({"metadata": {"name": "web"}}, "deployment.apps") == \
        "deployment.apps/web"


def test_humanize_key() -> None:
    assert printing.humanize_key("matchLabels") == "Match Labels"
    assert printing.humanize_key("podIP") == "Pod IP"
    assert printing.humanize_key("replicas") == "Replicas"
    assert printing.humanize_key("app.kubernetes.io/name") == "app.kubernetes.io/name"


def test_describe_object() -> None:
    now = dt.datetime.now(dt.UTC)
    ts = (now - dt.timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    obj = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "creationTimestamp": ts,
                     "labels": {"app": "web", "tier": "fe"},
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}},
                 "paused": False, "strategy": {}},
        "status": {"conditions": []},
    }
    events = [{"type": "Normal", "reason": "ScalingReplicaSet", "lastTimestamp": ts,
               "source": {"component": "deployment-controller"}, "message": "Scaled up"}]
    text = printing.describe_object(obj, events)
    lines = text.splitlines()
    assert lines[0] == "Name:               web"
    assert "Namespace:          default" in lines
    assert "Labels:             app=web" in lines
    assert "                    tier=fe" in lines
    # last-applied is noise in describe, as in kubectl
    assert "Annotations:        <none>" in lines
    assert "Spec:" in lines
    assert "  Replicas:  2" in lines
    assert "    Match Labels:" in lines
    assert "        - Name:   c" in lines
    assert "          Image:  nginx" in lines
    assert "  Paused:    false" in lines
    assert "  Strategy:  <none>" in lines
    assert "  Conditions:  <none>" in lines
    assert lines[-4] == "Events:"
    assert lines[-3].split() == ["Type", "Reason", "Age", "From", "Message"]
    assert lines[-2].split() == ["----", "------", "---", "----", "-------"]
    assert lines[-1].split()[:4] == ["Normal", "ScalingReplicaSet", lines[-1].split()[2],
                                     "deployment-controller"]
    assert lines[-1].split()[2].endswith("s")
    assert printing.describe_object(obj, []).splitlines()[-1] == "Events:  <none>"
    assert "Events" not in printing.describe_object(obj, None)


def test_api_resources_table() -> None:
    from .fakes import fake_resources

    res = [r for r in fake_resources() if r.name in ("pods", "deployments")]
    lines = printing.api_resources_table(res).splitlines()
    assert lines[0].split() == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert lines[1].split() == ["pods", "po", "v1", "true", "Pod"]
    assert lines[2].split() == ["deployments", "deploy", "apps/v1", "true", "Deployment"]
