"""An eighth outside attack on issue 25, findings 4 and 5: ``source``
strings cost memory outside the buffer budget and held the event loop.

- One ``POST /events`` of 6,000 events with distinct long ``aep:`` sources
  held the loop 12 s (the fleet-source check, then the parse, ran without
  a checkpoint), and a gated hook sent meanwhile failed open: the post now
  yields while it parses and while it checks the fleet's sources
  (``supervisor/relay/app.py``, :meth:`.ingest.Ingest.check_fleet_sources`);
  the per-source work bound is ``tests/unit/relay/test_fleet_sources.py``'s.
- 4,096-entry memos keyed by the raw source (and session) kept up to 64 KiB
  a key (+329 MiB): a key longer than 256 characters is not kept."""
from __future__ import annotations

import json
import sys

from supervisor.relay import envelope, fanout
from supervisor.relay.app import make_app
from supervisor.relay.core import Relay
from supervisor.relay.fleetsources import FleetSources
from tests.support.ticker import Ticker
from tests.unit.relay.test_relay_core import ev, take, ws

FDFA_HOST = "%EF%B7%BA" * 227  # 2 KB; NFKC makes each character 18


async def _post(relay: Relay, events: list[dict]) -> int:
    sent: list = []
    body = "\n".join(json.dumps(e) for e in events).encode()
    scope = {"type": "http", "path": "/events", "method": "POST", "query_string": b"",
             "server": ("127.0.0.1", 1), "headers": [
                 (b"host", b"127.0.0.1"), (b"content-type", b"application/x-ndjson"),
                 (b"aep-version", b"0.1"), (b"authorization", b"Bearer t")]}
    msgs = iter([{"type": "http.request", "body": body, "more_body": False}])

    async def receive():
        return next(msgs)

    async def send(m):
        sent.append(m)
    await make_app(relay)(scope, receive, send)
    return sent[0]["status"]


async def test_a_big_batch_lets_other_tasks_run_while_it_is_read(monkeypatch):
    """Another task (a gated hook's handler) gets the loop while one batch
    is parsed and its sources checked: the ticks of a task that only
    yields, seen from each source check and each parsed line, advance."""
    relay = Relay(token="t")
    relay.fleet_sources.reserve("aep://vm/agent/claude-code")
    ticker = Ticker()
    seen_by_check: list[int] = []
    seen_by_parse: list[int] = []
    owns = FleetSources.owns
    monkeypatch.setattr(FleetSources, "owns",
                        lambda self, s: seen_by_check.append(ticker.ticks) or owns(self, s))
    formed = sys.modules["supervisor.relay.app"].formed_entry
    monkeypatch.setattr("supervisor.relay.app.formed_entry",
                        lambda ln: seen_by_parse.append(ticker.ticks) or formed(ln))
    events = [ev(i + 1, "flood", source=f"aep://{FDFA_HOST}/agent/x/{i}") for i in range(1000)]
    status = await ticker.beside(lambda: _post(relay, events))
    assert status == 202
    assert len(seen_by_check) == len(seen_by_parse) == 1000
    # bounded runs between yields (128 lines parsed, 64 sources checked; trio
    # may run the other task before or after the poster in a round: half)
    assert len(set(seen_by_parse)) >= 1000 // 128 // 2
    assert len(set(seen_by_check)) >= 1000 // 64 // 2


async def test_a_refused_source_still_refuses_the_batch_whole():
    relay = Relay(token="t")
    relay.fleet_sources.reserve("aep://vm/agent/claude-code")
    events = [ev(i + 1, "mixed", source=f"aep://vm2/agent/x/{i}") for i in range(300)]
    events[250]["source"] = "aep://localhost" + "/" * 70 + "agent/claude-code/session/s1"
    assert await _post(relay, events) == 400
    assert relay.counters["events"] == 0 and relay.counters["refused_owned_source"] == 1


ROUND_11 = ["aep://l%D0%BEcalhost/agent/claude-code/session/s3",  # Cyrillic о
            "aep://localhost/agen%E1%BA%97/claude-code/session/s4",  # ẗ
            "aep://vm/agen%E1%BA%97/claude-code/session/s6"]


async def test_the_eleventh_attacks_spellings_are_refused_on_post():
    """An eleventh outside attack on issue 25 (atk11 f2): these were
    accepted 202 with ``agent: claude-code``, each alone in its post; each
    is now refused 400 and counted, and the plain forms still are."""
    relay = Relay(token="t")
    relay.fleet_sources.reserve("aep://vm/agent/claude-code")
    for n, source in enumerate([*ROUND_11, "aep://localhost/agent/claude-code/session/s1"]):
        event = ev(0, f"r11-{n}", type="session.started", source=source, agent="claude-code")
        assert await _post(relay, [event]) == 400, source
    assert relay.counters["events"] == 0 and relay.counters["refused_owned_source"] == 4
    other = ev(0, "r11-other", type="session.started", source="aep://vm2/agen%E1%BA%97/claude-code")
    assert await _post(relay, [other]) == 202  # another host's stays its own


def test_the_memos_keep_no_long_key():
    for n in range(300):
        src = f"aep://h/{n}/" + "a" * 60_000
        e = envelope.to_entry(ev(1, f"s{n}-" + "b" * 4000, source=src, id=f"i{n}"))
        fanout.sse_message(e, e.raw)
    kept = sum(sys.getsizeof(k) for k in envelope._SOURCE_OK) + \
        sum(sys.getsizeof(k) for k in fanout._IDS)
    assert kept < 2 << 20, kept


async def test_a_socket_emitters_long_sources_are_kept_by_a_bounded_key():
    """The live owned-source table (issue 10 #8) kept each ``/socket``
    emitter's last ``AEP_MAX_SESSIONS`` sources verbatim: 500 x 64 KiB a
    connection. It keeps their :func:`.bindings.key`; the rule still holds."""
    relay = Relay(token="t")
    conn = await ws(relay, role="emitter")
    long = [f"aep://h/{n}/" + "a" * 60_000 for n in range(200)]
    for n, src in enumerate(long):
        await conn.handle_text(json.dumps(ev(1, f"w{n}", source=src)))
    assert await take(conn.outlet) == []
    assert sum(sys.getsizeof(k) for k in conn.sources) < 1 << 20
    other = await ws(relay, role="emitter")
    await other.handle_text(json.dumps(ev(1, "other", source=long[7])))
    (err,) = await take(other.outlet)
    assert err["code"] == "invalid-event" and "connected emitter" in err["detail"], err
