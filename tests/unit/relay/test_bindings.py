"""Session bindings (issue 25, ``supervisor/relay/bindings.py``): who owns a
session beyond the life of a connection. The rule as a table, the journal
across a restart, and the relay's principals and checks in process."""
from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from bridges.core.aep import dumps
from supervisor.relay import InvalidEvent, Relay
from supervisor.relay.bindings import (
    ANONYMOUS,
    FLEET,
    SHARED,
    Bindings,
    binding_refusal,
    fleet_refusal,
    named,
)
from supervisor.relay.ingest import FleetRefused

A, B = "aep://h/agent/a/session/s", "aep://h/agent/b/session/s"


@pytest.mark.parametrize(("bound", "bound_src", "who", "src", "free", "refused"), [
    (FLEET, A, SHARED, A, True, True),            # the fleet's: never, even free, even its source
    (FLEET, A, named("x"), A, True, True),
    (named("x"), A, named("x"), B, False, False),  # a credential's: any source of it
    (named("x"), A, named("y"), A, True, True),    # another credential: never
    (named("x"), A, SHARED, A, True, True),        # the shared token: never
    (SHARED, A, SHARED, A, False, False),          # the shared token, same source: its owner
    (SHARED, A, SHARED, B, False, True),           # another source while held
    (SHARED, A, SHARED, B, True, False),           # ... and once free
    (SHARED, A, named("x"), B, False, True),       # a credential cannot take a held one
    (SHARED, A, named("x"), B, True, False),
    (ANONYMOUS, A, SHARED, A, False, True),        # another principal, same source: held
])
def test_the_rule(bound, bound_src, who, src, free, refused):
    assert (binding_refusal(bound, bound_src, who, src, free) is not None) is refused


def test_a_shared_binding_is_held_for_the_grace_after_its_last_claimant_left():
    b = Bindings(cap=10, grace_s=120)
    b.bind("s", SHARED, A, now=1000.0)
    assert b.refusal("s", SHARED, B, now=1000.0, live=True) is not None
    b.touch(["s"], now=2000.0)  # the claimant left
    assert b.refusal("s", SHARED, B, now=2119.0, live=False) is not None
    assert b.refusal("s", SHARED, B, now=2120.0, live=False) is None
    assert b.refusal("s", SHARED, B, now=2120.0, live=True) is not None  # someone holds it
    b.bind("s", SHARED, B, now=2120.0)
    assert b.refusal("s", SHARED, A, now=2121.0, live=False) is not None  # B's now


@pytest.mark.parametrize(("bound", "free", "refused"), [
    (FLEET, False, False),        # its own
    (SHARED, True, False),        # the shared token's, free: taken back (a squat after a restart)
    (ANONYMOUS, True, False),     # no token at all, free: taken back
    (SHARED, False, True),        # held: its claimant connected or within the grace
    (ANONYMOUS, False, True),
    (named("x"), True, True),     # a per-emitter credential's: never (an OTLP sender names it)
])
def test_the_fleets_rule(bound, free, refused):
    assert (fleet_refusal(bound, free=free) is not None) is refused


@pytest.mark.parametrize("held_by", [SHARED, ANONYMOUS])
def test_the_fleet_takes_a_shared_session_back_only_once_free(held_by):
    """Outside review of issue 25: the fleet took a live shared-token
    emitter's session from it (an unauthenticated OTLP export named it).
    Held while a claimant is connected and for the grace after; free then."""
    b = Bindings(cap=10, grace_s=1)
    b.bind("s", held_by, A, now=0.0)
    assert b.fleet_refusal("s", now=0.5, live=False) is not None  # within the grace
    assert b.fleet_refusal("s", now=5.0, live=True) is not None   # its claimant connected
    assert b.fleet_refusal("s", now=5.0, live=False) is None
    assert b.bind_fleet("s", B, now=5.0) is True
    assert b.bind_fleet("s", B, now=6.0) is False
    assert b.get("s").principal == FLEET  # type: ignore[union-attr]
    assert b.refusal("s", held_by, A, now=10_000.0, live=False) is not None


def test_the_fleet_never_takes_a_credentials_session():
    """Outside review of issue 25: an OTLP export naming a credential's
    session made the fleet's bridge emit into it, and the fleet took it."""
    b = Bindings(cap=10, grace_s=1)
    b.bind("s", named("x"), A, now=0.0)
    assert b.fleet_refusal("s", now=1e9, live=False) is not None
    assert b.bind_fleet("s", B, now=1.0) is False  # (the caller refused it already)
    assert b.get("s").principal == named("x")  # type: ignore[union-attr]
    assert b.refusal("s", named("x"), B, now=10_000.0, live=False) is None
    assert b.fleet_refusal("unbound", now=0.0, live=True) is None


def test_bindings_are_bounded_least_recently_used_first():
    b = Bindings(cap=2, grace_s=1)
    for s in ("s1", "s2", "s3"):
        b.bind(s, named("x"), A, now=0.0)
    assert len(b) == 2 and b.get("s1") is None and b.get("s3") is not None


def test_a_token_holder_churning_sessions_pushes_out_only_shared_bindings():
    b = Bindings(cap=3, grace_s=1)
    b.bind("mine", named("x"), A, now=0.0)
    b.bind_fleet("fleet", A, now=0.0)
    for i in range(100):
        b.bind(f"junk{i}", SHARED, A, now=float(i))
    assert len(b) == 3 and b.get("mine") is not None and b.get("fleet") is not None
    assert b.get("junk99") is not None and b.get("junk98") is None


def test_a_credential_churning_sessions_pushes_out_only_its_own_bindings():
    """Outside review of issue 25: a per-emitter credential binding new
    sessions past the cap pushed out the fleet's and another credential's
    bindings (then anyone could post into the fleet's session)."""
    b = Bindings(cap=4, grace_s=1)
    b.bind_fleet("fleet", A, now=0.0)
    b.bind("victim", named("v"), A, now=0.0)
    b.bind("shared", SHARED, A, now=0.0)
    for i in range(100):
        b.bind(f"junk{i}", named("m"), B, now=float(i))
    assert len(b) == 4
    assert b.get("fleet") is not None and b.get("victim") is not None
    assert b.get("junk99") is not None and b.get("junk98") is None
    assert b.get("shared") is not None


def test_a_full_table_of_others_loses_a_credential_before_the_fleet():
    b = Bindings(cap=2, grace_s=1)
    b.bind_fleet("fleet", A, now=0.0)
    b.bind("victim", named("v"), A, now=1.0)
    b.bind("new", named("m"), B, now=2.0)
    assert b.get("fleet") is not None and b.get("victim") is None and b.get("new") is not None


def test_a_rebound_session_moves_between_principals(tmp_path):
    b = Bindings(cap=3, grace_s=1)
    b.open(tmp_path / "j.jsonl", now=0.0)
    b.bind("s", SHARED, A, now=0.0)
    assert b.bind_fleet("s", A, now=1.0)
    for i in range(10):
        b.bind(f"m{i}", named("m"), B, now=2.0 + i)
    assert b.get("s") is not None and b.get("s").principal == FLEET  # type: ignore[union-attr]
    again = Bindings(cap=3, grace_s=1)
    assert again.open(tmp_path / "j.jsonl", now=0.0) == 3
    assert again.get("s") is not None and again.get("m9") is not None


def test_the_journal_remembers_across_a_restart_and_is_compacted(tmp_path):
    path = tmp_path / "relay-bindings.jsonl"
    b = Bindings(cap=3, grace_s=120)
    b.open(path, now=0.0)
    b.bind("s1", named("x"), A, now=0.0)
    b.bind("s1", named("x"), A, now=1.0)  # no change: no line
    b.bind_fleet("s2", B, now=0.0)
    b.bind("s3", SHARED, A, now=0.0)
    b.bind("s3", SHARED, B, now=500.0)  # rebound: the later line wins
    b.close()
    assert len(path.read_text().splitlines()) == 4
    with path.open("a") as f:
        f.write("not json\n{\"s\": 1}\n")  # a torn or foreign line is skipped
    again = Bindings(cap=2, grace_s=120)
    assert again.open(path, now=10_000.0) == 2  # the cap: the shared one (s3) forgotten first
    assert again.get("s3") is None and again.get("s1").principal == named("x")
    assert again.get("s2").principal == FLEET
    assert [json.loads(ln)["s"] for ln in path.read_text().splitlines()] == ["s1", "s2"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again.close()


def test_a_shared_binding_read_back_is_held_for_the_grace_from_the_restart(tmp_path):
    path = tmp_path / "relay-bindings.jsonl"
    b = Bindings(cap=3, grace_s=120)
    b.open(path, now=0.0)
    b.bind("s", SHARED, A, now=0.0)
    b.bind("s", SHARED, B, now=500.0)  # rebound once free: the later line wins
    b.close()
    again = Bindings(cap=3, grace_s=120)
    again.open(path, now=10_000.0)
    s = again.get("s")
    assert (s.principal, s.source) == (SHARED, B)
    assert again.refusal("s", SHARED, A, now=10_001.0, live=False) is not None
    assert again.refusal("s", SHARED, A, now=10_120.0, live=False) is None
    again.close()


def test_a_journal_that_cannot_be_written_keeps_the_table_in_memory(tmp_path):
    path = tmp_path / "missing-dir" / "relay-bindings.jsonl"
    b = Bindings(cap=3, grace_s=1)
    assert b.open(path, now=0.0) == 0
    b.bind("s", named("x"), A, now=0.0)
    assert b.get("s") is not None and not path.exists()


def _headers(token):
    return [(b"authorization", f"Bearer {token}".encode())]


def test_principals():
    r = Relay(token="shared", emitter_tokens={"alice": "alice-tok"})
    assert r.principal(_headers("shared")) == SHARED
    assert r.principal(_headers("alice-tok")) == named("alice")
    assert r.principal([], b"access_token=alice-tok") == named("alice")
    assert r.principal(_headers("nope")) == ANONYMOUS
    assert r.authenticated(_headers("alice-tok")) and r.authorized(_headers("alice-tok"))
    assert not r.authorized(_headers("nope"))
    assert Relay().principal(_headers("anything")) == ANONYMOUS


async def _noop(cmd):
    return None


def _ev(seq, session="s", agent="a", source=None):
    return {"aep": "0.1", "id": f"{agent}-{session}-{seq}", "type": "tool.completed",
            "time": "2026-12-01T10:00:00.000Z",
            "source": source or f"aep://h/agent/{agent}/session/{session}", "agent": agent,
            "session": session, "epoch": 1, "seq": seq}


async def test_a_post_into_a_fleet_or_a_credentials_session_is_refused():
    r = Relay(token="shared", emitter_tokens={"alice": "alice-tok"})
    fleet = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                              "identity": {"agent": "f"}}, _noop)
    await fleet.ingest(_ev(1, "fs", agent="f"))
    posted = [r.entry(_ev(5, "fs", agent="x"))]
    assert r.check_posted_sessions(posted, SHARED) is not None
    assert r.check_posted_sessions(posted, named("alice")) is not None
    # a credential's post binds a new session to it once admitted (a refused
    # one binds nothing); the shared token cannot post into it
    first = [r.entry(_ev(1, "as", agent="al"))]
    assert r.check_posted_sessions(first, named("alice")) is None
    assert r.bindings.get("as") is None
    r.bind_posted(first, named("alice"))
    assert r.check_posted_sessions([r.entry(_ev(2, "as", agent="x"))], SHARED) is not None
    assert r.check_posted_sessions([r.entry(_ev(2, "as", agent="al"))], named("alice")) is None
    # a shared-token session is not held against a post (a post claims nothing)
    assert r.check_posted_sessions([r.entry(_ev(1, "free"))], SHARED) is None
    assert r.counters["refused_owned_session"] == 3


async def test_a_socket_emitter_cannot_claim_a_fleet_session_and_the_fleet_takes_one_back():
    """The fleet takes a shared-token session back only once it is free
    (its claimant gone and ``AEP_CLAIM_GRACE`` passed): a remote party
    that pre-claimed a fleet session loses it then."""
    r = Relay(token="shared", claim_grace_s=0.0)
    fleet = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                              "identity": {"agent": "f"}}, _noop)
    remote = r.open_socket(True, SHARED)
    remote.role = "emitter"
    await fleet.ingest(_ev(1, "fs", agent="f"))
    with pytest.raises(InvalidEvent, match="bridge of this daemon"):
        r.accept(_ev(1, "fs", agent="r"), remote)
    await r.ingest(_ev(1, "rs", agent="r"), remote)  # the remote party's own session
    assert r.claims.holders("rs") == [remote]
    r.release(remote)  # gone, and the grace (0 s here) passed: free
    await fleet.ingest(_ev(1, "rs", agent="f"))  # a bridge emits into it: the fleet's now
    assert r.claims.holders("rs") == [fleet] and r.counters["fleet_reclaimed"] == 1
    back = r.open_socket(True, SHARED)
    back.role = "emitter"
    with pytest.raises(InvalidEvent):
        r.accept(_ev(2, "rs", agent="r"), back)


def _shared_squat_relay(grace: float) -> tuple[Relay, Any, Any]:
    r = Relay(token="shared", claim_grace_s=grace)
    fleet = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                              "identity": {"agent": "codex"}}, _noop)
    owner = r.open_socket(True, SHARED)
    owner.role = "emitter"
    return r, fleet, owner


async def test_a_fleet_bridge_never_takes_a_live_shared_tokens_session(caplog):
    """Outside review of issue 25: a shared-token emitter's live session S;
    an unauthenticated OTLP export naming S made the fleet's OTLP bridge
    emit into S, and the fleet reclaimed it: the owner's own events were
    refused from then on and its commands went to the fleet. Now the
    fleet's events there are refused (every path: untrusted, stamped, run,
    the pump's question) while the owner is connected and within the
    grace after it left, counted and logged once; the owner keeps S."""
    r, fleet, owner = _shared_squat_relay(grace=3600.0)
    await r.ingest(_ev(1, "S", agent="own"), owner)
    caplog.set_level(logging.WARNING, logger="aep.relay")
    src = "aep://h/agent/codex/session/S"
    with pytest.raises(FleetRefused, match="shared token"):
        await fleet.ingest(_ev(1, "S", agent="codex", source=src))
    ev2 = _ev(2, "S", agent="codex", source=src)
    with pytest.raises(FleetRefused):
        fleet.ingest_stamped(ev2, dumps(ev2))
    ok = _ev(1, "mine", agent="codex")
    assert fleet.ingest_stamped_run([(ok, dumps(ok)), (ev2, dumps(ev2))]) == 1
    assert fleet.refuses(ev2) and not fleet.refuses(ok)
    assert r.counters["refused_fleet_into_owned"] == 3
    assert r.counters["fleet_reclaimed"] == 0
    assert r.claims.holders("S") == [owner]
    assert r.bindings.get("S").principal == SHARED  # type: ignore[union-attr]
    await r.ingest(_ev(2, "S", agent="own"), owner)  # the owner goes on
    assert r.buffers.held("S") == 2
    r.release(owner)  # gone, but within the grace: still held for it
    assert fleet.refuses(ev2)
    with pytest.raises(FleetRefused):
        fleet.ingest_stamped(ev2, dumps(ev2))
    back = r.open_socket(True, SHARED)
    back.role = "emitter"
    await r.ingest(_ev(3, "S", agent="own"), back)  # it comes back to its session
    assert r.claims.holders("S") == [back]
    logged = [rec for rec in caplog.records if "refused_fleet_into_owned" in rec.getMessage()]
    assert len(logged) == 1, logged


async def test_a_fleet_bridge_takes_an_anonymous_session_only_when_free():
    r = Relay(claim_grace_s=0.0)  # no token at all: the anonymous principal
    fleet = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                              "identity": {"agent": "f"}}, _noop)
    owner = r.open_socket(True)
    owner.role = "emitter"
    await r.ingest(_ev(1, "S", agent="own"), owner)
    assert fleet.refuses(_ev(1, "S", agent="f"))  # connected: held
    r.release(owner)
    assert not fleet.refuses(_ev(1, "S", agent="f"))  # gone and the grace passed: free
    await fleet.ingest(_ev(1, "S", agent="f"))
    assert r.claims.holders("S") == [fleet] and r.counters["fleet_reclaimed"] == 1


async def test_a_fleet_bridge_of_another_agent_cannot_enter_a_claimed_session(caplog):
    """Outside review of issue 25: an OTLP export naming a Claude Code hook
    session made the Codex OTLP bridge claim it too: two claimants, every
    ``control.attention.respond`` refused ``ambiguous``. A fleet bridge of
    another agent is refused there (counted, logged once); two bridges of
    one agent (Codex's hook and OTLP bridges) still share a session."""
    r = Relay(token="shared")
    claude = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                               "identity": {"agent": "claude-code"}}, _noop)
    codex_otlp = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                                   "identity": {"agent": "codex"}}, _noop, open_sessions=True)
    codex_hooks = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                                    "identity": {"agent": "codex"}}, _noop)
    caplog.set_level(logging.WARNING, logger="aep.relay")
    await claude.ingest(_ev(1, "cc1", agent="claude-code"))
    src = "aep://h/agent/codex/session/cc1"
    ev = _ev(1, "cc1", agent="codex", source=src)
    assert codex_otlp.refuses(ev)
    with pytest.raises(FleetRefused, match="another agent"):
        await codex_otlp.ingest(ev)
    with pytest.raises(FleetRefused):
        codex_otlp.ingest_stamped(ev, dumps(ev))
    assert codex_otlp.ingest_stamped_run([(ev, dumps(ev))]) == 0
    assert r.claims.holders("cc1") == [claude]
    assert r.claims.refusal("cc1", "control.cancel")[0] != "ambiguous"  # type: ignore[index]
    assert r.counters["refused_fleet_into_owned"] == 3
    # the same agent's two bridges share a session (companion mode)
    await codex_hooks.ingest(_ev(1, "cx", agent="codex", source="aep://h/hooks/cx"))
    await codex_otlp.ingest(_ev(1, "cx", agent="codex"))
    assert set(r.claims.holders("cx")) == {codex_hooks, codex_otlp}
    logged = [rec for rec in caplog.records if "refused_fleet_into_owned" in rec.getMessage()]
    assert len(logged) == 1, logged


async def test_a_credentials_post_cannot_enter_a_held_shared_session():
    """Outside review of issue 25: a per-emitter credential posted into a
    connected shared-token emitter's session under another source and got
    202 (over ``/socket`` the same is refused). A credential's post meets
    the ``/socket`` hold; a shared-token post still claims nothing and is
    not held off."""
    r = Relay(token="shared", emitter_tokens={"bob": "bob-tok"}, claim_grace_s=3600.0)
    owner = r.open_socket(True, SHARED)
    owner.role = "emitter"
    await r.ingest(_ev(1, "S", agent="own"), owner)
    post = [r.entry(_ev(7, "S", agent="bob", source="aep://h/bob"))]
    got = r.check_posted_sessions(post, named("bob"))
    assert got is not None and got[0] == 0
    r.release(owner)  # within the grace: still held
    assert r.check_posted_sessions(post, named("bob")) is not None
    assert r.check_posted_sessions(post, SHARED) is None  # as documented
    # bob's own sessions, and his post beside his own live connection, pass
    bob = r.open_socket(True, named("bob"))
    bob.role = "emitter"
    await r.ingest(_ev(1, "B", agent="bob", source="aep://h/bob"), bob)
    assert r.check_posted_sessions([r.entry(_ev(2, "B", agent="bob", source="aep://h/bob"))],
                                   named("bob")) is None
    # a session another live connection claims (its binding forgotten) is held too
    r.bindings = type(r.bindings)(cap=10, grace_s=3600.0)
    other = r.open_socket(True, SHARED)
    other.role = "emitter"
    await r.ingest(_ev(1, "T", agent="o"), other)
    r.bindings = type(r.bindings)(cap=10, grace_s=3600.0)
    assert r.check_posted_sessions([r.entry(_ev(2, "T", agent="bob"))], named("bob")) is not None
    assert r.counters["refused_owned_session"] == 3


def test_compaction_never_follows_a_planted_tmp_file(tmp_path):
    """Outside review of issue 25: the compaction opened
    ``relay-bindings.jsonl.tmp`` with ``O_CREAT|O_TRUNC``: a symlink planted
    there truncated its target, and a tmp file left with a wider mode made
    the journal that mode (not 0600)."""
    journal = tmp_path / "j.jsonl"
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    (tmp_path / "j.jsonl.tmp").symlink_to(target)
    b = Bindings(cap=4, grace_s=1)
    b.bind("s", named("x"), A, now=0.0)
    b.open(journal, now=0.0)
    assert target.read_text() == "keep me\n"
    assert not journal.is_symlink() and journal.stat().st_mode & 0o777 == 0o600
    b.close()
    (tmp_path / "j.jsonl.tmp").write_text("")
    (tmp_path / "j.jsonl.tmp").chmod(0o666)
    again = Bindings(cap=4, grace_s=1)
    assert again.open(journal, now=0.0) == 1
    assert journal.stat().st_mode & 0o777 == 0o600
    again.close()


async def test_a_fleet_event_into_a_credentials_session_is_refused_and_counted(caplog):
    """Every fleet path into a credential's session refuses it (the
    untrusted ingest, the stamped one, the stamped run, the pump's question
    before it logs), counts each event ``refused_fleet_into_owned``, logs
    once per session; the credential keeps its claim and its session, and
    the fleet's other sessions go on."""
    r = Relay(token="shared", emitter_tokens={"alice": "alice-tok"})
    fleet = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                              "identity": {"agent": "f"}}, _noop)
    alice = r.open_socket(True, named("alice"))
    alice.role = "emitter"
    await r.ingest(_ev(1, "cs", agent="al"), alice)
    src = "aep://h/agent/f/session/cs"
    caplog.set_level(logging.WARNING, logger="aep.relay")
    with pytest.raises(FleetRefused, match="per-emitter credential"):
        await fleet.ingest(_ev(1, "cs", agent="f", source=src))
    ev2 = _ev(2, "cs", agent="f", source=src)
    with pytest.raises(FleetRefused):
        fleet.ingest_stamped(ev2, dumps(ev2))
    ok = _ev(1, "fs", agent="f")
    pairs = [(ok, dumps(ok)), (ev2, dumps(ev2))]
    assert fleet.ingest_stamped_run(pairs) == 1  # stops at the refused one, nothing of it done
    assert fleet.refuses(ev2) and not fleet.refuses(ok)
    assert r.counters["refused_fleet_into_owned"] == 3
    assert r.counters["fleet_reclaimed"] == 0
    assert r.claims.holders("cs") == [alice] and r.claims.holders("fs") == [fleet]
    assert r.bindings.get("cs").principal == named("alice")  # type: ignore[union-attr]
    assert r.buffers.held("cs") == 1  # alice's one event
    await r.ingest(_ev(2, "cs", agent="al"), alice)  # alice goes on in her session
    assert r.buffers.held("cs") == 2
    refusals = [rec for rec in caplog.records if "refused_fleet_into_owned" in rec.getMessage()]
    assert len(refusals) == 1, refusals
    assert "alice-tok" not in caplog.text


def test_the_journal_is_compacted_while_running_against_its_table(tmp_path):
    """Outside review of issue 25: the journal grew by a line per new or
    changed binding until the next start (compacted only past twice the
    table's *cap*, 132,096 lines by default, however small the table). Now
    past twice the table's size plus 1,024 lines, while running."""
    path = tmp_path / "relay-bindings.jsonl"
    b = Bindings(cap=65_536, grace_s=0)
    b.open(path, now=0.0)
    for i in range(5_000):  # one session rebound under a new source each time
        b.bind("s", SHARED, f"aep://h/src/{i}", now=float(i))
        b.bind(f"c{i % 3}", named("x"), A, now=float(i))
    lines = path.read_text().splitlines()
    assert len(lines) <= 2 * len(b) + 1024 + len(b), len(lines)
    b.close()
    again = Bindings(cap=65_536, grace_s=0)
    assert again.open(path, now=0.0) == 4
    assert again.get("s").source == "aep://h/src/4999"  # type: ignore[union-attr]


def test_a_long_session_id_is_journaled_by_its_digest(tmp_path):
    """Outside review of issue 25: a 100,000 character hook session id made
    one journal line of that size (and the table held it whole). Past
    ``KEY_MAX`` characters an id is keyed by a prefix and its SHA-256:
    still the same session's binding across a restart, never another's."""
    path = tmp_path / "relay-bindings.jsonl"
    long_id, twin = "x" * 100_000, "x" * 99_999 + "y"
    long_src = "aep://h/" + "\u00e9" * 50_000
    b = Bindings(cap=8, grace_s=3600)
    b.open(path, now=0.0)
    b.bind(long_id, SHARED, long_src, now=0.0)
    b.bind_fleet("f" * 5_000, A, now=0.0)
    assert b.refusal(long_id, SHARED, long_src, now=1.0, live=True) is None
    assert b.refusal(long_id, SHARED, A, now=1.0, live=True) is not None
    assert b.get(twin) is None
    b.close()
    text = path.read_text()
    assert max(len(line) for line in text.splitlines()) < 2_048, len(text)
    again = Bindings(cap=8, grace_s=3600)
    assert again.open(path, now=0.0) == 2
    assert again.get(long_id).principal == SHARED  # type: ignore[union-attr]
    assert again.refusal(long_id, SHARED, long_src, now=1.0, live=False) is None
    assert again.get("f" * 5_000).principal == FLEET  # type: ignore[union-attr]
    assert again.get(twin) is None and again.get("f" * 4_999) is None
    again.close()


async def test_two_agents_whose_own_ids_collide_are_two_claimants():
    """Session identity is emitter-scoped (AEP-0001 §5.2): two ACP agents
    both saying ``sess-1`` are two claimants (their commands
    ``ambiguous``, AEP-0004 §4.5), never one refused: only a bridge whose
    ids unauthenticated senders choose (OTLP) is kept out (seen in a
    parallel run: the rule first refused every bridge of another agent,
    and the second ACP tee's whole session was dropped)."""
    r = Relay(token="shared")
    acp = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                            "identity": {"agent": "acp"}}, _noop)
    gemini = r.attach_emitter({"versions": ["0.1"], "role": "emitter",
                               "identity": {"agent": "gemini"}}, _noop)
    await acp.ingest(_ev(1, "sess-1", agent="acp", source="aep://h/acp/sess-1"))
    ev = _ev(1, "sess-1", agent="gemini", source="aep://h/gemini/sess-1")
    assert not gemini.refuses(ev)
    await gemini.ingest(ev)
    assert set(r.claims.holders("sess-1")) == {acp, gemini}
    assert r.counters.get("refused_fleet_into_owned", 0) == 0
