"""fleet.api.tolerations: Kubernetes' ToleratesTaint, shared by scheduler, DaemonSets, node lifecycle."""

from __future__ import annotations

import pytest

from fleet.api.tolerations import tolerates, toleration_matches, untolerated

TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


@pytest.mark.parametrize(("tol", "ok"), [
    ({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}, True),
    ({"key": "dedicated", "value": "gpu"}, True),                      # default operator Equal, any effect
    ({"key": "dedicated", "operator": "Exists"}, True),
    ({"operator": "Exists"}, True),                                   # empty key + Exists: every taint
    ({"key": "dedicated", "value": "cpu"}, False),
    ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "other", "operator": "Exists"}, False),
    ({"key": "dedicated", "operator": "Gt", "value": "gpu"}, False),  # unknown operator
    ({"key": "dedicated"}, False),                                    # Equal with "" vs "gpu"
])
def test_toleration_matches(tol: dict, ok: bool) -> None:
    assert toleration_matches(tol, TAINT) is ok


def test_tolerates_and_untolerated_skip_malformed_entries() -> None:
    assert tolerates([5, None, {"operator": "Exists"}], TAINT)
    assert not tolerates(["x"], TAINT)
    assert untolerated([TAINT, 7], [], ("NoSchedule",))
    assert not untolerated([TAINT], [], ("NoExecute",))
    assert not untolerated([TAINT], [{"key": "dedicated", "value": "gpu"}], ("NoSchedule",))
