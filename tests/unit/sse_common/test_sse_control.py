"""The control gate (``bridges/sse_common/control.py``, ``bridge.py``):
the AEP-0008 text rules, AEP-0006 form values, every refusal of the design
record, configuration, and the proof that nothing is ever written to the
vendor when the gate is closed."""
from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

import httpx
import pytest
import trio

from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.ledger import Refuse
from bridges.core.posture import Posture
from bridges.kilocode_sse import from_env as kilo_from_env
from bridges.opencode_sse import PROFILE as OC
from bridges.opencode_sse import from_env as oc_from_env
from bridges.sse_common import control
from bridges.sse_common.bridge import SseBridge
from bridges.sse_common.control import ControlGate, form_answer, permission_answer
from bridges.sse_common.frames import BusEvent
from bridges.sse_common.receiver import ReceiverSettings
from bridges.sse_common.tracker import Tracker
from supervisor.fleet import run_bridge
from tests.support.opencode_fixtures import real_event

# ---------------------------------------------------------------- AEP-0008 text rules


@pytest.mark.parametrize("answer,expected", [
    ({"option": "once"}, ("once", None, {"option": "once"})),
    ({"option": "always"}, ("always", None, {"option": "always"})),
    ({"option": "reject"}, ("reject", None, {"option": "reject"})),
    ({"option": "reject", "text": " not now "}, ("reject", "not now",
                                                 {"option": "reject", "text": "not now"})),
    # text attached to a permissive option is not applied, so not recorded
    ({"option": "once", "text": "go"}, ("once", None, {"option": "once"})),
    # a text naming an option counts as it (id, any case, trimmed; or a label)
    ({"text": " ONCE "}, ("once", None, {"option": "once"})),
    ({"text": "always allow"}, ("always", None, {"option": "always"})),
    ({"text": "Reject"}, ("reject", None, {"option": "reject"})),
    # anything else refuses with the text as the reply message, never grants
    ({"text": "use make clean instead"}, ("reject", "use make clean instead",
                                          {"option": "reject", "text": "use make clean instead"})),
    ({"text": "allow"}, ("reject", "allow", {"option": "reject", "text": "allow"})),
])
def test_permission_answer_rules(answer, expected):
    assert permission_answer(answer, message_route=True) == expected


@pytest.mark.parametrize("answer", [
    {"values": {"1": "1"}}, {"option": "allow"}, {"option": "deny"}, {}, {"text": "  "},
    {"text": 5}, "once", None,
])
def test_permission_answer_invalid(answer):
    with pytest.raises(Refuse) as e:
        permission_answer(answer, message_route=True)
    assert e.value.reason == "invalid"


def test_free_text_without_a_message_route_is_refused_invalid():
    """The pinned permission.updated surface's reply route carries no message."""
    assert permission_answer({"text": "once"}, message_route=False)[0] == "once"
    for a in ({"text": "because"}, {"option": "reject", "text": "because"}):
        with pytest.raises(Refuse) as e:
            permission_answer(a, message_route=False)
        assert e.value.reason == "invalid"


# ---------------------------------------------------------------- AEP-0006 form values

def question_ask(vendor="kilocode", **q):
    tr = Tracker(Posture(agent=vendor, mode="primary", answerable=True))
    props = dict(real_event(vendor, "question.asked").properties)
    if q:
        props["questions"] = [dict(props["questions"][0], **q)]
    outs = tr.feed(BusEvent("question.asked", props, "evt_q"))
    outs[0].envelope = {"id": "req-1"}
    return tr, tr.find_ask(props["sessionID"], "req-1")


def test_form_answer_resolves_choice_ids_to_the_vendor_labels():
    _, a = question_ask()
    assert form_answer(a, {"values": {"1": "2"}}) == ([["SQLite"]], {"values": {"1": "2"}})


def test_form_answer_other_text_rides_verbatim():
    _, a = question_ask()
    assert form_answer(a, {"values": {"1": "DuckDB"}})[0] == [["DuckDB"]]


def test_form_answer_multi():
    _, a = question_ask(multiple=True)
    assert form_answer(a, {"values": {"1": ["1", "2"]}})[0] == [["PostgreSQL", "SQLite"]]


@pytest.mark.parametrize("answer", [
    {"values": {}}, {"values": {"1": ""}}, {"option": "1"}, {"text": "SQLite"},
    {"values": {"1": ["1", "2"]}}, {"values": {"1": 2}},
])
def test_form_answer_invalid(answer):
    _, a = question_ask()
    with pytest.raises(Refuse) as e:
        form_answer(a, answer)
    assert e.value.reason == "invalid"


def test_form_answer_closed_select_refuses_other_text():
    _, a = question_ask(custom=False)
    with pytest.raises(Refuse):
        form_answer(a, {"values": {"1": "DuckDB"}})


# ---------------------------------------------------------------- gate checks

S = "ses_1"


def cmd(type_, **kw):
    c = {"aep": "0.1", "id": kw.pop("id", "cmd-1"), "type": type_, "time": "2026-01-01T00:00:00Z",
         "source": "aep://h/agent/op", "agent": "op", "session": S}
    c.update(kw)
    return c


def gate_with_ask(surface="permission.asked"):
    tr = Tracker(Posture(agent="opencode", mode="primary", answerable=True))
    tr.feed(BusEvent("message.updated", {"sessionID": S, "info": {"id": "msg_u", "role": "user"}},
                     directory="/proj"))
    props = {"id": "per_1", "sessionID": S, "permission": "bash", "patterns": ["ls"],
             "metadata": {}, "always": [], "tool": {"messageID": "m", "callID": "c"}}
    if surface == "permission.updated":
        props = {"id": "per_1", "type": "bash", "pattern": "ls", "sessionID": S, "title": "ls",
                 "messageID": "m", "callID": "c", "metadata": {}, "time": {"created": 1}}
    outs = tr.feed(BusEvent(surface, props))
    outs[0].envelope = {"id": "req-1"}
    return ControlGate(OC, httpx.AsyncClient(base_url="http://x"), tr), tr


def test_respond_plans_the_current_reply_route_with_the_message():
    g, tr = gate_with_ask()
    c = cmd("control.attention.respond", subject="req-1",
            data={"answer": {"text": "not this one"}})
    plan = g.check(c)
    assert plan.path == "/permission/per_1/reply"
    assert plan.body == {"reply": "reject", "message": "not this one"}
    assert plan.params == {"directory": "/proj"}
    assert tr.find_ask(S, "req-1").settling is None  # check notes nothing
    disarm = g.note(plan)
    assert tr.find_ask(S, "req-1").settling == "cmd-1"
    disarm()
    assert tr.find_ask(S, "req-1").settling is None


def test_respond_on_the_pinned_surface_uses_the_legacy_route():
    g, _ = gate_with_ask("permission.updated")
    plan = g.check(cmd("control.attention.respond", subject="req-1",
                       data={"answer": {"option": "always"}}))
    assert (plan.path, plan.body) == ("/session/ses_1/permissions/per_1", {"response": "always"})


@pytest.mark.parametrize("c,reason", [
    (cmd("control.attention.respond", subject="nope", data={"answer": {"option": "once"}}),
     "refused"),
    (cmd("control.attention.respond", data={"answer": {"option": "once"}}), "invalid"),
    (cmd("control.attention.respond", subject="req-1", data={"answer": {"values": {"a": 1}}}),
     "invalid"),
    (cmd("control.cancel", data={"scope": "session"}), "refused"),
    (cmd("control.cancel", data={}), "invalid"),
    (cmd("control.cancel", run="msg_other", data={"scope": "run"}), "refused"),
])
def test_refusals(c, reason):
    g, _ = gate_with_ask()
    with pytest.raises(Refuse) as e:
        g.check(c)
    assert e.value.reason == reason


def test_stale_subject_is_refused_after_the_settle():
    g, tr = gate_with_ask()
    tr.feed(BusEvent("permission.replied", {"sessionID": S, "requestID": "per_1", "reply": "once"}))
    with pytest.raises(Refuse) as e:
        g.check(cmd("control.attention.respond", subject="req-1",
                    data={"answer": {"option": "once"}}))
    assert e.value.reason == "refused"


def test_second_answer_while_one_is_in_flight_is_refused():
    g, _ = gate_with_ask()
    first = cmd("control.attention.respond", subject="req-1", data={"answer": {"option": "once"}})
    g.note(g.check(first))
    with pytest.raises(Refuse):
        g.check(cmd("control.attention.respond", id="cmd-2", subject="req-1",
                    data={"answer": {"option": "once"}}))


def test_cancel_needs_an_open_run_and_arms_the_note():
    g, tr = gate_with_ask()
    c = cmd("control.cancel", run="msg_u", data={"scope": "run"})
    plan = g.check(c)
    assert plan.path == "/session/ses_1/abort"
    g.note(plan)
    assert tr.sessions[S].cancel.command == "cmd-1"
    with pytest.raises(Refuse):  # a second cancel of the same run
        g.check(cmd("control.cancel", id="cmd-2", data={"scope": "run"}))
    tr.feed(BusEvent("session.idle", {"sessionID": S}))
    with pytest.raises(Refuse) as e:
        g.check(cmd("control.cancel", id="cmd-3", data={"scope": "run"}))
    assert e.value.reason == "refused"


# ---------------------------------------------------------------- configuration

def test_from_env_defaults():
    b = oc_from_env({}, policy=CapturePolicy())
    assert (b.url, b.config.username, b.primary, b.control_honored) == (
        "http://127.0.0.1:4096", "opencode", False, False)
    assert b.preflight() == []
    k = kilo_from_env({}, policy=CapturePolicy())
    assert (k.name, k.agent, k.config.username) == ("kilocode_sse", "kilocode", "kilo")


def test_gate_needs_primary_and_token_and_the_flag():
    env = {"AEP_OPENCODE_SSE_PRIMARY": "1", "AEP_OPENCODE_SSE_CONTROL": "1", "AEP_TOKEN": "t"}
    assert oc_from_env(env, policy=CapturePolicy()).control_honored
    for drop in env:
        b = oc_from_env({k: v for k, v in env.items() if k != drop}, policy=CapturePolicy())
        assert not b.control_honored
        assert b.capabilities()["control"] == {"accepts": [], "ack_window_ms": 10000}
    on = oc_from_env(env, policy=CapturePolicy()).capabilities()["control"]
    assert on == {"accepts": ["control.attention.respond", "control.cancel"],
                  "ack_window_ms": 10000}


@pytest.mark.parametrize("env,needle", [
    ({"AEP_KILOCODE_SSE_CONTROL": "1", "AEP_TOKEN": "t"}, "ignored in companion mode"),
    ({"AEP_KILOCODE_SSE_CONTROL": "1", "AEP_KILOCODE_SSE_PRIMARY": "1"}, "needs AEP_TOKEN"),
    ({"AEP_KILOCODE_URL": "ftp://x"}, "AEP_KILOCODE_URL"),
    ({"AEP_KILOCODE_URL": "http://h:99999"}, "bad port"),
    ({"AEP_KILOCODE_SSE_PRIMARY": "maybe"}, "expected 1/true/yes/on or 0/false/no/off"),
    ({"AEP_KILOCODE_SSE_ACK_GUARD_MS": "20000"}, "AEP_KILOCODE_SSE_ACK_GUARD_MS"),
    ({"AEP_KILOCODE_SSE_ACK_GUARD_MS": "soon"}, "AEP_KILOCODE_SSE_ACK_GUARD_MS"),
])
def test_preflight_one_line_per_problem(env, needle):
    lines = kilo_from_env(env, policy=CapturePolicy()).preflight()
    assert len(lines) == 1 and needle in lines[0]


def test_preflight_never_shows_the_password():
    b = oc_from_env({"AEP_OPENCODE_PASSWORD": "hunter2-secret", "AEP_OPENCODE_URL": "nope"},
                    policy=CapturePolicy())
    assert all("hunter2" not in line for line in b.preflight())
    assert "hunter2" not in repr(vars(b).get("url"))


# ---------------------------------------------------------------- nothing written with the gate off

def test_the_only_writes_in_the_package_live_in_the_gate():
    """Structural proof: every HTTP call that could write (post/put/patch/
    delete/request, stream or :func:`bridges.core.rest.fetch` with a non-GET
    verb) in bridges/sse_common is inside
    ``ControlGate.perform``; the receiver's client type has no such method."""
    root = Path(control.__file__).parent
    writes = []
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text())
        for cls in [n for n in ast.walk(tree)]:
            for fn in ast.walk(cls) if isinstance(cls, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    else []:
                if not isinstance(fn, ast.Call) or not isinstance(fn.func, (ast.Attribute, ast.Name)):
                    continue
                verb = fn.func.attr if isinstance(fn.func, ast.Attribute) else fn.func.id
                # the verb of client.stream(VERB, ...) and rest.fetch(client, VERB, ...)
                at = {"stream": 0, "fetch": 1}.get(verb)
                given = fn.args[at] if at is not None and len(fn.args) > at else None
                if verb in ("post", "put", "patch", "delete", "request") or (
                        at is not None and not (isinstance(given, ast.Constant) and given.value == "GET")):
                    writes.append((path.name, cls.name, verb))
    assert writes == [("control.py", "perform", "fetch")]
    assert not any(hasattr(control.ReadOnlyClient, v)
                   for v in ("post", "put", "patch", "delete", "request", "stream"))


class Recorder:
    """A fake vendor (httpx transport): one stream with a user message and a
    pending ask, empty REST reads, and a record of every request."""

    def __init__(self):
        self.requests: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        if request.url.path == "/global/event":
            frames = [{"type": "message.updated", "properties": {
                "sessionID": S, "info": {"id": "msg_u", "role": "user"}}},
                {"type": "permission.asked", "properties": {
                    "id": "per_1", "sessionID": S, "permission": "bash", "patterns": ["ls"],
                    "metadata": {}, "always": [], "tool": {"messageID": "m", "callID": "c"}}}]
            body = "".join(f"data: {json.dumps({'directory': '/p', 'payload': f})}\n\n"
                           for f in frames)
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=body.encode())
        if request.url.path in ("/permission", "/question", "/session"):
            return httpx.Response(200, json=[])
        return httpx.Response(200, json={})


@pytest.mark.parametrize("env", [
    {},  # companion
    {"AEP_OPENCODE_SSE_PRIMARY": "1", "AEP_TOKEN": "t"},  # gate flag off
    {"AEP_OPENCODE_SSE_PRIMARY": "1", "AEP_OPENCODE_SSE_CONTROL": "1"},  # no token
    {"AEP_OPENCODE_SSE_CONTROL": "1", "AEP_TOKEN": "t"},  # control in companion
])
async def test_gate_off_refuses_commands_and_writes_nothing(env, tmp_path):
    rec = Recorder()
    # never the user's real ~/.local/state (a primary bridge persists its runs)
    env = {**env, "AEP_STATE_DIR": str(tmp_path)}
    b = SseBridge.from_env(OC, env, policy=CapturePolicy())
    b._transport = httpx.MockTransport(rec)
    b.receiver_settings = ReceiverSettings(backoff_initial=0.05, backoff_max=0.1,
                                           degraded_interval=0.05)
    out_s, out_r = trio.open_memory_channel(1000)
    cmd_s, cmd_r = trio.open_memory_channel(10)
    ctx = BridgeContext(b.name, Stamper("opencode", epoch=1, host="t"), out_s, cmd_r,
                        BridgeHealth(), logging.getLogger("t"))
    events = []
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(run_bridge, b, ctx)

            async def collect():
                async for o in out_r:
                    events.append(o.event)
            n.start_soon(collect)
            while sum(1 for m, _ in rec.requests if m == "GET") < 10:
                await trio.sleep(0.02)
            req = next((e for e in events if e["type"] == "attention.requested"), None)
            await cmd_s.send(cmd("control.attention.respond", id="r1",
                                 subject=req["id"] if req else "x",
                                 data={"answer": {"option": "once"}}))
            await cmd_s.send(cmd("control.cancel", id="c1", data={"scope": "run"}))
            while sum(1 for e in events if e["type"] == "control.rejected") < 2:
                await trio.sleep(0.02)
            n.cancel_scope.cancel()
    rejected = [e for e in events if e["type"] == "control.rejected"]
    assert {e["cause"] for e in rejected} == {"r1", "c1"}
    assert all(e["data"]["reason"] == "unsupported" for e in rejected)
    assert not [e for e in events if e["type"] == "control.accepted"]
    assert {m for m, _ in rec.requests} == {"GET"}, rec.requests
    if req is not None:  # primary: the read-only ask carries no answer path
        assert "options" not in req["data"] and "respond_via" not in req["data"]
