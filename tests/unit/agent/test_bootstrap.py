"""The agent's side of node join: kubeconfig reuse, client certificate rotation at
2/3 of its lifetime (as the node itself) and the kubelet-serving certificate —
against a fake API that approves and signs as the CSR controllers do."""

from __future__ import annotations

import base64
import copy
import datetime as dt
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from cryptography import x509

from fleet.agent import bootstrap as nb
from fleet.api.kinds import certificates as c
from fleet.auth.pki import ClusterPKI, write_private
from fleet.controllers import csr_plan

NODE = "n1"


class FakeAPI:
    """create/get_object of CSRs; each CSR is decided by csr_plan (as the node's
    requests arrive: username system:node:n1) and signed by the local CA."""

    def __init__(self, signer: ClusterPKI, *, user: str = "system:node:n1") -> None:
        self.signer = signer
        self.user = user
        self.csrs: dict[str, dict[str, Any]] = {}
        self.reloaded: list[tuple[bytes, bytes]] = []
        self.reload_event = trio.Event()

    async def create(self, api: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        obj["metadata"]["name"] = f"csr-{len(self.csrs)}"
        obj["spec"].update(username=self.user, groups=["system:nodes", "system:authenticated"])
        self.csrs[obj["metadata"]["name"]] = obj
        return obj

    async def get_object(self, api: str, plural: str, name: str) -> dict[str, Any]:
        obj = self.csrs[name]
        req = c.parse_request(c.request_pem(obj))
        verdict = csr_plan.approval(obj, req)
        if verdict.action != csr_plan.SKIP:
            ctype = c.APPROVED if verdict.action == csr_plan.APPROVE else c.DENIED
            obj.setdefault("status", {})["conditions"] = [c.condition(ctype, verdict.reason, verdict.message)]
        action = csr_plan.signing(obj, req)
        if action is not None and not action.failure:
            cert = self.signer.sign_csr(c.request_pem(obj), signer=obj["spec"]["signerName"],
                                        usages=action.usages, ttl=dt.timedelta(hours=3))
            obj["status"]["certificate"] = base64.b64encode(cert).decode()
        return obj

    def reload_client_certificate(self, cert: bytes, key: bytes) -> None:
        self.reloaded.append((cert, key))
        self.reload_event.set()


def setup(tmp_path: Path) -> tuple[FakeAPI, bytes]:
    pki = ClusterPKI(tmp_path / "server")
    pki.ensure([])
    return FakeAPI(pki), pki.server_ca_bundle_pem()


def write_node_kubeconfig(tmp_path: Path, api: FakeAPI, ca: bytes, *, age: dt.timedelta,
                          life: dt.timedelta) -> bytes:
    """A node kubeconfig whose certificate was issued `age` ago for `life`."""
    import datetime as _dt

    from cryptography.hazmat.primitives import hashes, serialization

    client_ca = api.signer.ca("client")
    ca_cert, ca_key = client_ca.cert, client_ca.key
    key = nb.new_key()
    now = _dt.datetime.now(_dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([
        x509.NameAttribute(x509.NameOID.ORGANIZATION_NAME, "system:nodes"),
        x509.NameAttribute(x509.NameOID.COMMON_NAME, f"system:node:{NODE}")]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(1)
        .not_valid_before(now - age).not_valid_after(now - age + life)
        .sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    write_private(tmp_path / nb.KUBECONFIG_NAME,
                  nb.kubeconfig_text("https://server:9300", ca, cert, nb.key_pem(key), NODE))
    return cert


def test_kubeconfig_is_reused_only_while_its_certificate_is_valid(tmp_path: Path) -> None:
    api, ca = setup(tmp_path)
    cert = write_node_kubeconfig(tmp_path, api, ca, age=dt.timedelta(hours=1), life=dt.timedelta(hours=3))
    cfg = nb.usable_kubeconfig(tmp_path / nb.KUBECONFIG_NAME)
    assert cfg is not None and cfg.client_cert_data == cert and cfg.server == "https://server:9300"
    start, end = nb.certificate_window(cert)
    assert nb.renew_at(cert) == start + (end - start) * 2 / 3
    write_node_kubeconfig(tmp_path, api, ca, age=dt.timedelta(hours=4), life=dt.timedelta(hours=3))
    assert nb.usable_kubeconfig(tmp_path / nb.KUBECONFIG_NAME) is None  # expired: join again
    assert nb.usable_kubeconfig(tmp_path / "missing") is None


async def test_node_credentials_reuse_an_earlier_join_without_a_token(tmp_path: Path) -> None:
    from fleet.agent.config import AgentConfig

    api, ca = setup(tmp_path)
    write_node_kubeconfig(tmp_path, api, ca, age=dt.timedelta(minutes=1), life=dt.timedelta(hours=3))
    got = await nb.node_credentials(AgentConfig(server_url="https://server:9300", data_dir=tmp_path))
    assert got is not None and got.client_cert_data
    # An admin (non-bootstrap) token is used as it is, as before join existed.
    assert await nb.node_credentials(AgentConfig(server_url="https://s", token="fleet-admin-x",
                                                 data_dir=tmp_path / "other")) is None


async def test_rotation_after_two_thirds_of_the_lifetime(tmp_path: Path) -> None:
    api, ca = setup(tmp_path)
    old = write_node_kubeconfig(tmp_path, api, ca, age=dt.timedelta(hours=2, minutes=5),
                                life=dt.timedelta(hours=3))
    with trio.move_on_after(10) as scope:
        async with trio.open_nursery() as n:
            n.start_soon(nb.rotate_client_certificate, api, NODE, tmp_path)
            await api.reload_event.wait()
            n.cancel_scope.cancel()
    assert not scope.cancelled_caught, "no rotation"
    (csr,) = api.csrs.values()
    assert csr["spec"]["signerName"] == c.KUBE_APISERVER_CLIENT_KUBELET
    assert c.conditions(csr)[0]["message"].startswith("Auto approving self kubelet client certificate")
    cfg = nb.usable_kubeconfig(tmp_path / nb.KUBECONFIG_NAME)
    assert cfg is not None and cfg.client_cert_data != old
    assert api.reloaded == [(cfg.client_cert_data, cfg.client_key_data)]
    leaf = x509.load_pem_x509_certificate(cfg.client_cert_data)
    assert leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "system:node:n1"
    assert yaml.safe_load((tmp_path / nb.KUBECONFIG_NAME).read_text())["clusters"][0]["cluster"]["server"] == \
        "https://server:9300"


async def test_no_rotation_before_two_thirds(tmp_path: Path) -> None:
    api, ca = setup(tmp_path)
    write_node_kubeconfig(tmp_path, api, ca, age=dt.timedelta(hours=1), life=dt.timedelta(hours=3))
    with trio.move_on_after(0.5):
        await nb.rotate_client_certificate(api, NODE, tmp_path)
    assert api.csrs == {} and api.reloaded == []


async def test_serving_certificate_for_the_nodes_own_name(tmp_path: Path) -> None:
    api, _ = setup(tmp_path)
    cert_path, key_path = await nb.serving_certificate(api, NODE, tmp_path, ["10.0.0.5", "10.0.0.5"])
    leaf = x509.load_pem_x509_certificate(cert_path.read_bytes())
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert sans.get_values_for_type(x509.DNSName) == [NODE]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    assert key_path.stat().st_mode & 0o077 == 0
    # Still fresh: reused, no new CSR.
    assert await nb.serving_certificate(api, NODE, tmp_path, ["10.0.0.5"]) == (cert_path, key_path)
    assert len(api.csrs) == 1


async def test_a_denied_request_is_a_join_error(tmp_path: Path) -> None:
    import pytest

    api, _ = setup(tmp_path)
    api.user = "system:node:other"  # a node asking for n1's name
    with pytest.raises(nb.JoinError, match="was denied"):
        await nb.request_certificate(api, nb.make_csr(nb.new_key(), "system:node:n1", ["system:nodes"]),
                                     c.KUBE_APISERVER_CLIENT_KUBELET, nb.CLIENT_USAGES, timeout=5)


class ConfigMapAPI:
    """get_object of one ConfigMap, as the API server publishes the client CA."""

    def __init__(self, data: dict[str, str] | None) -> None:
        self.data = data

    async def get_object(self, api: str, plural: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        from fleet.auth.bootstrap import CLIENT_CA_NAME, CLIENT_CA_NAMESPACE

        assert (api, plural, name, namespace) == ("v1", "configmaps", CLIENT_CA_NAME, CLIENT_CA_NAMESPACE)
        return {"metadata": {"name": name}, "data": self.data} if self.data is not None else {}


async def test_client_ca_bundle_is_written_and_refused_when_missing(tmp_path: Path) -> None:
    from fleet.auth.bootstrap import CLIENT_CA_KEY

    pki = ClusterPKI(tmp_path / "server")
    pki.ensure([])
    bundle = pki.client_ca_bundle_pem().decode()
    path = await nb.client_ca_bundle(ConfigMapAPI({CLIENT_CA_KEY: bundle}), tmp_path)  # type: ignore[arg-type]
    assert path == tmp_path / nb.CLIENT_CA_FILE and path.read_text() == bundle
    # A bundle that is not there (or not PEM) is refused; the file on disk stays.
    for data in ({}, {CLIENT_CA_KEY: "garbage"}):
        with pytest.raises(nb.JoinError, match="holds no client-ca-file"):
            await nb.client_ca_bundle(ConfigMapAPI(data), tmp_path)  # type: ignore[arg-type]
    assert path.read_text() == bundle


class Holder:
    """The provisioner's own client: records the certificates it is given."""

    def __init__(self) -> None:
        self.reloaded: list[tuple[bytes, bytes]] = []

    def reload_client_certificate(self, cert: bytes, key: bytes) -> None:
        self.reloaded.append((cert, key))


async def test_storage_provisioner_identity_is_asked_as_the_node_and_renewed(tmp_path: Path) -> None:
    from fleet.client import ClientConfig

    api, ca = setup(tmp_path)
    api.config = ClientConfig(server="https://server:9300", ca_data=ca)  # type: ignore[attr-defined]
    ident = nb.storage_identity(NODE)
    cfg = await nb.identity_credentials(api, NODE, tmp_path, ident)  # type: ignore[arg-type]
    (csr,) = api.csrs.values()
    assert csr["spec"]["signerName"] == c.KUBE_APISERVER_CLIENT
    assert csr["spec"]["username"] == "system:node:n1"  # asked as the node
    assert c.conditions(csr)[0]["message"].startswith("Auto approving node-local storage provisioner")
    leaf = x509.load_pem_x509_certificate(cfg.client_cert_data)
    assert leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == \
        "system:fleet:storage-provisioner:n1"
    assert [a.value for a in leaf.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)] == \
        ["system:fleet:storage-provisioners"]
    assert (tmp_path / nb.STORAGE_KUBECONFIG_NAME).stat().st_mode & 0o077 == 0
    # Fresh: reused, no second CSR; the node's own kubeconfig is untouched.
    again = await nb.identity_credentials(api, NODE, tmp_path, ident)  # type: ignore[arg-type]
    assert again.client_cert_data == cfg.client_cert_data and len(api.csrs) == 1
    assert not (tmp_path / nb.KUBECONFIG_NAME).exists()
    # Renewal (a clock past 2/3 of its life) reloads the provisioner's client, not the node's.
    holder = Holder()
    calls: list[int] = []

    def late(tz: dt.tzinfo) -> dt.datetime:  # past 2/3 of the life once, then the real time
        calls.append(1)
        return dt.datetime.now(tz) + (dt.timedelta(days=300) if len(calls) == 1 else dt.timedelta(0))

    with trio.move_on_after(10) as scope:
        async with trio.open_nursery() as n:
            n.start_soon(partial(nb.rotate_client_certificate, api, NODE, tmp_path, clock=late, ident=ident,
                                 holder=holder))
            while not holder.reloaded:
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    assert not scope.cancelled_caught, "no renewal"
    assert api.reloaded == [] and len(api.csrs) == 2
    renewed = nb.usable_kubeconfig(tmp_path / nb.STORAGE_KUBECONFIG_NAME)
    assert renewed is not None and holder.reloaded == [(renewed.client_cert_data, renewed.client_key_data)]
