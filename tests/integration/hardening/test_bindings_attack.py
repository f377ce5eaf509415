"""Issue 25, session bindings attacked from outside (the outside review of
``supervisor/relay/bindings.py``; README "Security", row "Integrity").

The rule under attack: a session is bound to the principal that first
claimed it (the fleet, a per-emitter credential of ``AEP_EMITTER_TOKENS``,
or the shared ``AEP_TOKEN`` for its source through ``AEP_CLAIM_GRACE``),
journaled across restarts. These tests hold what broke and what must keep
working:

- a per-emitter credential holder that posts batches of fresh sessions
  (each batch refused ``429 too-many-sessions``, so nothing is logged)
  bound every one of them anyway, filled the bindings table and pushed the
  fleet's and another credential's bindings out: then a shared-token post
  entered the fleet's session and a shared-token emitter took the other
  credential's session (first two tests, fixed: a refused batch binds
  nothing, a principal that fills the table forgets its own bindings
  first);
- a shared-token emitter reconnecting after a relay restart gets its
  session back at once under its own source (the default deployment must
  not wait out the grace);
- anyone who can reach the OTLP receiver (unauthenticated) named a
  credential's session as its ``conversation.id``: the fleet's bridge
  emitted into it and took it (fixed: a fleet bridge never takes a
  per-emitter credential's session; its events there are refused before
  the session log, counted ``refused_fleet_into_owned``).

The real daemon (``aep-bridges run`` with its OTLP bridge and embedded
relay), the real SDK duplex, raw HTTP posts; bounded loops only.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.hardening import (
    event,
    first_sequenced,
    otlp_json,
    otlp_record,
    post_events,
    post_otlp,
    refused_fleet_into_owned,
    stream_events,
)
from tests.support.nats import NatsCluster

from .test_control_forgery import TOKEN, _answers, _connections, _emitter, _wait_connections

VICTIM_CRED = "victim-cred-5b1e"
MALLORY_CRED = "mallory-cred-9c2d"
CONV = "bindings-attack-conv-1"


def _creds(tmp_path: Path) -> Path:
    creds = tmp_path / "emitters"
    creds.write_text(f"victim={VICTIM_CRED}\r\nmallory={MALLORY_CRED}\r\n")
    os.chmod(creds, 0o600)
    return creds


@pytest.fixture()
def daemon(tmp_path: Path):
    d = DaemonProcess(tmp_path / "state", {"AEP_EMITTER_TOKENS": str(_creds(tmp_path))},
                      token=TOKEN)
    d.start()
    yield d
    d.stop(timeout=20)


def _fleet_session(url: str, conv: str) -> str:
    """The session of the OTLP bridge's first sequenced event of ``conv``."""
    return str(first_sequenced(url, TOKEN, conv)["session"])


def _named_claim(url: str, session: str) -> None:
    """The victim credential claims ``session`` on ``/socket`` and leaves."""
    victim = _emitter(url, "victim", token=VICTIM_CRED)
    try:
        assert _answers(victim, event(1, session, agent="victim")) == []
        gone = _connections(url) - 1
    finally:
        victim.close()
    _wait_connections(url, gone)


def _churn(url: str, batches: int, size: int, tag: str) -> list[int]:
    """Mallory posts ``batches`` batches of ``size`` events, each in a
    fresh session: the statuses."""
    out = []
    for b in range(batches):
        evs: list[dict[str, Any]] = [event(1, f"churn-{tag}-{b}-{i}", agent="mallory")
                                     for i in range(size)]
        out.append(post_events(url, evs, token=MALLORY_CRED, timeout=120).status_code)
    return out


def test_a_credential_holder_cannot_churn_out_the_fleets_or_anothers_bindings(daemon):
    url = daemon.url
    assert post_otlp(daemon.http_port, otlp_json([otlp_record(CONV)])).status_code == 200
    fleet = _fleet_session(url, CONV)
    _named_claim(url, "bindings-victim-1")
    # past the table's cap (65,536 by default): each batch is refused 429
    # (over the new-session budget), so nothing is logged or admitted
    statuses = _churn(url, 7, 10_000, "a")
    assert set(statuses) <= {429, 202}, statuses
    # the shared token posts into the fleet's session
    r = post_events(url, [event(50, fleet, agent="mallory")], token=TOKEN)
    assert r.status_code == 400 and r.json()["error"] == "invalid-event", r.text
    # a shared-token emitter takes the victim credential's session
    squatter = _emitter(url, "victim")
    try:
        taken = _answers(squatter, event(2, "bindings-victim-1", agent="victim"))
        assert [a.get("code") for a in taken] == ["invalid-event"], taken
    finally:
        squatter.close()
    log = daemon.log()
    for secret in (TOKEN, VICTIM_CRED, MALLORY_CRED):
        assert secret not in log


def test_a_refused_post_binds_nothing(daemon):
    """A batch answered 429 (nothing admitted, nothing logged) must not bind
    its sessions: else a credential pre-binds any session id for free."""
    url = daemon.url
    assert _churn(url, 1, 500, "b") == [429]
    victim = _emitter(url, "victim", token=VICTIM_CRED)
    try:
        got = _answers(victim, event(1, "churn-b-0-7", agent="victim"))
        assert got == [], got
    finally:
        victim.close()


def test_a_shared_token_emitter_gets_its_session_back_after_a_restart(daemon):
    """The default deployment: one emitter on the shared token, the relay
    restarts; the emitter reconnects at once (inside the grace) under its
    own source and continues its session, and its commands reach it."""
    session = "bindings-shared-1"
    plain = _emitter(daemon.url, "plain")
    try:
        assert _answers(plain, event(1, session, agent="plain")) == []
    finally:
        plain.close()
    daemon.stop(timeout=20)
    daemon.start()
    plain = _emitter(daemon.url, "plain")
    try:
        assert _answers(plain, event(2, session, agent="plain")) == []
    finally:
        plain.close()


def _session_events(url: str, session: str) -> list[dict[str, Any]]:
    """Every event of ``session`` on ``/stream`` (``from=all``, ``live=0``)."""
    return [ev for ev in stream_events(url, TOKEN) if ev.get("session") == session]


def _refused_fleet_into_owned(url: str) -> float:
    return refused_fleet_into_owned(url, TOKEN)


def test_an_otlp_sender_cannot_take_a_credentials_session(daemon):
    """Broke: the OTLP receiver is unauthenticated and a ``conversation.id``
    within the id grammar becomes the AEP ``session`` verbatim. Anyone who
    read a named emitter's session id on ``/stream`` exported one OTLP
    record with that id: the fleet's OTLP bridge emitted into the session,
    :meth:`Bindings.bind_fleet` bound it to the fleet for ever (journaled)
    and evicted the credential's claim (``fleet_reclaimed``); the credential
    holder was refused in its own session from then on. Now a fleet bridge
    never takes a credential's session (it still takes back a shared-token
    one, ``test_fleet_squat.py``): its events there are refused before the
    session log (counted ``refused_fleet_into_owned``), so neither the
    stream nor a restarted daemon's replay holds them, and the bridge goes
    on with its other sessions."""
    url = daemon.url
    session = "bindings-otlp-victim"
    _named_claim(url, session)
    assert _refused_fleet_into_owned(url) == 0
    assert post_otlp(daemon.http_port, otlp_json([otlp_record(session)])).status_code == 200
    # the export is answered once the pump handled it: its events were refused
    assert _refused_fleet_into_owned(url) >= 1
    victim = _emitter(url, "victim", token=VICTIM_CRED)
    try:
        assert _answers(victim, event(2, session, agent="victim")) == []
    finally:
        victim.close()
    # the bridge goes on serving its other sessions
    assert post_otlp(daemon.http_port, otlp_json([otlp_record(CONV)])).status_code == 200
    _fleet_session(url, CONV)
    assert [e["agent"] for e in _session_events(url, session)] == ["victim", "victim"]
    log = daemon.log()
    assert log.count("refused_fleet_into_owned") == 1, log  # once per session
    for secret in (TOKEN, VICTIM_CRED, MALLORY_CRED):
        assert secret not in log
    daemon.stop(timeout=20)
    daemon.start()
    # the restarted relay replays the session's logged history: the victim's alone
    assert [e["agent"] for e in _session_events(daemon.url, session)] == ["victim", "victim"]
    victim = _emitter(daemon.url, "victim", token=VICTIM_CRED)
    try:
        assert _answers(victim, event(3, session, agent="victim")) == []
    finally:
        victim.close()


def test_a_batch_with_one_owned_session_is_refused_whole(daemon):
    """``POST /events`` mixing a free session and the fleet's: refused
    whole (400 with the owned event's line), nothing of it admitted or
    bound."""
    url = daemon.url
    assert post_otlp(daemon.http_port, otlp_json([otlp_record(CONV)])).status_code == 200
    fleet = _fleet_session(url, CONV)
    r = post_events(url, [event(1, "bindings-mixed-free", agent="mallory"),
                          event(60, fleet, agent="mallory")], token=MALLORY_CRED)
    assert r.status_code == 400 and r.json().get("line") == 1, r.text  # 0-based
    victim = _emitter(url, "victim", token=VICTIM_CRED)
    try:  # the free session was not bound to mallory
        assert _answers(victim, event(1, "bindings-mixed-free", agent="victim")) == []
    finally:
        victim.close()


def test_a_credentials_posted_session_is_its_own_on_another_jetstream_relay(tmp_path):
    """A per-emitter credential that only posts (``POST /events``) binds its
    session on the embedded relay; on JetStream the post only read KV
    ``AEP_bindings``, so another credential on another relay claimed the
    session over ``/socket`` and took its commands."""
    with NatsCluster(1, tmp_path / "nats") as c:
        env = {"AEP_NATS_URL": c.url, "AEP_EMITTER_TOKENS": str(_creds(tmp_path))}
        relays = [DaemonProcess(tmp_path / f"state{i}", env, args=("relay",), token=TOKEN)
                  for i in (1, 2)]
        for r in relays:
            r.start()
        try:
            session = "js-posted-named-1"
            r = post_events(relays[0].url, [event(1, session, agent="victim")], token=VICTIM_CRED)
            assert r.status_code == 202, r.text
            mallory = _emitter(relays[1].url, "mallory", token=MALLORY_CRED)
            try:
                taken = _answers(mallory, event(1, session, agent="mallory"))
                assert [a.get("code") for a in taken] == ["invalid-event"], taken
            finally:
                mallory.close()
            r = post_events(relays[1].url, [event(2, session, agent="mallory")],
                            token=MALLORY_CRED)
            assert r.status_code == 400, r.text
        finally:
            for d in relays:
                d.stop(timeout=20)


def test_an_otlp_sender_cannot_take_a_live_shared_token_session(daemon):
    """Broke (outside review of issue 25): a shared-token emitter connected
    on ``/socket`` and sent events in its session S; anyone, with no token,
    exported one OTLP record with ``conversation.id`` = S: the fleet's OTLP
    bridge emitted into S and :meth:`Bindings.bind_fleet` took it from the
    shared principal, so the owner's own next event was refused ("belongs
    to a bridge of this daemon"), its commands went to the OTLP bridge, and
    the journal kept it so across restarts. Now the fleet takes a
    shared-token session only once it is free (no claimant connected and
    ``AEP_CLAIM_GRACE`` passed): its events there are refused before the
    session log, counted ``refused_fleet_into_owned``, logged once."""
    url = daemon.url
    session = "bindings-otlp-shared"
    owner = _emitter(url, "plain")
    try:
        assert _answers(owner, event(1, session, agent="plain")) == []
        assert _refused_fleet_into_owned(url) == 0
        assert post_otlp(daemon.http_port, otlp_json([otlp_record(session)])).status_code == 200
        assert _refused_fleet_into_owned(url) >= 1
        # the owner goes on in its own session
        assert _answers(owner, event(2, session, agent="plain")) == []
    finally:
        owner.close()
    # gone, but within the grace: still held for it
    assert post_otlp(daemon.http_port, otlp_json([otlp_record(session)])).status_code == 200
    assert _refused_fleet_into_owned(url) >= 2
    assert [e["agent"] for e in _session_events(url, session)] == ["plain", "plain"]
    log = daemon.log()
    assert log.count("refused_fleet_into_owned") == 1, log  # once per session
    daemon.stop(timeout=20)
    daemon.start()
    owner = _emitter(daemon.url, "plain")
    try:  # the journal kept it the owner's
        assert _answers(owner, event(3, session, agent="plain")) == []
    finally:
        owner.close()
