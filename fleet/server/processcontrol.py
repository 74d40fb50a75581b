"""The API server's process-control gates and Fleet's `pods/{name}/signal`.

`pods/exec`, `pods/attach`, `pods/portforward` and `pods/signal` reach into running
containers; Fleet treats them as its audited replacement for SSH, behind three gates
in this order:

1. RBAC, done by connect.py before anything here: `create` on pods/exec|attach|portforward
   as kube-apiserver authorizes them, and Fleet's own verb `signal` on pods/signal —
   never implied by `update` or `create` (only a rule naming `signal`, or `*`, grants it).
2. Consent (`ProcessControlGate.consent`): with the gate on (`fleet server --hardened`
   or `--process-control-consent`), a ProcessControl in the pod's namespace must allow
   this user, action, pod and container (fleet/api/kinds/processcontrol.py decides);
   none → 403 naming what is missing.  Off (the development default): RBAC decides.
3. Admission: the request passes the admission chain as a CONNECT, with the options
   (PodExecOptions, PodAttachOptions, PodPortForwardOptions, PodSignal) as its object,
   as kube-apiserver runs admission for connect requests (plugins see verb `connect`).

Every request, allowed or refused, leaves annotations on its audit events
(`processcontrol.fleet.dev/*`: the container, the command, the signal, and which
ProcessControl consented), so the audit line says who ran what in which container.

`POST /api/v1/namespaces/{ns}/pods/{name}/signal` with a `fleet.dev/v1 PodSignal`
body (`{"container": "c", "signal": "SIGHUP"}`) is relayed to the agent of the pod's
node (`POST /signal/{ns}/{pod}/{container}?signal=SIGHUP`, fleet/agent/api.py), which
signals the container's main process through its runtime driver.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx

from fleet.admission import AdmissionChain
from fleet.api import errors
from fleet.api.kinds import processcontrol as pckind
from fleet.api.registry import Registry
from fleet.auth import Attributes, UserInfo
from fleet.auth.audit import record_annotations
from fleet.server.http import Resp
from fleet.server.proxy import PodProxy, agent_error, select_container
from fleet.store import Store

ANNOTATION_PREFIX = "processcontrol.fleet.dev/"
CONTAINER_ANNOTATION = ANNOTATION_PREFIX + "container"
COMMAND_ANNOTATION = ANNOTATION_PREFIX + "command"
SIGNAL_ANNOTATION = ANNOTATION_PREFIX + "signal"
CONSENT_ANNOTATION = ANNOTATION_PREFIX + "consent"
ACTION_ANNOTATION = ANNOTATION_PREFIX + "action"

# The kinds admission sees as the object of each connect request.
OPTIONS_KINDS = {pckind.EXEC: "PodExecOptions", pckind.ATTACH: "PodAttachOptions",
                 pckind.PORTFORWARD: "PodPortForwardOptions"}
SIGNAL_TIMEOUT = 10.0


def consent_annotation(name: str | None, enabled: bool) -> str:
    if not enabled:
        return "gate off"
    return name if name is not None else "none"


class ProcessControlGate:
    """Gates 2 and 3 for the four process-control subresources, and pods/signal itself."""

    def __init__(self, store: Store, registry: Registry, admission: AdmissionChain | None,
                 pods: PodProxy, *, consent: bool = False) -> None:
        self.store = store
        self.registry = registry
        self.admission = admission
        self.pods = pods
        # Whether the consent gate is on (--hardened, --process-control-consent).
        self.consent_required = consent

    async def _consents(self, namespace: str) -> list[dict[str, Any]]:
        info = self.registry.get(pckind.GROUP, pckind.VERSION, "processcontrols")
        assert info is not None, "ProcessControl is not registered"
        return (await self.store.list(info.key(namespace))).items

    async def check(self, user: UserInfo, action: str, namespace: str, pod_name: str,
                    container: str | None = None, *, command: Sequence[str] = (),
                    signal: str = "", options: dict[str, Any] | None = None) -> str:
        """Consent, then admission; returns the container the request targets ("" for
        port-forward).  Raises the APIError the client should see."""
        pod = await self.pods.pod(namespace, pod_name)
        chosen = "" if action == pckind.PORTFORWARD else select_container(pod, container)
        notes = {ACTION_ANNOTATION: action}
        if chosen:
            notes[CONTAINER_ANNOTATION] = chosen
        if command:
            notes[COMMAND_ANNOTATION] = json.dumps(list(command))
        if signal:
            notes[SIGNAL_ANNOTATION] = signal
        req = pckind.Request(action, namespace, user.name, tuple(user.groups),
                             (pod.get("metadata") or {}).get("labels") or {}, chosen, signal)
        allowed_by = pckind.allowing(await self._consents(namespace), req) if self.consent_required else None
        notes[CONSENT_ANNOTATION] = consent_annotation(allowed_by, self.consent_required)
        record_annotations(notes, verb=pckind.SIGNAL if action == pckind.SIGNAL else "")
        if self.consent_required and allowed_by is None:
            raise errors.Forbidden(pckind.refusal_message(pod_name, req), name=pod_name, kind="pods")
        if self.admission is not None:
            obj = dict(options or {})
            obj.setdefault("apiVersion", pckind.API_VERSION if action == pckind.SIGNAL else "v1")
            obj.setdefault("kind", pckind.SIGNAL_KIND if action == pckind.SIGNAL else OPTIONS_KINDS[action])
            if chosen:
                obj.setdefault("container", chosen)
            attrs = Attributes("connect", "", "v1", "pods", action, namespace, pod_name)
            await self.admission.admit(attrs, user, obj, None)
        return chosen

    async def signal(self, namespace: str, pod_name: str, body: bytes, user: UserInfo) -> Resp:
        """POST pods/{name}/signal (RBAC's `signal` already checked by the caller)."""
        try:
            doc = json.loads(body or b"{}")
        except ValueError:
            raise errors.BadRequest("the request body is not a JSON PodSignal object") from None
        causes = pckind.validate_signal_request(doc)
        if causes:
            parts = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
            raise errors.BadRequest(f'PodSignal for pod "{pod_name}" is invalid: {"; ".join(parts)}',
                                    causes=causes)
        num = pckind.parse_signal(doc["signal"])
        assert num is not None
        name = pckind.signal_name(num)
        container = await self.check(user, pckind.SIGNAL, namespace, pod_name, doc.get("container") or None,
                                     signal=name, options={"signal": name})
        agent = await self.pods.pod_agent(namespace, pod_name)
        url = agent.url(f"/signal/{_q(namespace)}/{_q(pod_name)}/{_q(container)}") + f"?signal={name}"
        async with httpx.AsyncClient(timeout=SIGNAL_TIMEOUT, headers=self.pods.auth_headers(agent),
                                     verify=agent.ssl_context(self.pods.tls) or True) as http:
            try:
                resp = await http.post(url)
            except httpx.TransportError as e:
                raise errors.ServiceUnavailable(f'Post "{url}": {e or type(e).__name__}') from None
        if resp.status_code != 200:
            raise agent_error(resp.status_code, resp.content)
        return Resp.json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                               "message": f'sent {name} to container "{container}" of pod "{pod_name}"',
                               "details": {"name": pod_name, "kind": "pods"}})


def _q(part: str) -> str:
    return quote(part, safe="")
