"""Reference normalization: the names users write → one canonical form."""

from __future__ import annotations

import pytest

from fleet.runtime.images import ImagePullError, normalize, parse_reference

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("busybox", "docker.io/library/busybox:latest"),
        ("busybox:1.36", "docker.io/library/busybox:1.36"),
        ("library/busybox", "docker.io/library/busybox:latest"),
        ("docker.io/busybox", "docker.io/library/busybox:latest"),
        ("index.docker.io/library/busybox:1", "docker.io/library/busybox:1"),
        ("registry-1.docker.io/user/app", "docker.io/user/app:latest"),
        ("user/app:v2", "docker.io/user/app:v2"),
        ("quay.io/org/app", "quay.io/org/app:latest"),
        ("registry:5000/x/y", "registry:5000/x/y:latest"),
        (f"registry:5000/x/y@{D}", f"registry:5000/x/y@{D}"),
        (f"registry:5000/x/y:tag@{D}", f"registry:5000/x/y:tag@{D}"),
        ("localhost/app", "localhost/app:latest"),
        ("localhost:5000/app:1", "localhost:5000/app:1"),
        ("127.0.0.1:5000/a/b/c:dev", "127.0.0.1:5000/a/b/c:dev"),
        ("[::1]:5000/app", "[::1]:5000/app:latest"),
        ("Registry.Example.com/app", "registry.example.com/app:latest"),
        ("a_b/c__d/e-f--g.h", "docker.io/a_b/c__d/e-f--g.h:latest"),
    ],
)
def test_normalize(given: str, want: str) -> None:
    assert normalize(given) == want
    # Normalizing is idempotent: the canonical form parses to itself.
    assert normalize(want) == want


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " busybox",
        "busy box",
        "Busybox",  # an upper-case first component is a host, and needs a path after it
        "docker.io/Library/busybox",
        "busybox:",
        "busybox:-bad",
        "busybox@sha256:short",
        "busybox@sha256:" + "AB" * 32,
        "x/../y",
        "a//b",
        "reg istry:5000/x",
        "registry:port/x",
    ],
)
def test_invalid_references(bad: str) -> None:
    with pytest.raises(ImagePullError) as info:
        parse_reference(bad)
    assert info.value.reason == "InvalidImageName"


def test_parts_and_target() -> None:
    r = parse_reference("busybox")
    assert (r.domain, r.path, r.tag, r.digest) == ("docker.io", "library/busybox", "latest", None)
    assert r.registry_host == "registry-1.docker.io"
    assert r.target == "latest"
    pinned = parse_reference(f"registry:5000/x/y:t@{D}")
    assert pinned.registry_host == "registry:5000"
    assert pinned.target == D  # a digest wins over the tag when pulling
    assert str(pinned.with_digest(D)) == f"registry:5000/x/y@{D}"
