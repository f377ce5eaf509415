"""The OpenHands control gate without sockets: configuration and preflight,
the hello declaration in both postures, the AEP-0008 answer rule, and the
guards (every refusal is decided before any write)."""
from __future__ import annotations

import pytest

from bridges.core.capture import CapturePolicy
from bridges.core.ledger import Refuse
from bridges.openhands import control as C
from bridges.openhands import from_env
from bridges.openhands.conversation import Conversation, Settling

POLICY = CapturePolicy()


def bridge(**env):
    return from_env(env, policy=POLICY)


# --------------------------------------------------------------------------- configuration

def test_defaults():
    b = bridge()
    s = b.settings
    assert s.url == "http://127.0.0.1:8000" and s.poll == 15.0 and s.guard_ms == 8000
    assert s.deltas is False and s.control is False and s.key is None and b.agent == "openhands"
    assert b.preflight() == []


def test_every_knob_is_read():
    b = bridge(AEP_OPENHANDS_URL="http://127.0.0.1:9000/", AEP_OPENHANDS_SESSION_API_KEY="k3y-value",
               AEP_OPENHANDS_POLL="2.5", AEP_OPENHANDS_DELTAS="1", AEP_OPENHANDS_CONTROL="1",
               AEP_OPENHANDS_ACK_GUARD_MS="3000", AEP_TOKEN="tok", AEP_AGENT_NAME="oh-prod",
               AEP_STATE_DIR="/tmp/aep-x")
    s = b.settings
    assert (s.url, s.key, s.poll, s.deltas, s.control, s.guard_ms, b.agent) == \
        ("http://127.0.0.1:9000", "k3y-value", 2.5, True, True, 3000, "oh-prod")
    assert str(s.state_dir) == "/tmp/aep-x" and b.preflight() == []


@pytest.mark.parametrize("env, needle", [
    ({"AEP_OPENHANDS_CONTROL": "1"}, "AEP_OPENHANDS_CONTROL=1 needs AEP_TOKEN"),
    ({"AEP_OPENHANDS_URL": "ftp://x"}, "AEP_OPENHANDS_URL"),
    ({"AEP_OPENHANDS_URL": "http://h:notaport"}, "port is not a number"),
    ({"AEP_OPENHANDS_URL": "http://127.0.0.1:8000/?session_api_key=x"}, "no query"),
    ({"AEP_OPENHANDS_POLL": "0"}, "AEP_OPENHANDS_POLL"),
    ({"AEP_OPENHANDS_POLL": "soon"}, "AEP_OPENHANDS_POLL"),
    ({"AEP_OPENHANDS_ACK_GUARD_MS": "10000"}, "inside the declared 10000 ms"),
    ({"AEP_OPENHANDS_ACK_GUARD_MS": "-1"}, "AEP_OPENHANDS_ACK_GUARD_MS"),
    ({"AEP_OPENHANDS_DELTAS": "maybe"}, "AEP_OPENHANDS_DELTAS"),
    ({"AEP_OPENHANDS_CONTROL": "yes please"}, "AEP_OPENHANDS_CONTROL"),
])
def test_bad_settings_are_one_clear_line_each(env, needle):
    problems = bridge(**env).preflight()
    assert len(problems) == 1 and needle in problems[0], problems


def test_several_problems_are_several_lines_and_never_the_key():
    problems = bridge(AEP_OPENHANDS_CONTROL="1", AEP_OPENHANDS_POLL="x", AEP_OPENHANDS_URL="nope",
                      AEP_OPENHANDS_SESSION_API_KEY="the-secret-key").preflight()
    assert len(problems) == 3
    assert not any("the-secret-key" in p for p in problems)


def test_hello_gated_off_declares_nothing():
    for env in ({}, {"AEP_OPENHANDS_CONTROL": "1"}, {"AEP_TOKEN": "t"}):
        caps = bridge(**env).capabilities()
        assert caps["control"] == {"accepts": [], "ack_window_ms": 10000}
        assert "x.openhands" in caps["emits"] and caps["capture"] == ["none", "metadata"]


def test_hello_gated_on_declares_exactly_five_and_never_cancel():
    caps = bridge(AEP_OPENHANDS_CONTROL="1", AEP_TOKEN="t").capabilities()
    assert caps["control"] == {"accepts": ["control.attention.respond", "control.pause", "control.resume",
                                           "x.openhands.control.send_input", "x.openhands.control.interrupt"],
                               "ack_window_ms": 10000}
    assert "control.cancel" not in caps["control"]["accepts"]


# --------------------------------------------------------------------------- AEP-0008 answers

@pytest.mark.parametrize("answer, want", [
    ({"option": "approve"}, (True, None, {"option": "approve"})),
    ({"option": "approve", "text": "fine"}, (True, None, {"option": "approve"})),
    ({"option": "deny"}, (False, None, {"option": "deny"})),
    ({"option": "deny", "text": " not here "}, (False, "not here", {"option": "deny", "text": "not here"})),
    ({"text": "approve"}, (True, None, {"option": "approve"})),
    ({"text": "  Approve "}, (True, None, {"option": "approve"})),
    ({"text": "DENY"}, (False, None, {"option": "deny"})),
    ({"text": "deny"}, (False, None, {"option": "deny"})),
    # unmatched text never grants: it denies with the text as the reason
    ({"text": "yes go ahead"}, (False, "yes go ahead", {"option": "deny", "text": "yes go ahead"})),
    ({"text": "approve it"}, (False, "approve it", {"option": "deny", "text": "approve it"})),
])
def test_answer_rule(answer, want):
    assert C.decide_answer(answer) == want


@pytest.mark.parametrize("answer", [None, "approve", {}, {"option": "always"}, {"text": "   "},
                                    {"values": {"a": 1}}, {"text": 3}, {"option": None, "text": ""}])
def test_answer_rule_invalid(answer):
    with pytest.raises(Refuse) as e:
        C.decide_answer(answer)
    assert e.value.reason == "invalid"


# --------------------------------------------------------------------------- guards

class _Recv:
    def __init__(self, conv: Conversation) -> None:
        self.conversations = {conv.id: conv}


def control_for(status: str | None, *, attention: str | None = None):
    conv = Conversation("c1", status=status, attention_id=attention)
    b = bridge(AEP_OPENHANDS_CONTROL="1", AEP_TOKEN="t")
    return C.OpenHandsControl(b.settings, _Recv(conv)), conv


def cmd(type_: str, **kw) -> dict:
    return {"id": "cmd-1", "type": type_, "session": "c1", "source": "aep://x/agent/t", "data": {}, **kw}


def refused(ctl, c) -> str:
    with pytest.raises(Refuse) as e:
        ctl.check(c)
    assert e.value.reason in ("refused", "invalid")
    return f"{e.value.reason}: {e.value.detail}"


@pytest.mark.parametrize("status", ["idle", "paused", "waiting_for_confirmation", "finished", "error", None])
def test_pause_and_interrupt_only_from_running(status):
    ctl, _ = control_for(status)
    for t in (C.PAUSE, C.INTERRUPT):
        assert refused(ctl, cmd(t)).startswith("refused")
    ctl_ok, _ = control_for("running")
    ctl_ok.check(cmd(C.PAUSE))
    ctl_ok.check(cmd(C.INTERRUPT))


def test_resume_only_from_paused_and_names_respond_from_waiting():
    ctl, _ = control_for("waiting_for_confirmation", attention="req-1")
    assert "control.attention.respond" in refused(ctl, cmd(C.RESUME))
    for status in ("idle", "running", "finished"):
        ctl, _ = control_for(status)
        assert f"(it is {status})" in refused(ctl, cmd(C.RESUME))
    control_for("paused")[0].check(cmd(C.RESUME))


def test_respond_only_to_the_live_pending_request():
    ctl, conv = control_for("waiting_for_confirmation", attention="req-1")
    good = cmd(C.RESPOND, subject="req-1", data={"answer": {"option": "approve"}})
    ctl.check(good)
    assert "not the live pending" in refused(ctl, cmd(C.RESPOND, subject="req-0",
                                                     data={"answer": {"option": "approve"}}))
    assert refused(ctl, cmd(C.RESPOND, subject="req-1", data={"answer": {"option": "maybe"}})).startswith("invalid")
    conv.settling = Settling("other", {"option": "approve"})
    assert "already settling" in refused(ctl, good)
    ctl2, _ = control_for("running", attention=None)
    assert "no confirmation is pending" in refused(ctl2, good)


def test_send_input_has_no_status_guard_but_a_cap():
    for status in ("idle", "running", "waiting_for_confirmation", "paused", "finished"):
        ctl, _ = control_for(status)
        ctl.check(cmd(C.SEND_INPUT, data={"text": "x" * 4000}))
        assert refused(ctl, cmd(C.SEND_INPUT, data={"text": "x" * 4001})).startswith("invalid")
        assert refused(ctl, cmd(C.SEND_INPUT, data={})).startswith("invalid")


def test_unknown_session_is_refused():
    ctl, _ = control_for("running")
    assert "no OpenHands conversation" in refused(ctl, dict(cmd(C.PAUSE), session="elsewhere"))


def test_note_sets_and_undo_clears_exactly_its_note():
    ctl, conv = control_for("running")
    plan = ctl.check(cmd(C.PAUSE))
    assert conv.notes == {}  # check notes nothing
    disarm = ctl.note(plan)
    assert conv.notes == {"pause": "cmd-1"}
    conv.notes["pause"] = "cmd-2"  # a newer command took the note
    disarm()
    assert conv.notes == {"pause": "cmd-2"}
    ctl, conv = control_for("waiting_for_confirmation", attention="req-1")
    disarm = ctl.note(ctl.check(cmd(C.RESPOND, subject="req-1", data={"answer": {"text": "nope"}})))
    assert conv.settling == Settling("cmd-1", {"option": "deny", "text": "nope"})
    disarm()
    assert conv.settling is None


def test_decorate_adds_options_and_the_respond_path_only():
    em = {"type": "attention.requested", "data": {"kind": "permission", "prompt": "p"}}
    C.decorate(em)
    assert em["data"] == {"kind": "permission", "prompt": "p",
                          "options": [{"id": "approve", "label": "Approve"}, {"id": "deny", "label": "Deny"}],
                          "respond_via": ["control"]}


# --------------------------------------------------------------------------- the write path

async def test_write_bodies_and_transport_failures():
    """The five request shapes, and a transport failure becomes Unreachable
    (acked busy) with a detail that never carries the key."""
    import httpx

    from bridges.core.ledger import Unreachable

    seen: list[tuple[str, str, bytes, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.content,
                     request.headers.get("x-session-api-key")))
        if request.url.path.endswith("/interrupt"):
            raise httpx.ConnectError("boom")
        if request.url.path.endswith("/pause"):
            return httpx.Response(409, json={"detail": "Conversation already running."})
        return httpx.Response(200, json={"success": True})

    b = bridge(AEP_OPENHANDS_CONTROL="1", AEP_TOKEN="t", AEP_OPENHANDS_SESSION_API_KEY="k-secret-1")
    client = httpx.AsyncClient(base_url=b.settings.url, headers={"X-Session-API-Key": "k-secret-1"},
                               transport=httpx.MockTransport(handler))
    conv = Conversation("c1", status="waiting_for_confirmation", attention_id="r1")
    ctl = C.OpenHandsControl(b.settings, _Recv(conv), client=client)

    async def perform(c, status):
        conv.status = status  # the state the command is honored in
        return await ctl.perform(ctl.check(c))

    res = await perform(cmd(C.RESPOND, subject="r1", data={"answer": {"text": "no way"}}),
                        "waiting_for_confirmation")
    assert res.status == 200 and res.after_ack is None
    res = await perform(cmd(C.PAUSE), "running")
    assert (res.status, res.detail) == (409, "Conversation already running.")
    await perform(cmd(C.RESUME), "paused")
    sent = await perform(cmd(C.SEND_INPUT, data={"text": "hi"}), "idle")
    assert sent.after_ack is not None  # input.sent follows the ack
    with pytest.raises(Unreachable) as e:
        await perform(cmd(C.INTERRUPT), "running")
    assert "k-secret-1" not in str(e.value)
    await client.aclose()
    import json as _json
    assert [(m, p) for m, p, _, _ in seen] == [
        ("POST", "/api/conversations/c1/events/respond_to_confirmation"), ("POST", "/api/conversations/c1/pause"),
        ("POST", "/api/conversations/c1/run"), ("POST", "/api/conversations/c1/events"),
        ("POST", "/api/conversations/c1/interrupt")]
    assert _json.loads(seen[0][2]) == {"accept": False, "reason": "no way"}
    assert _json.loads(seen[3][2]) == {"role": "user", "content": [{"type": "text", "text": "hi"}], "run": False}
    assert all(k == "k-secret-1" for *_, k in seen) and all("k-secret-1" not in p for _, p, _, _ in seen)


# --------------------------------------------------------------------------- an approval and the vendor's run

def _recorder():
    """A POST client over a mock transport, and the paths it was sent."""
    import httpx
    posts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(request.url.path)
        return httpx.Response(200, json={"success": True})
    return httpx.AsyncClient(base_url="http://127.0.0.1:1", transport=httpx.MockTransport(handler)), posts


async def _approve(frames_before, frames_after, *, autojump=False):
    """Feed ``frames_before`` (real captured frames) to a receiver, start an
    approval over control, let every task block, then feed
    ``frames_after``. Returns (POSTs made before, POSTs after, the outcome)."""
    import trio.testing

    from tests.unit.openhands.test_openhands_receiver import Harness
    h = Harness()
    await h.feed(frames_before)
    conv = h.conv
    assert conv.status == "waiting_for_confirmation" and conv.attention_id
    client, posts = _recorder()
    ctl = C.OpenHandsControl(bridge(AEP_OPENHANDS_CONTROL="1", AEP_TOKEN="t").settings, h.rx, client=client)
    plan = ctl.check(cmd(C.RESPOND, session=conv.id, subject=conv.attention_id,
                         data={"answer": {"option": "approve"}}))
    ctl.note(plan)
    outcome: list[object] = []

    async def perform() -> None:
        try:
            res = await ctl.perform(plan)
        except Refuse as r:
            outcome.append(r)
            return
        outcome.append(res)
        if res.after_ack is not None:  # what the ledger runs once the ack is out
            await res.after_ack()
    async with trio.open_nursery() as n:
        n.start_soon(perform)
        await trio.testing.wait_all_tasks_blocked()
        before = list(posts)
        await h.feed(frames_after)
        await trio.testing.wait_all_tasks_blocked()
        if not autojump:
            n.cancel_scope.cancel()  # what is left is the watch on a taken approval
    await client.aclose()
    return before, posts, outcome[0]


async def test_an_approval_waits_until_the_vendors_run_wound_down():
    """The real server flips to waiting_for_confirmation INSIDE its run task,
    then waits for its callbacks, clears the task and publishes a full_state
    snapshot. An approval posted before that snapshot is dropped by the
    vendor (respond_to_confirmation takes the still-live task for "already
    running" and answers 200): the flaky test_approve_over_control, the run
    never finished. The approval waits for the snapshot, then posts."""
    from tests.unit.openhands.test_openhands_receiver import frames
    f = frames("approve")
    assert f[6]["key"] == "execution_status" and f[8]["key"] == "full_state"  # flip, then the task's end
    before, after, res = await _approve(f[:8], [f[8]])
    assert before == [], "posted while the vendor's run task was still winding down"
    assert after == ["/api/conversations/c0ffee00-0000-4000-8000-000000000001/events/respond_to_confirmation"]
    assert getattr(res, "status", None) == 200


async def test_an_approval_of_a_replayed_ask_posts_at_once():
    """First attach to a conversation that has waited a while: the connect
    snapshot (newer than the replayed flip) says the run is over."""
    from tests.unit.openhands.test_openhands_receiver import frames
    f = frames("approve")
    before, _, _ = await _approve([f[8]] + f[1:8], [])
    assert len(before) == 1


async def test_an_approval_settled_meanwhile_writes_nothing():
    """The conversation left waiting_for_confirmation while the approval
    waited (a decision elsewhere): refused, no write (an approval of a
    conversation no longer waiting would start a run)."""
    from tests.unit.openhands.test_openhands_receiver import M_state, frames
    f = frames("approve")
    before, after, res = await _approve(f[:8], [M_state("execution_status", "idle", "2026-11-30T13:27:47.720000"),
                                                 f[8]])
    assert before == after == []
    assert isinstance(res, Refuse) and res.reason == "refused"


async def test_an_approval_with_no_snapshot_coming_posts_after_the_bound(autojump_clock):
    """A server that never publishes the snapshot: the approval is written
    after WIND_DOWN_WAIT (the old behaviour), not held forever."""
    from tests.unit.openhands.test_openhands_receiver import frames
    f = frames("approve")
    before, after, res = await _approve(f[:8], [], autojump=True)
    assert before == [] and len(after) == 1


async def test_an_approval_the_vendor_dropped_is_written_again():
    """Attached while the vendor's run wound down, the connect snapshot
    (newer than the flip) cannot show the task still live: the approval
    goes out at once and may be dropped. A snapshot after it with the ask
    still pending (no flip out of waiting) is that evidence: written again."""
    from tests.unit.openhands.test_openhands_receiver import frames
    f = frames("approve")
    end = dict(f[8], id="end-of-run", timestamp="2026-11-30T13:27:47.900000")
    before, after, res = await _approve([f[8]] + f[1:8], [end])
    assert len(before) == 1 and after == before * 2


async def test_an_approval_the_vendor_took_is_written_once():
    """The flip out of waiting follows the approval: nothing more is written
    (and the watch ends with the flip)."""
    from tests.unit.openhands.test_openhands_receiver import frames
    f = frames("approve")
    before, after, _ = await _approve(f[:9], f[9:])
    assert len(before) == len(after) == 1
