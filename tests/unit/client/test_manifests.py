"""Reading manifests from files, directories, lists and stdin."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from fleet.client.manifests import ManifestError, load_manifests, parse_manifest_text

CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {}\n"


def test_multi_document_and_list(tmp_path: Path) -> None:
    text = CM.format("a") + "---\n---\n" + """
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}
"""
    names = [m.obj["metadata"]["name"] for m in parse_manifest_text(text, "x.yaml")]
    assert names == ["a", "b", "c"]


def test_directories_and_stdin(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(CM.format("b"))
    (tmp_path / "a.json").write_text(
        '{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}')
    (tmp_path / "notes.txt").write_text("not a manifest")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "c.yml").write_text(CM.format("c"))
    flat = [m.obj["metadata"]["name"] for m in load_manifests([str(tmp_path)])]
    assert flat == ["a", "b"]
    deep = [m.obj["metadata"]["name"] for m in load_manifests([str(tmp_path)], recursive=True)]
    assert sorted(deep) == ["a", "b", "c"]
    piped = load_manifests(["-"], stdin=io.StringIO(CM.format("s")))
    assert piped[0].source == "STDIN" and piped[0].obj["metadata"]["name"] == "s"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: ConfigMap\nmetadata: {name: x}\n", "missing apiVersion or kind"),
        ("apiVersion: v1\nkind: ConfigMap\n", "has no metadata.name"),
        ("- a\n- b\n", "expected a mapping"),
        ("a: [\n", "error parsing"),
    ],
)
def test_bad_manifests(text: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifest_text(text, "bad.yaml")


def test_missing_path() -> None:
    with pytest.raises(ManifestError, match="does not exist"):
        load_manifests(["/no/such/file.yaml"])
