"""Which sessions a restarted ``tail`` catches up on
(:func:`supervisor.tools.missed.missed`), over a scripted replay: new by
their events' time, or holding an ask still open whatever its clock says."""
from __future__ import annotations

from supervisor.tools import missed as missed_mod

SAVED = 1_800_000_000.0  # the save, Unix seconds


def at(offset_s: float) -> str:
    from datetime import datetime, timezone
    return datetime.fromtimestamp(SAVED + offset_s, timezone.utc).isoformat().replace("+00:00", "Z")


def ev(session: str, type_: str, when: float, **kw) -> dict:
    return {"id": f"{session}-{type_}-{when}", "type": type_, "session": session,
            "source": f"aep://h/agent/a/session/{session}", "time": at(when), **kw}


def test_new_sessions_and_open_asks_count_old_and_known_ones_do_not(monkeypatch):
    replay = [
        ev("known", "progress.updated", 10),          # in the saved position
        ev("old", "progress.updated", -7200),          # before the save, nothing open
        ev("new", "session.started", 5),               # after it
        ev("late", "progress.updated", -30),           # within the slack: in flight at the close
        ev("askold", "attention.requested", -86400),   # a day off, still open
        ev("settledask", "attention.requested", -86400),
        {**ev("settledask", "attention.resolved", -86399), "subject": "settledask-attention.requested--86400"},
        ev("elsewhere", "attention.requested", -86400),  # settled by what tail already knew
        {"type": "x.v.agent_scoped", "id": "z", "time": at(100)},  # no session: nothing to replay
    ]
    seen = []

    def held(url, token, flt, **kw):
        seen.append(flt)
        return iter(replay)
    monkeypatch.setattr(missed_mod, "held", held)
    elsewhere = ev("elsewhere", "attention.requested", -86400)
    got = missed_mod.missed("http://x", None, {"agent": "a"}, known={"known"}, since=SAVED,
                            settled={("aep://h/agent/a/session/elsewhere", "elsewhere",
                                      elsewhere["id"]): "answered"}, deadline=0)
    assert got == ["new", "late", "askold"]
    assert seen == [{"agent": "a"}]  # the tail's own filter


def test_replay_pins_the_sessions_in_batches(monkeypatch):
    calls = []
    monkeypatch.setattr(missed_mod, "held",
                        lambda url, token, flt, **kw: calls.append(flt) or iter(()))
    sessions = [f"s{i}" for i in range(missed_mod.BATCH + 1)]
    assert list(missed_mod.replay("http://x", None, {"session": "ignored", "agent": "a"},
                                  sessions, deadline=0)) == []
    assert [c["session"] for c in calls] == [sessions[:missed_mod.BATCH], sessions[missed_mod.BATCH:]]
    assert all(c["agent"] == "a" for c in calls)
