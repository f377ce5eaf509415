"""The read-back's time bounds (supervisor.jetstream.recover.recover)
against a real nats-server, with session logs written by hand as the
daemon writes them (ULID ids stamped in the past):

- a session whose stream holds a stored event gets every event after it,
  however old its stamps and its file (an outage, events 1-5 stored when
  NATS came back, then a kill; the stream has since removed older
  messages, so its horizon is later than the file);
- a session the stream holds nothing of, its file last written before the
  horizon (its events may have been stored and removed): nothing.
"""
from __future__ import annotations

import json
import os
import time

import trio

from bridges.core.envelope import Ulids
from supervisor.jetstream import recover as R
from supervisor.jetstream.config import from_env
from supervisor.jetstream.link import aio, open_link
from supervisor.jetstream.publish import ensure_stream, message_for
from tests.support.nats import NatsCluster

ulid = Ulids()


def _session(logs, agent: str, session: str, n: int, stamped_ms: int) -> list[dict]:
    evs = [{"aep": "0.1", "id": ulid.at(stamped_ms + i), "type": "tool.completed",
            "time": "2026-01-01T00:00:00.000Z", "source": f"aep://h/{agent}/{session}",
            "agent": agent, "session": session, "seq": i, "epoch": 7, "capture": "metadata"}
           for i in range(n)]
    path = logs / agent / f"{session}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in evs))
    t = stamped_ms / 1000 + n / 1000
    os.utime(path, (t, t))
    return evs


async def test_the_read_back_bounds_by_stamping_time_only_where_nothing_is_stored(
        tmp_path) -> None:
    state = tmp_path / "state"
    old_ms = int((time.time() - 600) * 1000)  # stamped ten minutes ago
    kept = _session(state / "logs", "codex", "kept", 10, old_ms)
    aged = _session(state / "logs", "codex", "aged", 4, old_ms)
    with NatsCluster(1, tmp_path / "nats") as c:
        cfg, _ = from_env({"AEP_NATS_URL": c.url})
        async with open_link(cfg) as link:
            await ensure_stream(link, cfg)
            # the stream held "aged" and kept 0..4, then removed everything
            # before kept's first event (as its limits would)
            for e in [*aged, *kept[:5]]:
                m = message_for(cfg.stream, e, json.dumps(e).encode(), "d1")
                await aio(link.js.publish)(m.subject, m.payload, headers=m.headers)
            for seq in range(1, len(aged) + 1):
                await aio(link.js.delete_msg)(cfg.stream, seq)
            with trio.fail_after(30):
                got = await R.recover(link, cfg, state, "d1", since=0.0, epoch=None, limit=10)
    assert [json.loads(m.payload)["id"] for m in got] == [e["id"] for e in kept[5:]]
