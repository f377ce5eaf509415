"""Round 8 outside attack, finding 6 (issue 25): every fleet bridge bound
its sessions as the one principal FLEET, the unauthenticated OTLP receiver
included, and a full table forgets a principal's own least recently used
binding first: an OTLP flood of new ``conversation.id`` s pushed out a live
Claude Code hook session's binding, and after a restart a per-emitter
credential posted into that session. An open bridge's bindings are their
own kind now (``supervisor/relay/bindings.py``): its new ones push out
only its own kind's."""
from __future__ import annotations

import json

from supervisor.relay import Relay
from supervisor.relay.bindings import FLEET, SHARED, Bindings, named

CAP = 8
S = "3b9f1f64-8d0c-4c55-9d43-5b1f2d2b7c11"  # a Claude Code session


async def _noop(cmd):
    return None


def _ev(seq, session, agent, source=None):
    return {"aep": "0.1", "id": f"{agent}-{session}-{seq}", "type": "tool.completed",
            "time": "2026-12-01T10:00:00.000Z",
            "source": source or f"aep://h/agent/{agent}/session/{session}", "agent": agent,
            "session": session, "epoch": 1, "seq": seq}


def _relay(journal):
    r = Relay(token="shared", emitter_tokens={"evil": "evil-tok"})
    r.bindings.cap = CAP
    r.bindings.open(journal, 0.0)
    claude = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                               "identity": {"agent": "claude-code"}}, _noop)
    otlp = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                             "identity": {"agent": "codex"}}, _noop, open_sessions=True)
    return r, claude, otlp


def _evil_into_s(r):
    posted = [r.entry(_ev(0, S, "claude-code", source="urn:evil"))]
    return r.check_posted_sessions(posted, named("evil"))


async def test_an_open_bridges_flood_keeps_a_hook_sessions_binding_across_a_restart(tmp_path):
    journal = tmp_path / "relay-bindings.jsonl"
    r, claude, otlp = _relay(journal)
    await claude.ingest(_ev(1, S, "claude-code"))  # the live hook session
    assert _evil_into_s(r) is not None
    for i in range(3 * CAP):  # an unauthenticated sender's new conversations
        await otlp.ingest(_ev(1, f"otlp-conv-{i}", "codex"))
    assert len(r.bindings) <= CAP
    b = r.bindings.get(S)
    assert b is not None and b.principal == FLEET
    r.bindings.close()
    # the restart: the claims are gone, the journal is what is left
    again, _, _ = _relay(journal)
    why = _evil_into_s(again)
    assert why is not None and "belongs to a bridge of this daemon" in why[1]
    assert again.counters["refused_owned_session"] == 1
    again.bindings.close()


def test_the_attackers_order_with_cap_8():
    # REPORT.md finding 6, 10-bindings-fleet-flood-unit.py, with the bridge's kind said
    b = Bindings(CAP, 120.0)
    t = 1000.0
    b.bind_fleet("claude-session-S", "aep://h/agent/claude-code/session/claude-session-S", t)
    for i in range(CAP):
        b.bind_fleet(f"otlp-conv-{i}", f"aep://h/agent/codex/session/otlp-conv-{i}", t + 1 + i,
                     open_=True)
    assert b.refusal("claude-session-S", named("evil"), "urn:evil", t + 20, live=False) \
        == "this session belongs to a bridge of this daemon"
    assert b.get("otlp-conv-0") is None and b.get(f"otlp-conv-{CAP - 1}") is not None


def test_an_open_binding_never_pushes_out_another_kind():
    b = Bindings(4, 120.0)
    b.bind_fleet("hook", "aep://h/agent/claude-code/session/hook", 1.0)
    b.bind("cred", named("alice"), "urn:alice", 2.0)
    b.bind("tok", SHARED, "urn:tok", 3.0)
    b.bind_fleet("hook2", "aep://h/agent/claude-code/session/hook2", 4.0)
    b.bind_fleet("o1", "aep://h/agent/codex/session/o1", 5.0, open_=True)  # the only open one
    assert b.get("o1") is None  # not kept: nothing of its kind to push out
    assert all(b.get(s) is not None for s in ("hook", "cred", "tok", "hook2"))


def test_every_other_binder_pushes_out_the_open_kind_before_any_verified_one():
    b = Bindings(4, 120.0)
    b.bind_fleet("hook", "aep://h/x", 1.0)
    b.bind("cred", named("alice"), "urn:alice", 2.0)
    b.bind_fleet("o1", "aep://h/o1", 3.0, open_=True)
    b.bind_fleet("o2", "aep://h/o2", 4.0, open_=True)
    b.bind_fleet("hook2", "aep://h/y", 5.0)  # an authenticated bridge's: the open kind's first
    assert b.get("o1") is None and b.get("hook") is not None
    b.bind("cred2", named("bob"), "urn:bob", 6.0)  # a credential's first: the open kind's too
    assert b.get("o2") is None and b.get("cred") is not None and b.get("hook") is not None


def test_a_hook_bridge_takes_an_open_bridges_binding_into_its_kind(tmp_path):
    # Codex in companion mode: the OTLP export opened the session, the hook
    # bridge writes it too; the binding is the authenticated kind's then
    b = Bindings(CAP, 120.0)
    b.open(tmp_path / "j.jsonl", 0.0)
    b.bind_fleet("cx", "aep://h/agent/codex/session/cx", 1.0, open_=True)
    assert b.bind_fleet("cx", "aep://h/hooks/cx", 2.0) is False
    b.bind_fleet("cx", "aep://h/agent/codex/session/cx", 2.5, open_=True)  # the open one again
    for i in range(3 * CAP):
        b.bind_fleet(f"o{i}", f"aep://h/o{i}", 3.0 + i, open_=True)
    assert b.get("cx") is not None and not b.get("cx").open  # type: ignore[union-attr]
    b.close()
    rows = [json.loads(x) for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    kinds = {}
    for row in rows:
        kinds[row["s"]] = row.get("o")
    assert kinds["cx"] is None and kinds[f"o{3 * CAP - 1}"] == 1
    # read back: the kinds kept
    again = Bindings(CAP, 120.0)
    again.open(tmp_path / "j.jsonl", 0.0)
    for i in range(3 * CAP, 4 * CAP):
        again.bind_fleet(f"o{i}", f"aep://h/o{i}", 9.0, open_=True)
    assert again.get("cx") is not None
    again.close()


def test_a_journal_from_before_kinds_reads_every_fleet_binding_as_authenticated(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text("".join(json.dumps({"s": f"s{i}", "p": FLEET, "src": "aep://h/x"}) + "\n"
                            for i in range(4)))
    b = Bindings(4, 120.0)
    assert b.open(path, 0.0) == 4
    b.bind_fleet("o", "aep://h/o", 1.0, open_=True)
    assert all(b.get(f"s{i}") is not None for i in range(4)) and b.get("o") is None
    b.close()
