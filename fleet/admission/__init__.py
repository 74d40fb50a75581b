"""The admission stage: mutating plugins, then validating plugins.

A plugin sees the request attributes, the new object and the old one (on
update/delete).  Mutating plugins return the (possibly changed) object;
validating plugins raise an `APIError` to refuse.  The chain is empty in
issue 2; built-in plugins (quota, limit ranges, service accounts, ...) and
webhooks join it in later issues without changing the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from fleet.auth import Attributes, UserInfo


class MutatingPlugin(Protocol):
    name: str

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]: ...


class ValidatingPlugin(Protocol):
    name: str

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None: ...


@dataclass
class AdmissionChain:
    mutating: list[MutatingPlugin] = field(default_factory=list)
    validating: list[ValidatingPlugin] = field(default_factory=list)

    async def admit(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                    old: dict[str, Any] | None) -> dict[str, Any] | None:
        """Run mutating plugins in order, then validating ones; return the admitted object."""
        if obj is not None:
            for m in self.mutating:
                obj = await m.mutate(attrs, user, obj, old)
        for v in self.validating:
            await v.validate(attrs, user, obj, old)
        return obj
