"""Issue 25, a fifth outside attack: a 4 MB event ``id`` was accepted on
``/socket`` and ``POST /events`` (bounded only by ``AEP_MAX_BODY``) and then
held in the relay's buffers, the session log, ack tables and command
ledgers. An ``id`` (and a ``cause``) is at most ``MAX_ID`` characters, the
correlation names ``MAX_NAME``, ``source`` ``MAX_SOURCE``: past them the
event is refused ``invalid-event`` before anything keeps it, and the
refusal never echoes the value back (README "Security", docs/security.md).

The real daemon (``aep-bridges relay``), raw WebSocket frames and HTTP posts.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from supervisor.relay.envelope import MAX_ID, MAX_NAME
from tests.support.hardening import event, post_events, ws_frame, ws_read_frames, ws_upgrade

BIG = 4 << 20  # the attack's size: 4 MiB, well under AEP_MAX_BODY (16 MiB)


def _stream(url: str) -> list[dict[str, Any]]:
    """Every event the relay holds now (``from=all``, ``live=0``)."""
    out = []
    with httpx.stream("GET", url + "/stream", params={"from": "all", "live": "0"},
                      timeout=30, trust_env=False) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def _largest_file(state: Path) -> int:
    """The size of the largest file under the daemon's state directory
    (session logs, journals): nothing there may hold the attack's bytes."""
    return max((p.stat().st_size for p in state.rglob("*") if p.is_file()), default=0)


def test_post_events_refuses_a_4mb_id_and_keeps_nothing_of_it(relay_daemon):
    d = relay_daemon
    long_id = event(0, "post-long-id", id="I" * BIG)
    r = post_events(d.url, [long_id])
    assert r.status_code == 400, r.status_code
    body = r.json()
    assert body["error"] == "invalid-event" and f"id longer than {MAX_ID}" in body["detail"], body
    assert len(r.content) < 1024  # the answer does not carry the id back
    # in a batch: the line is named, nothing of the batch admitted
    batch = [event(0, "post-long-id"), {**event(1, "post-long-id"), "cause": "C" * (MAX_ID + 1)},
             event(2, "post-long-id")]
    r = post_events(d.url, batch)
    assert r.status_code == 400 and r.json()["line"] == 1, r.text  # (0-based)
    assert "cause longer than" in r.json()["detail"]
    r = post_events(d.url, [event(0, "post-long-id", id="short-1", agent="a" * (MAX_NAME + 1))])
    assert r.status_code == 400 and "agent longer than" in r.json()["detail"], r.text
    # an id at the bound is an id like any other
    at_bound = event(0, "post-long-id", id="J" * MAX_ID)
    assert post_events(d.url, [at_bound]).status_code == 202
    held = [e for e in _stream(d.url) if e.get("session") == "post-long-id"]
    assert [e["id"] for e in held] == [at_bound["id"]]
    assert _largest_file(d.state) < BIG // 4


def test_socket_refuses_a_4mb_id_without_echoing_it_and_goes_on(relay_daemon):
    d = relay_daemon
    s = ws_upgrade(d.port)
    try:
        s.sendall(ws_frame({"type": "hello", "versions": ["0.1"], "role": "emitter",
                            "identity": {"agent": "tester"}}))
        got = ws_read_frames(s, until=lambda f: f.get("type") == "hello")
        assert got and got[-1].get("type") == "hello", got
        s.sendall(ws_frame(event(0, "ws-long-id", id="W" * BIG)))
        s.sendall(ws_frame({**event(0, "ws-long-id"), "session": "S" * (MAX_NAME + 1)}))
        s.sendall(ws_frame(event(1, "ws-long-id")))
        s.sendall(ws_frame({"type": "ping", "t": 7}))
        frames = ws_read_frames(s, until=lambda f: f.get("type") == "pong", timeout=30)
    finally:
        s.close()
    errors = [f for f in frames if f.get("type") == "error"]
    assert [e.get("code") for e in errors] == ["invalid-event", "invalid-event"], frames
    assert f"id longer than {MAX_ID}" in errors[0]["detail"]
    assert "session longer than" in errors[1]["detail"]
    assert "cause" not in errors[0]  # a 4 MB id is not sent back to its sender
    assert errors[1]["cause"] == event(0, "ws-long-id")["id"]  # a bounded id still is
    assert frames[-1] == {"type": "pong", "t": 7}  # the connection served on
    held = [e for e in _stream(d.url) if "ws-long-id" in str(e.get("source"))]
    assert [e["seq"] for e in held] == [1]  # the valid one, only
    assert _largest_file(d.state) < BIG // 4
