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

import os
import socket

from tests.integration.hooks.test_daemon import HookDaemon, moment
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
