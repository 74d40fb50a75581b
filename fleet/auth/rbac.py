"""RBAC: the rule algebra, the rule resolver and the authorizer (`--authorization-mode RBAC`).

Three layers, as in kube-apiserver's plugin/pkg/auth/authorizer/rbac:

* **Rule algebra** (pure functions over PolicyRule dicts): does a rule allow a
  request (`rule_allows`: verbs, apiGroups, resources with `resource/subresource`,
  `*` and `*/subresource`, resourceNames, nonResourceURLs with a trailing `*`);
  does a set of rules cover another (`covers`, used by escalation prevention);
  the compact description of missing rules Kubernetes prints.
* **Resolver** (`RBACAuthorizer.visit_rules`): which rules apply to a user in a
  namespace — every ClusterRoleBinding naming the user (by name, a group, or its
  ServiceAccount), then every RoleBinding in the namespace; a RoleBinding may point
  at a Role of its namespace or at a ClusterRole, granting it only there.
* **Authorizer**: allows when some applicable rule allows; otherwise has no
  opinion (so a union can ask the next authorizer; with none left the API server
  answers 403 in Kubernetes' words).  A binding whose role does not exist is
  remembered as an error and becomes the denial's reason (`RBAC: role.rbac... not
  found`), as kube-apiserver reports it.

The authorizer decides synchronously from four watch-fed caches (roles,
clusterroles, rolebindings, clusterrolebindings); `run(store)` keeps them current
and is started supervised by the server (`Security.tasks`).  Before the first
list completes it knows nothing, so it has no opinion: requests made in that
window by anyone but `system:masters` are refused, never wrongly allowed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from fleet.api import meta
from fleet.auth import Attributes, Decision, UserInfo
from fleet.store import Store
from fleet.store.watchcache import WatchCache

Rule = dict[str, Any]

GROUP = "rbac.authorization.k8s.io"
VERB_ALL = "*"
API_GROUP_ALL = "*"
RESOURCE_ALL = "*"
NON_RESOURCE_ALL = "*"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

# `*` on everything: what setting an aggregationRule requires (it can gather anything).
FULL_AUTHORITY: tuple[Rule, ...] = (
    {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
    {"verbs": ["*"], "nonResourceURLs": ["*"]},
)


def _strs(rule: Rule, key: str) -> list[str]:
    """rule[key] as a list of strings (anything else in it is dropped)."""
    v = rule.get(key)
    return [s for s in v if isinstance(s, str)] if isinstance(v, list) else []


def _items(rule: Rule, key: str) -> list[Any]:
    """rule[key] without copying, for matching on the hot path (an item that is not
    a string never equals a request's string; the schema keeps them strings)."""
    v = rule.get(key)
    return v if isinstance(v, list) else []


# ---------------------------------------------------------------------------
# Matching one request against one rule (rbac/v1 evaluation_helpers.go).
# ---------------------------------------------------------------------------


def verb_matches(rule: Rule, verb: str) -> bool:
    verbs = _items(rule, "verbs")
    return verb in verbs or VERB_ALL in verbs


def api_group_matches(rule: Rule, group: str) -> bool:
    groups = _items(rule, "apiGroups")
    return group in groups or API_GROUP_ALL in groups


def resource_matches(rule: Rule, combined: str, subresource: str) -> bool:
    """`combined` is `resource` or `resource/subresource`.  `*` matches everything;
    `*/sub` matches that subresource of any resource (never the resource itself)."""
    resources = _items(rule, "resources")
    if combined in resources or RESOURCE_ALL in resources:
        return True
    return bool(subresource) and "*/" + subresource in resources


def resource_name_matches(rule: Rule, name: str) -> bool:
    """No resourceNames: any name.  Otherwise only those names — so a request
    without a name (list, watch, create, deletecollection) never matches."""
    names = _items(rule, "resourceNames")
    return not names or name in names


def non_resource_url_matches(rule: Rule, path: str) -> bool:
    for u in _items(rule, "nonResourceURLs"):
        if not isinstance(u, str):
            continue
        if u in (NON_RESOURCE_ALL, path):
            return True
        if u.endswith("*") and path.startswith(u.rstrip("*")):
            return True
    return False


def rule_allows(attrs: Attributes, rule: Rule) -> bool:
    """Whether `rule` allows the request (RuleAllows)."""
    if attrs.resource_request:
        combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        return (verb_matches(rule, attrs.verb) and api_group_matches(rule, attrs.group)
                and resource_matches(rule, combined, attrs.subresource)
                and resource_name_matches(rule, attrs.name))
    return verb_matches(rule, attrs.verb) and non_resource_url_matches(rule, attrs.path)


def applies_to_user(user: UserInfo, subject: dict[str, Any], namespace: str) -> bool:
    """Whether a binding's subject names `user`.  A ServiceAccount subject without a
    namespace means the binding's own (only RoleBindings have one)."""
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return user.name == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or namespace
        return bool(ns) and user.name == f"{SERVICE_ACCOUNT_PREFIX}{ns}:{name}"
    return False


# ---------------------------------------------------------------------------
# Covering: do the owner's rules include every permission of the servant's?
# (pkg/registry/rbac/validation/policy_comparator.go)
# ---------------------------------------------------------------------------


def breakdown_rule(rule: Rule) -> list[Rule]:
    """The rule as atoms of one group, one resource, one verb, at most one name (or
    one URL and one verb): each atom is covered by a single owner rule or not at all."""
    out: list[Rule] = []
    verbs = _strs(rule, "verbs")
    names = _strs(rule, "resourceNames")
    for g in _strs(rule, "apiGroups"):
        for r in _strs(rule, "resources"):
            for verb in verbs:
                if names:
                    out += [{"apiGroups": [g], "resources": [r], "verbs": [verb], "resourceNames": [n]}
                            for n in names]
                else:
                    out.append({"apiGroups": [g], "resources": [r], "verbs": [verb]})
    for u in _strs(rule, "nonResourceURLs"):
        out += [{"nonResourceURLs": [u], "verbs": [verb]} for verb in verbs]
    return out


def _resources_cover(owner: list[str], wanted: list[str]) -> bool:
    if RESOURCE_ALL in owner or set(wanted) <= set(owner):
        return True
    for path in wanted:
        if path in owner:
            continue
        if "/" not in path or "*/" + path.split("/", 1)[1] not in owner:
            return False
    return True


def _url_covers(owner: str, path: str) -> bool:
    return owner == path or (owner.endswith("*") and path.startswith(owner.rstrip("*")))


def rule_covers(owner: Rule, sub: Rule) -> bool:
    """Whether `owner` (any rule) covers `sub` (an atom from `breakdown_rule`)."""
    o_verbs, o_groups = _strs(owner, "verbs"), _strs(owner, "apiGroups")
    verbs_ok = VERB_ALL in o_verbs or set(_strs(sub, "verbs")) <= set(o_verbs)
    groups_ok = API_GROUP_ALL in o_groups or set(_strs(sub, "apiGroups")) <= set(o_groups)
    resources_ok = _resources_cover(_strs(owner, "resources"), _strs(sub, "resources"))
    urls_ok = all(any(_url_covers(o, p) for o in _strs(owner, "nonResourceURLs"))
                  for p in _strs(sub, "nonResourceURLs"))
    o_names, s_names = _strs(owner, "resourceNames"), _strs(sub, "resourceNames")
    names_ok = not o_names or (bool(s_names) and set(s_names) <= set(o_names))
    return verbs_ok and groups_ok and resources_ok and names_ok and urls_ok


def covers(owner_rules: Iterable[Rule], servant_rules: Iterable[Rule]) -> tuple[bool, list[Rule]]:
    """(whether the owner's rules cover the servant's, the uncovered atoms)."""
    owners = list(owner_rules)
    missing = [sub for rule in servant_rules for sub in breakdown_rule(rule)
               if not any(rule_covers(o, sub) for o in owners)]
    return not missing, missing


def compact_rules(rules: list[Rule]) -> list[Rule]:
    """CompactRules: atoms of one group/resource (and at most one name) differing
    only in their verb become one rule."""
    out: list[Rule] = []
    simple: dict[tuple[str, str, str | None], Rule] = {}
    for r in rules:
        groups, resources, names = _strs(r, "apiGroups"), _strs(r, "resources"), _strs(r, "resourceNames")
        is_simple = (len(groups) == 1 and len(resources) == 1 and len(names) <= 1
                     and not _strs(r, "nonResourceURLs"))
        if not is_simple:
            out.append(r)
            continue
        key = (groups[0], resources[0], names[0] if names else None)
        if key in simple:
            simple[key]["verbs"] = simple[key]["verbs"] + _strs(r, "verbs")
        else:
            simple[key] = {k: list(v) for k, v in r.items()}
    return out + list(simple.values())


def _go_quote_list(items: list[str]) -> str:
    """Go's `%q` of a []string: `["a" "b"]`."""
    return "[" + " ".join(json.dumps(s) for s in items) + "]"


def compact_string(rule: Rule) -> str:
    """rbacv1helpers.CompactString: `{APIGroups:[""], Resources:["pods"], Verbs:["get"]}`."""
    parts = []
    for key, label in (("apiGroups", "APIGroups"), ("resources", "Resources"),
                       ("nonResourceURLs", "NonResourceURLs"), ("resourceNames", "ResourceNames"),
                       ("verbs", "Verbs")):
        values = _strs(rule, key)
        if values:
            parts.append(f"{label}:{_go_quote_list(values)}")
    return "{" + ", ".join(parts) + "}"


def escalation_message(user: UserInfo, missing: list[Rule], errors: list[str]) -> str:
    """ConfirmNoEscalation's message."""
    described = sorted({compact_string(r) for r in compact_rules(missing)})
    msg = (f"user {json.dumps(user.name)} (groups={_go_quote_list(list(user.groups))}) is attempting to grant "
           "RBAC permissions not currently held:\n" + "\n".join(described))
    if errors:
        msg += f"; resolution errors: [{', '.join(errors)}]"
    return msg


# ---------------------------------------------------------------------------
# The resolver and authorizer.
# ---------------------------------------------------------------------------


def _subject_keys(obj: dict[str, Any]) -> list[str]:
    """Index of a binding by who it names (`User:<name>`, `Group:<name>`; a
    ServiceAccount is the user it authenticates as), prefixed with a RoleBinding's
    namespace (`ns|User:alice`): a request looks up only the bindings that can
    apply to its user, not every binding of the namespace."""
    md = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    assert isinstance(md, dict)
    ns = md.get("namespace") or ""
    prefix = f"{ns}|" if ns else ""
    out = []
    for s in obj.get("subjects") or []:
        if not isinstance(s, dict):
            continue
        kind, name = s.get("kind"), s.get("name")
        if kind == "ServiceAccount":
            out.append(f"{prefix}User:{SERVICE_ACCOUNT_PREFIX}{s.get('namespace') or ns}:{name}")
        elif kind in ("User", "Group"):
            out.append(f"{prefix}{kind}:{name}")
    return out


def _user_keys(user: UserInfo) -> list[str]:
    return [f"User:{user.name}", *(f"Group:{g}" for g in user.groups)]


@dataclass
class RulesResult:
    """The rules that apply to a user in a namespace, in SelfSubjectRulesReview's
    JSON shape (`resourceRules`, `nonResourceRules`, `incomplete`, `evaluationError`)."""

    resource_rules: list[dict[str, Any]] = field(default_factory=list)
    non_resource_rules: list[dict[str, Any]] = field(default_factory=list)
    incomplete: bool = False
    error: str = ""


@dataclass(frozen=True)
class RuleSource:
    """Which binding (and which of its subjects) brought a rule: the allow reason."""

    binding: dict[str, Any]
    subject: dict[str, Any]
    namespace: str

    def __str__(self) -> str:
        kind = "RoleBinding" if self.namespace else "ClusterRoleBinding"
        name = self.binding["metadata"]["name"] + (f"/{self.namespace}" if self.namespace else "")
        ref = self.binding.get("roleRef") or {}
        return (f'{kind} "{name}" of {ref.get("kind")} "{ref.get("name")}" to '
                f'{self.subject.get("kind")} "{self.subject.get("name")}"')


# Called with (source, rule, error): a rule to look at, or an error (source None).
Visitor = Callable[["RuleSource | None", "Rule | None", "str | None"], bool]


MEMO_SIZE = 4096


class _Cache(WatchCache):
    """A WatchCache that counts its changes (`generation`), so decisions made from
    it can be remembered until it changes."""

    def __init__(self, prefix: str, **kw: Any) -> None:
        self.generation = 0
        super().__init__(prefix, **kw)

    def put(self, obj: dict[str, Any]) -> None:
        self.generation += 1
        super().put(obj)

    def drop(self, obj: dict[str, Any]) -> None:
        self.generation += 1
        super().drop(obj)

    def replace(self, objs: Iterable[dict[str, Any]]) -> None:
        self.generation += 1
        super().replace(objs)


def _prefix(plural: str) -> str:
    return meta.store_key(GROUP, plural, None)


class RBACAuthorizer:
    """`--authorization-mode RBAC`: allow when a bound role's rule allows.

    Also the rule resolver: `rules_for` (SelfSubjectRulesReview, escalation checks)
    and `role_ref_rules` (the rules a binding would grant)."""

    def __init__(self) -> None:
        self.roles = _Cache(_prefix("roles"))
        self.cluster_roles = _Cache(_prefix("clusterroles"))
        self.role_bindings = _Cache(_prefix("rolebindings"), indexes={"subject": _subject_keys})
        self.cluster_role_bindings = _Cache(_prefix("clusterrolebindings"), indexes={"subject": _subject_keys})
        self._memo: dict[tuple[str, tuple[str, ...], Attributes], Decision] = {}
        self._memo_generation: tuple[int, ...] = ()

    @property
    def synced(self) -> bool:
        return all(c.synced for c in self._caches())

    def _caches(self) -> tuple[WatchCache, ...]:
        return (self.roles, self.cluster_roles, self.role_bindings, self.cluster_role_bindings)

    async def run(self, store: Store, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the four caches current; started once all have listed."""
        async with trio.open_nursery() as nursery:
            for c in self._caches():
                await nursery.start(c.run, store)
            task_status.started()

    # -- the resolver ------------------------------------------------------------------
    def role_ref_rules(self, ref: dict[str, Any], namespace: str) -> tuple[list[Rule], str | None]:
        """The rules a roleRef points at, or an error (`role.rbac... "x" not found`)."""
        kind, name = ref.get("kind"), ref.get("name")
        if kind == "ClusterRole":
            obj = self.cluster_roles.get(str(name))
            if obj is None:
                return [], f'clusterrole.{GROUP} "{name}" not found'
        elif kind == "Role":
            obj = self.roles.get(f"{namespace}/{name}")
            if obj is None:
                return [], f'role.{GROUP} "{name}" not found'
        else:
            return [], f"unsupported role reference kind: {kind!r}"
        return [r for r in obj.get("rules") or [] if isinstance(r, dict)], None

    def visit_rules(self, user: UserInfo, namespace: str, visit: Visitor) -> None:
        """Every rule that applies to `user` in `namespace`, in kube's order
        (ClusterRoleBindings, then the namespace's RoleBindings); `visit` returns
        False to stop early."""
        seen: set[str] = set()
        for key in _user_keys(user):
            for crb in self.cluster_role_bindings.by_index("subject", key):
                crb_name = crb["metadata"]["name"]
                if crb_name in seen:
                    continue
                seen.add(crb_name)
                if not self._visit_binding(user, crb, "", visit):
                    return
        if namespace:
            seen.clear()
            for key in _user_keys(user):
                for rb in self.role_bindings.by_index("subject", f"{namespace}|{key}"):
                    rb_name = rb["metadata"]["name"]
                    if rb_name in seen:
                        continue
                    seen.add(rb_name)
                    if not self._visit_binding(user, rb, namespace, visit):
                        return

    def _visit_binding(self, user: UserInfo, binding: dict[str, Any], namespace: str, visit: Visitor) -> bool:
        subjects = [s for s in binding.get("subjects") or [] if isinstance(s, dict)]
        subject = next((s for s in subjects if applies_to_user(user, s, namespace)), None)
        if subject is None:
            return True
        ref = binding.get("roleRef") or {}
        rules, err = self.role_ref_rules(ref, namespace)
        if err is not None:
            return visit(None, None, err)
        source = RuleSource(binding, subject, namespace)  # formatted only when it allows
        return all(visit(source, rule, None) for rule in rules)

    def policy_rules_for(self, user: UserInfo, namespace: str) -> tuple[list[Rule], list[str]]:
        """(every applicable rule, resolution errors) — RulesFor."""
        rules: list[Rule] = []
        errors: list[str] = []

        def visit(source: RuleSource | None, rule: Rule | None, err: str | None) -> bool:
            if rule is not None:
                rules.append(rule)
            if err is not None:
                errors.append(err)
            return True

        self.visit_rules(user, namespace, visit)
        return rules, errors

    def rules_for(self, user: UserInfo, namespace: str) -> RulesResult:
        """The rules for SelfSubjectRulesReview (RBACAuthorizer.RulesFor)."""
        rules, errors = self.policy_rules_for(user, namespace)
        out = RulesResult(error=aggregate(errors))
        for r in rules:
            if _strs(r, "resources"):
                rr: dict[str, Any] = {"verbs": _strs(r, "verbs")}
                for key in ("apiGroups", "resources", "resourceNames"):
                    if _strs(r, key):
                        rr[key] = _strs(r, key)
                out.resource_rules.append(rr)
            if _strs(r, "nonResourceURLs"):
                out.non_resource_rules.append({"verbs": _strs(r, "verbs"),
                                               "nonResourceURLs": _strs(r, "nonResourceURLs")})
        return out

    # -- the authorizer ------------------------------------------------------------------
    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        # Clients repeat the same requests (a controller's list/watch/update loop), and
        # walking bindings costs ~100 µs in Python: decisions are remembered until any
        # RBAC object changes (the caches' generation moves) or the memo fills up.
        gen = self._generation()
        if gen != self._memo_generation or len(self._memo) >= MEMO_SIZE:
            self._memo.clear()
            self._memo_generation = gen
        key = (user.name, user.groups, attrs)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self.decide(user, attrs)
        return got

    def _generation(self) -> tuple[int, ...]:
        return tuple(c.generation for c in self._caches())

    def decide(self, user: UserInfo, attrs: Attributes) -> Decision:
        """The decision, from the bindings as they are now (no memo)."""
        allowed_by: list[RuleSource] = []
        errors: list[str] = []

        def visit(source: RuleSource | None, rule: Rule | None, err: str | None) -> bool:
            if rule is not None and source is not None and rule_allows(attrs, rule):
                allowed_by.append(source)
                return False
            if err is not None:
                errors.append(err)
            return True

        self.visit_rules(user, attrs.namespace, visit)
        if allowed_by:
            return Decision(True, f"RBAC: allowed by {allowed_by[0]}")
        return Decision(False, f"RBAC: {aggregate(errors)}" if errors else "", no_opinion=True)


def aggregate(errors: list[str]) -> str:
    """utilerrors.NewAggregate(...).Error(): one message, or `[a, b]`."""
    if not errors:
        return ""
    return errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"


__all__ = ["FULL_AUTHORITY", "RBACAuthorizer", "RulesResult", "aggregate", "applies_to_user", "breakdown_rule",
           "compact_rules", "compact_string", "covers", "escalation_message", "rule_allows", "rule_covers"]
