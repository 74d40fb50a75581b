"""Label/field selector parsing and matching, and label key/value validation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.api.errors import BadRequest
from fleet.api.selectors import (
    DOES_NOT_EXIST,
    DOUBLE_EQUALS,
    EQUALS,
    EXISTS,
    IN,
    NOT_EQUALS,
    NOT_IN,
    LabelSelector,
    Requirement,
    label_selector_from_dict,
    label_selector_to_string,
    parse_field_selector,
    parse_label_selector,
    parsed_label_selector,
    selector_dict_matches,
    set_selector_matches,
    validate_label_key,
    validate_label_value,
)

LABELS = {"app": "web", "tier": "frontend", "app.kubernetes.io/name": "shop", "n": "7"}

MATCH_CASES = [
    ("", True),
    ("app=web", True),
    ("app==web", True),
    ("app = web ,tier=frontend", True),
    ("app=db", False),
    ("app!=db", True),
    ("missing!=x", True),  # != matches objects without the key
    ("tier in (frontend,backend)", True),
    ("tier in (backend)", False),
    ("tier notin (backend)", True),
    ("missing notin (a)", True),  # notin matches objects without the key
    ("tier notin (frontend)", False),
    ("app", True),
    ("missing", False),
    ("!missing", True),
    ("!app", False),
    ("app.kubernetes.io/name=shop", True),
    ("app=web,missing", False),
    ("missing=", False),
    ("n>5", True),
    ("n<5", False),
    ("app>5", False),  # a non-integer label value never satisfies gt/lt
    ("x in (a,)", False),
    ("missing in ()", False),  # the set {""}
    ("missing notin ()", True),
]


@pytest.mark.parametrize("text,expected", MATCH_CASES)
def test_label_selector_matching(text: str, expected: bool) -> None:
    assert parse_label_selector(text).matches(LABELS) is expected


def test_empty_selector_matches_objects_without_labels() -> None:
    assert parse_label_selector("").matches(None)
    assert parse_label_selector("a!=b").matches(None)
    assert not parse_label_selector("a").matches(None)


@pytest.mark.parametrize("text,expected", [
    ("b=2,a=1", "a=1,b=2"),
    ("tier in (b, a, a)", "tier in (a,b)"),
    ("x,!y", "x,!y"),
    ("a==1", "a==1"),
    ("k notin (z)", "k notin (z)"),
    ("a=", "a="),
])
def test_label_selector_canonical_string(text: str, expected: str) -> None:
    assert str(parse_label_selector(text)) == expected


@pytest.mark.parametrize("text,fragment", [
    ("a=b,", "identifier after ','"),
    ("a in b", "expected: '('"),
    ("a in (b", "expected: ',' or ')'"),
    ("a in (b c)", "expected: ',' or ')'"),
    ("!a=b", "expected: ',' or 'end of string'"),
    ("a b", "expected: [!=, <, =, ==, >, in, notin]"),
    ("=b", "expected: identifier"),
    ("a=b=c", "expected: ',' or 'end of string'"),
    ("-a=b", 'key: Invalid value: "-a"'),
    ("a/b/c=d", "a qualified name must consist"),
    ("Example.com/a=b", "prefix part a lowercase RFC 1123 subdomain"),
    ("a=-b", 'values[0][a]: Invalid value: "-b"'),
    ("a>b", "the value must be an integer"),
    (",", "expected: identifier"),
])
def test_label_selector_errors(text: str, fragment: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_label_selector(text)
    assert err.value.code == 400
    assert err.value.message.startswith("unable to parse requirement: ")
    assert fragment in err.value.message


def test_label_selector_from_dict() -> None:
    sel = {"matchLabels": {"app": "web"},
           "matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]},
                                {"key": "canary", "operator": "DoesNotExist"},
                                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                                {"key": "zone", "operator": "Exists"}]}
    parsed = label_selector_from_dict(sel)
    assert label_selector_to_string(sel) == "app=web,!canary,env notin (prod),tier in (a,b),zone"
    assert parsed == parse_label_selector(str(parsed))
    assert parsed.matches({"app": "web", "tier": "a", "zone": "z1"})
    assert not parsed.matches({"app": "web", "tier": "a", "zone": "z1", "canary": "1"})
    assert not parsed.matches({"app": "web", "tier": "a"})
    assert label_selector_to_string({"matchLabels": {"app": "web"}}) == "app=web"


def test_nil_and_empty_api_selectors() -> None:
    # Upstream: a nil selector selects nothing, an empty one everything.
    assert not label_selector_from_dict(None).matches({"a": "b"})
    assert label_selector_from_dict({}).matches({"a": "b"})
    assert label_selector_from_dict({}).empty()
    assert label_selector_to_string({}) == ""


@pytest.mark.parametrize("sel", [
    {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]},
    {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
    {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]},
    {"matchExpressions": [{"key": "-a", "operator": "Exists"}]},
    {"matchLabels": {"a": "-b"}},
    {"matchLabels": ["a"]},
])
def test_label_selector_from_dict_errors(sel: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        label_selector_from_dict(sel)


# --------------------------------------------------------------------------
# Label key/value validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize("key", [
    "a", "A", "a-b_c.d", "app.kubernetes.io/name", "example.com/X", "1", "a" * 63,
    "a" * 253 + "/b",
])
def test_valid_label_keys(key: str) -> None:
    assert validate_label_key(key) is None


@pytest.mark.parametrize("key,fragment", [
    ("", "name part must be non-empty"),
    ("-a", "name part must consist"),
    ("a-", "name part must consist"),
    ("a" * 64, "no more than 63"),
    ("/a", "prefix part must be non-empty"),
    ("Ex.com/a", "prefix part a lowercase RFC 1123"),
    ("a" * 254 + "/b", "no more than 253"),
    ("a/", "name part must be non-empty"),
    ("a/b/c", "a qualified name"),
])
def test_invalid_label_keys(key: str, fragment: str) -> None:
    problem = validate_label_key(key)
    assert problem is not None and fragment in problem


@pytest.mark.parametrize("value,ok", [
    ("", True), ("a", True), ("A.b-c_1", True), ("a" * 63, True),
    ("a" * 64, False), ("-a", False), ("a b", False), ("a/b", False),
])
def test_label_values(value: str, ok: bool) -> None:
    assert (validate_label_value(value) is None) is ok


# --------------------------------------------------------------------------
# Field selectors
# --------------------------------------------------------------------------

POD = {"metadata": {"name": "web-1", "namespace": "default"},
       "spec": {"nodeName": "n1", "hostNetwork": True},
       "status": {"phase": "Running"}}


def _any(_: str) -> bool:
    return True


@pytest.mark.parametrize("text,expected", [
    ("", True),
    ("metadata.name=web-1", True),
    ("metadata.name==web-1", True),
    ("metadata.name!=web-1", False),
    ("spec.nodeName=n1,status.phase!=Failed", True),
    ("spec.nodeName=n2", False),
    ("spec.missing=", True),  # a missing field compares as ""
    ("spec.missing!=", False),
    ("spec.hostNetwork=true", True),
    ("metadata.namespace=default,metadata.name=web-2", False),
])
def test_field_selector_matching(text: str, expected: bool) -> None:
    assert parse_field_selector(text, _any).matches(POD) is expected


def test_field_selector_exact_value_and_escapes() -> None:
    sel = parse_field_selector("metadata.namespace=ns,metadata.name!=x", _any)
    assert sel.exact_value("metadata.namespace") == "ns"
    assert sel.exact_value("metadata.name") is None
    escaped = parse_field_selector(r"metadata.name=a\,b\=c\\d", _any)
    assert escaped.exact_value("metadata.name") == "a,b=c\\d"
    assert parse_field_selector(str(escaped), _any) == escaped


def test_field_selector_unknown_field() -> None:
    allowed = {"metadata.name", "metadata.namespace"}.__contains__
    with pytest.raises(BadRequest) as err:
        parse_field_selector("spec.foo=bar", allowed)
    assert err.value.message == ('"spec.foo" is not a known field selector: '
                                 'only "metadata.name", "metadata.namespace"')


@pytest.mark.parametrize("text", ["metadata.name", "=x", "metadata.name=a,", r"a=b\x", "a=b=c"])
def test_field_selector_syntax_errors(text: str) -> None:
    with pytest.raises(BadRequest):
        parse_field_selector(text, _any)


# --------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------

_label_keys = st.sampled_from(["app", "tier", "env", "app.kubernetes.io/name", "x.y/z-1", "k_2"])
_label_values = st.sampled_from(["", "a", "b", "web", "A-1", "v.2"])


@st.composite
def _requirements(draw: st.DrawFn) -> Requirement:
    key = draw(_label_keys)
    op = draw(st.sampled_from([EQUALS, DOUBLE_EQUALS, NOT_EQUALS, IN, NOT_IN, EXISTS,
                               DOES_NOT_EXIST]))
    if op in (IN, NOT_IN):
        values = tuple(sorted(draw(st.sets(_label_values, min_size=1, max_size=3))))
    elif op in (EXISTS, DOES_NOT_EXIST):
        values = ()
    else:
        values = (draw(_label_values),)
    return Requirement(key, op, values)


_selectors = st.lists(_requirements(), max_size=5).map(LabelSelector.of)
_label_maps = st.dictionaries(_label_keys, _label_values, max_size=5)


@settings(max_examples=300, deadline=None)
@given(_selectors)
def test_label_selector_string_round_trip(sel: LabelSelector) -> None:
    assert parse_label_selector(str(sel)) == sel


def _reference_matches(sel: LabelSelector, labels: dict[str, str]) -> bool:
    for r in sel.requirements:
        if r.operator in (EQUALS, DOUBLE_EQUALS):
            ok = labels.get(r.key) == r.values[0] and r.key in labels
        elif r.operator == NOT_EQUALS:
            ok = labels.get(r.key, None) != r.values[0] or r.key not in labels
        elif r.operator == IN:
            ok = r.key in labels and labels[r.key] in r.values
        elif r.operator == NOT_IN:
            ok = r.key not in labels or labels[r.key] not in r.values
        elif r.operator == EXISTS:
            ok = r.key in labels
        else:
            ok = r.key not in labels
        if not ok:
            return False
    return True


@settings(max_examples=300, deadline=None)
@given(_selectors, _label_maps)
def test_label_selector_matches_reference(sel: LabelSelector, labels: dict[str, str]) -> None:
    assert sel.matches(labels) is _reference_matches(sel, labels)
    # The string form selects the same objects.
    assert parse_label_selector(str(sel)).matches(labels) is _reference_matches(sel, labels)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_label_keys, _label_values, max_size=4), _label_maps)
def test_match_labels_dict_agrees_with_string(match: dict[str, str],
                                              labels: dict[str, str]) -> None:
    sel = {"matchLabels": match}
    expected = all(labels.get(k) == v and k in labels for k, v in match.items())
    assert label_selector_from_dict(sel).matches(labels) is expected
    assert parse_label_selector(label_selector_to_string(sel)).matches(labels) is expected


# --------------------------------------------------------------------------
# API selectors in objects: selector_dict_matches, the one matcher that
# validation, controllers, eviction and disruption budgets use
# --------------------------------------------------------------------------

_WEB = {"app": "web", "tier": "a"}


@pytest.mark.parametrize(("desc", "sel", "labels", "expected"), [
    ("null selects nothing", None, _WEB, False),
    ("empty selects everything", {}, _WEB, True),
    ("empty selects even no labels", {}, None, True),
    ("matchLabels equal", {"matchLabels": {"app": "web"}}, _WEB, True),
    ("matchLabels differ", {"matchLabels": {"app": "db"}}, _WEB, False),
    ("matchLabels key absent", {"matchLabels": {"zone": "z"}}, _WEB, False),
    ("In", {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}, _WEB, True),
    ("In, absent key", {"matchExpressions": [{"key": "x", "operator": "In", "values": ["a"]}]}, _WEB, False),
    ("NotIn", {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, _WEB, False),
    ("NotIn, absent key matches", {"matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["a"]}]},
     _WEB, True),
    ("Exists", {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, _WEB, True),
    ("DoesNotExist", {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, _WEB, False),
    ("labels and expressions are ANDed",
     {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}]},
     {**_WEB, "canary": "1"}, False),
    # A selector LabelSelectorAsSelector refuses selects nothing (controllers skip it).
    ("unknown operator", {"matchExpressions": [{"key": "tier", "operator": "Near", "values": ["a"]}]},
     _WEB, False),
    ("In without values", {"matchExpressions": [{"key": "tier", "operator": "In"}]}, _WEB, False),
    ("bad key", {"matchLabels": {"bad key": "web"}}, {"bad key": "web"}, False),
    ("values not a list", {"matchExpressions": [{"key": "tier", "operator": "In", "values": "a"}]},
     _WEB, False),
    ("matchLabels not a map", {"matchLabels": ["app"]}, _WEB, False),
    ("operator not a string", {"matchExpressions": [{"key": "tier", "operator": ["In"], "values": ["a"]}]},
     _WEB, False),
    ("not an object", "app=web", _WEB, False),
])
def test_selector_dict_matches(desc: str, sel: Any, labels: dict[str, str] | None, expected: bool) -> None:
    assert selector_dict_matches(sel, labels) is expected, desc


def test_parsed_label_selector_is_memoized_and_refuses_bad_selectors() -> None:
    sel = {"matchLabels": {"app": "web"}}
    assert parsed_label_selector(sel) is parsed_label_selector({"matchLabels": {"app": "web"}})
    assert parsed_label_selector(None).nothing
    with pytest.raises(BadRequest):
        parsed_label_selector({"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]})


@pytest.mark.parametrize("sel,labels,want", [
    ({"app": "web"}, {"app": "web", "v": "1"}, True),
    ({"app": "web", "tier": "f"}, {"app": "web"}, False),
    ({"app": "web"}, {"app": "db"}, False),
    ({"app": "web"}, None, False),
    ({}, {"x": "y"}, True),  # labels.SelectorFromSet of an empty map: everything
])
def test_set_selector_matches(sel: dict[str, str], labels: dict[str, str] | None, want: bool) -> None:
    assert set_selector_matches(sel, labels) is want

