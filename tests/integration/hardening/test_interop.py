"""Issue 10, interop with standard AEP clients (#1, #2).

#1: Node 22's built-in ``WebSocket`` (what browsers and most JS consumers
use) must see the relay's ``error`` frame before every error-then-close,
and the close code the relay chose (not 1006): the relay finishes the close
handshake (waits, bounded, for the peer's close frame) instead of dropping
TCP under the client's unread data.

#2: an emitter whose events carry another ``agent`` than its hello identity
(the AEP conformance tooling does exactly this) is accepted and claims by
default, counted; ``AEP_STRICT_IDENTITY=1`` refuses it ``invalid-event``.
The roster shows the claim with the hello identity and ``control`` verbatim.
"""
from __future__ import annotations

import threading
import time

import pytest
from aep_sdk.control import ControlClient, open_duplex

from tests.support.daemon import DaemonProcess
from tests.support.hardening import event, node_ws, post_events, ws_url

HELLO = {"type": "hello", "versions": ["0.1"], "role": "consumer"}

ERROR_THEN_CLOSE = [
    # (name, frames sent, expected error code, expected close code)
    ("hello-required", [{"type": "subscribe", "id": "a"}], "hello-required", 1002),
    ("hello-required-not-json", ["not json"], "hello-required", 1002),
    ("version-unsupported", [{**HELLO, "versions": ["9.9"]}], "version-unsupported", 1002),
    ("invalid-hello-role", [{**HELLO, "role": "admin"}], "invalid-hello", 1002),
    ("invalid-hello-emitter-identity", [{**HELLO, "role": "emitter"}], "invalid-hello", 1002),
    ("binary-unsupported", [HELLO, {"binary": [1, 2, 3]}], "binary-unsupported", 1003),
]


@pytest.mark.parametrize("name,frames,code,close", ERROR_THEN_CLOSE,
                         ids=[c[0] for c in ERROR_THEN_CLOSE])
def test_node_websocket_sees_the_error_frame_before_the_close(relay_daemon, name, frames,
                                                              code, close):
    # several rounds: the race the bug loses is timing-dependent
    for _ in range(3):
        got = node_ws(ws_url(relay_daemon.url), frames)
        errors = [m for m in got["messages"] if isinstance(m, dict) and m.get("type") == "error"]
        assert [e["code"] for e in errors] == [code], got
        assert got["close"] is not None and got["close"]["code"] == close, got


def test_node_websocket_sees_closing_and_1001_at_shutdown(tmp_path):
    d = DaemonProcess(tmp_path / "state", args=("relay",)).start()
    try:
        stopped = threading.Event()

        def stop_soon() -> None:
            time.sleep(1.0)  # hello + subscribe answered first
            d.stop(timeout=20)
            stopped.set()

        got = node_ws(ws_url(d.url), [HELLO, {"type": "subscribe", "id": "a"}], wait_s=20,
                      on_open=lambda: threading.Thread(target=stop_soon, daemon=True).start())
        stopped.wait(30)
    finally:
        d.kill()
    types = [m.get("type") for m in got["messages"] if isinstance(m, dict)]
    assert "subscribed" in types and types[-1] == "closing", got
    assert got["close"] == {"code": 1001, "reason": got["close"]["reason"]}, got


# ------------------------------------------------------------------ #2 identity

CONTROL = {"accepts": ["control.cancel"], "ack_window_ms": 10000}


def _emit_as_checker(url: str, session: str) -> list[dict]:
    """What the AEP conformance tooling does: hello as
    ``aep-live-check-roster``, events as ``aep-live-check``. Returns the
    frames answered to the event (error frames, if any)."""
    duplex = open_duplex(url, connect_timeout_ms=10_000)
    duplex.send_json({"type": "hello", "versions": ["0.1"], "role": "emitter",
                      "identity": {"agent": "aep-live-check-roster", "instance": "probe/1"},
                      "capabilities": {"emits": ["tool"], "control": CONTROL}})
    assert duplex.recv_json()["type"] == "hello"
    duplex.send_json(event(1, session, agent="aep-live-check"))
    # ping after the event: its pong proves every answer to the event came first
    duplex.send_json({"type": "ping", "t": 7})
    answers = []
    while True:
        frame = duplex.recv_json()
        assert frame is not None
        if frame.get("type") == "pong":
            break
        answers.append(frame)
    return answers, duplex


def test_identity_mismatch_is_accepted_and_claimed_by_default(relay_daemon):
    answers, duplex = _emit_as_checker(relay_daemon.url, "idcheck-1")
    try:
        assert answers == []  # no invalid-event
        client = ControlClient(relay_daemon.url, agent="tester", host="laptop")
        client.connect(connect_timeout_ms=10_000)
        try:
            roster = [e for e in client.roster() if e.get("session") == "idcheck-1"]
        finally:
            client.close()
        assert roster == [{"session": "idcheck-1", "agent": "aep-live-check-roster",
                           "instance": "probe/1", "control": CONTROL, "emits": ["tool"]}]
    finally:
        duplex.close()


def test_strict_identity_refuses_the_mismatch(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_STRICT_IDENTITY": "1"}, args=("relay",)).start()
    try:
        answers, duplex = _emit_as_checker(d.url, "idcheck-2")
        duplex.close()
        assert [a.get("code") for a in answers] == ["invalid-event"], answers
        # and the relay still works for a matching emitter over HTTP
        assert post_events(d.url, [event(1, "idcheck-ok")]).status_code == 202
    finally:
        d.stop(timeout=20)
