"""The relay's re-admission of the session logs at start (issue 25 row 9,
``supervisor/relay/restore.py``): the tails of live files and rotated
(plain and ``.gz``) segments, in order, bounded by the buffer settings."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import trio

from bridges.core.aep import dumps
from supervisor.relay.attrmatch import Filter
from supervisor.relay.core import Relay
from supervisor.relay.restore import read_tails, restore_from_logs


def _ev(session: str, seq: int, **kw) -> dict:
    return {"aep": "0.1", "id": f"{session}-{seq}", "type": "tool.completed",
            "time": "2026-12-01T10:00:00.000Z", "source": f"aep://h/agent/a/session/{session}",
            "agent": "a", "session": session, "epoch": 3, "seq": seq, **kw}


def _lines(evs) -> bytes:
    return b"".join(dumps(e) + b"\n" for e in evs)


def _write_session(root: Path, session: str) -> list[dict]:
    """A rotated session: a .gz segment (1-10), a plain segment (11-20),
    the live file (21-30) with a torn tail and a command and an agent.* line."""
    d = root / "a"
    d.mkdir(parents=True, exist_ok=True)
    evs = [_ev(session, i) for i in range(1, 31)]
    with gzip.open(d / f"{session}.20261201T100000.000001Z.jsonl.gz", "wb") as f:
        f.write(_lines(evs[:10]))
    (d / f"{session}.20261201T100001.000001Z.jsonl").write_bytes(_lines(evs[10:20]))
    cmd = {"aep": "0.1", "id": "c1", "type": "control.cancel", "time": "2026-12-01T10:00:00.000Z",
           "source": "aep://x/agent/op", "agent": "op", "session": session}
    live = _lines(evs[20:25]) + dumps(cmd) + b"\n" + _lines(evs[25:]) + b'{"aep":"0.1","id":"torn'
    (d / f"{session}.jsonl").write_bytes(live)
    return evs




async def _stream_all(relay: Relay) -> list[dict]:
    outlet = relay.open_stream(Filter({}), None, plan_all=True, positions=None, live=False)
    chunks: list[bytes] = []
    with trio.fail_after(10):
        while True:
            got = await outlet.next_batch()
            if got is None:
                break
            payloads, _ = got
            if not payloads:
                break
            chunks.extend(p if isinstance(p, bytes) else p.encode() for p in payloads)
            if any(b"replay-complete" in c for c in chunks):
                break
    text = b"".join(chunks).decode()
    return [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: ")]


def test_every_file_of_a_rotated_session_in_order(tmp_path):
    evs = _write_session(tmp_path, "s1")
    chosen, counts = read_tails(tmp_path, depth=100, buffer_bytes=1 << 20,
                                total_bytes=1 << 24, max_sessions=10)
    assert counts["files"] == 3 and counts["sessions"] == 1
    got = [json.loads(ln) for ln in chosen[0]]
    assert [e["id"] for e in got if "seq" in e] == [e["id"] for e in evs]


def test_depth_reads_only_the_tail(tmp_path):
    evs = _write_session(tmp_path, "s1")
    chosen, counts = read_tails(tmp_path, depth=8, buffer_bytes=1 << 20,
                                total_bytes=1 << 24, max_sessions=10)
    ids = [json.loads(ln)["id"] for ln in chosen[0]]
    assert ids[-1] == evs[-1]["id"] and len(ids) == 8
    assert counts["files"] == 1  # the live file held enough: no segment was opened


def test_the_session_cap_keeps_the_most_recent(tmp_path):
    for i in range(5):
        _write_session(tmp_path, f"s{i}")
        for f in (tmp_path / "a").glob(f"s{i}.*"):
            os.utime(f, (1000 + i, 1000 + i))
    chosen, counts = read_tails(tmp_path, depth=100, buffer_bytes=1 << 20,
                                total_bytes=1 << 24, max_sessions=2)
    sessions = [json.loads(c[0])["session"] for c in chosen]
    assert sessions == ["s3", "s4"]  # oldest first, so the buffers' recency is the logs'


async def test_restored_events_keep_their_ids_and_positions(tmp_path):
    evs = _write_session(tmp_path, "s1")
    relay = Relay()
    got = await restore_from_logs(relay, tmp_path)
    assert got["restored"] == 30 and got["skipped"] == 1  # the command (the torn tail is not read)
    assert relay.buffers.held("s1") == 30
    # a resume position is answered from the restored history
    assert relay.counters["restored_events"] == 30
    served = await _stream_all(relay)
    assert [(e["id"], e["epoch"], e["seq"]) for e in served] == \
        [(e["id"], e["epoch"], e["seq"]) for e in evs]


async def test_the_byte_caps_bound_what_is_read(tmp_path):
    for i in range(4):
        _write_session(tmp_path, f"s{i}")
    relay = Relay(buffer_bytes=4096, total_bytes=8192)
    got = await restore_from_logs(relay, tmp_path)
    assert 0 < got["restored"] < 120 and got["bytes"] <= 8192
    assert relay.buffers.bytes <= 8192


def test_a_line_bigger_than_the_share_is_passed_over_not_the_end(tmp_path):
    """A line bigger than the session's whole byte share (a poster's big
    event, the newest or in between, in the live file or a ``.gz``
    segment) is counted ``oversize`` and passed over; the lines before it
    are still restored (issue 25 re-attack: it hid the whole history)."""
    d = tmp_path / "a"
    d.mkdir()
    evs = [_ev("s", i) for i in range(1, 9)]
    big = [_ev("s", 100 + i, data={"pad": "x" * 300_000}) for i in range(3)]
    with gzip.open(d / "s.20261201T100000.000001Z.jsonl.gz", "wb") as f:
        f.write(_lines(evs[:2] + big[:1]))
    # in the live file: one in between, one that is the newest, one as a torn tail
    (d / "s.jsonl").write_bytes(_lines(evs[2:5] + big[1:2] + evs[5:] + big[2:])
                                + dumps(big[0])[:200_000])
    chosen, counts = read_tails(tmp_path, depth=100, buffer_bytes=100_000, total_bytes=10**9,
                                max_sessions=10)
    assert [json.loads(ln)["seq"] for ln in chosen[0]] == [e["seq"] for e in evs]
    assert counts["oversize"] == 4
