"""`authentication.k8s.io/v1` TokenReview and SelfSubjectReview: create-only, never stored.

As in kube-apiserver these kinds have no storage: a POST is answered by the
server's authentication stack (fleet/server/tokenapi.py, wired through
fleet/server/security.py) and the object comes back with its `status` filled.
They are registered so that discovery lists them (`kubectl auth whoami` looks
for selfsubjectreviews) and so that name resolution and OpenAPI know them;
hence the only verb, `create`.

TokenRequest is not a resource of its own: it is what `serviceaccounts/token`
(on the core ServiceAccount kind) takes and returns.
"""

from __future__ import annotations

from fleet.api.registry import KindInfo

GROUP = "authentication.k8s.io"

TOKEN_REVIEW = KindInfo(
    group=GROUP, version="v1", kind="TokenReview", plural="tokenreviews", singular="tokenreview",
    namespaced=False, verbs=("create",),
)

SELF_SUBJECT_REVIEW = KindInfo(
    group=GROUP, version="v1", kind="SelfSubjectReview", plural="selfsubjectreviews",
    singular="selfsubjectreview", namespaced=False, verbs=("create",),
)

KINDS = (TOKEN_REVIEW, SELF_SUBJECT_REVIEW)
