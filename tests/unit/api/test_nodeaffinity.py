"""The one node-selection matcher (scheduler NodeAffinity, PodTopologySpread, DaemonSets)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.api.nodeaffinity import (
    compile_term,
    preferred_terms,
    required_node_affinity,
    term_matches,
)

LABELS = {"zone": "a", "disk": "ssd", "cores": "8"}


def req(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)} if values else {"key": key, "operator": op}


def required(*terms: Any) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                          {"nodeSelectorTerms": list(terms)}}}}


@pytest.mark.parametrize(("desc", "term", "want"), [
    ("In", {"matchExpressions": [req("zone", "In", "a", "b")]}, True),
    ("In, other value", {"matchExpressions": [req("zone", "In", "b")]}, False),
    ("NotIn, absent key matches", {"matchExpressions": [req("gpu", "NotIn", "x")]}, True),
    ("Exists", {"matchExpressions": [req("disk", "Exists")]}, True),
    ("DoesNotExist", {"matchExpressions": [req("disk", "DoesNotExist")]}, False),
    ("Gt", {"matchExpressions": [req("cores", "Gt", "4")]}, True),
    ("Lt", {"matchExpressions": [req("cores", "Lt", "4")]}, False),
    ("Gt on a non-number label", {"matchExpressions": [req("zone", "Gt", "4")]}, False),
    ("expressions are ANDed", {"matchExpressions": [req("zone", "In", "a"), req("disk", "In", "hdd")]}, False),
    ("matchFields metadata.name In", {"matchFields": [req("metadata.name", "In", "n1")]}, True),
    ("matchFields metadata.name NotIn", {"matchFields": [req("metadata.name", "NotIn", "n1")]}, False),
    # Malformed or empty terms match no node, as upstream.
    ("empty term", {}, None),
    ("In without values", {"matchExpressions": [req("zone", "In")]}, None),
    ("Exists with values", {"matchExpressions": [req("zone", "Exists", "a")]}, None),
    ("Gt with a non-integer", {"matchExpressions": [req("cores", "Gt", "x")]}, None),
    ("unknown operator", {"matchExpressions": [req("zone", "Near", "a")]}, None),
    ("matchFields with two values", {"matchFields": [req("metadata.name", "In", "n1", "n2")]}, None),
    ("matchFields Exists", {"matchFields": [req("metadata.name", "Exists")]}, None),
])
def test_terms(desc: str, term: dict[str, Any], want: bool | None) -> None:
    compiled = compile_term(term)
    if want is None:
        assert compiled is None, desc
    else:
        assert compiled is not None and term_matches(compiled, LABELS, "n1") is want, desc


@pytest.mark.parametrize(("desc", "spec", "want"), [
    ("no constraint at all", {}, None),
    ("nodeSelector matches", {"nodeSelector": {"zone": "a"}}, True),
    ("nodeSelector does not", {"nodeSelector": {"zone": "b"}}, False),
    ("terms are ORed", required({"matchExpressions": [req("zone", "In", "b")]},
                                {"matchExpressions": [req("zone", "In", "a")]}), True),
    ("no term matches", required({"matchExpressions": [req("zone", "In", "b")]}), False),
    ("no terms: nothing matches", required(), False),
    ("only malformed terms: nothing matches", required({"matchExpressions": [req("zone", "In")]}), False),
    ("nodeSelector and affinity both apply",
     {"nodeSelector": {"disk": "hdd"}, **required({"matchExpressions": [req("zone", "In", "a")]})}, False),
])
def test_required_node_affinity(desc: str, spec: dict[str, Any], want: bool | None) -> None:
    got = required_node_affinity(spec)
    if want is None:
        assert got is None, desc
    else:
        assert got is not None and got.matches(LABELS, "n1") is want, desc


def test_preferred_terms_keep_weighted_valid_terms() -> None:
    na = {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 5, "preference": {"matchExpressions": [req("zone", "In", "a")]}},
        {"weight": 0, "preference": {"matchExpressions": [req("zone", "In", "a")]}},
        {"weight": "x", "preference": {"matchExpressions": [req("zone", "In", "a")]}},
        {"weight": 3, "preference": {}},
    ]}
    assert [w for w, _ in preferred_terms(na)] == [5]
