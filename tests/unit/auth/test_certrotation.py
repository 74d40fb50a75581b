"""fleet/auth/certrotation.py: live contexts renewed in place, the rotator's tick."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from fleet.auth.certrotation import CertRotator, component_client_config
from fleet.auth.pki import ClusterPKI, load_pem_chain
from fleet.client.rest import ssl_context


def test_component_config_carries_a_live_context(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path, leaf_lifetime=dt.timedelta(hours=3))
    pki.ensure([])
    rot = CertRotator(pki)
    cfg = component_client_config(pki, "https://127.0.0.1:1", "system:kube-scheduler", (), rot)
    assert cfg.token is None
    live = rot.live[0]
    assert ssl_context(cfg) is live.ctx  # the client uses exactly this context
    assert live.cert is not None and "system:kube-scheduler" in live.cert.subject.rfc4514_string()
    first = live.cert.serial_number
    now = dt.datetime.now(dt.UTC)
    rot.tick(now + dt.timedelta(hours=1))
    assert live.cert.serial_number == first
    rot.tick(now + dt.timedelta(hours=2, minutes=1))
    assert live.cert.serial_number != first and live.renewals == 2


def test_tick_after_a_cli_rotation_reloads_and_tells_listeners(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path)
    pki.ensure([])
    rot = CertRotator(pki)
    live = rot.client_tls("apiserver-kubelet-client", "fleet-apiserver-kubelet-client", ["system:masters"])
    calls: list[int] = []
    rot.on_change(lambda: calls.append(1))
    assert rot.tick() is False and calls == []
    # `fleet certs rotate` in another process: a ClusterPKI of its own.
    ClusterPKI(tmp_path).rotate("all")
    assert rot.tick() is True and calls == [1]
    assert live.cert is not None and live.cert.issuer == pki.ca("client").cert.subject
    # The live context now trusts both server CAs (old and new).
    trusted = {c["subject"] for c in live.ctx.get_ca_certs()}
    assert len([s for s in trusted if "fleet-ca@" in str(s)]) == 2
    assert len(load_pem_chain(pki.server_ca_bundle_pem())) == 2
