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
                   f"aep://{host}/agent/claude-cod%D0%B5"]
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
