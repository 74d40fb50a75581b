"""ServiceAccount: every pod runs as a ServiceAccount and gets its API credentials mounted.

kube-apiserver's plugin (plugin/pkg/admission/serviceaccount, as of 1.32), on pod
**create** only (other verbs and subresources pass untouched):

* `spec.serviceAccountName` defaults to `default` (the deprecated `serviceAccount`
  mirrors it);
* the account must exist, else 403 `error looking up service account ns/name:
  serviceaccount "name" not found`.  The lookup asks the watch-fed cache, then the
  store — for `default` again every 100-200 ms, because the ServiceAccount controller
  creates it a moment after the namespace and a pod created right then should not
  fail.  Kubernetes tries 10 times (1-2 s); we keep trying for up to 5 s, since a
  freshly started server's controller manager (or a loaded test machine) can take
  longer than that to list and react, and a pod refused for it is a flake;
* unless `automountServiceAccountToken` says false (the pod's setting wins over the
  account's; unset on both means true), a projected volume `kube-api-access-<5
  random chars>` — a bound token (3607 s, `token`), `ca.crt` from the
  `kube-root-ca.crt` ConfigMap and the `namespace` from the downward API, defaultMode
  0644 — is added and mounted read-only at /var/run/secrets/kubernetes.io/serviceaccount
  in every init and app container that has no mount at that path yet; a pod that
  already has a `kube-api-access-*` volume keeps it (no second one);
* a pod without imagePullSecrets gets the account's;
* with the account annotated `kubernetes.io/enforce-mountable-secrets: "true"`, secret
  volumes, secretKeyRef env and imagePullSecrets must name secrets the account lists.

Mirror pods (annotation `kubernetes.io/config.mirror`) are never changed, and may not
reference a ServiceAccount, secrets or token projections (403).

The volume is added only when the server issues bound tokens (`mount_tokens`; kube's
`MountServiceAccountToken`): `fleet/server/run.py` turns it on when the TokenRequest
subresource (`serviceaccounts/token`) is served, so no pod is given a volume its node
could never fill.

The decisions are pure functions (`token_volume_source`, `should_automount`,
`mount_service_account_token`, `mirror_pod_violation`, `secret_reference_violation`)
beside the thin plugin class.
"""

from __future__ import annotations

import copy
import logging
import random
import secrets
from collections.abc import Callable
from typing import Any

import trio

from fleet.admission.priority import forbidden
from fleet.api import meta
from fleet.auth import Attributes, UserInfo
from fleet.store import KeyNotFound, Store
from fleet.store.watchcache import WatchCache

log = logging.getLogger(__name__)

PLUGIN_NAME = "ServiceAccount"
DEFAULT_SERVICE_ACCOUNT_NAME = "default"
SERVICE_ACCOUNT_VOLUME_NAME = "kube-api-access"
DEFAULT_API_TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# serviceaccount.WarnOnlyBoundTokenExpirationSeconds: the server may extend such tokens
# (to a year) and only warn when one is used after 3607 s; the kubelet refreshes at 80%.
WARN_ONLY_BOUND_TOKEN_EXPIRATION_SECONDS = 3607
PROJECTED_VOLUME_DEFAULT_MODE = 0o644  # corev1.ProjectedVolumeSourceDefaultMode (420)
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
ROOT_CA_KEY = "ca.crt"
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
ENFORCE_MOUNTABLE_SECRETS_ANNOTATION = "kubernetes.io/enforce-mountable-secrets"
PREFIX = meta.store_key("", "serviceaccounts", None)

# getServiceAccount: how long the `default` account is waited for (see the docstring).
DEFAULT_ACCOUNT_WAIT = 5.0

# names.SimpleNameGenerator's alphabet (no vowels, no look-alike digits).
_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"


def generate_volume_name(prefix: str = SERVICE_ACCOUNT_VOLUME_NAME + "-") -> str:
    """`kube-api-access-` + 5 random characters, as names.SimpleNameGenerator makes them."""
    return prefix + "".join(secrets.choice(_ALPHANUMS) for _ in range(5))


class ServiceAccountCache(WatchCache):
    """ServiceAccounts by `namespace/name` (a `WatchCache`, see fleet/store/watchcache.py)."""

    def __init__(self) -> None:
        super().__init__(PREFIX)


# -- the pure parts ----------------------------------------------------------------------


def token_volume_source() -> dict[str, Any]:
    """The projected volume source kube-apiserver 1.32 writes (`TokenVolumeSource`)."""
    return {
        "defaultMode": PROJECTED_VOLUME_DEFAULT_MODE,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": WARN_ONLY_BOUND_TOKEN_EXPIRATION_SECONDS,
                                     "path": "token"}},
            {"configMap": {"name": ROOT_CA_CONFIGMAP,
                           "items": [{"key": ROOT_CA_KEY, "path": ROOT_CA_KEY}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                                        "fieldRef": {"apiVersion": "v1",
                                                     "fieldPath": "metadata.namespace"}}]}},
        ],
    }


def should_automount(account: dict[str, Any], pod_spec: dict[str, Any]) -> bool:
    """The pod's `automountServiceAccountToken` wins, then the account's; unset → True."""
    mine = pod_spec.get("automountServiceAccountToken")
    if isinstance(mine, bool):
        return mine
    theirs = account.get("automountServiceAccountToken")
    if isinstance(theirs, bool):
        return theirs
    return True


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def mount_service_account_token(spec: dict[str, Any],
                                generate_name: Callable[[], str] = generate_volume_name) -> None:
    """Add the token volume and its mounts to `spec`, in place (kube's
    `mountServiceAccountToken`): an existing `kube-api-access-*` volume is reused, a
    container with a mount at the API token path keeps its own, and the volume is
    added only if some container mounts it."""
    volume_name = ""
    for vol in _dicts(spec.get("volumes")):
        name = vol.get("name")
        if isinstance(name, str) and name.startswith(SERVICE_ACCOUNT_VOLUME_NAME + "-"):
            volume_name = name
            break
    has_volume = bool(volume_name)
    if not volume_name:
        volume_name = generate_name()
    needs_volume = False
    for key in ("initContainers", "containers"):
        for container in _dicts(spec.get(key)):
            mounts = container.get("volumeMounts")
            if mounts is None:
                mounts = container["volumeMounts"] = []
            if not isinstance(mounts, list):
                continue  # validation reports it
            if any(isinstance(m, dict) and m.get("mountPath") == DEFAULT_API_TOKEN_MOUNT_PATH
                   for m in mounts):
                continue
            mounts.append({"name": volume_name, "readOnly": True,
                           "mountPath": DEFAULT_API_TOKEN_MOUNT_PATH})
            needs_volume = True
    if needs_volume and not has_volume:
        volumes = spec.get("volumes")
        if not isinstance(volumes, list):
            volumes = spec["volumes"] = []
        volumes.append({"name": volume_name, "projected": token_volume_source()})


def _secret_names(spec: dict[str, Any]) -> list[str]:
    """Every Secret a pod spec names (podutil.VisitPodSecretNames, AllContainers)."""
    names = [r.get("name") for r in _dicts(spec.get("imagePullSecrets"))]
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in _dicts(spec.get(key)):
            names += [(e.get("secretRef") or {}).get("name") for e in _dicts(c.get("envFrom"))]
            names += [((e.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name")
                      for e in _dicts(c.get("env"))]
    for vol in _dicts(spec.get("volumes")):
        if isinstance(vol.get("secret"), dict):
            names.append(vol["secret"].get("secretName"))
        for src in _dicts((vol.get("projected") or {}).get("sources")
                          if isinstance(vol.get("projected"), dict) else None):
            if isinstance(src.get("secret"), dict):
                names.append(src["secret"].get("name"))
        csi = vol.get("csi")
        if isinstance(csi, dict) and isinstance(csi.get("nodePublishSecretRef"), dict):
            names.append(csi["nodePublishSecretRef"].get("name"))
    return [n for n in names if isinstance(n, str) and n]


def mirror_pod_violation(pod: dict[str, Any]) -> str | None:
    """Why a mirror pod may not be created (kube's `Validate` for mirror pods), or None."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    if spec.get("serviceAccountName"):
        return "a mirror pod may not reference service accounts"
    if _secret_names(spec):
        return "a mirror pod may not reference secrets"
    for vol in _dicts(spec.get("volumes")):
        proj = vol.get("projected")
        if isinstance(proj, dict) and any("serviceAccountToken" in s for s in _dicts(proj.get("sources"))):
            return "a mirror pod may not use ServiceAccountToken volume projections"
    return None


def enforce_mountable_secrets(account: dict[str, Any]) -> bool:
    value = ((account.get("metadata") or {}).get("annotations") or {}).get(
        ENFORCE_MOUNTABLE_SECRETS_ANNOTATION)
    return isinstance(value, str) and value.lower() in ("1", "t", "true")  # strconv.ParseBool


def secret_reference_violation(account: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """kube's `limitSecretReferences`: a pod of an account that enforces mountable secrets
    may use only the secrets the account lists (and pull only with its pull secrets)."""
    name = (account.get("metadata") or {}).get("name", "")
    mountable = {r.get("name") for r in _dicts(account.get("secrets"))}
    for vol in _dicts(spec.get("volumes")):
        if isinstance(vol.get("secret"), dict):
            secret = vol["secret"].get("secretName")
            if secret not in mountable:
                return (f'volume with secret.secretName="{secret}" is not allowed because service '
                        f"account {name} does not reference that secret")
    for key, what in (("initContainers", "init container"), ("containers", "container")):
        for c in _dicts(spec.get(key)):
            for env in _dicts(c.get("env")):
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if isinstance(ref, dict) and ref.get("name") not in mountable:
                    return (f"{what} {c.get('name')} with envVar {env.get('name')} referencing "
                            f'secret.secretName="{ref.get("name")}" is not allowed because service '
                            f"account {name} does not reference that secret")
    pull = {r.get("name") for r in _dicts(account.get("imagePullSecrets"))}
    for i, ref in enumerate(_dicts(spec.get("imagePullSecrets"))):
        if ref.get("name") not in pull:
            return (f'imagePullSecrets[{i}].name="{ref.get("name")}" is not allowed because service '
                    f"account {name} does not reference that imagePullSecret")
    return None


def is_mirror_pod(pod: dict[str, Any]) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations")
    return isinstance(annotations, dict) and MIRROR_POD_ANNOTATION in annotations


# -- the plugin --------------------------------------------------------------------------


class AccountNotFound(Exception):
    pass


class ServiceAccount:
    """Mutating and validating admission plugin for pod creates (see the module docstring)."""

    name = PLUGIN_NAME

    def __init__(self, store: Store, cache: ServiceAccountCache | None = None, *,
                 mount_tokens: bool = True,
                 generate_name: Callable[[], str] = generate_volume_name) -> None:
        self.store = store
        self.cache = cache if cache is not None else ServiceAccountCache()
        self.mount_tokens = mount_tokens
        self.generate_name = generate_name

    @staticmethod
    def _applies(attrs: Attributes, obj: dict[str, Any] | None) -> bool:
        return ((attrs.group, attrs.resource, attrs.verb) == ("", "pods", "create")
                and not attrs.subresource and isinstance(obj, dict)
                and isinstance(obj.get("spec"), dict))

    async def _get(self, namespace: str, name: str) -> dict[str, Any]:
        """getServiceAccount: the cache, then the store (repeatedly for `default`)."""
        if self.cache.synced:
            found = self.cache.get(f"{namespace}/{name}")
            if found is not None:
                return found
        wait = DEFAULT_ACCOUNT_WAIT if name == DEFAULT_SERVICE_ACCOUNT_NAME else 0.0
        deadline = trio.current_time() + wait
        interval = (100 + random.randrange(100)) / 1000
        key = meta.store_key("", "serviceaccounts", namespace, name)
        while True:
            try:
                return await self.store.get(key)
            except KeyNotFound:
                pass
            if trio.current_time() + interval > deadline:
                raise AccountNotFound(f'serviceaccount "{name}" not found')
            await trio.sleep(interval)

    async def _account(self, attrs: Attributes, namespace: str, name: str) -> dict[str, Any]:
        try:
            return await self._get(namespace, name)
        except AccountNotFound as e:
            raise forbidden("pods", "", attrs.name,
                            f"error looking up service account {namespace}/{name}: {e}") from None

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]:
        if not self._applies(attrs, obj) or is_mirror_pod(obj):
            return obj  # mirror pods: never changed; `validate` judges them
        spec = obj["spec"]
        name = spec.get("serviceAccountName")
        if not isinstance(name, str):
            if name is not None:
                return obj  # a type error: validation reports it
            name = ""
        if not name:
            name = spec["serviceAccountName"] = DEFAULT_SERVICE_ACCOUNT_NAME
        spec["serviceAccount"] = name
        namespace = attrs.namespace or (obj.get("metadata") or {}).get("namespace") or "default"
        account = await self._account(attrs, namespace, name)
        if self.mount_tokens and should_automount(account, spec):
            mount_service_account_token(spec, self.generate_name)
        if not spec.get("imagePullSecrets"):
            pull = [{"name": r["name"]} for r in _dicts(account.get("imagePullSecrets"))
                    if isinstance(r.get("name"), str)]
            if pull:
                spec["imagePullSecrets"] = copy.deepcopy(pull)
        return obj

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        if not self._applies(attrs, obj):
            return
        assert obj is not None
        if is_mirror_pod(obj):
            why = mirror_pod_violation(obj)
            if why is not None:
                raise forbidden("pods", "", attrs.name, why)
            return
        spec = obj["spec"]
        name = spec.get("serviceAccountName")
        if not isinstance(name, str) or not name:
            raise forbidden("pods", "", attrs.name,
                            f"no service account specified for pod {attrs.namespace}/{attrs.name}")
        # A mutating plugin after ours (a webhook) may have changed the name: look again.
        account = await self._account(attrs, attrs.namespace or "default", name)
        if enforce_mountable_secrets(account):
            why = secret_reference_violation(account, spec)
            if why is not None:
                raise forbidden("pods", "", attrs.name, why)
