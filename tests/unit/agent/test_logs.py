"""fleet.agent.logs: CRI parsing, partial lines, tail, since, timestamps, limitBytes,
follow (new lines, container exit, rotation) — on files written here, no containers."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
import trio

from fleet.agent import logs
from fleet.agent.logs import CriRecord, LogOptions

T0 = 1_795_968_000 * 1_000_000_000  # 2026-11-29T16:00:00Z


def ts(ns: int) -> str:
    sec, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{frac:09d}Z"


def rec(ns: int, text: str, *, stream: str = "stdout", tag: str = "F") -> bytes:
    return f"{ts(ns)} {stream} {tag} {text}\n".encode()


def write(path: Path, *records: bytes) -> Path:
    with open(path, "ab") as f:
        for r in records:
            f.write(r)
    return path


SAMPLE = [
    rec(T0, "one"),
    rec(T0 + 1_000_000_000, "two", stream="stderr"),
    rec(T0 + 2_000_000_000, "thr", tag="P"),
    rec(T0 + 2_000_000_001, "ee-", tag="P"),
    rec(T0 + 2_000_000_002, "end"),
    rec(T0 + 3_500_000_000, "four"),
]


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    return write(tmp_path / "0.log", *SAMPLE)


# -- timestamps ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "ns"), [
    ("2026-11-29T16:00:00Z", T0),
    ("2026-11-29T16:00:00.123456789Z", T0 + 123456789),
    ("2026-11-29T16:00:00.5Z", T0 + 500_000_000),
    ("2026-11-29T17:00:00+01:00", T0),
    ("2026-11-29T15:30:00.25-00:30", T0 + 250_000_000),
])
def test_parse_timestamp(text: str, ns: int) -> None:
    assert logs.parse_timestamp(text) == ns


@pytest.mark.parametrize("bad", ["", "2026-11-29", "yesterday", "2026-11-29T16:00:00",
                                 "2026-11-29T16:00:00.1234567891Z"])
def test_parse_timestamp_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        logs.parse_timestamp(bad)


@pytest.mark.parametrize(("ns", "text"), [
    # Go's RFC3339Nano: trailing zeros dropped, no fraction when it is zero.
    (T0, "2026-11-29T16:00:00Z"),
    (T0 + 123456789, "2026-11-29T16:00:00.123456789Z"),
    (T0 + 120_000_000, "2026-11-29T16:00:00.12Z"),
    (T0 + 1, "2026-11-29T16:00:00.000000001Z"),
])
def test_format_timestamp(ns: int, text: str) -> None:
    assert logs.format_timestamp(ns) == text
    assert logs.parse_timestamp(text) == ns


# -- records ------------------------------------------------------------------------


def test_parse_record() -> None:
    assert logs.parse_record(rec(T0 + 5, "hello world").rstrip(b"\n")) == \
        CriRecord(T0 + 5, "stdout", False, b"hello world")
    assert logs.parse_record(rec(T0, "x", stream="stderr", tag="P").rstrip(b"\n")) == \
        CriRecord(T0, "stderr", True, b"x")
    # An empty line is "<ts> stdout F " (or even without the trailing space).
    assert logs.parse_record(f"{ts(T0)} stdout F".encode()) == CriRecord(T0, "stdout", False, b"")
    assert logs.parse_record(f"{ts(T0)} stdout F ".encode()) == CriRecord(T0, "stdout", False, b"")


@pytest.mark.parametrize("bad", [b"", b"garbage", b"2026 stdout F x",
                                 f"{ts(T0)} stdin F x".encode(),
                                 f"{ts(T0)} stdout X x".encode()])
def test_parse_record_rejects(bad: bytes) -> None:
    assert logs.parse_record(bad) is None


# -- read_log: the non-follow answer ------------------------------------------------


@pytest.mark.parametrize(("opts", "expected"), [
    (LogOptions(), b"one\ntwo\nthree-end\nfour\n"),
    (LogOptions(tail_lines=1), b"four\n"),
    # The partial group counts as one line.
    (LogOptions(tail_lines=2), b"three-end\nfour\n"),
    (LogOptions(tail_lines=3), b"two\nthree-end\nfour\n"),
    (LogOptions(tail_lines=4), b"one\ntwo\nthree-end\nfour\n"),
    (LogOptions(tail_lines=100), b"one\ntwo\nthree-end\nfour\n"),
    (LogOptions(tail_lines=0), b""),
    (LogOptions(since_ns=T0 + 1_000_000_000), b"two\nthree-end\nfour\n"),
    # A line is judged by its first record: "three" started before the cut.
    (LogOptions(since_ns=T0 + 2_000_000_001), b"four\n"),
    (LogOptions(since_ns=T0 + 9_000_000_000), b""),
    (LogOptions(limit_bytes=6), b"one\ntw"),
    (LogOptions(limit_bytes=1), b"o"),
    (LogOptions(tail_lines=2, limit_bytes=12), b"three-end\nfo"),
    (LogOptions(timestamps=True, tail_lines=2),
     b"2026-11-29T16:00:02Z three-end\n2026-11-29T16:00:03.5Z four\n"),
    # limitBytes counts the timestamp prefixes too.
    (LogOptions(timestamps=True, limit_bytes=24), b"2026-11-29T16:00:00Z one"),
])
def test_read_log(sample: Path, opts: LogOptions, expected: bytes) -> None:
    assert logs.read_log(sample, opts) == expected


def test_read_log_missing_file(tmp_path: Path) -> None:
    assert logs.read_log(tmp_path / "nope.log", LogOptions()) == b""


def test_malformed_lines_are_skipped(tmp_path: Path) -> None:
    p = write(tmp_path / "0.log", rec(T0, "a"), b"not a cri line\n", rec(T0 + 1, "b"))
    assert logs.read_log(p, LogOptions()) == b"a\nb\n"
    assert logs.read_log(p, LogOptions(tail_lines=1)) == b"b\n"


def test_unterminated_partial_at_end(tmp_path: Path) -> None:
    # A long line still being written: the P records so far, without a newline.
    p = write(tmp_path / "0.log", rec(T0, "done"), rec(T0 + 1, "half", tag="P"))
    assert logs.read_log(p, LogOptions()) == b"done\nhalf"
    assert logs.read_log(p, LogOptions(tail_lines=1)) == b"done\nhalf"


# -- tail_offset: reading backwards in blocks ---------------------------------------


@pytest.mark.parametrize("block", [1, 7, 64, 65536])
def test_tail_offset_any_block_size(sample: Path, block: int) -> None:
    data = sample.read_bytes()
    f = io.BytesIO(data)
    starts = [0]
    for r in SAMPLE:
        starts.append(starts[-1] + len(r))
    # Whole lines start at records 0, 1, 2 (the P group) and 5.
    assert logs.tail_offset(f, 1, block=block) == starts[5]
    assert logs.tail_offset(f, 2, block=block) == starts[2]
    assert logs.tail_offset(f, 3, block=block) == starts[1]
    assert logs.tail_offset(f, 4, block=block) == 0
    assert logs.tail_offset(f, 50, block=block) == 0
    assert logs.tail_offset(f, 0, block=block) == len(data)


def test_tail_offset_empty() -> None:
    assert logs.tail_offset(io.BytesIO(b""), 3) == 0


def test_tail_reads_only_the_end(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    with open(big, "wb") as f:
        for i in range(100_000):
            f.write(rec(T0 + i, f"line {i}"))

    class Counting(io.FileIO):
        read_bytes = 0

        def read(self, n: int = -1) -> bytes:  # type: ignore[override]
            data = super().read(n)
            Counting.read_bytes += len(data)
            return data

    with Counting(big, "r") as f:
        off = logs.tail_offset(f, 10, block=4096)  # type: ignore[arg-type]
    # One block (plus the byte checking the final newline) out of ~5 MB.
    assert Counting.read_bytes <= 4096 + 1
    tail = big.read_bytes()[off:].decode().splitlines()
    assert len(tail) == 10 and tail[-1].endswith("line 99999")


# -- stream_log / follow ------------------------------------------------------------


async def collect(path: Path, opts: LogOptions, **kw: object) -> bytes:
    out = b""
    async for chunk in logs.stream_log(path, opts, **kw):  # type: ignore[arg-type]
        out += chunk
    return out


async def test_stream_log_matches_read_log(sample: Path) -> None:
    for opts in (LogOptions(), LogOptions(tail_lines=2, timestamps=True),
                 LogOptions(limit_bytes=7), LogOptions(since_ns=T0 + 1)):
        assert await collect(sample, opts) == logs.read_log(sample, opts)


async def test_follow_streams_new_lines_until_exit(tmp_path: Path) -> None:
    path = write(tmp_path / "0.log", rec(T0, "old1"), rec(T0 + 1, "old2"))
    running = True

    async def is_running() -> bool:
        return running

    got: list[bytes] = []
    seen_new = trio.Event()

    async def reader() -> None:
        async for chunk in logs.stream_log(path, LogOptions(follow=True, tail_lines=1),
                                           is_running=is_running, poll_interval=0.01):
            got.append(chunk)
            if b"new" in chunk:
                seen_new.set()

    with trio.fail_after(5):
        async with trio.open_nursery() as n:
            n.start_soon(reader)
            await trio.sleep(0.05)
            write(path, rec(T0 + 2, "new"))
            await seen_new.wait()
            # Lines flushed right as the container exits still arrive.
            write(path, rec(T0 + 3, "par", tag="P"), rec(T0 + 4, "ting"))
            running = False
    assert b"".join(got) == b"old2\nnew\nparting\n"


async def test_follow_waits_for_missing_file_and_ends_if_never_started(
        tmp_path: Path) -> None:
    path = tmp_path / "late.log"
    calls = 0

    async def is_running() -> bool:
        nonlocal calls
        calls += 1
        return calls < 5

    with trio.fail_after(5):
        assert await collect(path, LogOptions(follow=True), is_running=is_running,
                             poll_interval=0.01) == b""

    calls = 0

    async def running_until_written() -> bool:
        return not path.exists() or b"bye" not in path.read_bytes()

    async def create_later() -> None:
        await trio.sleep(0.05)
        write(path, rec(T0, "hi"), rec(T0 + 1, "bye"))

    with trio.fail_after(5):
        async with trio.open_nursery() as n:
            n.start_soon(create_later)
            out = await collect(path, LogOptions(follow=True),
                                is_running=running_until_written, poll_interval=0.01)
    assert out == b"hi\nbye\n"


async def test_follow_holds_back_an_unfinished_record(tmp_path: Path) -> None:
    path = write(tmp_path / "0.log", rec(T0, "a"))
    half = rec(T0 + 1, "bcd")
    running = True

    async def is_running() -> bool:
        return running

    got = b""

    async def reader() -> None:
        nonlocal got
        async for chunk in logs.stream_log(path, LogOptions(follow=True),
                                           is_running=is_running, poll_interval=0.01):
            got += chunk

    with trio.fail_after(5):
        async with trio.open_nursery() as n:
            n.start_soon(reader)
            with open(path, "ab") as f:
                f.write(half[:10])
                f.flush()
                await trio.sleep(0.1)
                assert got == b"a\n"  # the half-written record is not shown yet
                f.write(half[10:])
            await trio.sleep(0.1)
            running = False
    assert got == b"a\nbcd\n"


async def test_follow_reopens_a_rotated_file(tmp_path: Path) -> None:
    path = write(tmp_path / "0.log", rec(T0, "before"))
    running = True

    async def is_running() -> bool:
        return running

    got = b""

    async def reader() -> None:
        nonlocal got
        async for chunk in logs.stream_log(path, LogOptions(follow=True),
                                           is_running=is_running, poll_interval=0.01):
            got += chunk

    with trio.fail_after(5):
        async with trio.open_nursery() as n:
            n.start_soon(reader)
            await trio.sleep(0.05)
            rotated = write(tmp_path / "new.log", rec(T0 + 1, "after"))
            os.replace(rotated, path)
            while b"after" not in got:
                await trio.sleep(0.01)
            running = False
    assert got == b"before\nafter\n"


async def test_follow_stops_at_limit_bytes(tmp_path: Path) -> None:
    path = write(tmp_path / "0.log", rec(T0, "0123456789"))

    async def is_running() -> bool:
        return True  # would follow forever; the limit ends it

    with trio.fail_after(5):
        out = await collect(path, LogOptions(follow=True, limit_bytes=4),
                            is_running=is_running, poll_interval=0.01)
    assert out == b"0123"


async def test_follow_records_from_end(tmp_path: Path) -> None:
    path = write(tmp_path / "0.log", rec(T0, "history"))
    running = True

    async def is_running() -> bool:
        return running

    got: list[CriRecord] = []

    async def reader() -> None:
        async for r in logs.follow_records(path, from_end=True, follow=True,
                                           is_running=is_running, poll_interval=0.01):
            got.append(r)

    with trio.fail_after(5):
        async with trio.open_nursery() as n:
            n.start_soon(reader)
            await trio.sleep(0.05)
            write(path, rec(T0 + 1, "fresh", stream="stderr"))
            while not got:
                await trio.sleep(0.01)
            running = False
    assert got == [CriRecord(T0 + 1, "stderr", False, b"fresh")]


# -- the containerLogs query string (fleet.agent.api.log_options) ---------------------


@pytest.mark.parametrize(("query", "expected"), [
    ({}, LogOptions()),
    ({"follow": "true", "timestamps": "1", "tailLines": "5", "limitBytes": "10"},
     LogOptions(follow=True, timestamps=True, tail_lines=5, limit_bytes=10)),
    ({"tailLines": "-1"}, LogOptions()),
    ({"sinceSeconds": "10"}, LogOptions(since_ns=T0 - 10_000_000_000)),
    ({"sinceTime": "2026-11-29T15:59:00Z"}, LogOptions(since_ns=T0 - 60_000_000_000)),
    # Both: the later instant wins.
    ({"sinceSeconds": "10", "sinceTime": "2026-11-29T15:59:00Z"},
     LogOptions(since_ns=T0 - 10_000_000_000)),
])
def test_log_options(query: dict[str, str], expected: LogOptions) -> None:
    from fleet.agent.api import log_options
    assert log_options(query, now_ns=T0) == expected


@pytest.mark.parametrize("query", [{"tailLines": "x"}, {"tailLines": "-2"},
                                   {"sinceSeconds": "0"}, {"limitBytes": "0"},
                                   {"sinceTime": "yesterday"}])
def test_log_options_rejects(query: dict[str, str]) -> None:
    from fleet.agent.api import log_options
    from fleet.api.errors import BadRequest
    with pytest.raises(BadRequest):
        log_options(query, now_ns=T0)
