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
        pad = "x" * 300
        removed = 0
        for k in range(60):  # bounded: stops once the flood was swept several times over
            recs = [otlp_record(f"flood-{(k * 40 + j) % 400}", event_name="codex.user_prompt",
                                extra={"prompt_length": pad})
                    for j in range(40) for _ in range(3)]
            r = post_otlp(codex_http, otlp_json(recs))
            assert r.status_code in (200, 429, 503), r.text
            removed = _retained(d)["jsonl_removed_files"]
            if removed >= 40 and k >= 12:
                break
            time.sleep(0.5)  # under the new-session rate
        assert removed >= 40, _retained(d)  # the cap held: the flood's files went
        time.sleep(2.5)  # a further check and sweep
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
        pad = "x" * 300
        removed = 0
        for k in range(60):  # bounded: stops once the flood was swept several times over
            recs = [otlp_record(f"flood-{(k * 40 + j) % 400}", event_name="codex.user_prompt",
                                extra={"prompt_length": pad})
                    for j in range(40) for _ in range(3)]
            r = post_otlp(codex_http, otlp_json(recs))
            assert r.status_code in (200, 429, 503), r.text
            removed = _retained(d)["jsonl_removed_files"]
            if removed >= 40 and k >= 12:
                break
            time.sleep(0.5)  # under the new-session rate
        assert removed >= 40, _retained(d)  # the cap held: the flood's files went
        time.sleep(2.5)  # a further check and sweep
        for p, body in mine.items():
            assert p.exists(), f"the hook session's log was evicted by the OTLP flood " \
                               f"({_retained(d)['jsonl_removed_files']} files removed)"
            assert p.read_bytes() == body
        # who wrote what, as retention groups it (and a restart reads it back)
        writers = {}
        for line in (logs / ".writers").read_text().splitlines():
            stem, writer = json.loads(line)
            writers.setdefault(stem, writer)
        assert writers[f"codex/{hook}"] == "codex_hooks"
        assert writers["poster/posted-1"] == "relay:token"
        assert {w for s, w in writers.items() if s.startswith("codex/flood-")} == {"otlp_in.codex"}
        # and the directories are the user's alone (attack 5, item 2)
        for p in (logs, logs / "codex"):
            assert p.stat().st_mode & 0o777 == 0o700, oct(p.stat().st_mode)
    finally:
        assert d.stop() == 0
