"""The audit policy: parsing and validation (kube-apiserver's words), rule matching
(policy/checker.go), and the Metadata cap on secrets that no policy can lift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.auth import Attributes, UserInfo, non_resource
from fleet.auth.audit import (
    DEFAULT_POLICY,
    LEVELS,
    METADATA,
    NONE,
    REQUEST,
    REQUEST_RECEIVED,
    REQUEST_RESPONSE,
    RESPONSE_STARTED,
    PolicyError,
    load_policy,
    parse_policy,
)

ALICE = UserInfo("alice", groups=("devs", "system:authenticated"))
BOB = UserInfo("bob", groups=("ops",))


def policy(*rules: dict, **top: object) -> str:
    return json.dumps({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": list(rules), **top})


def res(verb: str, resource: str, *, group: str = "", sub: str = "", ns: str = "", name: str = "") -> Attributes:
    return Attributes(verb, group, "v1", resource, sub, ns, name)


# -- matching ---------------------------------------------------------------------------

MATCH_CASES = [
    # (rule, user, attrs, matches)
    ({"level": "Metadata"}, ALICE, res("get", "pods"), True),
    ({"level": "Metadata"}, None, non_resource("get", "/healthz"), True),
    ({"level": "Metadata", "users": ["alice"]}, ALICE, res("get", "pods"), True),
    ({"level": "Metadata", "users": ["alice"]}, BOB, res("get", "pods"), False),
    ({"level": "Metadata", "users": ["alice"]}, None, res("get", "pods"), False),  # a 401
    ({"level": "Metadata", "userGroups": ["ops"]}, BOB, res("get", "pods"), True),
    ({"level": "Metadata", "userGroups": ["ops"]}, ALICE, res("get", "pods"), False),
    ({"level": "Metadata", "verbs": ["get", "list"]}, ALICE, res("list", "pods"), True),
    ({"level": "Metadata", "verbs": ["get", "list"]}, ALICE, res("watch", "pods"), False),
    ({"level": "Metadata", "resources": [{"group": "", "resources": ["pods"]}]}, ALICE, res("get", "pods"), True),
    # a subresource is only matched by "pods/log", "pods/*", "*/log" or "*"
    ({"level": "Metadata", "resources": [{"resources": ["pods"]}]}, ALICE, res("get", "pods", sub="log"), False),
    ({"level": "Metadata", "resources": [{"resources": ["pods/log"]}]}, ALICE, res("get", "pods", sub="log"), True),
    ({"level": "Metadata", "resources": [{"resources": ["pods/log"]}]}, ALICE, res("get", "pods"), False),
    ({"level": "Metadata", "resources": [{"resources": ["pods/*"]}]}, ALICE, res("get", "pods", sub="exec"), True),
    ({"level": "Metadata", "resources": [{"resources": ["pods/*"]}]}, ALICE, res("get", "pods"), True),
    ({"level": "Metadata", "resources": [{"resources": ["*/scale"]}]}, ALICE,
     res("update", "deployments", group="apps", sub="scale"), False),  # wrong group
    ({"level": "Metadata", "resources": [{"group": "apps", "resources": ["*/scale"]}]}, ALICE,
     res("update", "deployments", group="apps", sub="scale"), True),
    ({"level": "Metadata", "resources": [{"group": "apps", "resources": ["*/scale"]}]}, ALICE,
     res("update", "deployments", group="apps"), False),
    ({"level": "Metadata", "resources": [{"resources": ["*"]}]}, ALICE, res("get", "pods", sub="status"), True),
    ({"level": "Metadata", "resources": [{"group": "apps"}]}, ALICE, res("get", "deployments", group="apps"), True),
    ({"level": "Metadata", "resources": [{"group": "apps"}]}, ALICE, res("get", "pods"), False),
    ({"level": "Metadata", "resources": [{"resources": ["configmaps"], "resourceNames": ["a"]}]}, ALICE,
     res("get", "configmaps", ns="x", name="a"), True),
    ({"level": "Metadata", "resources": [{"resources": ["configmaps"], "resourceNames": ["a"]}]}, ALICE,
     res("get", "configmaps", ns="x", name="b"), False),
    ({"level": "Metadata", "namespaces": ["kube-system"]}, ALICE, res("get", "pods", ns="kube-system"), True),
    ({"level": "Metadata", "namespaces": ["kube-system"]}, ALICE, res("get", "pods", ns="default"), False),
    ({"level": "Metadata", "namespaces": [""]}, ALICE, res("get", "nodes"), True),  # "" = cluster-scoped
    ({"level": "Metadata", "namespaces": ["kube-system"]}, ALICE, non_resource("get", "/healthz"), False),
    ({"level": "Metadata", "resources": [{"resources": ["pods"]}]}, ALICE, non_resource("get", "/api"), False),
    ({"level": "Metadata", "nonResourceURLs": ["/healthz*"]}, ALICE, non_resource("get", "/healthz/etcd"), True),
    ({"level": "Metadata", "nonResourceURLs": ["/healthz*"]}, ALICE, non_resource("get", "/livez"), False),
    ({"level": "Metadata", "nonResourceURLs": ["/version"]}, ALICE, non_resource("get", "/version"), True),
    ({"level": "Metadata", "nonResourceURLs": ["/version"]}, ALICE, non_resource("get", "/version/x"), False),
    ({"level": "Metadata", "nonResourceURLs": ["*"]}, ALICE, non_resource("get", "/anything"), True),
    ({"level": "Metadata", "nonResourceURLs": ["*"]}, ALICE, res("get", "pods"), False),
]


@pytest.mark.parametrize(("rule", "user", "attrs", "matches"), MATCH_CASES)
def test_rule_matching(rule: dict, user: UserInfo | None, attrs: Attributes, matches: bool) -> None:
    p = parse_policy(policy(rule, {"level": "RequestResponse", "users": ["nobody-at-all"]}))
    assert (p.evaluate(user, attrs).level == METADATA) is matches


def test_first_matching_rule_wins_and_no_match_is_none() -> None:
    p = parse_policy(policy(
        {"level": "None", "users": ["system:kube-proxy"], "verbs": ["watch"]},
        {"level": "RequestResponse", "resources": [{"resources": ["configmaps"]}]},
        {"level": "Request", "resources": [{"resources": ["configmaps", "pods"]}]},
        {"level": "Metadata", "verbs": ["get"]},
    ))
    assert p.evaluate(UserInfo("system:kube-proxy"), res("watch", "configmaps")).level == NONE
    assert p.evaluate(ALICE, res("watch", "configmaps")).level == REQUEST_RESPONSE
    assert p.evaluate(ALICE, res("create", "pods")).level == REQUEST
    assert p.evaluate(ALICE, res("get", "nodes")).level == METADATA
    assert p.evaluate(ALICE, res("delete", "nodes")).level == NONE  # no rule: not audited


def test_omit_stages_union_and_managed_fields_override() -> None:
    p = parse_policy(policy(
        {"level": "Metadata", "verbs": ["get"], "omitStages": ["ResponseStarted"], "omitManagedFields": False},
        {"level": "Metadata"},
        omitStages=["RequestReceived"], omitManagedFields=True))
    got = p.evaluate(ALICE, res("get", "pods"))
    assert got.omit_stages == {REQUEST_RECEIVED, RESPONSE_STARTED}
    assert got.omit_managed_fields is False  # the rule's own setting wins
    other = p.evaluate(ALICE, res("list", "pods"))
    assert other.omit_stages == {REQUEST_RECEIVED} and other.omit_managed_fields is True
    unmatched = parse_policy(policy({"level": "Metadata", "users": ["x"]}, omitStages=["Panic"]))
    assert unmatched.evaluate(ALICE, res("get", "pods")).omit_stages == {"Panic"}


def test_default_policy_is_metadata_for_everything_one_line_per_request() -> None:
    for user, attrs in [(ALICE, res("get", "pods")), (None, non_resource("get", "/healthz")),
                        (BOB, res("create", "configmaps", ns="a"))]:
        cfg = DEFAULT_POLICY.evaluate(user, attrs)
        assert cfg.level == METADATA and REQUEST_RECEIVED in cfg.omit_stages


# -- secrets ------------------------------------------------------------------------------

SECRET_REQUESTS = [
    res("create", "secrets", ns="a"), res("get", "secrets", ns="a", name="s"), res("list", "secrets"),
    res("watch", "secrets", ns="a"), res("patch", "secrets", ns="a", name="s"),
    res("create", "serviceaccounts", sub="token", ns="a", name="default"),
    res("create", "tokenreviews", group="authentication.k8s.io"),
]


@pytest.mark.parametrize("attrs", SECRET_REQUESTS)
@pytest.mark.parametrize("rule", [
    {"level": "RequestResponse"},
    {"level": "Request"},
    {"level": "RequestResponse", "resources": [{"group": "", "resources": ["secrets", "serviceaccounts/token"]},
                                               {"group": "authentication.k8s.io"}]},
    {"level": "RequestResponse", "resources": [{"resources": ["*"]}, {"group": "authentication.k8s.io",
                                                                       "resources": ["*"]}]},
])
def test_secrets_capped_at_metadata_whatever_the_policy(rule: dict, attrs: Attributes) -> None:
    assert parse_policy(policy(rule)).evaluate(ALICE, attrs).level == METADATA


def test_secrets_can_still_be_none_and_configmaps_are_not_capped() -> None:
    p = parse_policy(policy({"level": "None", "resources": [{"resources": ["secrets"]}]},
                            {"level": "RequestResponse"}))
    assert p.evaluate(ALICE, res("get", "secrets", ns="a", name="s")).level == NONE
    assert p.evaluate(ALICE, res("get", "configmaps", ns="a", name="c")).level == REQUEST_RESPONSE
    # a serviceaccount itself holds no secret; only its token subresource is capped
    assert p.evaluate(ALICE, res("get", "serviceaccounts", ns="a", name="d")).level == REQUEST_RESPONSE


@given(level=st.sampled_from(LEVELS), verb=st.sampled_from(["get", "list", "watch", "create", "update",
                                                             "patch", "delete", "deletecollection"]),
       ns=st.sampled_from(["", "default", "kube-system"]), name=st.sampled_from(["", "x"]))
def test_property_secret_level_never_beyond_metadata(level: str, verb: str, ns: str, name: str) -> None:
    p = parse_policy(policy({"level": level}))
    got = p.evaluate(ALICE, res(verb, "secrets", ns=ns, name=name)).level
    assert LEVELS.index(got) <= LEVELS.index(METADATA)
    assert got == (NONE if level == NONE else METADATA)


# -- parsing and validation ------------------------------------------------------------------

def test_yaml_policy_from_file(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text("""
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
  - "RequestReceived"
rules:
  - level: RequestResponse
    resources:
    - group: ""
      resources: ["pods"]
  - level: Metadata
    resources:
    - group: ""
      resources: ["pods/log", "pods/status"]
  - level: None
    users: ["system:kube-proxy"]
    verbs: ["watch"]
  - level: None
    userGroups: ["system:authenticated"]
    nonResourceURLs:
    - "/api*"
    - "/version"
  - level: Metadata
    omitStages:
      - "RequestReceived"
""")
    p = load_policy(f)
    assert len(p.rules) == 5
    assert p.evaluate(ALICE, res("get", "pods", ns="a", name="p")).level == REQUEST_RESPONSE
    assert p.evaluate(ALICE, res("get", "pods", sub="log", ns="a", name="p")).level == METADATA
    assert p.evaluate(ALICE, non_resource("get", "/apis/apps")).level == NONE


@pytest.mark.parametrize(("doc", "message"), [
    ("", "loaded illegal policy with 0 rules"),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\n", "loaded illegal policy with 0 rules"),
    ("apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules: [{level: None}]",
     "unknown group version field audit.k8s.io/v1beta1, Kind=Policy in policy"),
    ("kind: Policy\nrules: [{level: None}]", "unknown group version field"),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{}]", "rules[0].level: Required value"),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Everything}]",
     'rules[0].level: Unsupported value: "Everything": supported values: "None", "Metadata", "Request", '
     '"RequestResponse"'),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [healthz]}]",
     "non-resource URL rules must begin with a '/' character"),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: ['/a*/b']}]",
     "non-resource URL wildcards '*' must be the final character of the rule"),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: ['/a'], "
     "namespaces: [x]}]", "rules cannot apply to both regular resources and non-resource URLs"),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, resources: [{group: Apps}]}]",
     'rules[0].resources.group: Invalid value: "Apps"'),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, resources: [{group: apps/v1}]}]",
     'rules[0].resources.group: Invalid value: "apps/v1"'),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [Done]\nrules: [{level: None}]",
     'omitStages[0]: Invalid value: "Done": allowed stages are RequestReceived,ResponseStarted,'
     'ResponseComplete,Panic'),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, users: alice}]",
     "rules[0].users: Invalid value: 'alice': must be a list of strings"),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: {level: None}", "rules: expected a list"),
    ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None}\n", "failed decoding"),
    ("[1, 2]", "failed decoding"),
])
def test_bad_policies_are_refused(doc: str, message: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(doc)
    assert message in str(e.value)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match='failed to read file path ".*missing.yaml"'):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\n")
    with pytest.raises(PolicyError, match=f"loaded illegal policy with 0 rules: from file {bad}"):
        load_policy(bad)


def test_unknown_fields_warn_and_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    p = parse_policy(policy({"level": "Metadata", "verb": ["get"]}))  # typo: verbs
    assert p.evaluate(ALICE, res("delete", "pods")).level == METADATA  # lenient, as kube-apiserver
    assert 'unknown field(s) "rules[0].verb"' in caplog.text
