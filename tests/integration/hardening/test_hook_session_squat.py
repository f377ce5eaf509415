"""Issue 25 (outside review): an unauthenticated OTLP export naming a held
Claude Code hook session made every answer to its ask ``ambiguous``.

The Claude Code hook bridge names its AEP session by the hook's
``session_id`` and the OTLP bridge names its by the export's
``conversation.id``, both verbatim. Before the fix, anyone who can reach
the (unauthenticated) OTLP receiver exported one record with
``conversation.id`` = the hook session's id: the OTLP bridge (agent
``codex``) emitted into that session and claimed it beside the hook bridge
(agent ``claude-code``), so the relay saw two fleet claimants and refused
every ``control.attention.respond`` to the held ask ``ambiguous``; the
Claude Code user's tool call waited out its hold. Now a fleet bridge never
enters a session a fleet bridge of another agent claims
(``supervisor/relay/ingest.py`` ``Ingest.fleet_refusal``): the OTLP
bridge's event is refused before the session log, counted
``refused_fleet_into_owned``, and the answer reaches the held hook.

The real daemon (``aep-bridges run``: the Claude Code hook bridge with its
gate on, the OTLP bridge, the embedded relay), real-shaped hook payloads,
a raw OTLP/JSON export, the SDK ``ControlClient``.
"""
from __future__ import annotations

from tests.integration.hooks.test_daemon import BASH, Background, HookDaemon, ask_of, moment
from tests.support.daemon import send_command
from tests.support.hardening import otlp_json, otlp_record, post_otlp, refused_fleet_into_owned, stream_events

SESSION = "cc1"


def _refused_fleet_into_owned(d: HookDaemon) -> float:
    return refused_fleet_into_owned(d.url, d.token)


def test_an_otlp_export_naming_a_held_hook_session_does_not_make_its_answer_ambiguous(tmp_path):
    d = HookDaemon(tmp_path / "state", AEP_BRIDGE_OTLP_IN="1", AEP_CLAUDE_CODE_CONTROL="1",
                   AEP_CLAUDE_CODE_GATE_TOOLS="Bash", AEP_CLAUDE_CODE_HOLD_S="60")
    d.start()
    stream = d.subscribe()
    held = None
    try:
        assert d.post(moment(SESSION, "SessionStart", source="startup")).status_code == 200
        held = Background(d, moment(SESSION, "PreToolUse", tool_use_id="toolu_1", **BASH))
        ask = ask_of(stream, SESSION)
        assert ask["data"]["kind"] == "permission" and ask["subject"] == "Bash"
        assert held.headers_seen.wait(30), "the held hook's response start never came"
        assert held.response is None  # held for its decision
        assert _refused_fleet_into_owned(d) == 0
        # anyone on the OTLP port, no token: one record naming the hook session
        r = post_otlp(d.http_port, otlp_json([otlp_record(SESSION)]))
        assert r.status_code == 200, r.text
        status, detail = send_command(d, "control.attention.respond", SESSION,
                                      subject=ask["id"], data={"answer": {"option": "allow"}})
        assert status == "accepted", (status, detail)
        got = held.result()
        assert got.status_code == 200, got.text
        assert got.json()["hookSpecificOutput"]["permissionDecision"] == "allow", got.text
        # the export was answered once the pump handled it: its event was refused
        assert _refused_fleet_into_owned(d) >= 1
        stream.first(lambda e: e.get("session") == SESSION and e["type"] == "attention.resolved",
                     what="attention.resolved")
        in_session = [e for e in stream_events(d.url, d.token) if e.get("session") == SESSION]
        assert in_session and {e["agent"] for e in in_session} == {"claude-code"}, in_session
        assert not [e for e in in_session if str(e["type"]).startswith("x.codex.")], in_session
        assert d.log().count("refused_fleet_into_owned") == 1  # logged once per session
    finally:
        stream.close()
        d.stop(timeout=20)
        if held is not None:
            held.thread.join(10)
