"""Manifest dialects and choosing this node's platform from an index."""

from __future__ import annotations

import json

import pytest

from fleet.runtime.images import ImagePullError, Platform, select_platform
from fleet.runtime.images.manifest import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
    Descriptor,
    media_type_of,
    parse_manifest,
)


def _d(n: int, os: str, arch: str, variant: str = "", **ann: str) -> Descriptor:
    return Descriptor(
        OCI_MANIFEST, f"sha256:{n:064x}", 100, Platform(os, arch, variant), ann or None
    )


INDEX = [
    _d(1, "linux", "amd64"),
    _d(2, "linux", "arm", "v6"),
    _d(3, "linux", "arm", "v7"),
    _d(4, "linux", "arm64", "v8"),
    _d(5, "windows", "amd64"),
    _d(6, "unknown", "unknown", **{"vnd.docker.reference.type": "attestation-manifest"}),
]


@pytest.mark.parametrize(
    ("want", "digest_n"),
    [
        (Platform("linux", "amd64"), 1),
        (Platform("linux", "arm", "v7"), 3),
        (Platform("linux", "arm", "v6"), 2),
        (Platform("linux", "arm64", "v8"), 4),
        (Platform("linux", "arm64"), 4),
        (Platform("windows", "amd64"), 5),
    ],
)
def test_select_platform(want: Platform, digest_n: int) -> None:
    assert select_platform(INDEX, want).digest == f"sha256:{digest_n:064x}"


def test_variant_less_entry_matches_a_node_with_a_variant() -> None:
    entries = [_d(1, "linux", "amd64"), _d(2, "linux", "arm64")]
    assert select_platform(entries, Platform("linux", "arm64", "v8")).digest.endswith("2")


def test_exact_variant_preferred_over_compatible() -> None:
    entries = [_d(1, "linux", "arm64"), _d(2, "linux", "arm64", "v8")]
    assert select_platform(entries, Platform("linux", "arm64", "v8")).digest.endswith("2")


def test_no_match_names_what_was_offered() -> None:
    with pytest.raises(ImagePullError) as info:
        select_platform(INDEX, Platform("linux", "s390x"))
    msg = info.value.message
    assert "no matching manifest for linux/s390x" in msg
    assert "linux/arm64/v8" in msg and "unknown" not in msg  # attestations are not offered


def test_platform_parse_and_host() -> None:
    assert Platform.parse("linux/arm64/v8") == Platform("linux", "arm64", "v8")
    assert Platform.parse(("linux", "amd64")) == Platform("linux", "amd64")
    assert str(Platform("linux", "arm", "v7")) == "linux/arm/v7"
    with pytest.raises(ValueError):
        Platform.parse("linux")
    assert Platform.host().os == "linux" and Platform.host().architecture


@pytest.mark.parametrize(
    ("doc", "header", "want"),
    [
        ({"mediaType": DOCKER_LIST, "manifests": []}, "", DOCKER_LIST),
        ({"manifests": []}, "", OCI_INDEX),
        ({"manifests": []}, DOCKER_LIST + "; charset=utf-8", DOCKER_LIST),
        ({"config": {}, "layers": []}, "", OCI_MANIFEST),
        ({"mediaType": DOCKER_MANIFEST, "config": {}, "layers": []}, "", DOCKER_MANIFEST),
    ],
)
def test_media_type_of(doc: dict, header: str, want: str) -> None:
    assert media_type_of(json.dumps(doc).encode(), header) == want


def test_parse_manifest_checks_types() -> None:
    good = {
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + "a" * 64, "size": 10},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": "sha256:" + "b" * 64, "size": 20}],
    }
    m = parse_manifest(good, OCI_MANIFEST)
    assert m.config.size == 10 and [x.size for x in m.layers] == [20]
    helm = dict(good, config=dict(good["config"], mediaType="application/vnd.cncf.helm.config.v1+json"))
    with pytest.raises(ImagePullError, match="not a container image"):
        parse_manifest(helm, OCI_MANIFEST)
    with pytest.raises(ImagePullError, match="unsupported manifest media type"):
        parse_manifest(good, "application/vnd.docker.distribution.manifest.v1+json")
    no_size = dict(good, layers=[{"digest": "sha256:" + "b" * 64}])
    with pytest.raises(ImagePullError, match="size"):
        parse_manifest(no_size, OCI_MANIFEST)
