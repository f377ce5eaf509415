"""Issue 25, degraded: one unauthenticated OTLP sender that filled
``AEP_LOG_MAX_TOTAL_BYTES`` evicted every other agent's session files
within a minute (they were the oldest closed files). The total cap is now
shared: over it, the agent holding the most bytes loses its oldest closed
files first, so a quiet agent holding less than its share keeps every file
while one agent floods.

The real daemon with two OTLP profiles (two agents, each its own
listener): the quiet one (VS Code) writes three sessions; the flood (Codex)
writes many sessions (more than the daemon keeps open, so the quiet files
are closed and the oldest on disk) until retention has removed files
several times over. Bounded loop."""
from __future__ import annotations

import json
import time

from tests.support.daemon import DaemonProcess
from tests.support.hardening import event, otlp_json, otlp_record, post_events, post_otlp
from tests.support.net import free_ports

TOKEN = "retention-token"
CAP = 256 * 1024


def _vscode_doc(session: str) -> dict:
    return {"resourceLogs": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "copilot-chat"}},
            {"key": "session.id", "value": {"stringValue": session}}]},
        "scopeLogs": [{"scope": {"name": "copilot-chat"}, "logRecords": [
            {"attributes": [{"key": "event.name",
                             "value": {"stringValue": "copilot_chat.session.start"}},
                            {"key": "gen_ai.request.model", "value": {"stringValue": "gpt-4o"}}],
             "body": {"stringValue": "copilot_chat.session.start"}}]}]}]}


def _retained(d: DaemonProcess) -> dict:
    h = d.healthz()
    for v in (h, *(x for x in h.values() if isinstance(x, dict))):
        if "jsonl_removed_files" in v:
            return v
    raise AssertionError(f"no jsonl_* counts in /healthz: {sorted(h)}")


def _otlp_flood(d: DaemonProcess, port: int) -> None:
    """Unauthenticated OTLP exports as agent ``codex`` into 400 rotating
    sessions, under the new-session rate, until retention has removed at
    least 40 files (the cap at work; bounded), then one more sweep."""
    pad = "x" * 300
    removed = 0
    for k in range(60):  # bounded: stops once the flood was swept several times over
        recs = [otlp_record(f"flood-{(k * 40 + j) % 400}", event_name="codex.user_prompt",
                            extra={"prompt_length": pad})
                for j in range(40) for _ in range(3)]
        r = post_otlp(port, otlp_json(recs))
        assert r.status_code in (200, 429, 503), r.text
        removed = _retained(d)["jsonl_removed_files"]
        if removed >= 40 and k >= 12:
            break
        time.sleep(0.5)  # under the new-session rate
    assert removed >= 40, _retained(d)  # the cap held: the flood's files went
    time.sleep(2.5)  # a further check and sweep


def _writers(logs) -> dict[str, str]:
    """``stem -> writer`` as ``logs/.writers`` records it (an authenticated
    writer's line, ``[stem, writer, 1]``, outranks an open one's)."""
    writers: dict[str, str] = {}
    ranked: set[str] = set()
    for line in (logs / ".writers").read_text().splitlines():
        row = json.loads(line)
        if len(row) == 3 and row[0] not in ranked:
            writers[row[0]] = row[1]
            ranked.add(row[0])
        else:
            writers.setdefault(row[0], row[1])
    return writers


def test_one_flooding_agent_does_not_evict_a_quiet_agents_files(tmp_path) -> None:
    (vs_http,) = free_ports(1)
    d = DaemonProcess(tmp_path / "state", {
        "AEP_OTLP_VENDOR": "codex,vscode", "AEP_OTLP_PRIMARY": "1",
        "AEP_OTLP_VSCODE_HTTP_LISTEN": f"127.0.0.1:{vs_http}",
        "AEP_OTLP_VSCODE_GRPC_LISTEN": "off",
        "AEP_LOG_MAX_TOTAL_BYTES": str(CAP), "AEP_LOG_MAX_BYTES": "16K"}, token=TOKEN)
    d.start()
    try:
        for s in ("quiet-1", "quiet-2", "quiet-3"):
            assert post_otlp(vs_http, _vscode_doc(s)).status_code == 200
        logs = tmp_path / "state" / "logs"
        quiet = {p: p.read_bytes() for p in logs.rglob("*.jsonl") if "quiet-" in p.name}
        assert len(quiet) == 3, sorted(logs.rglob("*"))
        quiet_agent = {p.parent for p in quiet}
        assert len(quiet_agent) == 1
        codex_http = int(d.env["AEP_OTLP_HTTP_LISTEN"].rpartition(":")[2])
        _otlp_flood(d, codex_http)
        total = sum(p.stat().st_size for p in logs.rglob("*") if p.is_file())
        flood = [p for p in logs.rglob("*") if p.is_file() and p.parent not in quiet_agent]
        assert flood, "the flood wrote nothing"
        for p, body in quiet.items():
            assert p.exists(), f"{p.name} evicted by another agent's flood " \
                               f"({_retained(d)['jsonl_removed_files']} files removed)"
            assert p.read_bytes() == body
            assert json.loads(body.splitlines()[0])["session"].startswith("quiet-")
        assert total <= CAP + 4 * 16 * 1024 + 64 * 1024, total  # the cap holds (live files aside)
    finally:
        assert d.stop() == 0


def test_an_otlp_flood_as_agent_codex_does_not_evict_a_codex_hook_sessions_log(tmp_path) -> None:
    # attack 5: the unauthenticated OTLP receiver and the authenticated Codex
    # hook bridge both write agent ``codex``; grouped by agent, ~3 MB of OTLP
    # writes deleted the hook session's log (its descriptor closed by the
    # flood's sessions, AEP_LOG_MAX_OPEN). The group is the writer now
    import uuid

    import httpx
    d = DaemonProcess(tmp_path / "state", {
        "AEP_BRIDGE_CODEX_HOOKS": "1", "AEP_BRIDGE_OTLP_IN": "1", "AEP_OTLP_PRIMARY": "1",
        "AEP_LOG_MAX_TOTAL_BYTES": str(CAP), "AEP_LOG_MAX_BYTES": "16K",
        "AEP_LOG_MAX_OPEN": "16"}, token=TOKEN)
    d.start()
    try:
        hook = "hook-" + uuid.uuid4().hex[:8]
        for m in ({"hook_event_name": "SessionStart", "session_id": hook},
                  {"hook_event_name": "UserPromptSubmit", "session_id": hook, "prompt": "x",
                   "turn_id": "t1"},
                  {"hook_event_name": "Stop", "session_id": hook, "turn_id": "t1"}):
            r = httpx.post(f"{d.url}/hooks/codex", content=json.dumps(m), timeout=60,
                           headers={"Authorization": f"Bearer {TOKEN}",
                                    "X-AEP-Hook-Id": uuid.uuid4().hex}, trust_env=False)
            assert r.status_code == 200, r.text
        # a remote emitter's post: its principal is its files' writer
        assert post_events(d.url, [event(0, "posted-1", agent="poster")],
                           token=TOKEN).status_code == 202
        logs = tmp_path / "state" / "logs"
        mine = {p: p.read_bytes() for p in (logs / "codex").iterdir() if p.name.startswith(hook)}
        assert len(mine) == 1, sorted(logs.rglob("*"))
        codex_http = int(d.env["AEP_OTLP_HTTP_LISTEN"].rpartition(":")[2])
        _otlp_flood(d, codex_http)
        for p, body in mine.items():
            assert p.exists(), f"the hook session's log was evicted by the OTLP flood " \
                               f"({_retained(d)['jsonl_removed_files']} files removed)"
            assert p.read_bytes() == body
        # who wrote what, as retention groups it (and a restart reads it back)
        writers = _writers(logs)
        assert writers[f"codex/{hook}"] == "codex_hooks"
        assert writers["poster/posted-1"] == "relay:token"
        assert {w for s, w in writers.items() if s.startswith("codex/flood-")} == {"otlp_in.codex"}
        # and the directories are the user's alone (attack 5, item 2)
        for p in (logs, logs / "codex"):
            assert p.stat().st_mode & 0o777 == 0o700, oct(p.stat().st_mode)
    finally:
        assert d.stop() == 0


def _codex_hook(d: DaemonProcess, session: str) -> None:
    import uuid

    import httpx
    for m in ({"hook_event_name": "SessionStart", "session_id": session},
              {"hook_event_name": "UserPromptSubmit", "session_id": session, "prompt": "x",
               "turn_id": "t1"},
              {"hook_event_name": "Stop", "session_id": session, "turn_id": "t1"}):
        r = httpx.post(f"{d.url}/hooks/codex", content=json.dumps(m), timeout=60,
                       headers={"Authorization": f"Bearer {TOKEN}",
                                "X-AEP-Hook-Id": uuid.uuid4().hex}, trust_env=False)
        assert r.status_code == 200, r.text


def test_a_hook_session_whose_first_line_came_over_otlp_is_not_evicted_by_an_otlp_flood(
        tmp_path) -> None:
    # attack 6, item 2: the first writer decided: a Codex session whose first
    # line came from the unauthenticated OTLP receiver (Codex's own export, or
    # anyone naming the id) was filed under the OTLP group, and an OTLP flood
    # removed the hook session's file. The authenticated hook bridge takes it
    import uuid
    d = DaemonProcess(tmp_path / "state", {
        "AEP_BRIDGE_CODEX_HOOKS": "1", "AEP_BRIDGE_OTLP_IN": "1", "AEP_OTLP_PRIMARY": "1",
        "AEP_LOG_MAX_TOTAL_BYTES": str(CAP), "AEP_LOG_MAX_BYTES": "16K",
        "AEP_LOG_MAX_OPEN": "16"}, token=TOKEN)
    d.start()
    try:
        codex_http = int(d.env["AEP_OTLP_HTTP_LISTEN"].rpartition(":")[2])
        victim = "hook-" + uuid.uuid4().hex[:8]
        r = post_otlp(codex_http, otlp_json([otlp_record(victim,
                                                         event_name="codex.conversation_starts")]))
        assert r.status_code == 200, r.text
        logs = tmp_path / "state" / "logs"
        for _ in range(100):  # bounded: the OTLP line on disk before the hook's
            if (logs / "codex" / f"{victim}.jsonl").exists():
                break
            time.sleep(0.05)
        _codex_hook(d, victim)
        victim_file = logs / "codex" / f"{victim}.jsonl"
        kept = victim_file.read_bytes()
        assert kept.count(b"\n") == 4, kept
        _otlp_flood(d, codex_http)
        assert victim_file.exists(), "the hook session's log was evicted by the OTLP flood"
        assert victim_file.read_bytes() == kept
        assert _writers(logs)[f"codex/{victim}"] == "codex_hooks"
    finally:
        assert d.stop() == 0


def test_a_session_named_like_a_fleet_sessions_segment_does_not_evict_the_fleets_logs(
        tmp_path) -> None:
    # attack 6, item 1: a per-emitter credential that reads fleet session ids
    # on /stream posted sessions named ``{S}.{UTC}`` (a rotated segment's
    # stamp) as agent claude-code: their files fell into the stem of S, the
    # Claude Code bridge's, so the cap removed the fleet's session logs and
    # kept the poster's. A session id never names a segment now
    import os
    import uuid

    from tests.integration.hooks.test_daemon import HookDaemon, moment
    alice = "alice-cred-7c1e"
    creds = tmp_path / "emitters"
    creds.write_text(f"alice={alice}\n")
    os.chmod(creds, 0o600)
    d = HookDaemon(tmp_path / "state", AEP_EMITTER_TOKENS=str(creds),
                   AEP_LOG_MAX_TOTAL_BYTES=str(CAP), AEP_LOG_MAX_OPEN="4")
    d.start()
    try:
        fleet = [str(uuid.uuid4()) for _ in range(6)]
        for sid in fleet:
            for m in (moment(sid, "SessionStart", source="startup"),
                      moment(sid, "UserPromptSubmit", prompt="p"), moment(sid, "Stop")):
                assert d.post(m).status_code == 200
        logs = tmp_path / "state" / "logs"
        fleet_files = {p: p.read_bytes() for p in (logs / "claude-code").iterdir()}
        assert len(fleet_files) == 6, sorted(fleet_files)
        target = fleet[0]
        import secrets
        for k in range(40):  # bounded: ~12x the cap in all
            sess = f"{target}.20260101T0000{k:02d}.000000Z"
            evs = [event(i, sess, agent="claude-code", source=f"urn:alice:{k}",
                         data={"b": secrets.token_hex(4000)}) for i in range(10)]
            r = post_events(d.url, evs, token=alice)
            assert r.status_code == 202, r.text
        removed = 0
        for _ in range(40):  # bounded: the cap at work (a sweep a second)
            removed = _retained(d)["jsonl_removed_bytes"]
            if removed >= 4 * CAP:
                break
            time.sleep(0.5)
        time.sleep(2.5)  # a further check and sweep
        gone = [p.name for p in fleet_files if not p.exists()]
        assert not gone, f"the fleet's session logs were removed by the poster's: {gone}"
        assert removed >= 4 * CAP, _retained(d)  # the poster's bytes went, several caps' worth
        assert {p: p.read_bytes() for p in fleet_files} == fleet_files
        # the poster's sessions are its own: its files, its group
        writers = _writers(logs)
        assert writers[f"claude-code/{target}"] == "claude_code"
        assert not [s for s, w in writers.items() if w != "claude_code" and s.startswith(
            f"claude-code/{target}")], writers
    finally:
        assert d.stop() == 0
