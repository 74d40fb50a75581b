"""SliceTracker.keys_to_sync: which Services a slice event queues, for either
slice-writing controller (endpointslice, endpointslicemirroring)."""

from __future__ import annotations

from typing import Any

from fleet.controllers.endpoints_util import (
    ENDPOINTSLICE_CONTROLLER,
    MIRRORING_CONTROLLER,
    SliceTracker,
)

ME = ENDPOINTSLICE_CONTROLLER


def es(svc: str, rv: int, manager: str = ME, uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": f"{svc}-x", "uid": uid, "resourceVersion": str(rv),
                         "labels": {"kubernetes.io/service-name": svc,
                                    "endpointslice.kubernetes.io/managed-by": manager}}}


def test_news_about_our_slice_queues_its_service_and_our_own_write_does_not() -> None:
    t = SliceTracker()
    assert t.keys_to_sync(ME, None, es("web", 5)) == ["ns/web"]
    t.update(es("web", 5))
    assert t.keys_to_sync(ME, es("web", 4), es("web", 5)) == []       # our own write
    assert t.keys_to_sync(ME, es("web", 5), es("web", 6)) == ["ns/web"]  # someone edited it


def test_someone_elses_slices_are_ignored_unless_they_change_hands() -> None:
    t = SliceTracker()
    other = MIRRORING_CONTROLLER
    assert t.keys_to_sync(ME, es("web", 1, other), es("web", 2, other)) == []
    assert t.keys_to_sync(ME, es("web", 2, other), es("web", 3, ME)) == ["ns/web"]


def test_a_slice_moved_between_services_queues_both() -> None:
    assert SliceTracker().keys_to_sync(ME, es("a", 1), es("b", 2)) == ["ns/a", "ns/b"]


def test_deletions_queue_only_when_someone_else_deleted_our_slice() -> None:
    t = SliceTracker()
    t.update(es("web", 5))
    assert t.keys_to_sync(ME, es("web", 5), None) == ["ns/web"]   # not ours to expect
    t.update(es("web", 6))
    t.expect_deletion(es("web", 6))
    assert t.keys_to_sync(ME, es("web", 6), None) == []          # our own deletion
    assert t.keys_to_sync(ME, es("other", 1), None) == []        # never ours
