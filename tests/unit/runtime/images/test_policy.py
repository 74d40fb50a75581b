"""imagePullPolicy: should_pull and the Kubernetes default."""

from __future__ import annotations

import pytest

from fleet.runtime.images import ImagePullError, default_pull_policy, should_pull


@pytest.mark.parametrize(
    ("policy", "present", "want"),
    [
        ("Always", True, True),
        ("Always", False, True),
        ("IfNotPresent", True, False),
        ("IfNotPresent", False, True),
        ("Never", True, False),
    ],
)
def test_should_pull(policy: str, present: bool, want: bool) -> None:
    assert should_pull(policy, present) is want


def test_never_and_absent_is_err_image_never_pull() -> None:
    with pytest.raises(ImagePullError) as info:
        should_pull("Never", False, image="app:v1")
    assert info.value.reason == "ErrImageNeverPull"
    assert 'Container image "app:v1" is not present with pull policy of Never' == info.value.message


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="Sometimes"):
        should_pull("Sometimes", True)


@pytest.mark.parametrize(
    ("image", "want"),
    [
        ("busybox", "Always"),
        ("busybox:latest", "Always"),
        ("busybox:1.36", "IfNotPresent"),
        ("registry:5000/app", "Always"),
        ("registry:5000/app:v1", "IfNotPresent"),
        ("busybox@sha256:" + "a" * 64, "IfNotPresent"),
        ("busybox:latest@sha256:" + "a" * 64, "IfNotPresent"),
    ],
)
def test_default_policy(image: str, want: str) -> None:
    assert default_pull_policy(image) == want


def test_empty_policy_uses_the_default_for_the_image() -> None:
    assert should_pull(None, True, image="busybox") is True  # :latest → Always
    assert should_pull("", True, image="busybox:1.36") is False  # IfNotPresent
