"""ImageLocality: kube-scheduler's size x spread formula, thresholds, and image name normalization."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.scheduler.plugins import ImageLocality
from fleet.scheduler.plugins.image_locality import calculate_priority
from fleet.scheduler.podinfo import normalize_image_name
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import node, pod, score_nodes

DIGEST = "sha256:abababababababababababababababababababababababababababababababab"
MB = 1024 * 1024


def image_pod(*images: str, init: tuple[str, ...] = ()) -> dict[str, Any]:
    return pod(containers=[{"name": f"c{i}", "image": im} for i, im in enumerate(images)],
               init=[{"name": f"i{i}", "image": im} for i, im in enumerate(init)] or None)


@pytest.mark.parametrize(("nodes", "p", "want"), [
    # Each image is on one of two nodes (spread 1/2): 40MB*1/2 is under the
    # 23MB floor; 300MB*1/2 = 150MB of the 2 x 1000MB range scores 6.
    ([node("n1", images=[(["gcr.io/40:latest"], 40 * MB)]), node("n2", images=[(["gcr.io/300:latest"], 300 * MB)])],
     image_pod("gcr.io/40", "gcr.io/300"), {"n1": 0, "n2": 6}),
    # An image on every node gives no node an edge... but still scores everywhere.
    ([node("n1", images=[(["gcr.io/250:latest"], 250 * MB)]), node("n2", images=[(["gcr.io/250:latest"], 250 * MB)])],
     image_pod("gcr.io/250"), {"n1": 23, "n2": 23}),
    # Spellings of one image meet in their normalized form.
    ([node("n1", images=[(["docker.io/library/nginx:latest", f"docker.io/library/nginx@{DIGEST}"], 500 * MB)]),
      node("n2")], image_pod("nginx"), {"n1": 23, "n2": 0}),
    # Clamped at 1000MB per container.
    ([node("n1", images=[(["big:v1"], 3000 * MB)])], image_pod("big:v1"), {"n1": 100}),
    # Init containers count, and widen the range (2 containers: up to 2000MB).
    ([node("n1", images=[(["big:v1"], 1000 * MB)])], image_pod("small:v1", init=("big:v1",)),
     {"n1": 100 * (1000 * MB - 23 * MB) // (2000 * MB - 23 * MB)}),
])
def test_scores(nodes, p, want):
    assert score_nodes(ImageLocality(), p, Snapshot.build(nodes)) == want


def test_skipped_when_no_node_has_the_images():
    snap = Snapshot.build([node("n1", images=[(["other:v1"], 500 * MB)])])
    assert score_nodes(ImageLocality(), image_pod("nginx"), snap) is None


def test_node_image_updates_are_tracked():
    snap = Snapshot.build([node("n1"), node("n2")])
    assert score_nodes(ImageLocality(), image_pod("app:v1"), snap) is None
    snap.set_node(node("n1", images=[(["app:v1"], 500 * MB)]))
    assert score_nodes(ImageLocality(), image_pod("app:v1"), snap) == {"n1": 23, "n2": 0}
    snap.remove_node("n1")
    assert score_nodes(ImageLocality(), image_pod("app:v1"), snap) is None


@pytest.mark.parametrize(("total", "containers", "want"), [
    (0, 1, 0), (23 * MB, 1, 0), (1000 * MB, 1, 100), (5000 * MB, 1, 100), (2000 * MB, 2, 100),
])
def test_calculate_priority(total, containers, want):
    assert calculate_priority(total, containers) == want


@pytest.mark.parametrize(("name", "want"), [
    ("nginx", "docker.io/library/nginx:latest"),
    ("nginx:1.25", "docker.io/library/nginx:1.25"),
    ("library/nginx", "docker.io/library/nginx:latest"),
    ("docker.io/nginx", "docker.io/library/nginx:latest"),
    ("index.docker.io/library/nginx:1", "docker.io/library/nginx:1"),
    ("user/app", "docker.io/user/app:latest"),
    ("gcr.io/proj/app", "gcr.io/proj/app:latest"),
    ("localhost:5000/app", "localhost:5000/app:latest"),
    ("localhost/app:v1", "localhost/app:v1"),
    ("registry:5000/team/app:v2", "registry:5000/team/app:v2"),
    ("nginx@sha256:abababababababababababababababababababababababababababababababab", "docker.io/library/nginx@sha256:abababababababababababababababababababababababababababababababab"),
    ("gcr.io/app:v1@sha256:abababababababababababababababababababababababababababababababab", "gcr.io/app:v1@sha256:abababababababababababababababababababababababababababababababab"),
    # The registry host is case-insensitive: the scheduler normalizes as the agent does.
    ("Registry.Example.COM/app", "registry.example.com/app:latest"),
    ("Registry.Example.COM:5000/team/app:v2", "registry.example.com:5000/team/app:v2"),
    ("not a reference", "not a reference"),
])
def test_normalize_image_name(name, want):
    assert normalize_image_name(name) == want
