"""Image GC thresholds and what counts as in use."""

import pytest

from fleet.agent import imagegc


@pytest.mark.parametrize("total,free,expected", [
    (1000, 500, 0),          # 50% used: nothing to do
    (1000, 150, 0),          # 85% used: at the high mark, still fine
    (1000, 100, 100),        # 90% used: free down to 80%
    (1000, 0, 200),          # full
    (0, 0, 0),               # unknown filesystem size
])
def test_bytes_to_free(total, free, expected):
    assert imagegc.bytes_to_free(total, free) == expected


def test_images_in_use_covers_every_container_list():
    pods = [
        {"spec": {"initContainers": [{"name": "i", "image": "init:1"}],
                  "containers": [{"name": "a", "image": "app:1"}, {"name": "b", "image": "app:2"}]}},
        {"spec": {"containers": [{"name": "c", "image": "app:1"}],
                  "ephemeralContainers": [{"name": "d", "image": "debug:1"}]}},
        {"spec": {}},
    ]
    assert imagegc.images_in_use(pods) == {"init:1", "app:1", "app:2", "debug:1"}


async def test_collect_once_frees_only_under_pressure(tmp_path, monkeypatch):
    calls = []

    class FakeStore:
        async def gc(self, keep=(), bytes_to_free=None):
            calls.append((set(keep), bytes_to_free))
            return bytes_to_free

    class St:
        f_frsize = 1
        f_blocks = 1000
        f_bavail = 500

    monkeypatch.setattr(imagegc.os, "statvfs", lambda p: St)
    assert await imagegc.collect_once(FakeStore(), tmp_path, lambda: {"app:1"}) == 0
    assert calls == []
    St.f_bavail = 50
    assert await imagegc.collect_once(FakeStore(), tmp_path, lambda: {"app:1"}) == 150
    assert calls == [({"app:1"}, 150)]
