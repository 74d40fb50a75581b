"""ControllerRevision helpers: hashing, naming, choosing the update revision, truncation."""

from __future__ import annotations

import pytest

from fleet.controllers import history


def test_fnv32_is_fnv1_not_fnv1a():
    assert history.fnv32(b"") == 0x811C9DC5
    assert history.fnv32(b"a") == 0x050C5D7E  # FNV-1a would be 0xe40c292c


def test_safe_encode_avoids_vowels_and_is_stable():
    enc = history.safe_encode("1234567890")
    assert enc == "56789bcdf4"
    assert not set(enc) & set("aeiou013")


def test_hash_depends_on_data_and_collision_count():
    data = {"spec": {"template": {"x": 1}}}
    a, b = history.hash_data(data, 0), history.hash_data(data, 1)
    assert a != b and a == history.hash_data({"spec": {"template": {"x": 1}}}, 0)
    assert history.hash_data({"spec": {"template": {"x": 2}}}, 0) != a


def test_revision_name_truncates_long_prefixes():
    assert history.revision_name("web", "abc") == "web-abc"
    assert len(history.revision_name("x" * 300, "abcdefghij")) == 223 + 1 + 10


def test_template_round_trip():
    sts = {"spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}}}}
    data = history.template_patch(sts)
    assert data["spec"]["template"]["$patch"] == "replace"
    assert history.template_of({"data": data}) == sts["spec"]["template"]
    assert "$patch" not in sts["spec"]["template"]  # the workload itself is untouched


def rev(name: str, n: int, image: str) -> dict:
    return {"metadata": {"name": name, "creationTimestamp": f"2024-01-01T00:00:0{n}Z"}, "revision": n,
            "data": history.template_patch({"spec": {"template": {"image": image}}})}


def data_for(image: str) -> dict:
    return history.template_patch({"spec": {"template": {"image": image}}})


@pytest.mark.parametrize(("revisions", "image", "want"), [
    ([], "v1", ("create", None, 1)),
    ([rev("a", 1, "v1")], "v1", ("existing", "a", 1)),
    ([rev("a", 1, "v1")], "v2", ("create", None, 2)),
    ([rev("a", 1, "v1"), rev("b", 2, "v2")], "v1", ("renumber", "a", 3)),  # a rollback
    ([rev("a", 1, "v1"), rev("b", 2, "v2")], "v2", ("existing", "b", 2)),
])
def test_choose_update_revision(revisions, image, want):
    choice, r, n = history.choose_update_revision(history.sort_revisions(revisions), data_for(image))
    assert (choice, r["metadata"]["name"] if r else None, n) == want


def test_sort_and_truncate_keep_live_revisions():
    revs = [rev("c", 3, "v3"), rev("a", 1, "v1"), rev("b", 2, "v2"), rev("d", 4, "v4")]
    assert [r["metadata"]["name"] for r in history.sort_revisions(revs)] == ["a", "b", "c", "d"]
    assert [r["metadata"]["name"] for r in history.history_to_delete(revs, {"d", "a"}, 1)] == ["b"]
    assert history.history_to_delete(revs, {"d"}, 10) == []
    assert history.history_to_delete(revs, set(), -1) == []
