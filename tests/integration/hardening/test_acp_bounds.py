"""Issue 25, the ACP mount (rows 3-5 and two degraded findings), on the real
daemon with the real tee in front of the Python SDK agent, and raw
WebSocket clients playing the attacker:

- row 3: one ``#`` control record of 200,000 ``[`` crashed the bridge for
  the agent id (every tee cut, the victim's turn never closed);
- row 4: tees that leave an unfinished line held in the daemon, without bound;
- row 5: a hello reusing a live tee's instance id (read from a run id on
  ``/stream``) forged ``session.ended`` into the victim's session;
- degraded: a tee that changes ``sessionId`` every line made a session file
  per line; each malformed hello logged a traceback, unbounded."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from bridges.acp import wire
from tests.integration.acp.peers.py_client import drive
from tests.integration.acp.test_acp_pairs import ANSWERS, assert_python_story, wait_story
from tests.support.acp import DAEMON_ENV, py_agent, tee
from tests.support.daemon import DaemonProcess, run_daemon


def ws_url(d: DaemonProcess) -> str:
    return d.url.replace("http://", "ws://") + wire.path_for("acp")


def counters(d: DaemonProcess) -> dict:
    return d.healthz()["bridges"]["acp"]["counters"]


def counters_when(d: DaemonProcess, pred, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        c = counters(d)
        if pred(c) or time.monotonic() > deadline:
            assert pred(c), c
            return c
        time.sleep(0.1)


def in_thread(fn, *args):
    """Run the trio function ``fn`` to completion from a blocking callback
    (the client drive's ``between`` runs inside asyncio's loop)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(trio.run(fn, *args)))
    t.start()
    t.join(120)
    assert out, "the attacker did not finish"
    return out[0]


CLAIMED = 4409  # bridges.acp.wire.CLAIMED: the tee id belongs to another connection


def hello(tee_id: str, resume: str | None = None, **kw) -> str:
    h = wire.hello(tee_id, "acp", ["attacker"], 1, {"drops": 0}, **kw)
    return json.dumps({**h, "resume": resume} if resume else h)


def welcome_key(message) -> str | None:
    """The resume key of the daemon's welcome (``{"aep_acp_daemon": 1, "resume": KEY}``)."""
    try:
        w = json.loads(message)
    except ValueError:
        return None
    return w.get("resume") if isinstance(w, dict) and w.get("aep_acp_daemon") == 1 else None


def frame(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


# ------------------------------------------------------------------ row 3

def test_a_deeply_nested_control_record_costs_the_attacker_only(tmp_path):
    """The attacker's tee sends a control record of 200,000 ``[`` (three
    times, on three connections) while the victim's tee is in its session:
    the victim's three turns complete and its whole story arrives; the
    bridge never restarts; the refusals are counted, logged once per tee."""
    deep = b"#" + (200_000).to_bytes(4, "big") + b"[" * 200_000

    async def attack(url: str, n: int) -> None:
        try:
            async with open_websocket_url(url) as ws:
                await ws.send_message(hello(f"ATTACKER{n}"))
                await ws.send_message(deep)
                await ws.send_message(deep)
        except (ConnectionClosed, HandshakeError):  # (the old code: the bridge crashed under it)
            pass

    with run_daemon(tmp_path, DAEMON_ENV, healthy=True) as d:
        col = d.subscribe()
        try:
            def between(turn: int) -> None:
                if turn == 1:
                    for n in range(3):
                        in_thread(attack, ws_url(d), n)
                    # (wait until handled: the old code crashed and restarted the bridge)
                    counters_when(d, lambda c: c.get("control_refused") == 6
                                  or c.get("restarts", 0) > 0)

            asyncio.run(drive(tee(d.url) + py_agent(), ANSWERS, between=between))
            assert_python_story(wait_story(col, "sess-1"))
            c = counters(d)
            assert c.get("restarts", 0) == 0 and c["control_refused"] == 6, c
            lines = [ln for ln in d.log().splitlines() if "control record" in ln]
            assert len(lines) == 3, lines  # once per tee
            assert "Traceback" not in d.log() and "RecursionError" not in d.log()
        finally:
            col.close()


# ------------------------------------------------------------------ row 4

def test_unfinished_lines_are_bounded_per_tee_and_in_total(tmp_path):
    """16 tees each leave 3 MiB of an unfinished line in each direction (48
    MiB per tee... 96 MiB in all on the old code, kept after they left):
    the bridge's own accounting (``held_bytes``, in ``/healthz`` and
    ``/metrics``) never passes ``AEP_ACP_MAX_HELD_BYTES``, what would pass
    it is cut and counted, and a tee that left holds nothing."""
    cap = 8 << 20
    piece = b'{"jsonrpc":"2.0","method":"x","params":{"p":"' + b"x" * (3 << 20)
    env = {**DAEMON_ENV, "AEP_ACP_MAX_HELD_BYTES": str(cap), "AEP_ACP_MAX_TEES": "64"}
    with run_daemon(tmp_path, env, healthy=True) as d:
        async def tees() -> None:
            async with trio.open_nursery() as n:
                for i in range(16):
                    n.start_soon(one, i)

        async def one(i: int) -> None:
            async with open_websocket_url(ws_url(d), max_message_size=1 << 20) as ws:
                await ws.send_message(hello(f"HOLDER{i}", max_line=16 << 20))
                await ws.send_message(wire.record("client", piece))
                await ws.send_message(wire.record("agent", piece))
                await holding.wait()

        holding = trio.Event()
        seen: list[int] = []

        async def watch() -> None:
            async with trio.open_nursery() as n:
                n.start_soon(tees)
                with trio.fail_after(60):
                    while True:
                        c = await trio.to_thread.run_sync(counters, d)
                        seen.append(c.get("held_bytes", -1))
                        if c["tees_attached"] == 16 and c.get("lines_cut", 0) > 0 \
                                and c.get("held_bytes", 0) > 0:
                            break
                        await trio.sleep(0.1)
                holding.set()

        trio.run(watch)
        c = counters_when(d, lambda c: c["tees_attached"] == 0)
        assert 0 <= max(seen) <= cap, (max(seen), cap)
        c = counters_when(d, lambda c: c["held_bytes"] == 0)
        # 32 unfinished lines of 3 MiB: at most two fit under 8 MiB at once
        assert c["lines_cut"] >= 30, c
        metrics = __import__("httpx").get(d.url + "/metrics").text
        assert "aep_bridges_acp_held_bytes" in metrics


# ------------------------------------------------------------------ row 5

def test_a_hello_cannot_speak_for_another_tee(tmp_path):
    """The forger reads the victim tee's instance id from a run id on
    ``/stream`` and says hello with it (with no key, and with a made-up
    one), then reports an exit: refused with close code 4409; the victim's
    story is whole (one ``session.ended``, at the end, ``normal``) and
    ``/healthz`` counts tees right."""
    forged: list = []

    async def forge(url: str, tee_id: str, resume: str | None) -> int | None:
        async with open_websocket_url(url) as ws:
            await ws.send_message(hello(tee_id, resume=resume))
            try:
                await ws.send_message(wire.record("client", frame(
                    {"jsonrpc": "2.0", "id": 99, "method": "session/prompt",
                     "params": {"sessionId": "sess-1", "prompt": []}})))
                await ws.send_message(wire.control({"exit": 1}))
                with trio.move_on_after(10):  # (the old code: the forgery was taken, no close)
                    while True:
                        await ws.get_message()
            except ConnectionClosed as e:
                return e.reason.code
        return None

    with run_daemon(tmp_path, DAEMON_ENV, healthy=True) as d:
        col = d.subscribe()
        try:
            def between(turn: int) -> None:
                if turn == 1:
                    run = col.first(lambda e: e["type"] == "run.finished", 30)["run"]
                    victim = run.rsplit(".", 1)[0]
                    for resume in (None, "NOTTHEKEY"):
                        forged.append(in_thread(forge, ws_url(d), victim, resume))

            asyncio.run(drive(tee(d.url) + py_agent(), ANSWERS, between=between))
            events = wait_story(col, "sess-1")
            ends = [e for e in col.drain() if e.get("session") == "sess-1"
                    and e["type"] in ("run.failed", "session.ended")]
            assert ends == [events[-1]] and events[-1]["data"]["reason"] == "normal", ends
            assert_python_story(events)
            assert forged == [CLAIMED, CLAIMED]
            c = counters_when(d, lambda c: c["tees_attached"] == 0)
            assert c["tees_seen"] == 1, c
        finally:
            col.close()


def test_a_tee_id_is_bound_to_its_resume_key(tmp_path):
    """The daemon answers a hello with a resume key; the id's next
    connection needs it (and none while another holds the id)."""
    async def main(url: str) -> None:
        async with open_websocket_url(url) as first:
            await first.send_message(hello("OWNER"))
            with trio.fail_after(10):
                key = welcome_key(await first.get_message())
            assert key
            async with open_websocket_url(url) as second:  # the owner is attached: refused
                await second.send_message(hello("OWNER", resume=key))
                with trio.fail_after(10):
                    try:
                        await second.get_message()
                    except ConnectionClosed as e:
                        assert e.reason.code == CLAIMED
                    else:
                        raise AssertionError("a second connection spoke for a live tee")
        async with open_websocket_url(url) as again:  # the owner left: its key resumes
            await again.send_message(hello("OWNER", resume=key))
            with trio.fail_after(10):
                assert welcome_key(await again.get_message()) == key

    with run_daemon(tmp_path, DAEMON_ENV, healthy=True) as d:
        trio.run(main, ws_url(d))
        c = counters_when(d, lambda c: c["tees_attached"] == 0)
        assert c["tees_seen"] == 1 and c["tee_claims_refused"] == 1, c


# ------------------------------------------------------------------ degraded

def test_a_tee_that_changes_session_every_line_is_capped(tmp_path):
    """2,000 lines, each in a new ``sessionId``: at most the bucket's burst
    plus its rate over the elapsed time become session files; the rest are
    dropped and counted ``sessions_refused``."""
    n = 2_000
    lines = b"".join(frame({"jsonrpc": "2.0", "method": "session/cancel",
                            "params": {"sessionId": f"flood-{i}"}}) for i in range(n))
    env = {**DAEMON_ENV, "AEP_ACP_NEW_SESSIONS_PER_S": "2"}
    with run_daemon(tmp_path, env, healthy=True) as d:
        async def flood() -> None:
            async with open_websocket_url(ws_url(d)) as ws:
                await ws.send_message(hello("FLOODER"))
                await ws.send_message(wire.record("client", lines))
                await ws.send_message(wire.control({"exit": 0}))

        started = time.monotonic()
        trio.run(flood)
        c = counters_when(d, lambda c: c["lines"] >= n and c["tees_attached"] == 0)
        elapsed = time.monotonic() - started
        files = list((d.state / "logs" / "acp").glob("*.jsonl"))
        assert len(files) <= 10 + 2 * elapsed + 2, (len(files), elapsed)
        assert c["sessions_refused"] >= n - len(files), c


def test_malformed_hellos_log_one_line_per_peer_and_no_traceback(tmp_path):
    """100 bad hellos (not JSON, nested past any parser) refused 1008, and
    100 with a field of the wrong type (each once raised in the handler)
    read as if the field were absent: one log line for the peer (the rest
    counted), never a traceback."""
    bad = ["not json", "[" * 100_000,
           '{"aep_acp_tee":1,"tee":"T%d","agent":"acp","mid_line":[{}]}',
           '{"aep_acp_tee":1,"tee":"T%d","agent":"acp","max_line":1e400,"stats":[]}']

    async def main(url: str) -> list:
        codes = []
        for i in range(200):
            text = bad[i % len(bad)]
            async with open_websocket_url(url) as ws:
                await ws.send_message(text % i if "%d" in text else text)
                try:
                    with trio.fail_after(10):
                        codes.append(welcome_key(await ws.get_message()) and "welcome")
                except ConnectionClosed as e:
                    codes.append(e.reason.code)
        return codes

    with run_daemon(tmp_path, DAEMON_ENV, healthy=True) as d:
        codes = trio.run(main, ws_url(d))
        assert codes.count(1008) == 100 and codes.count("welcome") == 100, codes
        log = d.log()
        assert "Traceback" not in log, log[-3000:]
        refusals = [ln for ln in log.splitlines() if "refused a tee connection" in ln]
        assert len(refusals) == 1, refusals
        c = counters(d)
        assert c["refused"] == 100 and c["log_suppressed"] >= 99, c


# ------------------------------------------------------------------ round 11, finding 3

def test_lines_past_the_json_bounds_are_one_malformed_line_each(tmp_path):
    """A tee's lines of ``[{},{},...]`` (the attack: 16 MiB lines of 5.6
    million members held the loop ~2 s each and counted 33.5 million
    ``malformed``): over 65,536 members (past the container cap) or 2,000
    (past the batch bound), each is one ``malformed`` line, counted
    ``lines_refused``, logged once for the tee; a good line after them maps."""
    attack = [b"[" + b",".join([b"{}"] * 70_000) + b"]\n",
              b"[" + b",".join([b"{}"] * 2_000) + b"]\n"] * 2
    good = frame({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "after"}})
    with run_daemon(tmp_path, DAEMON_ENV, healthy=True) as d:
        async def send() -> None:
            async with open_websocket_url(ws_url(d)) as ws:
                await ws.send_message(hello("BATCHER"))
                await ws.send_message(wire.record("agent", b"".join(attack) + good))
                await ws.send_message(wire.control({"exit": 0}))

        trio.run(send)
        c = counters_when(d, lambda c: c["lines"] >= 5 and c["tees_attached"] == 0)
        assert (c["lines_refused"], c["malformed"]) == (4, 4), c
        refusals = [ln for ln in d.log().splitlines() if "lines_refused" in ln]
        assert len(refusals) == 1, refusals
        assert list((d.state / "logs" / "acp").glob("*.jsonl"))  # the good line mapped
