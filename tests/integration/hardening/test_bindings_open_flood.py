"""Round 8 outside attack, finding 6 (issue 25): unauthenticated OTLP
sessions evicted the hook bridges' session bindings.

Every bridge of the daemon bound its sessions as the one principal FLEET,
the open OTLP receiver included, and a full bindings table forgets a
principal's own least recently used binding first: a flood of new
``conversation.id`` s (no credential needed) pushed out a live Claude Code
hook session's binding, and after a restart a per-emitter credential
posted an ``attention.requested`` into that Claude Code session (HTTP 202;
refused before the flood). An open bridge's bindings are their own kind
now (``supervisor/relay/bindings.py``): its new ones push out only its own.

The real daemon (``aep-bridges run``: the Claude Code hook bridge, the
OTLP bridge, the embedded relay with its journal), real-shaped hook
payloads, raw OTLP/JSON exports with no credential, ``POST /events`` with
a per-emitter credential. ``AEP_MAX_BINDINGS=16`` (the table's size, the
knob made for it) stands for the default 65,536, and the OTLP new-session
rate is raised, so the flood takes one request instead of ~22 minutes.
"""
from __future__ import annotations

import json
import time

from tests.integration.hooks.test_daemon import HookDaemon, moment
from tests.support.hardening import event, otlp_json, otlp_record, post_events, post_otlp

EVIL = "evil-cred-7d3a9e1c"
S = "3b9f1f64-8d0c-4c55-9d43-5b1f2d2b7c11"  # the Claude Code session
CAP = 16


def _evil_post(d: HookDaemon, seq: int):
    ev = event(seq, S, agent="claude-code", source="urn:evil", type="attention.requested",
               severity="notice", data={"kind": "permission", "prompt": "Permission requested: Bash",
                                        "options": [{"id": "allow", "label": "Allow"}]})
    return post_events(d.url, [ev], token=EVIL)


def test_an_otlp_flood_and_a_restart_leave_a_hook_session_to_its_bridge(tmp_path):
    creds = tmp_path / "emitters"
    creds.write_text(f"evil={EVIL}\n")
    creds.chmod(0o600)
    d = HookDaemon(tmp_path / "state", AEP_BRIDGE_OTLP_IN="1", AEP_EMITTER_TOKENS=str(creds),
                   AEP_MAX_BINDINGS=str(CAP), AEP_OTLP_NEW_SESSIONS_PER_S="100000",
                   AEP_OTLP_MAX_NEW_SESSIONS="1000", AEP_LOG_SPARES="16")
    d.start()
    try:
        assert d.post(moment(S, "SessionStart", source="startup")).status_code == 200
        r = _evil_post(d, 0)
        assert r.status_code == 400 and "belongs to a bridge of this daemon" in r.text, r.text
        # anyone on the OTLP port, no credential: 4 x the table in new conversations
        flood = [otlp_record(f"otlp-flood-{i}") for i in range(4 * CAP)]
        r = post_otlp(d.http_port, otlp_json(flood))
        assert r.status_code == 200, r.text
        files = {p.name for p in (d.state / "logs" / "codex").iterdir()}
        assert sum(n.startswith("otlp-flood-") for n in files) == 4 * CAP  # all taken
        # the relay binds after the session log's write (the fleet pump): wait for it
        deadline = time.monotonic() + 60
        while True:
            journal = [json.loads(x) for x in
                       (d.state / "relay-bindings.jsonl").read_text().splitlines()]
            bound = sum(str(j["s"]).startswith("otlp-flood-") for j in journal)
            if bound >= 4 * CAP or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert bound == 4 * CAP  # all bound
        # the daemon restarts (an upgrade, a crash); Claude Code's session goes on
        d.restart()
        r = _evil_post(d, 1)
        assert r.status_code == 400 and "belongs to a bridge of this daemon" in r.text, r.text
        assert d.post(moment(S, "UserPromptSubmit", prompt="hi", prompt_id="p1")).status_code == 200
        lines = [json.loads(x) for x in (d.state / "logs" / "claude-code" / f"{S}.jsonl")
                 .read_text().splitlines()]
        assert lines and all(e["source"] != "urn:evil" for e in lines), lines
        assert [e["type"] for e in lines][-1] != "attention.requested"
    finally:
        d.stop(timeout=20)
