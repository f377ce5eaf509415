"""Spool ingestion (``hooks-contract.md`` §3): what a shim spooled is taken
at run start and while running, fed through the live path as spooled
(never held, even with the gate open), malformed lines counted and
skipped, leftovers of a crashed ingest taken first, a moment the daemon
already had (same hook id) emitted once."""
from __future__ import annotations

import fcntl
import json
import os

import trio

from bridges.claude_code.profile import PROFILE as CLAUDE
from bridges.core.envelope import ms_text
from bridges.hooks_common import spool
from bridges.hooks_common.config import HookConfig
from bridges.hooks_common.hub import now_ms
from tests.support.hooks import Rig


def line(hid, payload, agent="claude-code", at=1):
    return json.dumps({"id": hid, "agent": agent, "spooled_at_ms": at, "payload": payload}) + "\n"


def mo(event, **kw):
    return {"hook_event_name": event, "session_id": "sp", **kw}


async def wait_counter(rig, name, n):
    for _ in range(5000):
        if rig.ctx.health.counters.get(name, 0) >= n:
            return
        await trio.sleep(0.001)
    raise AssertionError(f"{name}: {rig.ctx.health.counters}")


async def test_spooled_moments_are_ingested_never_held_and_malformed_lines_counted(tmp_path):
    (tmp_path / "claude-code.jsonl").write_text(
        line("a" * 32, mo("UserPromptSubmit"))
        + "not json\n"
        + line("b" * 32, "raw text the vendor sent")
        + line("c" * 32, mo("Stop"), agent="codex")
        + line("d" * 32, json.dumps(mo("PermissionRequest", tool_name="Bash",
                                       tool_input={"command": "ls"})))
        + line("e" * 32, mo("Stop")))
    cfg = HookConfig(control=True, aep_token=True, gate_tools=("*",), spool_dir=tmp_path)
    rig = Rig(CLAUDE, cfg)
    async with trio.open_nursery() as n:
        await rig.start(n)
        await wait_counter(rig, "hooks_spool_malformed", 3)
        await wait_counter(rig, "hooks_spooled_ingested", 3)  # counted once mapped and logged
        n.cancel_scope.cancel()
    assert rig.types() == ["run.started", "attention.requested", "attention.resolved",
                           "run.finished"]
    assert rig.of("attention.requested")[0]["data"]["respond_via"] == ["oob"]
    assert rig.ctx.health.counters["hooks_held"] == 0
    assert not list(tmp_path.iterdir())


async def test_a_leftover_ingesting_file_is_taken_and_a_repeat_id_is_emitted_once(tmp_path):
    (tmp_path / "claude-code.jsonl.ingesting-01AAAA").write_text(line("f" * 32, mo("UserPromptSubmit")))
    rig = Rig(CLAUDE, HookConfig(spool_dir=tmp_path))
    async with trio.open_nursery() as n:
        await rig.start(n)
        await wait_counter(rig, "hooks_spooled_ingested", 1)
        # the same moment live (the shim gave up after the daemon had it) and spooled again
        await rig.post(mo("Stop"), headers={"X-AEP-Hook-Id": "g" * 32})
        (tmp_path / "claude-code.jsonl").write_text(line("g" * 32, mo("Stop")))
        await wait_counter(rig, "hooks_duplicate", 1)
        n.cancel_scope.cancel()
    assert rig.types() == ["run.started", "run.finished"]


async def test_spooled_events_carry_the_moments_own_time_and_durations(tmp_path):
    """A turn that ran while the daemon was down: each event is stamped
    with its moment's ``spooled_at_ms``, and the run, tool and ask
    durations are the differences of those, not of the ingestion times."""
    t = now_ms() - 600_000  # ten minutes ago
    bash = {"tool_name": "Bash", "tool_input": {"command": "ls"}}
    (tmp_path / "claude-code.jsonl").write_text(
        line("a" * 32, mo("UserPromptSubmit", prompt="hi"), at=t)
        + line("b" * 32, mo("PreToolUse", tool_use_id="tu1", **bash), at=t + 1_000)
        + line("c" * 32, mo("PermissionRequest", **bash), at=t + 1_500)
        + line("d" * 32, mo("PostToolUse", tool_use_id="tu1", tool_response="ok", **bash),
               at=t + 4_000)
        + line("e" * 32, mo("Stop"), at=t + 9_000))
    rig = Rig(CLAUDE, HookConfig(spool_dir=tmp_path))
    async with trio.open_nursery() as n:
        await rig.start(n)
        await wait_counter(rig, "hooks_spooled_ingested", 5)
        n.cancel_scope.cancel()
    at = {e["type"]: e["time"] for e in rig.events()}
    assert at == {"run.started": ms_text(t), "tool.requested": ms_text(t + 1_000),
                  "attention.requested": ms_text(t + 1_500),
                  "tool.completed": ms_text(t + 4_000),
                  "attention.answered": ms_text(t + 4_000),
                  "attention.resolved": ms_text(t + 4_000), "run.finished": ms_text(t + 9_000)}
    assert rig.of("run.finished")[0]["data"]["duration_ms"] == 9_000
    assert rig.of("tool.completed")[0]["data"]["duration_ms"] == 3_000
    assert rig.of("attention.resolved")[0]["data"]["latency_ms"] == 2_500
    assert [e["seq"] for e in rig.events()] == list(range(7))  # the log order is the moments'


async def test_a_moment_replayed_with_the_spooled_header_carries_that_time():
    rig = Rig(CLAUDE, HookConfig())
    t = now_ms() - 60_000
    async with trio.open_nursery() as n:
        await rig.start(n)
        await rig.post(mo("UserPromptSubmit"), headers={"X-AEP-Hook-Spooled": str(t)})
        await rig.post(mo("Stop"))  # live: its arrival, a minute later
        n.cancel_scope.cancel()
    start, fin = rig.events()
    assert start["time"] == ms_text(t)
    assert fin["time"] > start["time"] and fin["data"]["duration_ms"] >= 60_000


def test_claim_renames_under_the_writers_lock_so_a_writer_reopens(tmp_path):
    path = tmp_path / "claude-code.jsonl"
    path.write_text(line("h" * 32, mo("Stop")))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    fcntl.flock(fd, fcntl.LOCK_EX)
    done = {}
    import threading

    def take():
        done["p"] = spool.claim(tmp_path, "claude-code")
    t = threading.Thread(target=take)
    t.start()
    t.join(0.2)
    assert t.is_alive(), "claim must wait for the writer's lock"
    os.write(fd, line("i" * 32, mo("Stop")).encode())
    fcntl.flock(fd, fcntl.LOCK_UN)
    t.join(10)
    taken = done["p"]
    assert taken is not None and taken.name.startswith("claude-code.jsonl.ingesting-")
    assert len(taken.read_text().splitlines()) == 2  # the locked writer's line came along
    assert os.fstat(fd).st_ino != (os.stat(path).st_ino if path.exists() else -1)
    os.close(fd)
    assert spool.claim(tmp_path, "claude-code") is None


def test_parse_line_takes_the_contract_shape_only():
    assert spool.parse_line(line("x" * 32, mo("Stop"), at=5).encode(), "claude-code") == \
        ("x" * 32, mo("Stop"), 5)
    assert spool.parse_line(line("x" * 32, json.dumps(mo("Stop"))).encode(), "claude-code") == \
        ("x" * 32, mo("Stop"), 1)
    for at in (None, "5", True, 1.5):  # no usable spool time: the moment takes its arrival's
        assert spool.parse_line(line("x" * 32, mo("Stop"), at=at).encode(),
                                "claude-code").at_ms is None
    for bad in (b"", b"[]", b"{", line("x", mo("Stop"), agent="codex").encode(),
                line("x", [1]).encode(), line("x", "not json").encode()):
        assert spool.parse_line(bad, "claude-code") is None


def test_a_symlinked_spool_file_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(line("z" * 32, mo("Stop")))
    (tmp_path / "claude-code.jsonl").symlink_to(elsewhere)
    import pytest
    with pytest.raises(spool.Foreign):
        spool.claim(tmp_path, "claude-code")
    assert elsewhere.exists() and (tmp_path / "claude-code.jsonl").is_symlink()


def test_a_spool_file_of_another_user_is_left_alone(tmp_path, monkeypatch):
    (tmp_path / "claude-code.jsonl").write_text(line("y" * 32, mo("Stop")))
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # as if another user wrote it
    import pytest
    with pytest.raises(spool.Foreign):
        spool.claim(tmp_path, "claude-code")
    assert spool.pending(tmp_path, "claude-code") == []
    assert (tmp_path / "claude-code.jsonl").exists()


async def test_an_overlong_hook_id_is_not_remembered(tmp_path):
    """Issue 25 re-attack: the dedupe set keeps 8,192 hook ids, each as long
    as a request header may be (~16 KB): +106 MB RSS measured from one token
    holder, per hook bridge. An id longer than the shim's (32 hex) by far is
    not one the daemon dedupes on."""
    rig = Rig(CLAUDE, HookConfig(spool_dir=tmp_path))
    async with trio.open_nursery() as n:
        await rig.start(n)
        for i in range(3):
            await rig.post(mo("Notification", notification_type="other", message="m"),
                           headers={"X-AEP-Hook-Id": f"{i:04d}" + "a" * 15_000})
        n.cancel_scope.cancel()
    assert rig.run is not None
    assert all(len(k) <= 128 for k in rig.run.hub.seen)  # the shim's ids are 32
