"""Score arithmetic shared by several plugins, with Go's integer semantics.

kube-scheduler computes scores in int64 arithmetic; Python's `//` floors
where Go truncates toward zero, and Python's `round` rounds half to even where
Go's `math.Round` rounds half away from zero.  Scores must match upstream to
the unit (ties decide placements), so these helpers spell the Go behaviour out.
"""

from __future__ import annotations

import math

from fleet.scheduler.framework import MAX_NODE_SCORE


def go_div(a: int, b: int) -> int:
    """Integer division truncating toward zero, as Go's `/` on ints."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def go_round(x: float) -> int:
    """Go's math.Round: half away from zero."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def default_normalize_score(scores: dict[str, int], *, reverse: bool = False,
                            max_priority: int = MAX_NODE_SCORE) -> None:
    """kube-scheduler's helper.DefaultNormalizeScore, in place.

    Scales so the highest raw score becomes `max_priority`; with `reverse`,
    the highest becomes 0 (fewer is better, as for intolerable taints).  All
    zero stays zero, or becomes `max_priority` everywhere when reversed.
    """
    highest = max(scores.values(), default=0)
    if highest == 0:
        if reverse:
            for name in scores:
                scores[name] = max_priority
        return
    for name, s in scores.items():
        s = go_div(max_priority * s, highest)
        scores[name] = max_priority - s if reverse else s
