"""The Claude Code hook bridge through the real daemon (``aep-bridges run``,
its own process, the embedded relay): real-shaped hook payloads POSTed to
``/hooks/claude-code`` on ``AEP_LISTEN``, the stream read with the SDK
consumer, asks answered with the SDK ``ControlClient``: allow, a free-text
deny, a form, the hold's timeout, and the gate off (zero decisions). Every
event read is schema-valid, alone and as a stream."""
from __future__ import annotations

import json
import re
import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.support.daemon import DaemonProcess, send_command
from tests.support.schema import validated

TOKEN = "hooks-test-token"
BASH = {"tool_name": "Bash", "tool_input": {"command": "ls -la", "description": "list"}}


class HookDaemon(DaemonProcess):
    token = TOKEN

    def __init__(self, state, **env: str) -> None:
        super().__init__(state, {"AEP_BRIDGE_CLAUDE_CODE": "1", "AEP_BRIDGE_OTLP_IN": "0", **env})

    def headers(self, token: str | None = TOKEN) -> dict[str, str]:
        h = {"X-AEP-Hook-Transport": "command", "X-AEP-Hook-Id": uuid.uuid4().hex,
             "Content-Type": "application/json"}
        if token:
            h["Authorization"] = f"Bearer {token}"
        return h

    def post(self, moment: dict[str, Any], *, token: str | None = TOKEN,
             timeout: float = 60.0) -> httpx.Response:
        return httpx.post(f"{self.url}/hooks/claude-code", content=json.dumps(moment),
                          headers=self.headers(token), timeout=timeout)


def moment(session: str, event: str, **kw: Any) -> dict[str, Any]:
    return {"hook_event_name": event, "session_id": session, "cwd": "/work/p",
            "transcript_path": "/home/u/.claude/projects/p/t.jsonl",
            "permission_mode": "default", **kw}


class Background:
    """A hook POST held in a thread (the vendor waiting for its decision)."""

    def __init__(self, daemon: HookDaemon, m: dict[str, Any]) -> None:
        self.response: httpx.Response | None = None
        self.headers_seen = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(daemon, m), daemon=True)
        self.thread.start()

    def _run(self, daemon: HookDaemon, m: dict[str, Any]) -> None:
        with httpx.stream("POST", f"{daemon.url}/hooks/claude-code", content=json.dumps(m),
                          headers=daemon.headers(), timeout=60.0) as r:
            self.headers_seen.set()  # the response start, before any decision
            r.read()
            self.response = r

    def result(self, timeout: float = 60.0) -> httpx.Response:
        self.thread.join(timeout)
        assert self.response is not None, "the held hook never answered"
        return self.response


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    d = HookDaemon(tmp_path_factory.mktemp("hooks") / "state", AEP_CLAUDE_CODE_CONTROL="1",
                   AEP_CLAUDE_CODE_GATE_TOOLS="Bash", AEP_CLAUDE_CODE_HOLD_S="60")
    d.start()
    stream = d.subscribe()
    yield d, stream
    stream.close()
    d.stop()


def ask_of(stream, session: str) -> dict[str, Any]:
    return stream.first(lambda e: e.get("session") == session
                        and e["type"] == "attention.requested", what="attention.requested")


def test_a_held_pretooluse_is_allowed_from_aep(gated):
    d, stream = gated
    s = f"s-allow-{uuid.uuid4().hex[:6]}"
    assert d.post(moment(s, "UserPromptSubmit", prompt="list files")).json() == {}
    held = Background(d, moment(s, "PreToolUse", tool_use_id="toolu_1", **BASH))
    ask = ask_of(stream, s)
    assert ask["data"]["kind"] == "permission" and ask["subject"] == "Bash"
    assert held.headers_seen.wait(30), "the held hook's response start never came"
    assert held.response is None
    status, _ = send_command(d, "control.attention.respond", s, subject=ask["id"],
                             data={"answer": {"option": "allow"}})
    assert status == "accepted"
    r = held.result()
    assert r.status_code == 200 and int(r.headers["aep-hold-ms"]) == 60_000
    assert r.json()["hookSpecificOutput"]["permissionDecision"] == "allow"
    d.post(moment(s, "PostToolUse", tool_use_id="toolu_1", tool_response={"stdout": "x"}, **BASH))
    d.post(moment(s, "Stop"))
    stream.first(lambda e: e.get("session") == s and e["type"] == "run.finished")
    evs = validated(stream.of(s))
    types = [e["type"] for e in evs]
    assert types[:2] == ["run.started", "tool.requested"]
    for t in ("control.accepted", "attention.answered", "attention.resolved", "tool.completed"):
        assert t in types
    assert all("transcript" not in json.dumps(e) for e in evs)
    late, _ = send_command(d, "control.attention.respond", s, subject=ask["id"],
                           data={"answer": {"option": "deny"}})
    assert late == "refused"


def test_free_text_denies_with_the_text_for_the_model(gated):
    d, stream = gated
    s = f"s-deny-{uuid.uuid4().hex[:6]}"
    held = Background(d, moment(s, "PermissionRequest", **BASH))
    ask = ask_of(stream, s)
    status, _ = send_command(d, "control.attention.respond", s, subject=ask["id"],
                             capture="redacted",
                             data={"answer": {"text": "not in prod, use the staging box"}})
    assert status == "accepted"
    assert held.result().json() == {"hookSpecificOutput": {
        "hookEventName": "PermissionRequest",
        "decision": {"behavior": "deny", "message": "not in prod, use the staging box"}}}
    ans = stream.first(lambda e: e.get("session") == s and e["type"] == "attention.answered")
    assert ans["data"] == {"answer": {"option": "deny", "text": "not in prod, use the staging box"},
                           "via": "control"}
    validated(stream.of(s))


def test_a_form_is_answered_with_values_and_bad_values_are_nacked(gated):
    d, stream = gated
    s = f"s-form-{uuid.uuid4().hex[:6]}"
    schema = {"type": "object", "properties": {
        "environment": {"type": "string", "enum": ["staging", "production"]},
        "replicas": {"type": "integer"}}, "required": ["environment"]}
    held = Background(d, moment(s, "Elicitation", mcp_server_name="deploy",
                                message="Configure the target", requested_schema=schema))
    ask = ask_of(stream, s)
    assert ask["data"]["kind"] == "form"
    bad, _ = send_command(d, "control.attention.respond", s, subject=ask["id"],
                          data={"answer": {"values": {"environment": "moon"}}})
    assert bad == "invalid"
    ok, _ = send_command(d, "control.attention.respond", s, subject=ask["id"],
                         data={"answer": {"values": {"environment": "staging", "replicas": 2}}})
    assert ok == "accepted"
    assert held.result().json() == {"hookSpecificOutput": {
        "hookEventName": "Elicitation", "action": "accept",
        "content": {"environment": "staging", "replicas": 2}}}
    validated(stream.of(s))


def test_the_hold_ends_in_attention_timeout_and_no_decision(tmp_path):
    d = HookDaemon(tmp_path / "state", AEP_CLAUDE_CODE_CONTROL="1", AEP_CLAUDE_CODE_HOLD_S="1")
    d.start()
    stream = d.subscribe()
    try:
        s = "s-timeout"
        r = d.post(moment(s, "PermissionRequest", **BASH))
        assert r.json() == {} and r.headers["aep-hold-ms"] == "1000"
        t = stream.first(lambda e: e.get("session") == s and e["type"] == "attention.timeout")
        ask = ask_of(stream, s)
        assert t["cause"] == ask["id"]
        validated(stream.of(s))
    finally:
        stream.close()
        d.stop()


def test_gate_off_gives_zero_decisions(tmp_path):
    d = HookDaemon(tmp_path / "state")
    d.start()
    stream = d.subscribe()
    try:
        s = "s-off"
        for m in (moment(s, "PermissionRequest", **BASH),
                  moment(s, "PreToolUse", tool_use_id="t1", **BASH)):
            r = d.post(m)
            assert r.json() == {} and "aep-hold-ms" not in r.headers
        ask = ask_of(stream, s)
        assert ask["data"]["respond_via"] == ["oob"]
        status, _ = send_command(d, "control.attention.respond", s, subject=ask["id"],
                                 data={"answer": {"option": "allow"}})
        assert status == "unsupported"
        assert d.post(moment(s, "Stop"), token=None).status_code == 401
        validated(stream.of(s))
    finally:
        stream.close()
        d.stop()


def test_codex_hooks_beside_otlp_answer_a_permission_and_the_otlp_profile_says_companion(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CODEX_HOOKS": "1", "AEP_BRIDGE_OTLP_IN": "1",
                                           "AEP_OTLP_PRIMARY": "1", "AEP_CODEX_HOOKS_CONTROL": "1"},
                      token=TOKEN)
    d.start()
    stream = d.subscribe()
    try:
        s = "thread-1"

        def post(m: dict[str, Any]) -> httpx.Response:
            return httpx.post(f"{d.url}/hooks/codex", content=json.dumps(m), timeout=60,
                              headers={"Authorization": f"Bearer {TOKEN}",
                                       "X-AEP-Hook-Id": uuid.uuid4().hex})
        assert post({"hook_event_name": "UserPromptSubmit", "session_id": s, "turn_id": "turn-1",
                     "prompt": "clean"}).json() == {}
        box: dict[str, httpx.Response] = {}
        t = threading.Thread(target=lambda: box.setdefault("r", post(
            {"hook_event_name": "PermissionRequest", "session_id": s, "turn_id": "turn-1",
             "tool_name": "shell", "tool_input": {"command": "rm -rf build"}})), daemon=True)
        t.start()
        ask = ask_of(stream, s)
        assert ask["run"] == "turn-1" and ask["agent"] == "codex"
        status, _ = send_command(d, "control.attention.respond", s, subject=ask["id"],
                                 data={"answer": {"option": "deny"}})
        assert status == "accepted"
        t.join(60)
        assert box["r"].json()["hookSpecificOutput"]["decision"]["behavior"] == "deny"
        validated(stream.of(s))
        # said once, with its reason (the trial saw it twice at start)
        assert d.log().count("companion mode") == 1 and "AEP_BRIDGE_CODEX_HOOKS=1" in d.log()
    finally:
        stream.close()
        d.stop()


def test_moments_spooled_while_the_daemon_was_down_arrive_when_it_starts(tmp_path):
    """What a shim spooled (the contract's line format, ``<state>/hooks-spool``)
    is on the stream once the daemon runs, in order, never held, counted."""
    state = tmp_path / "state"
    spool = state / "hooks-spool"
    spool.mkdir(parents=True, mode=0o700)
    s = "s-spooled"
    lines = [{"id": uuid.uuid4().hex, "agent": "claude-code", "spooled_at_ms": 1, "payload": p}
             for p in (moment(s, "UserPromptSubmit", prompt="hi"),
                       moment(s, "PermissionRequest", **BASH), moment(s, "Stop"))]
    (spool / "claude-code.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines) + "{not json\n")
    d = HookDaemon(state, AEP_CLAUDE_CODE_CONTROL="1")
    d.start()
    stream = d.subscribe()
    try:
        stream.first(lambda e: e.get("session") == s and e["type"] == "run.finished")
        evs = validated(stream.of(s))
        assert [e["type"] for e in evs] == ["run.started", "attention.requested",
                                            "attention.resolved", "run.finished"]
        assert evs[1]["data"]["respond_via"] == ["oob"]
        for _ in range(200):  # counted just after the moment's log wait (the stream can be first)
            counters = d.healthz(TOKEN)["bridges"]["claude_code"]["counters"]
            if counters["hooks_spooled_ingested"] == 3:
                break
            time.sleep(0.05)
        assert counters["hooks_spooled_ingested"] == 3 and counters["hooks_spool_malformed"] == 1
        assert not (spool / "claude-code.jsonl").exists()
    finally:
        stream.close()
        d.stop()


def test_a_daemon_stop_dismisses_the_held_ask_in_the_session_log(tmp_path):
    """SIGTERM while a ``PreToolUse`` is held: the hook answers no decision and
    the session log ends the ask with ``attention.resolved{dismissed}`` (AEP-0002
    section 7 rule 2); without it the restarted daemon re-admits the ask from
    the log as pending forever, and an answer to it is nacked ``no-route``."""
    d = HookDaemon(tmp_path / "state", AEP_CLAUDE_CODE_CONTROL="1",
                   AEP_CLAUDE_CODE_GATE_TOOLS="Bash", AEP_CLAUDE_CODE_HOLD_S="60")
    d.start()
    stream = d.subscribe()
    s = "s-stop-held"
    try:
        held = Background(d, moment(s, "PreToolUse", tool_use_id="toolu_9", **BASH))
        ask = ask_of(stream, s)
        assert held.headers_seen.wait(30)
    finally:
        stream.close()
        assert d.stop() == 0
    logged = [json.loads(line) for p in (tmp_path / "state" / "logs").rglob("*.jsonl")
              for line in p.read_text().splitlines() if line.strip()]
    mine = [e for e in logged if e.get("session") == s]
    assert ask["id"] in [e["id"] for e in mine]
    done = [e for e in mine if e["type"] == "attention.resolved" and e["subject"] == ask["id"]]
    assert [e["data"]["resolution"] for e in done] == ["dismissed"]
    validated(mine)


def test_the_shim_signs_its_request_and_the_daemon_proves_itself(gated, tmp_path):
    """The command shim against the real daemon with AEP_TOKEN: the token never
    crosses the socket (an HMAC does, bridges/core/signed.py), the daemon's answer
    carries its proof and the shim prints the decision; the same signed request
    replayed, or its body swapped, is refused 401 (a process that saw one moment
    while squatting the port can make nothing of it)."""
    import subprocess
    import sys

    from bridges.core import signed
    from bridges.hooks_common import shim
    d, stream = gated
    s = "s-signed"
    body = json.dumps(moment(s, "UserPromptSubmit", prompt="hi")).encode()
    proc = subprocess.run([sys.executable, "-S", "-E", shim.__file__, "claude-code",
                           "--daemon", d.url, "--spool", str(tmp_path / "spool")],
                          input=body, capture_output=True, timeout=60,
                          env={"AEP_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and b"did not prove" not in proc.stderr, proc.stderr
    assert not (tmp_path / "spool").exists()  # answered by the daemon: nothing spooled
    stream.first(lambda e: e.get("session") == s and e["type"] == "run.started")

    hook = uuid.uuid4().hex
    digest = signed.body_digest(body)
    t = int(time.time())
    mac = signed.request_mac(TOKEN, t, hook, "/hooks/claude-code", digest)
    headers = {"X-AEP-Hook-Id": hook, "X-AEP-Hook-Digest": digest, "X-AEP-Hook-Transport":
               "command", "Authorization": f"AEP-HMAC-SHA256 {t}:{mac}",
               "Content-Type": "application/json"}
    first = httpx.post(f"{d.url}/hooks/claude-code", content=body, headers=headers, timeout=60)
    assert first.status_code == 200
    assert first.headers["aep-proof"] == signed.head_proof(TOKEN, hook, 200)
    proof, _, decision = first.content.partition(b"\n")
    assert proof.decode() == signed.body_proof(TOKEN, hook, decision)
    assert json.loads(decision) == {}
    replay = httpx.post(f"{d.url}/hooks/claude-code", content=body, headers=headers, timeout=60)
    assert replay.status_code == 401 and "aep-proof" not in replay.headers
    hook2 = uuid.uuid4().hex
    mac2 = signed.request_mac(TOKEN, t, hook2, "/hooks/claude-code", digest)
    swapped = httpx.post(f"{d.url}/hooks/claude-code", content=body.replace(b"hi", b"rm"),
                         headers={**headers, "X-AEP-Hook-Id": hook2,
                                  "Authorization": f"AEP-HMAC-SHA256 {t}:{mac2}"}, timeout=60)
    assert swapped.status_code == 401 and "aep-proof" not in swapped.headers
    wrong = signed.request_mac("not-the-token", t, hook2, "/hooks/claude-code", digest)
    forged = httpx.post(f"{d.url}/hooks/claude-code", content=body,
                        headers={**headers, "X-AEP-Hook-Id": hook2,
                                 "Authorization": f"AEP-HMAC-SHA256 {t}:{wrong}"}, timeout=60)
    assert forged.status_code == 401
    bearer = d.post(moment(s, "Stop"))  # Claude Code's own http hooks: bearer, as before
    assert bearer.status_code == 200 and "aep-proof" not in bearer.headers


def test_a_shim_with_the_wrong_token_is_told_and_the_daemon_counts_it(gated, tmp_path):
    """Trial issue 27: a wrong token bypassed the gate silently (the shim said
    "daemon unavailable", the daemon nothing). The shim says the credentials were
    refused; the daemon counts hooks_unauthorized (/healthz, /metrics) and logs it,
    never the token."""
    import subprocess
    import sys

    from bridges.hooks_common import shim
    d, _ = gated
    before = d.healthz(TOKEN)["bridges"]["claude_code"]["counters"]["hooks_unauthorized"]
    body = json.dumps(moment("s-wrong-token", "UserPromptSubmit", prompt="hi")).encode()
    proc = subprocess.run([sys.executable, "-S", "-E", shim.__file__, "claude-code",
                           "--daemon", d.url, "--spool", str(tmp_path / "spool")],
                          input=body, capture_output=True, timeout=60,
                          env={"AEP_TOKEN": "the-agents-wrong-token", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stdout == b""
    assert b"the daemon refused the hook's credentials (HTTP 401): the agent's AEP_TOKEN / " \
        b"--token-file does not match the daemon's" in proc.stderr, proc.stderr
    assert (tmp_path / "spool" / "claude-code.jsonl").exists()  # fail-open: spooled
    counters = d.healthz(TOKEN)["bridges"]["claude_code"]["counters"]
    assert counters["hooks_unauthorized"] == before + 1
    metrics = httpx.get(d.url + "/metrics", headers={"authorization": f"Bearer {TOKEN}"},
                        timeout=10).text
    (n,) = re.findall(r'^aep_bridges_hooks_unauthorized_total\{bridge="claude_code"\} (\S+)$',
                      metrics, re.M)
    assert float(n) == before + 1
    log = d.log()
    assert "hooks_unauthorized" in log
    assert "the-agents-wrong-token" not in log and TOKEN not in log
