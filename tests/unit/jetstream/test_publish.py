"""The publisher's rounds (supervisor.jetstream.publish) against a fake
JetStream whose publishes fail by a hypothesis-drawn script, each failure
either before the server stored the message or after (the ack lost): the
stream ends up with every event exactly once, each session's in emission
order, however the failures fall. And the outbox policy: notice+ waits for
room (never dropped), debug/info are shed and counted."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import trio
import trio_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.jetstream import publish as P
from supervisor.jetstream.config import NatsConfig


@dataclass
class Ack:
    seq: int
    duplicate: bool = False


class FakeJS:
    """Stores by Nats-Msg-Id with dedupe; ``script`` yields per publish
    ``ok``, ``before`` (raise, not stored) or ``after`` (stored, raise)."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.stored: list[tuple[str, str]] = []
        self.ids: dict[str, int] = {}

    async def publish(self, subject, payload, timeout, headers):
        await asyncio.sleep(0)  # lanes interleave
        what = self.script.pop(0) if self.script else "ok"
        if what == "before":
            raise TimeoutError("lost on the way")
        mid = headers["Nats-Msg-Id"]
        if mid in self.ids:
            ack = Ack(self.ids[mid], duplicate=True)
        else:
            self.stored.append((subject, mid))
            self.ids[mid] = len(self.stored)
            ack = Ack(len(self.stored))
        if what == "after":
            raise TimeoutError("ack lost")
        return ack


def _cfg(outbox: int = 10_000) -> NatsConfig:
    return NatsConfig(servers=("nats://127.0.0.1:1",), outbox=outbox)


def _event(i: int, session: str, severity: str = "notice") -> dict:
    return {"id": f"id{i:05d}", "source": "aep://h/t", "agent": "a", "session": session,
            "epoch": 1, "seq": i, "type": "x.a.tick", "severity": severity}


async def _run_publisher(events: list[dict], script: list[str], *, outbox: int = 10_000):
    js = FakeJS(script)
    link = SimpleNamespace(connected=True, js=js)
    pub = P.Publisher(_cfg(outbox), "d")
    P.RETRY_INITIAL_S, P.RETRY_MAX_S = 0.0, 0.0  # no waiting in the unit test
    async with trio_asyncio.open_loop():
        async with trio.open_nursery() as n:
            n.start_soon(pub.run, link)
            for ev in events:
                await pub.put(ev, b"{}")
            with trio.fail_after(30):
                await pub.flush()
            n.cancel_scope.cancel()
    return js, pub


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=60),
       st.lists(st.sampled_from(["ok", "ok", "ok", "before", "after"]), max_size=120))
def test_any_failure_pattern_stores_each_event_once_in_session_order(sessions, script) -> None:
    events = [_event(i, f"s{k}") for i, k in enumerate(sessions)]
    js, pub = trio.run(_run_publisher, events, script)
    assert sorted(mid for _, mid in js.stored) == sorted(f"id{i:05d} aep://h/t"
                                                          for i in range(len(events)))
    for k in set(sessions):
        subject = f"AEP.ev.a.s{k}"
        got = [mid for subj, mid in js.stored if subj == subject]
        want = [f"{e['id']} aep://h/t" for e in events if e["session"] == f"s{k}"]
        assert got == want
    assert pub.depth == 0 and pub.stats()["dropped"] == 0


@pytest.mark.parametrize("severity", ["notice", "warning", "error", "critical"])
def test_notice_and_above_wait_for_room_instead_of_being_dropped(severity) -> None:
    async def main():
        pub = P.Publisher(_cfg(outbox=16), "d")
        for i in range(16):
            assert pub.offer(_event(i, "s", severity), b"{}") == "queued"
        assert pub.offer(_event(16, "s", severity), b"{}") == "full"
        with trio.move_on_after(0.2) as waited:
            await pub.put(_event(17, "s", severity), b"{}")
        assert waited.cancelled_caught and pub.depth == 16
        assert pub.stats()["dropped"] == 0
    trio.run(main)


def test_debug_and_info_are_shed_first_and_counted_per_severity() -> None:
    pub = P.Publisher(_cfg(outbox=16), "d")
    for i in range(8):
        pub.offer(_event(i, "s", "debug"), b"{}")
    for i in range(8, 16):
        pub.offer(_event(i, "s", "info"), b"{}")
    for i in range(16, 26):
        assert pub.offer(_event(i, "s", "notice"), b"{}") == "queued"
    st_ = pub.stats()
    assert (st_["dropped_debug"], st_["dropped_info"], st_["dropped"]) == (8, 2, 10)
    assert pub.offer(_event(99, "s", "debug"), b"{}") == "dropped"  # only info/notice left
    assert pub.stats()["dropped_debug"] == 9


def test_stream_settings_and_drift() -> None:
    cfg = NatsConfig(servers=("nats://x:1",), max_age=100.0, duplicate_window=300.0, replicas=3)
    want = P.wanted_stream(cfg)
    assert want["subjects"] == ["AEP.ev.>"] and want["duplicate_window"] == 100.0
    have = SimpleNamespace(max_age=100.0, max_bytes=cfg.max_bytes, num_replicas=1,
                           duplicate_window=100.0, subjects=["other.>"])
    drift = P.stream_drift(have, want)
    assert drift == ["num_replicas: 1 -> 3", "subjects: ['other.>'] -> ['other.>', 'AEP.ev.>']"]
    same = SimpleNamespace(**{k: want[k] for k in ("max_age", "max_bytes", "num_replicas",
                                                     "duplicate_window", "subjects")})
    assert P.stream_drift(same, want) == []


def test_a_message_too_large_for_the_server_is_settled_counted_and_the_lane_goes_on() -> None:
    import nats.errors

    class Big(FakeJS):
        async def publish(self, subject, payload, timeout, headers):
            if headers["Nats-Msg-Id"].startswith("id00001 "):
                raise nats.errors.MaxPayloadError
            return await super().publish(subject, payload, timeout, headers)

    async def main():
        js = Big([])
        pub = P.Publisher(_cfg(), "d")
        async with trio_asyncio.open_loop():
            async with trio.open_nursery() as n:
                n.start_soon(pub.run, SimpleNamespace(connected=True, js=js))
                for i in range(3):
                    await pub.put(_event(i, "s"), b"{}")
                with trio.fail_after(10):
                    await pub.flush()
                n.cancel_scope.cancel()
        return js, pub
    js, pub = trio.run(main)
    assert [mid for _, mid in js.stored] == ["id00000 aep://h/t", "id00002 aep://h/t"]
    assert pub.stats()["too_large"] == 1 and pub.stats()["rounds_failed"] == 0
