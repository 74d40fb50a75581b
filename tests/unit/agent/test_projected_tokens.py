"""Projected ServiceAccount tokens on the node: the refresh rule, the TokenRequest the
agent sends, the token cache, and the volume they land in (kube-api-access-*),
written atomically and refreshed in place.

The TokenRequest API is faked by a client double that records the requests and
answers as kube-apiserver does (status.token + status.expirationTimestamp).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.admission.serviceaccount import token_volume_source
from fleet.agent.satokens import (
    MAX_TTL,
    IssuedToken,
    ServiceAccountTokens,
    TokenError,
    parse_issued,
    requires_refresh,
    token_request,
)
from fleet.agent.volumes import (
    DATA_DIR_NAME,
    FileContent,
    VolumeError,
    VolumeManager,
    mounts_under,
    write_atomic,
)
from fleet.api import meta
from fleet.client import ApiException

T0 = 1_800_000_000.0  # a fixed "now" (2027)


# -- the refresh rule (pure) ----------------------------------------------------------------


@pytest.mark.parametrize("age, lifetime, jitter, want", [
    (0, 3607, 0, False),
    (0.79 * 3607, 3607, 0, False),
    (0.80 * 3607 - 1, 3607, 0, False),     # 80% of 3607 s is 2885.6; the rule counts whole seconds
    (3607 - 721 + 1, 3607, 0, True),       # past exp - 20% (721 s)
    (3607 - 721 - 5, 3607, 10, True),      # jitter moves it earlier
    (3607 - 721 - 5, 3607, 0, False),
    (3600, 3600, 0, True),                 # expired
    (23 * 3600, 7 * 86400, 0, False),      # a week-long token at 23 h: neither rule yet
    (24 * 3600 + 1, 7 * 86400, 0, True),   # ... older than 24 h: refresh
    (24 * 3600 - 5, 7 * 86400, 10, True),  # the 24 h rule with jitter
    (600 * 0.8 + 1, 600, 0, True),
])
def test_requires_refresh(age: float, lifetime: int, jitter: float, want: bool) -> None:
    issued = T0
    assert requires_refresh(issued + lifetime, lifetime, issued + age, jitter) is want


def test_max_ttl_is_a_day() -> None:
    assert MAX_TTL == 86400


# -- the request and the answer ---------------------------------------------------------------


POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "web", "namespace": "team", "uid": "3f1c-uid"},
       "spec": {"serviceAccountName": "builder", "containers": [{"name": "c"}]}}


def test_token_request_shape() -> None:
    assert token_request(POD, "", 3607) == {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 3607,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": "3f1c-uid"}}}
    assert token_request(POD, "vault", 600)["spec"]["audiences"] == ["vault"]


def test_parse_issued() -> None:
    got = parse_issued({"spec": {"expirationSeconds": 3607},
                        "status": {"token": "t", "expirationTimestamp": meta.format_time(T0 + 3607)}}, 3600)
    assert got == IssuedToken("t", T0 + 3607, 3607) and got.issued == T0
    # No spec in the answer: the lifetime asked for.
    assert parse_issued({"status": {"token": "t", "expirationTimestamp": meta.format_time(T0)}},
                        600).expiration_seconds == 600
    with pytest.raises(ValueError):
        parse_issued({"status": {"expirationTimestamp": meta.format_time(T0)}}, 600)


# -- the cache over a fake TokenRequest API ---------------------------------------------------


class FakeTokenAPI:
    """`client.create(..., subresource="token", name=sa)` as kube-apiserver answers it."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.fail: ApiException | None = None
        self.accounts = {("team", "builder"), ("team", "default")}

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None, *, subresource: str | None = None,
                     name: str | None = None, **kw: Any) -> dict[str, Any]:
        assert (api_version, plural, subresource) == ("v1", "serviceaccounts", "token")
        assert namespace is not None and name is not None
        self.requests.append((namespace, name, body))
        if self.fail is not None:
            raise self.fail
        if (namespace, name) not in self.accounts:
            raise ApiException({"reason": "NotFound", "message": f'serviceaccounts "{name}" not found'}, 404)
        seconds = body["spec"]["expirationSeconds"]
        return {**body, "status": {"token": f"tok-{len(self.requests)}",
                                   "expirationTimestamp": meta.format_time(self.clock[0] + seconds)}}


def manager(clock: list[float]) -> tuple[ServiceAccountTokens, FakeTokenAPI]:
    api = FakeTokenAPI(clock)
    return ServiceAccountTokens(api, clock=lambda: clock[0], jitter=lambda: 0.0), api


async def test_cached_until_80_percent_then_refreshed() -> None:
    clock = [T0]
    tokens, api = manager(clock)
    assert await tokens(POD, "", 3607) == "tok-1"
    ns, sa, body = api.requests[0]
    assert (ns, sa) == ("team", "builder")
    assert body["spec"]["boundObjectRef"] == {"kind": "Pod", "apiVersion": "v1", "name": "web",
                                              "uid": "3f1c-uid"}
    clock[0] = T0 + 2800
    assert await tokens(POD, "", 3607) == "tok-1" and len(api.requests) == 1
    clock[0] = T0 + 2900
    assert await tokens(POD, "", 3607) == "tok-2" and len(api.requests) == 2
    # Another audience is another token.
    assert await tokens(POD, "vault", 3607) == "tok-3"


async def test_first_fetch_failure_is_kubelets_words() -> None:
    clock = [T0]
    tokens, api = manager(clock)
    pod = {**POD, "spec": {"serviceAccountName": "ghost"}}
    with pytest.raises(TokenError) as e:
        await tokens(pod, "", 3607)
    assert str(e.value) == 'failed to fetch token: serviceaccounts "ghost" not found'


async def test_failed_refresh_keeps_a_valid_token_then_gives_up_when_expired() -> None:
    clock = [T0]
    tokens, api = manager(clock)
    assert await tokens(POD, "", 600) == "tok-1"
    api.fail = ApiException({"reason": "ServiceUnavailable", "message": "try later"}, 503)
    clock[0] = T0 + 550
    assert await tokens(POD, "", 600) == "tok-1"  # logged, the old one still valid
    clock[0] = T0 + 601
    with pytest.raises(TokenError, match="failed to fetch token: try later"):
        await tokens(POD, "", 600)  # expired: dropped from the cache, nothing to fall back on
    api.fail = None
    assert await tokens(POD, "", 600) == "tok-4"


async def test_forget_drops_a_pods_tokens() -> None:
    clock = [T0]
    tokens, _ = manager(clock)
    await tokens(POD, "", 600)
    other = {**POD, "metadata": {**POD["metadata"], "uid": "other", "name": "x"}}
    await tokens(other, "", 600)
    assert len(tokens) == 2
    tokens.forget("3f1c-uid")
    assert len(tokens) == 1


# -- the kube-api-access volume ----------------------------------------------------------------


@pytest.fixture
def pod_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "pod"
    yield d
    for mp in mounts_under(tmp_path):  # a failing test must not leave a tmpfs behind
        subprocess.run(["umount", "-l", str(mp)], check=False)


CA = "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n"


def api_access_pod(sa: str = "builder") -> dict[str, Any]:
    return {"metadata": {"name": "web", "namespace": "team", "uid": "3f1c-uid"},
            "spec": {"serviceAccountName": sa, "containers": [{"name": "c"}],
                     "volumes": [{"name": "kube-api-access-abcde", "projected": token_volume_source()}]}}


async def root_ca(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    if (kind, namespace, name) == ("ConfigMap", "team", "kube-root-ca.crt"):
        return {"data": {"ca.crt": CA}}
    return None


def seen(vol: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in vol.iterdir() if not p.name.startswith("..")}


async def test_kube_api_access_volume_is_written_and_refreshed(pod_dir: Path) -> None:
    clock = [T0]
    tokens, api = manager(clock)
    vm = VolumeManager(pod_dir, root_ca, token_source=tokens)
    pod = api_access_pod()
    vol = (await vm.setup(pod))["kube-api-access-abcde"]
    assert seen(vol) == {"token": "tok-1", "ca.crt": CA, "namespace": "team"}
    assert all((vol / n).is_symlink() for n in ("token", "ca.crt", "namespace"))
    assert oct((vol / "token").stat().st_mode & 0o777) == oct(0o644)  # defaultMode 420
    first = (vol / DATA_DIR_NAME).readlink()
    # Refresh before 80%: nothing changes, nothing is written.
    clock[0] = T0 + 1000
    assert await vm.refresh(pod) == []
    # After 80% of 3607 s: a new token, swapped in by the ..data symlink.
    clock[0] = T0 + 2900
    assert await vm.refresh(pod) == ["kube-api-access-abcde"]
    assert seen(vol)["token"] == "tok-2"
    assert (vol / DATA_DIR_NAME).readlink() != first and not (vol / first).exists()
    await vm.teardown()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
async def test_token_volume_is_a_tmpfs(pod_dir: Path) -> None:
    tokens, _ = manager([T0])
    vm = VolumeManager(pod_dir, root_ca, token_source=tokens)
    vol = (await vm.setup(api_access_pod()))["kube-api-access-abcde"]
    assert os.path.ismount(vol) and mounts_under(pod_dir) == [vol]
    await vm.teardown()
    assert mounts_under(pod_dir) == [] and not pod_dir.exists()


async def test_a_restarted_agent_writes_a_fresh_token_over_the_old(pod_dir: Path) -> None:
    """After a restart the cache is empty: set-up runs again on the same volume, asks
    for a new token and swaps it in; the layout (and a tmpfs) stays as it was."""
    clock = [T0]
    before, _ = manager(clock)
    vm = VolumeManager(pod_dir, root_ca, token_source=before)
    vol = (await vm.setup(api_access_pod()))["kube-api-access-abcde"]
    mounted = mounts_under(pod_dir)
    clock[0] = T0 + 60
    after = FakeTokenAPI(clock)
    after.requests = [("", "", {})] * 5  # its tokens are numbered on from here: tok-6
    vm2 = VolumeManager(pod_dir, root_ca, token_source=ServiceAccountTokens(
        after, clock=lambda: clock[0], jitter=lambda: 0.0))
    assert (await vm2.setup(api_access_pod()))["kube-api-access-abcde"] == vol
    assert seen(vol) == {"token": "tok-6", "ca.crt": CA, "namespace": "team"}
    assert mounts_under(pod_dir) == mounted
    assert len([p for p in vol.iterdir() if p.name.startswith("..") and not p.is_symlink()]) == 1
    await vm2.teardown()


async def test_token_failure_is_failed_mount(pod_dir: Path) -> None:
    clock = [T0]
    tokens, _ = manager(clock)
    vm = VolumeManager(pod_dir, root_ca, token_source=tokens)
    with pytest.raises(VolumeError) as e:
        await vm.setup(api_access_pod("ghost"))
    assert (e.value.reason, e.value.message) == (
        "FailedMount", 'MountVolume.SetUp failed for volume "kube-api-access-abcde" : '
                       'failed to fetch token: serviceaccounts "ghost" not found')
    await vm.teardown()


async def test_missing_root_ca_configmap_is_failed_mount(pod_dir: Path) -> None:
    clock = [T0]
    tokens, _ = manager(clock)

    async def nothing(kind: str, namespace: str, name: str) -> None:
        return None

    vm = VolumeManager(pod_dir, nothing, token_source=tokens)
    with pytest.raises(VolumeError) as e:
        await vm.setup(api_access_pod())
    assert e.value.message == ('MountVolume.SetUp failed for volume "kube-api-access-abcde" : '
                               'configmap "kube-root-ca.crt" not found')
    await vm.teardown()


def test_atomic_writes_never_show_a_partial_token(tmp_path: Path) -> None:
    """A reader opening `token` while tokens are swapped sees a whole old one or a
    whole new one, never a mix or an empty file.  (As with the kubelet's AtomicWriter,
    a reader that resolved `..data` to the old directory just before the writer removed
    it gets ENOENT and reads again; it is counted, not failed.)"""
    target = tmp_path / "vol"
    size = 256 * 1024
    payloads = [{"token": FileContent(ch * size, 0o644)} for ch in (b"a", b"b")]
    write_atomic(target, payloads[0])
    stop = threading.Event()
    bad: list[str] = []
    reads = [0, 0]  # whole reads, ENOENT

    def reader() -> None:
        while not stop.is_set():
            try:
                data = (target / "token").read_bytes()
            except FileNotFoundError:
                reads[1] += 1
                continue
            reads[0] += 1
            if len(data) != size or len(set(data)) != 1:
                bad.append(f"partial ({len(data)} bytes, {len(set(data))} kinds)")

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(200):
            assert write_atomic(target, payloads[(i + 1) % 2])
    finally:
        stop.set()
        t.join()
    assert bad == [] and reads[0] > 0
    assert reads[1] <= reads[0]
    # Only the current timestamped directory is left.
    assert [p.name for p in target.iterdir() if p.name.startswith("..") and p.is_dir()
            and not p.is_symlink()] == [(target / DATA_DIR_NAME).readlink().name]
