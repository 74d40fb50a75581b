"""The one `$(VAR)` expander, against the cases of Kubernetes' expansion tests.

Expected values are what k8s.io/kubernetes third_party/forked/golang/expansion
`Expand(input, MappingFuncFor(env))` returns (its expand_test.go), including the
cases where the regex expander the worker used to have gave another answer
(nested references, names with characters a regex would not accept).
"""

from __future__ import annotations

import pytest

from fleet.api.expansion import expand_vars

ENV = {"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": "",
       "A B": "spaced", "1ST": "first", "A$(B": "odd"}


@pytest.mark.parametrize(("text", "env", "want"), [
    # (the table the agent's env tests carried)
    ("plain", {}, "plain"),
    ("$(A)-$(B)", {"A": "1", "B": "2"}, "1-2"),
    ("$(MISSING)", {}, "$(MISSING)"),
    ("$$(A)", {"A": "1"}, "$(A)"),
    ("$$$(A)", {"A": "1"}, "$1"),
    ("a$$b", {}, "a$b"),
    ("$(A", {"A": "1"}, "$(A"),
    ("$A", {"A": "1"}, "$A"),
    ("end$", {}, "end$"),
    ("$()", {}, "$()"),
    ("x$(A)y$(A)z", {"A": "-"}, "x-y-z"),
    # expand_test.go
    ("$(VAR_A)", ENV, "A"),
    ("___$(VAR_B)___", ENV, "___B___"),
    ("$(VAR_A)-$(VAR_A)", ENV, "A-A"),
    ("f000-$$VAR_A", ENV, "f000-$VAR_A"),
    ("foo\\$(VAR_C)bar", ENV, "foo\\Cbar"),
    ("foo\\\\$(VAR_C)bar", ENV, "foo\\\\Cbar"),
    ("$(VAR_A)$(VAR_B)$(VAR_C)", ENV, "ABC"),
    ("$(VAR_REF)", ENV, "$(VAR_A)"),  # values are not expanded again
    ("$(VAR_EMPTY)", ENV, ""),
    ("$(VAR_EMPTY)$(VAR_EMPTY)x", ENV, "x"),
    ("$(VAR_DNE)", ENV, "$(VAR_DNE)"),
    ("$(VAR_A)$(VAR_DNE)", ENV, "A$(VAR_DNE)"),
    ("$$$$$$(BIG_MONEY)", ENV, "$$$(BIG_MONEY)"),
    ("$$$$$$$(VAR_A)", ENV, "$$$A"),
    ("$$$$$$$$(VAR_A)", ENV, "$$$$(VAR_A)"),
    ("$$$", ENV, "$$"),
    ("$$$$", ENV, "$$"),
    ("$$-$$", ENV, "$-$"),
    ("$VAR_A", ENV, "$VAR_A"),
    ("$(VAR_A", ENV, "$(VAR_A"),
    ("$(VAR_A)$(", ENV, "A$("),
    ("$(VAR_A$(", ENV, "$(VAR_A$("),
    ("$", ENV, "$"),
    ("$(", ENV, "$("),
    ("$)", ENV, "$)"),
    ("$()$()", ENV, "$()$()"),
    ("x$(VAR_A)y", ENV, "xAy"),
    # Nested: the name runs to the first `)`, so the inner reference is not expanded.
    ("$(VAR_A$(VAR_B))", ENV, "$(VAR_A$(VAR_B))"),
    ("$(A$(B))", ENV, "odd)"),
    # Any name the environment defines, not only identifier-like ones.
    ("$(A B)", ENV, "spaced"),
    ("$(1ST)", ENV, "first"),
    ("é$(VAR_A)é", ENV, "éAé"),
])
def test_expand_vars_matches_kubernetes(text: str, env: dict[str, str], want: str) -> None:
    assert expand_vars(text, env) == want
