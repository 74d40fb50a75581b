"""Node join: from a bootstrap token to the node's own client certificate (the
kubelet's TLS bootstrap, kubeadm's token discovery), and its renewal.

`fleet agent --server URL --token <id>.<secret> [--ca-cert-hash sha256:...]`:

1. discovery — `kube-public/cluster-info` is fetched with the token as bearer
   (authenticated as `system:bootstrap:<id>`) over a TLS connection that cannot be
   verified yet; its kubeconfig is trusted only if `jws-kubeconfig-<id>` is a valid
   detached JWS of it by this token (and, with --ca-cert-hash, the CA's public key
   hash matches), then the CA is confirmed by a second, verified fetch;
2. TLS bootstrap — a fresh EC key and a CSR (signer
   `kubernetes.io/kube-apiserver-client-kubelet`, CN=system:node:<node>,
   O=system:nodes) are sent as the token's user; the agent waits for it to be
   approved (csrapproving) and issued (csrsigning);
3. `<data-dir>/kubelet.kubeconfig` is written (the certificate and key embedded,
   0600) and used from then on: a restarted agent reuses it and needs no token.

Rotation (`rotate_client_certificate`): once 2/3 of the certificate's lifetime has
passed the agent asks again — as the node itself (the approver's self-renewal
rule) — rewrites the kubeconfig and loads the new certificate into the running
client.  `serving_certificate` obtains a `kubernetes.io/kubelet-serving`
certificate for the agent API the same way.

Errors a person must act on (token refused, signature mismatch, CSR denied) are
`JoinError`s with a message saying so; the CLI prints it and exits.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fleet.api.kinds import certificates as csrs
from fleet.auth import (
    NODE_USER_PREFIX,
    NODES_GROUP,
    STORAGE_PROVISIONER_PREFIX,
    STORAGE_PROVISIONERS_GROUP,
    bootstrap,
)
from fleet.client import ApiException, Client, ClientConfig

log = logging.getLogger(__name__)

KUBECONFIG_NAME = "kubelet.kubeconfig"
STORAGE_KUBECONFIG_NAME = "storage-provisioner.kubeconfig"
SERVING_CERT, SERVING_KEY = "kubelet-serving.crt", "kubelet-serving.key"
CLIENT_CA_FILE = "client-ca.crt"
CLIENT_USAGES = ["digital signature", "client auth"]
SERVING_USAGES = ["digital signature", "server auth"]
CSR_API = f"{csrs.GROUP}/v1"
CSR_PLURAL = "certificatesigningrequests"
# Renew when this share of the certificate's lifetime has passed (kubelet: 70-90%).
RENEW_AT = 2 / 3


class JoinError(Exception):
    """Joining cannot go on without a person: the message says what to do."""


# ------------------------------------------------------------------------- keys + CSRs


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_csr(key: ec.EllipticCurvePrivateKey, common_name: str, organizations: Iterable[str] = (),
             dns_names: Iterable[str] = (), ip_addresses: Iterable[str] = ()) -> bytes:
    """A PEM CERTIFICATE REQUEST for `common_name` / `organizations` with these SANs."""
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs))
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def csr_object(csr_pem: bytes, signer: str, usages: list[str], *, name: str = "",
               generate_name: str = "node-csr-", expiration_seconds: int | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name} if name else {"generateName": generate_name}
    spec: dict[str, Any] = {"request": base64.b64encode(csr_pem).decode(), "signerName": signer,
                            "usages": list(usages)}
    if expiration_seconds:
        spec["expirationSeconds"] = expiration_seconds
    return {"apiVersion": CSR_API, "kind": "CertificateSigningRequest", "metadata": md, "spec": spec}


async def request_certificate(client: Client, csr_pem: bytes, signer: str, usages: list[str], *,
                              timeout: float = 3600.0, poll: float = 0.5) -> bytes:
    """Create a CSR and wait for its certificate (PEM); JoinError if denied or failed."""
    created = await client.create(CSR_API, CSR_PLURAL, csr_object(csr_pem, signer, usages))
    name = created["metadata"]["name"]
    log.info("certificate signing request %s (%s) created; waiting for approval", name, signer)
    with trio.move_on_after(timeout):
        while True:
            csr = await client.get_object(CSR_API, CSR_PLURAL, name)
            for cond in csrs.conditions(csr):
                if cond.get("type") in (csrs.DENIED, csrs.FAILED):
                    raise JoinError(f"certificate signing request {name} was {cond['type'].lower()}: "
                                    f"{cond.get('reason', '')}: {cond.get('message', '')}")
            pem = csrs.certificate_pem(csr)
            if pem:
                log.info("certificate signing request %s approved and issued", name)
                return pem
            await trio.sleep(poll)
    raise JoinError(f"certificate signing request {name} was not approved within {timeout:.0f}s: "
                    f"approve it with `kubectl certificate approve {name}`")


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class ClusterInfo:
    server: str
    ca_pem: bytes


def _refused(e: ApiException) -> JoinError:
    return JoinError(f"the server refused the bootstrap token ({e.code} {e.reason}): it is expired, "
                     "deleted or wrong; create a new one with `fleet token create`")


class _NotYet(JoinError):
    """Worth asking again: the server is not up yet, or has not signed for the token."""


async def discover(server: str, token: str, *, ca_cert_hashes: Iterable[str] = (),
                   timeout: float = 120.0) -> ClusterInfo:
    """The cluster's CA, proven by the token's JWS over cluster-info (kubeadm's
    token discovery, retried like kubeadm's until `timeout` while the server cannot
    be reached or has not signed cluster-info for the token yet).  `server` stays
    the URL the agent was given."""
    last: Exception | None = None
    with trio.move_on_after(timeout):
        while True:
            try:
                return await _discover_once(server, token, ca_cert_hashes)
            except (_NotYet, httpx.TransportError) as e:
                if last is None or str(last) != str(e):
                    log.info("discovery: %s; retrying", e)
                last = e
            await trio.sleep(1.0)
    raise JoinError(f"discovery failed after {timeout:.0f}s: {last}")


async def _discover_once(server: str, token: str, ca_cert_hashes: Iterable[str]) -> ClusterInfo:
    parsed = bootstrap.parse_token(token)
    if parsed is None:
        raise JoinError("the join token is not a bootstrap token (<6 chars>.<16 chars>)")
    token_id, token_sec = parsed
    path = f"/api/v1/namespaces/{bootstrap.CLUSTER_INFO_NAMESPACE}/configmaps/{bootstrap.CLUSTER_INFO_NAME}"
    insecure = ClientConfig(server=server, token=token, insecure_skip_tls_verify=True)
    try:
        async with Client(insecure, user_agent="fleet-agent/bootstrap") as c:
            cm = await c.get(path)
    except ApiException as e:
        if e.code in (401, 403):
            raise _refused(e) from None
        raise
    data = cm.get("data") or {}
    kubeconfig = data.get(bootstrap.KUBECONFIG_KEY)
    if not isinstance(kubeconfig, str):
        raise JoinError("cluster-info has no kubeconfig")
    jws = data.get(bootstrap.JWS_PREFIX + token_id)
    if not isinstance(jws, str):
        raise _NotYet(f"there is no JWS signed token in the cluster-info ConfigMap for token ID "
                        f"\"{token_id}\" (the bootstrap signer has not signed it yet, or the token is "
                        "not a signing token)")
    if not bootstrap.verify_detached_signature(kubeconfig, jws, token_id, token_sec):
        raise JoinError(f"failed to verify JWS signature of received cluster info object, can't trust "
                        f"this API Server (token ID \"{token_id}\")")
    _, ca_pem = bootstrap.parse_cluster_info_kubeconfig(kubeconfig)
    hashes_ = [h.lower() for h in ca_cert_hashes]
    if hashes_:
        got = bootstrap.ca_cert_hash(ca_pem)
        if got not in hashes_:
            raise JoinError(f"cluster CA found in cluster-info ConfigMap is not trusted: public key "
                            f"hash {got} does not match --ca-cert-hash")
    else:
        log.warning("joining without --ca-cert-hash: the CA is trusted on the token's signature only")
    # Confirm over a verified connection that this server holds that CA's key.
    async with Client(ClientConfig(server=server, token=token, ca_data=ca_pem),
                      user_agent="fleet-agent/bootstrap") as c:
        try:
            await c.get(path)
        except httpx.HTTPError as e:
            raise JoinError(f"the server's certificate is not signed by the cluster CA: {e}") from None
    return ClusterInfo(server, ca_pem)


# -------------------------------------------------------------------------- kubeconfig


def kubeconfig_text(server: str, ca_pem: bytes, cert_pem: bytes, key: bytes, node_name: str, *,
                    user: str | None = None) -> str:
    """A kubeconfig for one client certificate (the node's, unless `user` names another)."""
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    user = user or NODE_USER_PREFIX + node_name
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "fleet", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert_pem),
                                          "client-key-data": b64(key)}}],
        "contexts": [{"name": "fleet", "context": {"cluster": "fleet", "user": user}}],
        "current-context": "fleet", "preferences": {},
    }, sort_keys=False)


def _write_private(path: Path, data: str | bytes) -> None:
    from fleet.auth.pki import write_private

    write_private(path, data)


def certificate_window(cert_pem: bytes) -> tuple[dt.datetime, dt.datetime]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def renew_at(cert_pem: bytes) -> dt.datetime:
    start, end = certificate_window(cert_pem)
    return start + (end - start) * RENEW_AT


def usable_kubeconfig(path: Path, now: dt.datetime | None = None) -> ClientConfig | None:
    """The kubeconfig at `path` if it holds a certificate still valid (else None)."""
    from fleet.client import KubeconfigError, load_kubeconfig

    if not path.is_file():
        return None
    try:
        cfg = load_kubeconfig(str(path))
    except KubeconfigError:
        return None
    if not cfg.client_cert_data:
        return None
    try:
        _, end = certificate_window(cfg.client_cert_data)
    except ValueError:
        return None
    if end <= (now or dt.datetime.now(dt.UTC)):
        log.warning("%s holds an expired certificate; joining again", path)
        return None
    return cfg


async def join(server: str, token: str, node_name: str, data_dir: Path, *,
               ca_cert_hashes: Iterable[str] = (), timeout: float = 3600.0) -> ClientConfig:
    """Discovery + TLS bootstrap; writes and returns the node's kubeconfig."""
    info = await discover(server, token, ca_cert_hashes=ca_cert_hashes)
    key = new_key()
    csr_pem = make_csr(key, NODE_USER_PREFIX + node_name, [NODES_GROUP])
    async with Client(ClientConfig(server=info.server, token=token, ca_data=info.ca_pem),
                      user_agent=f"fleet-agent/{node_name}") as c:
        try:
            cert = await request_certificate(c, csr_pem, csrs.KUBE_APISERVER_CLIENT_KUBELET, CLIENT_USAGES,
                                             timeout=timeout)
        except ApiException as e:
            if e.code == 401:
                raise _refused(e) from None
            raise
    path = Path(data_dir) / KUBECONFIG_NAME
    await trio.to_thread.run_sync(_write_private, path,
                                  kubeconfig_text(info.server, info.ca_pem, cert, key_pem(key), node_name))
    log.info("joined as %s%s; credentials in %s", NODE_USER_PREFIX, node_name, path)
    cfg = usable_kubeconfig(path)
    assert cfg is not None
    return cfg


async def node_credentials(cfg: Any) -> ClientConfig | None:
    """What the agent (fleet.agent.config.AgentConfig `cfg`) authenticates with when it
    joins with a bootstrap token: its kubeconfig from an earlier join, or a fresh join.
    None when the agent was given no bootstrap token (an admin token or a kubeconfig:
    used as they are)."""
    path = Path(cfg.data_dir) / KUBECONFIG_NAME
    existing = await trio.to_thread.run_sync(usable_kubeconfig, path)
    if existing is not None and (cfg.token is None or bootstrap.parse_token(cfg.token) is not None):
        return existing
    if cfg.token is None or bootstrap.parse_token(cfg.token) is None or cfg.kubeconfig:
        return None
    return await join(cfg.server_url, cfg.token, cfg.node_name, Path(cfg.data_dir),
                      ca_cert_hashes=list(getattr(cfg, "ca_cert_hashes", []) or []))


# ---------------------------------------------------------------------------- rotation


@dataclass(frozen=True)
class Identity:
    """A client certificate the agent keeps for itself: who (CN, O), through which
    signer, in which kubeconfig under its data dir."""

    kubeconfig: str
    cn: str
    orgs: tuple[str, ...]
    signer: str
    user: str | None = None  # the kubeconfig's user entry (default: the node's)


def node_identity(node_name: str) -> Identity:
    return Identity(KUBECONFIG_NAME, NODE_USER_PREFIX + node_name, (NODES_GROUP,),
                    csrs.KUBE_APISERVER_CLIENT_KUBELET)


def storage_identity(node_name: str) -> Identity:
    """The node-local storage provisioner's (`system:fleet:storage-provisioner:<node>`,
    a `kube-apiserver-client` certificate csrapproving grants a node for its own name)."""
    return Identity(STORAGE_KUBECONFIG_NAME, STORAGE_PROVISIONER_PREFIX + node_name,
                    (STORAGE_PROVISIONERS_GROUP,), csrs.KUBE_APISERVER_CLIENT,
                    user=STORAGE_PROVISIONER_PREFIX + node_name)


async def identity_credentials(client: Client, node_name: str, data_dir: Path, ident: Identity, *,
                               timeout: float = 600.0) -> ClientConfig:
    """`ident`'s kubeconfig: the one on disk while its certificate has more than 1/3
    of its life left, else a fresh key and CSR (asked as the node, over `client`)."""
    path = Path(data_dir) / ident.kubeconfig
    current = await trio.to_thread.run_sync(usable_kubeconfig, path)
    if current is not None and current.client_cert_data and \
            renew_at(current.client_cert_data) > dt.datetime.now(dt.UTC):
        return current
    key = new_key()
    cert = await request_certificate(client, make_csr(key, ident.cn, list(ident.orgs)), ident.signer,
                                     CLIENT_USAGES, timeout=timeout)
    cfg = client.config
    assert cfg.ca_data is not None
    await trio.to_thread.run_sync(_write_private, path, kubeconfig_text(
        cfg.server, cfg.ca_data, cert, key_pem(key), node_name, user=ident.user))
    fresh = await trio.to_thread.run_sync(usable_kubeconfig, path)
    assert fresh is not None
    return fresh


async def rotate_client_certificate(client: Client, node_name: str, data_dir: Path, *,
                                    clock: Any = None, ident: Identity | None = None,
                                    holder: Client | None = None) -> None:
    """Renew a client certificate (the node's, or `ident`'s) at 2/3 of its lifetime,
    for ever: a new key and CSR asked as the node itself (over `client`), the
    kubeconfig rewritten, and the running client using that identity (`holder`,
    default `client`) given the new pair."""
    ident = ident or node_identity(node_name)
    path = Path(data_dir) / ident.kubeconfig
    while True:
        current = await trio.to_thread.run_sync(usable_kubeconfig, path)
        if current is None or current.client_cert_data is None:
            return
        wait = (renew_at(current.client_cert_data) - (clock or dt.datetime.now)(dt.UTC)).total_seconds()
        if wait > 0:
            await trio.sleep(wait)
        key = new_key()
        csr_pem = make_csr(key, ident.cn, list(ident.orgs))
        try:
            cert = await request_certificate(client, csr_pem, ident.signer, CLIENT_USAGES, timeout=600)
        except (ApiException, JoinError, httpx.HTTPError) as e:
            log.warning("%s certificate rotation failed: %s; retrying in 60s", ident.cn, e)
            await trio.sleep(60)
            continue
        assert current.ca_data is not None
        await trio.to_thread.run_sync(_write_private, path, kubeconfig_text(
            current.server, current.ca_data, cert, key_pem(key), node_name, user=ident.user))
        (holder or client).reload_client_certificate(cert, key_pem(key))
        log.info("%s certificate rotated; valid until %s", ident.cn, certificate_window(cert)[1])


async def serving_certificate(client: Client, node_name: str, data_dir: Path, addresses: Iterable[str],
                              *, timeout: float = 600.0) -> tuple[Path, Path]:
    """A kubelet-serving certificate for the agent API (reused while it has more than
    1/3 of its lifetime left): (cert file, key file)."""
    cert_path, key_path = Path(data_dir) / SERVING_CERT, Path(data_dir) / SERVING_KEY
    if cert_path.is_file() and key_path.is_file():
        try:
            if renew_at(cert_path.read_bytes()) > dt.datetime.now(dt.UTC):
                return cert_path, key_path
        except ValueError:
            pass
    ips, dns = [], [node_name]
    for a in dict.fromkeys(addresses):
        try:
            ips.append(str(ipaddress.ip_address(a)))
        except ValueError:
            dns.append(a)
    key = new_key()
    csr_pem = make_csr(key, NODE_USER_PREFIX + node_name, [NODES_GROUP], dns, ips)
    cert = await request_certificate(client, csr_pem, csrs.KUBELET_SERVING, SERVING_USAGES, timeout=timeout)
    await trio.to_thread.run_sync(_write_private, key_path, key_pem(key))
    await trio.to_thread.run_sync(_write_private, cert_path, cert)
    return cert_path, key_path


async def client_ca_bundle(client: Client, data_dir: Path) -> Path:
    """The cluster's client CA bundle (what signs the API server's client certificate
    for agents), read from kube-system/extension-apiserver-authentication over the
    verified connection and kept as `<data-dir>/client-ca.crt`."""
    from fleet.auth.bootstrap import CLIENT_CA_KEY, CLIENT_CA_NAME, CLIENT_CA_NAMESPACE

    cm = await client.get_object("v1", "configmaps", CLIENT_CA_NAME, CLIENT_CA_NAMESPACE)
    bundle = str(((cm or {}).get("data") or {}).get(CLIENT_CA_KEY) or "")
    if "BEGIN CERTIFICATE" not in bundle:
        raise JoinError(f"{CLIENT_CA_NAMESPACE}/{CLIENT_CA_NAME} holds no {CLIENT_CA_KEY}")
    path = Path(data_dir) / CLIENT_CA_FILE
    await trio.to_thread.run_sync(_write_atomic, path, bundle.encode())
    return path


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


async def keep_client_ca(client: Client, data_dir: Path, *, interval: float = 600.0) -> None:
    """Re-read the client CA bundle every `interval` seconds, for ever: after a CA
    rotation (`fleet certs rotate`) the bundle holds the new CA before the old one's
    overlap ends, so the agent API keeps accepting the server."""
    while True:
        await trio.sleep(interval)
        try:
            await client_ca_bundle(client, data_dir)
        except (ApiException, JoinError, httpx.HTTPError, OSError) as e:
            log.warning("client CA bundle: %s; keeping the one on disk", e)


async def keep_serving_certificate(client: Client, node_name: str, data_dir: Path, addresses: Iterable[str],
                                   *, retry: float = 30.0) -> None:
    """The agent API's serving certificate, obtained as the node (a kubelet-serving CSR
    the approver grants for the node's own name) and renewed at 2/3 of its lifetime,
    for ever.  The files are `<data-dir>/kubelet-serving.crt|key`, what the agent
    API's TLS listener serves (fleet/agent/api.py)."""
    addresses = [a for a in addresses if a]
    while True:
        try:
            cert_path, _ = await serving_certificate(client, node_name, data_dir, addresses)
            cert = await trio.to_thread.run_sync(cert_path.read_bytes)
        except (ApiException, JoinError, httpx.HTTPError, OSError, ValueError) as e:
            log.warning("kubelet serving certificate: %s; retrying in %.0fs", e, retry)
            await trio.sleep(retry)
            continue
        wait = (renew_at(cert) - dt.datetime.now(dt.UTC)).total_seconds()
        await trio.sleep(max(wait, 1.0))
