"""A small authorizer + rule resolver for the reviews and impersonation tests.

`GrantAuthorizer` allows what its grants say (by user or group), refuses outright
what its denials say, and has no opinion otherwise — the three answers an authorizer
in a union can give.  It also lists its grants as SelfSubjectRulesReview rules
(`rules_for`), like the RBAC authorizer does, so it doubles as the test RuleResolver.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.auth import (
    ADMIN,
    Attributes,
    Decision,
    MastersBypass,
    TokenAuthenticator,
    UnionAuthenticator,
    UnionAuthorizer,
    UserInfo,
)
from fleet.auth.reviews import RulesResult, UnionRuleResolver
from fleet.auth.reviews import handlers as review_handlers
from fleet.testing.apiserver import TOKEN, InProcessAPI, open_api


@dataclass(frozen=True)
class Grant:
    """verbs on group/resource[/subresource] (names: resourceNames), in `namespace`
    ("" = every namespace), or on non-resource `urls`."""

    verbs: tuple[str, ...]
    group: str = ""
    resource: str = ""
    namespace: str = ""
    names: tuple[str, ...] = ()
    urls: tuple[str, ...] = ()

    def matches(self, a: Attributes) -> bool:
        if "*" not in self.verbs and a.verb not in self.verbs:
            return False
        if not a.resource_request:
            return any(u == "*" or u == a.path for u in self.urls)
        if self.urls:
            return False
        resource = a.resource + (f"/{a.subresource}" if a.subresource else "")
        return (self.group in ("*", a.group) and self.resource in ("*", resource)
                and self.namespace in ("", a.namespace)
                and (not self.names or a.name in self.names))

    def rule(self) -> tuple[str, dict[str, Any]]:
        if self.urls:
            return "non", {"verbs": list(self.verbs), "nonResourceURLs": list(self.urls)}
        r: dict[str, Any] = {"verbs": list(self.verbs), "apiGroups": [self.group], "resources": [self.resource]}
        if self.names:
            r["resourceNames"] = list(self.names)
        return "res", r


@dataclass
class GrantAuthorizer:
    grants: dict[str, list[Grant]] = field(default_factory=dict)  # user or group name -> grants
    denials: dict[str, list[Grant]] = field(default_factory=dict)

    def _mine(self, table: dict[str, list[Grant]], user: UserInfo) -> list[Grant]:
        return [g for who in (user.name, *user.groups) for g in table.get(who, [])]

    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        if any(g.matches(attrs) for g in self._mine(self.denials, user)):
            return Decision(False, "denied by the test authorizer")
        if any(g.matches(attrs) for g in self._mine(self.grants, user)):
            return Decision(True, "granted by the test authorizer")
        return Decision(False, no_opinion=True)

    def rules_for(self, user: UserInfo, namespace: str) -> RulesResult:
        out = RulesResult()
        for g in self._mine(self.grants, user):
            if g.namespace and g.namespace != namespace:
                continue
            kind, rule = g.rule()
            (out.non_resource_rules if kind == "non" else out.resource_rules).append(rule)
        return out


# Everyone may ask the self reviews and read discovery (system:basic-user / system:discovery).
BASIC = [Grant(("create",), "authorization.k8s.io", "selfsubjectaccessreviews"),
         Grant(("create",), "authorization.k8s.io", "selfsubjectrulesreviews"),
         Grant(("get",), urls=("/api", "/apis", "/version"))]

ALICE = UserInfo("alice", "alice-uid", ("devs",))
BOB = UserInfo("bob", groups=("viewers",))
TOKENS = {"alice-token": ALICE, "bob-token": BOB, TOKEN: ADMIN}


def make_authorizer() -> GrantAuthorizer:
    return GrantAuthorizer(
        grants={
            "system:authenticated": list(BASIC),
            "alice": [Grant(("get", "list"), "", "pods", "team-a"),
                      Grant(("create",), "", "pods", "team-a"),
                      Grant(("get",), urls=("/healthz",))],
            "devs": [Grant(("get",), "apps", "deployments")],
            "viewers": [Grant(("get", "list"), "", "pods")],
        },
        denials={"alice": [Grant(("delete",), "", "pods", "team-a")]},
    )


@asynccontextmanager
async def review_api(tmp_path: Path, authz: GrantAuthorizer | None = None) -> AsyncIterator[InProcessAPI]:
    """The in-process API with the test tokens, masters bypass + `authz`, and the
    review handlers wired as fleet/server/security.py wires them."""
    authz = authz or make_authorizer()
    async with open_api(tmp_path, namespace_controller=False, sync="OFF") as api:
        authorizer = UnionAuthorizer(MastersBypass(), authz)
        api.server.authenticator = UnionAuthenticator(TokenAuthenticator(TOKENS))
        api.server.authorizer = authorizer
        api.server.resource_handlers.update(review_handlers(authorizer, UnionRuleResolver(authz)))
        yield api
