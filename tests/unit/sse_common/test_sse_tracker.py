"""The runtime tracker (``bridges/sse_common/tracker.py``): the real
captures replayed end to end, then the control, run and reconcile rules on
small synthetic sequences (shapes as the real servers send them)."""
from __future__ import annotations

from collections import Counter

import pytest

from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.sse_common.frames import BusEvent
from bridges.sse_common.tracker import Out, Tracker
from tests.support.opencode_fixtures import global_events, rest
from tests.support.schema import validate_stream

VENDORS = ["opencode", "kilocode"]


def stamp(outs: list[Out], stamper: Stamper) -> list[dict]:
    """What the receiver does: stamp in order, resolving ``cause_of``."""
    evs = []
    for o in outs:
        o.envelope = stamper.stamp(o.session, o.emission, run=o.run, cause=o.resolved_cause())
        evs.append(o.envelope)
    return evs


def replay(vendor: str, mode: str) -> tuple[Tracker, list[dict]]:
    tr = Tracker(Posture(agent=vendor, mode=mode))
    st = Stamper(vendor, epoch=3, host="test")
    evs: list[dict] = []
    for ev in global_events(vendor):
        evs += stamp(tr.feed(ev), st)
    return tr, evs


def core(evs):
    return [e for e in evs if not e["type"].startswith("x.")]


@pytest.mark.parametrize("vendor", VENDORS)
def test_primary_replay_of_the_real_capture(vendor):
    tr, evs = replay(vendor, "primary")
    validate_stream(evs)  # schemas, seq/epoch, terminal exclusivity, attention closure
    types = Counter(e["type"] for e in evs)
    # the capture's script: 6 prompts (plain, 3 bash, question, slow+abort)
    assert types["run.started"] == 6 and types["run.finished"] == 6
    assert types["session.started"] == 2 and types["session.ended"] == 1
    assert types["attention.requested"] == 4 and types["attention.resolved"] == 4
    assert types["tool.completed"] == 3  # two bash calls + the question tool
    assert types["tool.denied"] == 1 and types["tool.failed"] == 0
    denied = next(e for e in evs if e["type"] == "tool.denied")
    assert denied["data"]["by"] == "runtime"  # rejected on the vendor's own route
    # every lifecycle event names its request by the request's envelope id
    req = {e["id"]: e for e in evs if e["type"] == "attention.requested"}
    for e in evs:
        if e["type"] == "attention.resolved":
            assert e["subject"] in req and e["cause"] == e["subject"]
            assert e["run"] == req[e["subject"]]["run"]
    # runs are the vendor's user message ids, each closed exactly once
    runs = [e["run"] for e in evs if e["type"] == "run.started"]
    assert all(r.startswith("msg_") for r in runs) and len(set(runs)) == 6
    # the sync duplicates were dropped by id, the deltas never emitted
    assert tr.counters["duplicates"] > 0 and tr.counters["deltas_skipped"] > 0


@pytest.mark.parametrize("vendor", VENDORS)
def test_companion_replay_has_no_core_type(vendor):
    _, evs = replay(vendor, "companion")
    validate_stream(evs)
    assert evs and all(e["type"].startswith(f"x.{vendor}.") for e in evs)
    assert all(e.get("severity") in ("debug", "error") for e in evs)


@pytest.mark.parametrize("vendor", VENDORS)
def test_other_directory_session_is_seen_on_the_global_stream(vendor):
    other = rest(vendor, "create session other dir")["answer"]
    _, evs = replay(vendor, "primary")
    mine = [e["type"] for e in evs if e["session"] == other["id"]]
    assert mine == ["session.started", "session.ended"]


# ---------------------------------------------------------------- synthetic

S = "ses_1"


def ev(type_, **props):
    props.setdefault("sessionID", S)
    return BusEvent(type_, props)


def user(mid="msg_u1"):
    return ev("message.updated", info={"id": mid, "role": "user", "sessionID": S})


def ask(pid="per_1", call="call_1", cmd="rm -rf build"):
    return ev("permission.asked", id=pid, permission="bash", patterns=[cmd],
              metadata={"command": cmd}, always=["rm *"],
              tool={"messageID": "msg_a1", "callID": call})


def tool(call, status, **state):
    return ev("message.part.updated", part={"type": "tool", "tool": "bash", "callID": call,
                                            "sessionID": S, "state": {"status": status, **state}})


class Run:
    def __init__(self, answerable=True):
        self.tr = Tracker(Posture(agent="opencode", mode="primary", answerable=answerable))
        self.st = Stamper("opencode", epoch=1, host="test")
        self.evs: list[dict] = []

    def feed(self, *events):
        out = []
        for e in events:
            out += stamp(self.tr.feed(e), self.st)
        self.evs += out
        return out

    def types(self, evs=None):
        return [e["type"] for e in (self.evs if evs is None else evs)]


def test_steering_never_double_opens_and_a_closed_run_never_reopens():
    r = Run()
    r.feed(user("msg_u1"), user("msg_u2"))
    assert r.types() == ["run.started"] and r.evs[0]["run"] == "msg_u1"
    r.feed(ev("session.idle"), ev("session.idle"), user("msg_u1"))
    assert r.types() == ["run.started", "run.finished"]
    validate_stream(r.evs)


def test_control_answer_becomes_answered_then_resolved_cause_linked():
    r = Run()
    r.feed(user(), tool("call_1", "pending", input={}), ask())
    req = r.evs[-1]
    a = r.tr.find_ask(S, req["id"])
    r.tr.arm_answer(a, "cmd-1", {"option": "reject", "text": "use make clean"})
    out = r.feed(ev("permission.replied", requestID="per_1", reply="reject"),
                 tool("call_1", "error", error="rejected"))
    answered, resolved, denied = out
    assert answered["type"] == "attention.answered" and answered["cause"] == "cmd-1"
    assert answered["data"] == {"answer": {"option": "reject", "text": "use make clean"},
                                "via": "control"}
    assert answered["subject"] == resolved["subject"] == req["id"]
    assert resolved["cause"] == answered["id"]
    assert denied["type"] == "tool.denied" and denied["data"]["by"] == "policy"
    assert denied["cause"] == "cmd-1"
    validate_stream(r.evs)


def test_vendor_side_settle_is_observed_without_a_control_claim():
    r = Run()
    r.feed(user(), ask())
    out = r.feed(ev("permission.replied", requestID="per_1", reply="once"))
    assert r.types(out) == ["attention.resolved"] and "answered" not in str(r.types())


def test_a_vendor_reply_that_differs_from_the_commanded_one_is_not_claimed():
    r = Run()
    r.feed(user(), ask())
    r.tr.arm_answer(r.tr.find_ask(S, r.evs[-1]["id"]), "cmd-1", {"option": "once"})
    out = r.feed(ev("permission.replied", requestID="per_1", reply="reject"))
    assert r.types(out) == ["attention.resolved"]


def test_pending_ask_is_dismissed_when_the_run_ends():
    r = Run()
    r.feed(user(), ask())
    out = r.feed(ev("session.idle"))
    assert r.types(out) == ["attention.resolved", "run.finished"]
    assert out[0]["data"] == {"resolution": "dismissed"}
    validate_stream(r.evs)


def test_cancel_note_closes_the_run_as_cancelled_cause_linked():
    r = Run()
    r.feed(user())
    r.tr.arm_cancel(S, "cmd-9", "msg_u1")
    out = r.feed(ev("session.error", error={"name": "MessageAbortedError", "data": {}}),
                 ev("session.idle"), ev("session.idle"), ev("session.idle"))
    assert r.types(out) == ["x.opencode.session.error", "run.cancelled"]
    assert out[1]["cause"] == "cmd-9" and out[1]["data"] == {"by": "control"}
    validate_stream(r.evs)


def test_disarmed_cancel_leaves_a_plain_finish():
    r = Run()
    r.feed(user())
    r.tr.arm_cancel(S, "cmd-9", "msg_u1")()
    assert r.types(r.feed(ev("session.idle"))) == ["run.finished"]


def test_session_deleted_mid_run_closes_everything_before_ending():
    r = Run()
    r.feed(ev("session.created", info={"id": S, "version": "1"}), user(), ask())
    out = r.feed(ev("session.deleted", info={"id": S}), user("msg_u9"), ev("session.idle"))
    assert r.types(out) == ["attention.resolved", "run.cancelled", "session.ended"]
    validate_stream(r.evs)


def test_status_and_message_repeats_are_reduced():
    r = Run()
    busy = {"type": "busy"}
    r.feed(ev("session.status", status=busy), ev("session.status", status=busy),
           ev("message.updated", info={"id": "m", "role": "assistant", "time": {"created": 1}}),
           ev("message.updated", info={"id": "m", "role": "assistant",
                                       "time": {"created": 1, "completed": 2}}),
           ev("message.updated", info={"id": "m", "role": "assistant",
                                       "time": {"created": 1, "completed": 2}}))
    assert r.types() == ["progress.status", "x.opencode.message.updated"]


def test_tool_seen_first_completed_still_gets_requested_then_one_terminal():
    r = Run()
    r.feed(user(), tool("c", "completed", input={"command": "ls"}, output="x"),
           tool("c", "completed", input={"command": "ls"}, output="x"))
    assert r.types()[1:] == ["tool.requested", "tool.completed"]


def test_todo_snapshots_diff_into_transitions():
    r = Run()
    r.feed(user(), ev("todo.updated", todos=[{"content": "a", "status": "pending"}]),
           ev("todo.updated", todos=[{"content": "a", "status": "completed"}]))
    assert r.types()[1:] == ["progress.task.planned", "progress.task.completed"]
    assert r.evs[1]["subject"] == r.evs[2]["subject"]


def test_sessionless_and_duplicate_events_are_counted_not_emitted():
    r = Run()
    r.feed(BusEvent("plugin.added", {"id": "x"}, "evt_1"), BusEvent("session.idle", {}, "evt_2"),
           BusEvent("session.idle", {"sessionID": S}, "evt_3"),
           BusEvent("session.idle", {"sessionID": S}, "evt_3", form="sync"))
    assert r.evs == []
    assert r.tr.counters["sessionless_skipped"] == 2 and r.tr.counters["duplicates"] == 1


def test_unknown_settle_keeps_the_pinned_vendor_subject():
    r = Run()
    out = r.feed(ev("permission.replied", requestID="per_gone", reply="once"))
    assert out[0]["subject"] == "per_gone"


def test_eviction_keeps_sessions_with_open_runs():
    tr = Tracker(Posture(agent="opencode", mode="primary"), max_sessions=2)
    tr.feed(BusEvent("message.updated", {"sessionID": "a", "info": {"id": "m", "role": "user"}}))
    for s in "bcd":
        tr.feed(BusEvent("session.status", {"sessionID": s, "status": {"type": "idle"}}))
    assert "a" in tr.sessions and len(tr.sessions) <= 2


# ---------------------------------------------------------------- reconcile

def msg(mid, role, parent=None, completed=True, created=1, error=None):
    info = {"id": mid, "role": role, "sessionID": S, "time": {"created": created}}
    if parent:
        info["parentID"] = parent
    if completed:
        info["time"]["completed"] = created + 1
    if error:
        info["error"] = error
    return {"info": info, "parts": []}


def test_reconcile_closes_a_run_that_finished_unseen():
    r = Run()
    r.feed(user())
    outs = r.tr.reconcile(queried={None}, busy={}, permissions=[], questions=[],
                          messages={S: [msg("msg_u1", "user"), msg("msg_a1", "assistant",
                                                                   "msg_u1")]})
    evs = stamp(outs, r.st)
    assert r.types(evs) == ["run.finished"]
    again = r.tr.reconcile(queried={None}, busy={}, permissions=[], questions=[], messages={})
    assert again == []  # nothing twice


def test_reconcile_reports_a_run_the_server_lost_as_interrupted():
    r = Run()
    r.feed(user(), ask())
    outs = stamp(r.tr.reconcile(
        queried={None}, busy={}, permissions=[], questions=[],
        messages={S: [msg("msg_u1", "user"), msg("msg_a1", "assistant", "msg_u1",
                                                 completed=False)]}), r.st)
    assert r.types(outs) == ["attention.resolved", "run.failed"]
    assert outs[0]["data"] == {"resolution": "dismissed"}
    assert outs[1]["data"] == {"reason": "interrupted"}
    r.evs += outs
    validate_stream(r.evs)


def test_reconcile_resumes_a_busy_run_and_raises_a_pending_ask_once():
    r = Run()
    perm = ask().properties
    kw = dict(queried={None}, busy={S: "busy"}, permissions=[perm], questions=[],
              messages={S: [msg("msg_u0", "user", created=1), msg("msg_u1", "user", created=5)]})
    outs = stamp(r.tr.reconcile(**kw), r.st)
    assert r.types(outs) == ["run.started", "progress.status", "attention.requested"]
    assert outs[0]["run"] == "msg_u1" and outs[0]["data"] == {"trigger": "resume"}
    assert outs[1]["subject"] == "busy" and outs[2]["run"] == "msg_u1"
    assert r.tr.reconcile(**kw) == []
    # the live stream then repeats the ask and the user message: no duplicates
    assert r.feed(ask(), user("msg_u1")) == []


def test_reconcile_resolves_a_vanished_ask_and_claims_it_when_ours():
    r = Run()
    r.feed(user(), ask("per_1", "c1"), ask("per_2", "c2", "ls"))
    mine = r.tr.find_ask(S, r.evs[2]["id"])
    r.tr.arm_answer(mine, "cmd-5", {"option": "always"})
    outs = stamp(r.tr.reconcile(queried={None}, busy={S: "busy"}, permissions=[], questions=[],
                                messages={}), r.st)
    assert r.types(outs) == ["progress.status", "attention.resolved", "attention.answered",
                             "attention.resolved"]
    assert outs[1]["data"]["resolution"] == "dismissed"
    assert outs[2]["cause"] == "cmd-5"


def test_reconcile_leaves_sessions_of_unread_directories_alone():
    r = Run()
    r.feed(BusEvent("message.updated", {"sessionID": S, "info": {"id": "msg_u1", "role": "user"}},
                    directory="/elsewhere"))
    assert r.tr.reconcile(queried={None}, busy={}, permissions=[], questions=[],
                          messages={}) == []
    assert r.tr.needs_messages({}, {"/elsewhere"}) == [S]


def test_companion_never_reconciles():
    tr = Tracker(Posture(agent="opencode", mode="companion"))
    assert tr.reconcile(queried={None}, busy={S: "busy"}, permissions=[ask().properties],
                        questions=[], messages={}) == []


def test_a_stale_snapshot_never_re_raises_a_settled_ask():
    """A reconcile's REST snapshot may predate a settle the stream already
    delivered (reads and the stream run concurrently): the ask stays closed."""
    r = Run()
    r.feed(user(), ask())
    r.feed(ev("permission.replied", requestID="per_1", reply="once"))
    outs = r.tr.reconcile(queried={None}, busy={S: "busy"}, permissions=[ask().properties],
                          questions=[], messages={})
    assert [o.emission["type"] for o in outs] == ["progress.status"]


def test_snapshot_restore_round_trip_continues_the_run_and_the_ask():
    """What a daemon restart keeps: the open run (no second run.started), the
    ask under its original request id (answerable, settled once), the
    settling mark and the cancel note; the snapshot is JSON."""
    import json
    r = Run()
    r.feed(user(), tool("call_1", "pending", input={}), ask())
    req = r.evs[-1]
    r.tr.arm_cancel(S, "cmd-c", "msg_u1")
    snap = json.loads(json.dumps(r.tr.snapshot()))
    fresh = Tracker(Posture(agent="opencode", mode="primary", answerable=True))
    assert fresh.restore(snap) == 1 and fresh.open_run(S) == "msg_u1"
    a = fresh.find_ask(S, req["id"])
    assert a is not None and a.vendor_id == "per_1" and a.call_id == "call_1"
    fresh.arm_answer(a, "cmd-a", {"option": "once"})
    st2 = Stamper("opencode", epoch=2, host="test")
    outs = stamp(fresh.feed(user("msg_u1")), st2)  # the live repeat: nothing
    outs += stamp(fresh.feed(ev("permission.replied", requestID="per_1", reply="once")), st2)
    outs += stamp(fresh.feed(ev("session.idle")), st2)
    assert [e["type"] for e in outs] == ["attention.answered", "attention.resolved",
                                         "run.cancelled"]
    assert outs[0]["subject"] == req["id"] and outs[2]["cause"] == "cmd-c"
    validate_stream(r.evs + outs)


def test_restore_tolerates_garbage():
    tr = Tracker(Posture(agent="opencode", mode="primary"))
    for junk in (None, [], {"sessions": []}, {"sessions": {"s": 5, 7: {}}},
                 {"sessions": {"s": {"asks": [{"vendor_id": 1}], "cancel": ["x"]}}}):
        tr.restore(junk)
    assert all(not st.asks and st.cancel is None for st in tr.sessions.values())


def test_snapshot_keeps_the_open_run_and_ask_envelopes_for_the_reannounce():
    """Review of issue 8, finding 1: the stamped ``run.started`` (bound by
    the receiver) and ``attention.requested`` survive the snapshot whole, for
    ``BridgeContext.reannounce`` after a daemon restart; a closed run's go."""
    import json
    r = Run()
    r.feed(user(), tool("call_1", "pending", input={}), ask())
    started = next(e for e in r.evs if e["type"] == "run.started")
    req = r.evs[-1]
    r.tr.bind_run(S, started)
    fresh = Tracker(Posture(agent="opencode", mode="primary", answerable=True))
    fresh.restore(json.loads(json.dumps(r.tr.snapshot())))
    assert fresh.open_envelopes() == [started, req]
    r.feed(ev("permission.replied", requestID="per_1", reply="once"), ev("session.idle"))
    assert r.tr.open_envelopes() == []
    again = Tracker(Posture(agent="opencode", mode="primary"))
    again.restore(json.loads(json.dumps(r.tr.snapshot())))
    assert again.open_envelopes() == []
