"""Issue 25, fifth outside attack: the fleet's agent-scoped source was not
protected.

The owned-source rule refused a post under a per-session source a fleet
bridge had used, but posts (the shared token, a per-emitter credential) in
fresh sessions under ``aep://{host}/agent/claude-code`` (the source of the
Claude Code bridge's agent-scoped events, ``agent.idle``...) and under a
per-session source it had not used yet were accepted. Now every source at
or under a fleet bridge's ``aep://{host}/agent/{agent}`` is the fleet's
from the daemon's start (``supervisor/relay/fleetsources.py``): refused ``invalid-event``, counted
``refused_owned_source``, before the bridge's first event too. Naming the
agent (``agent: claude-code``) under a source of one's own stays accepted
with ``AEP_STRICT_IDENTITY=0`` (documented: ``agent`` is an asserted name).

The real daemon (``aep-bridges run`` with the Claude Code hook bridge and
per-emitter credentials), raw ``POST /events``.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time

from tests.integration.hooks.test_daemon import BASH, HookDaemon, moment
from tests.support.daemon import console_script, send_command
from tests.support.hardening import event, post_events

ALICE = "alice-cred-3f9a"

def test_posts_under_the_fleets_sources_are_refused_before_and_after_its_first_event(tmp_path):
    creds = tmp_path / "emitters"
    creds.write_text(f"alice={ALICE}\n")
    os.chmod(creds, 0o600)
    d = HookDaemon(tmp_path / "state", AEP_EMITTER_TOKENS=str(creds))
    d.start()
    try:
        base = f"aep://{socket.gethostname()}/agent/claude-code"

        def probe(n: int, source: str, token: str) -> int:
            return post_events(d.url, [event(1, f"probe-{n}", agent="claude-code", source=source)],
                               token=token).status_code

        def refused() -> int:
            return d.healthz(d.token)["relay_counts"]["counters"]["refused_owned_source"]

        sources = [base, f"{base}/session/not-yet-used"]
        n = 0
        for source in sources:  # before the bridge's first event
            for token in (d.token, ALICE):
                n += 1
                assert probe(n, source, token) == 400, (source, token == ALICE)
        assert refused() == 4
        assert d.post(moment("real-session", "SessionStart", source="startup")).status_code == 200
        for source in (*sources, f"{base}/session/real-session"):  # and after
            for token in (d.token, ALICE):
                n += 1
                assert probe(n, source, token) == 400, (source, token == ALICE)
        assert refused() == 10
        # documented (AEP_STRICT_IDENTITY=0): the agent's name under one's own source
        own = post_events(d.url, [event(1, "own", agent="claude-code", source="urn:alice:own")],
                          token=ALICE)
        assert own.status_code == 202, own.text
    finally:
        d.stop(timeout=20)


def test_other_spellings_of_the_fleets_sources_are_refused(tmp_path):
    """Sixth outside attack: the base was matched as a literal prefix, so
    ``claude%2Dcode``, ``x/../``, ``u@host:80``, ``?x=1``, ``127.0.0.1``...
    were accepted (202). Now each is refused ``invalid-event`` (normalized:
    ``supervisor/relay/fleetsources.py``), a raw lookalike as no URI at all;
    another agent's source under this host and another host's stay accepted."""
    creds = tmp_path / "emitters"
    creds.write_text(f"alice={ALICE}\n")
    os.chmod(creds, 0o600)
    d = HookDaemon(tmp_path / "state", AEP_EMITTER_TOKENS=str(creds))
    d.start()
    try:
        host = socket.gethostname()
        refused = [f"aep://{host}/agent/claude%2Dcode", f"aep://{host}/x/../agent/claude-code",
                   f"aep://u@{host.upper()}.:80/agent/claude-code", f"aep://{host}/agent/claude-code?x=1",
                   f"aep://{host}//agent/claude-code;x/session/s", "aep://127.0.0.1/agent/claude-code",
                   f"aep://{host}/agent/claude-cod%D0%B5",
                   # an eighth attack: past the old read limits, no authority
                   f"aep://{host}" + "/" * 70 + "agent/claude-code/session/s1",
                   "aep://localhost/" + "./" * 70 + "agent/claude-code/session/s2",
                   "aep://127.0.0.1/" + "x/../" * 70 + "agent/claude-code/session/s3",
                   "aep://" + "u" * 2100 + f"@{host}/agent/claude-code/session/s4",
                   "aep:/agent/claude-code/session/s5"]
        not_uris = [f"aep://{host}/agent/claude-cod\u0435", f"aep://{host}/agent/claude-code\u200b"]
        n = 0
        for source in refused + not_uris:
            for token in (d.token, ALICE):
                n += 1
                r = post_events(d.url, [event(1, f"spelling-{n}", agent="claude-code", source=source)],
                                token=token)
                assert r.status_code == 400, (source, token == ALICE, r.text)
                assert "invalid-event" in r.text, r.text
        counters = d.healthz(d.token)["relay_counts"]["counters"]
        assert counters["refused_owned_source"] == 2 * len(refused)
        for source in (f"aep://{host}/agent/my-agent", "aep://elsewhere/agent/claude-code"):
            n += 1
            r = post_events(d.url, [event(1, f"spelling-{n}", agent="claude-code", source=source)],
                            token=ALICE)
            assert r.status_code == 202, (source, r.text)
    finally:
        d.stop(timeout=20)


def test_a_gated_hook_sent_during_hostile_batches_is_held(tmp_path):
    """Eighth outside attack, finding 5: one ``POST /events`` of 6,000
    events with distinct ``aep://`` + 2 KB of U+FDFA hosts held the event
    loop 12 s, and a gated Claude Code ``PreToolUse`` sent through the real
    shim meanwhile found no daemon within its budget, was spooled, and the
    tool ran unapproved. Two posters send bounded batches of such events
    (another agent's, so accepted) while the shim asks: the hook is held
    and the AEP answer decides it."""
    d = HookDaemon(tmp_path / "state", AEP_CLAUDE_CODE_CONTROL="1",
                   AEP_CLAUDE_CODE_GATE_TOOLS="Bash", AEP_CLAUDE_CODE_HOLD_S="120")
    d.start()
    host = "%EF%B7%BA" * 227
    posted: list[int] = []
    started = threading.Event()

    def flood(k: int) -> None:
        for b in range(3):  # bounded: 3 batches of 1,500 events (3.3 MB each)
            events = [event(i, f"flood-{k}-{b}", source=f"aep://{host}/agent/x/{k}-{b}-{i}")
                      for i in range(1, 1501)]
            started.set()
            posted.append(post_events(d.url, events, token=d.token, timeout=120).status_code)

    floods = [threading.Thread(target=flood, args=(k,), daemon=True) for k in range(2)]
    shim = None
    try:
        for t in floods:
            t.start()
        assert started.wait(60)
        shim = subprocess.Popen([*console_script(), "hook", "claude-code", "--daemon", d.url],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={**d.env, "AEP_TOKEN": d.token})
        assert shim.stdin is not None
        shim.stdin.write(json.dumps(moment("victim", "PreToolUse", tool_use_id="t1",
                                           **BASH)).encode())
        shim.stdin.close()
        shim.stdin = None  # (communicate() would flush it)
        log = d.state / "logs" / "claude-code" / "victim.jsonl"
        ask = None
        deadline = time.monotonic() + 90
        while ask is None and shim.poll() is None and time.monotonic() < deadline:
            lines = log.read_bytes().splitlines() if log.exists() else []
            asks = [json.loads(x) for x in lines if b'"attention.requested"' in x]
            ask = asks[0] if asks else None
            time.sleep(0.2)
        if ask is None:  # the shim gave up (the old code: spooled, tool runs unapproved)
            out, err = shim.communicate(timeout=30)
            raise AssertionError(f"the gated hook was not held: exit {shim.returncode}, "
                                 f"stdout {out[:200]!r}, stderr {err[-300:]!r}")
        status, _ = send_command(d, "control.attention.respond", "victim", subject=ask["id"],
                                 data={"answer": {"option": "allow"}})
        assert status == "accepted"
        out, err = shim.communicate(timeout=60)
        assert shim.returncode == 0, err
        decision = json.loads(out)["hookSpecificOutput"]
        assert decision["permissionDecision"] == "allow", out
        assert b"spooled" not in err, err
        for t in floods:
            t.join(120)
        assert posted == [202] * 6, posted
    finally:
        if shim is not None and shim.poll() is None:
            shim.kill()
        d.stop(timeout=30)
