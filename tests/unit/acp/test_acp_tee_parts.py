"""The tee's pure parts and the wire: line splitting on ``\\n`` only with a
memory cap, the bounded drop-oldest queue, the wire records round trip,
the command line, and the bridge's settings (table-driven)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.acp import config, from_env, wire
from bridges.acp.link import DaemonLink
from bridges.acp.tee import ObservationQueue, TeeOptions, add_arguments, exit_status, options_from
from bridges.acp.wire import LineSplitter, Shipper
from tests.support.configcases import cases, check
from tests.support.recording import RecordingEnv

# --------------------------------------------------------------------------- LineSplitter

def test_split_only_on_newline():
    s = LineSplitter()
    assert s.feed("a\u2028b\u2029c\r".encode() + b"\nd") == ["a\u2028b\u2029c\r".encode()]
    assert s.feed(b"e\n\n") == [b"de", b""]
    assert s.finish() == []
    assert s.feed(b"tail") == [] and s.finish() == [b"tail"]


def test_over_the_cap_only_the_size_is_reported_and_memory_is_capped():
    s = LineSplitter(max_line=10)
    out = s.feed(b"x" * 8) + s.feed(b"y" * 8)
    assert out == [] and s._held == 0  # the line passed the cap: nothing held
    out = s.feed(b"z" * 1000 + b"\nok\n")
    assert out == [1016, b"ok"] and s.oversize == 1
    assert s.feed(b"w" * 50) == [] and s.finish() == [50] and s.oversize == 2


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=20), st.integers(1, 30))
def test_splitter_reassembles_any_chunking(chunks, cap):
    """Whatever the chunking, the records are the ``\\n``-split lines (or,
    over the cap, their sizes), and nothing more than the cap is held."""
    s = LineSplitter(max_line=cap)
    out = []
    for c in chunks:
        out += s.feed(c)
        assert s._held <= cap
    out += s.finish()
    data = b"".join(chunks)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    assert out == [ln if len(ln) <= cap else len(ln) for ln in lines]


def test_resync_drops_the_partial_line():
    s = LineSplitter()
    assert s.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    s.resync()
    assert s.feed(b":2} still the broken one") == []
    assert s.feed(b'\n{"c":3}\n') == [b'{"c":3}']
    s.resync()
    assert s.finish() == []


# --------------------------------------------------------------------------- Shipper

@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"x", b"\n")), max_size=20),
       st.integers(1, 40))
def test_shipper_then_splitter_is_the_split_with_the_cap(pieces, cap):
    """What the tee ships (``Shipper``) split by the daemon (``LineSplitter``
    with the same cap) gives every line under the cap verbatim and every
    line over it as oversize, in order; the tee never ships more of a
    line than the cap and one byte, except within one piece."""
    ship, split = Shipper(cap), LineSplitter(cap)
    out = []
    for p in pieces:
        sent = ship.cut(p)
        assert len(sent) <= len(p)
        out += split.feed(sent)
    out += split.finish()
    lines = b"".join(pieces).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    assert [o if isinstance(o, bytes) else "over" for o in out] == [
        ln if len(ln) <= cap else "over" for ln in lines]


def test_shipper_skips_a_line_that_never_ends():
    ship = Shipper(10)
    assert ship.cut(b"a" * 8) == b"a" * 8
    assert ship.cut(b"b" * 8) == b"bbb"  # cap + 1 in all
    assert ship.cut(b"c" * 1000) == b"" and ship.skipped == 1005
    assert ship.cut(b"c\nok\n") == b"\nok\n" and ship.skipped == 1006


# --------------------------------------------------------------------------- ObservationQueue

async def test_queue_drops_oldest_and_counts():
    q = ObservationQueue(max_bytes=3 * (15 + ObservationQueue.OVERHEAD))
    for i in range(5):
        q.push(wire.piece("client", b"%010d" % i))
    assert q.drops == 2 and len(q) == 3
    got = q.take(1 << 20)
    assert [d for _, d in got[1:]] == [b"%010d" % i for i in (2, 3, 4)]
    assert got[0] == (wire.control({"gap": "client"}), b"")  # the drops, marked
    q.requeue([wire.piece("agent", b"%010d" % 9)])
    assert q.take(1) == [wire.piece("agent", b"%010d" % 9)]  # at least one even over the limit
    with trio.move_on_after(0.05) as scope:
        await q.wait()
    assert scope.cancelled_caught  # empty: nothing to wait for
    q.push(wire.piece("agent", b"x"))
    await q.wait()


class SinkSocket:
    """The daemon end of a healthy link: takes every message at once."""

    closed = None

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send_message(self, message: bytes) -> None:
        self.sent.append(message)


async def test_the_last_flush_ends_when_the_exit_record_went_out(autojump_clock):
    """The agent exited: finish() queues the exit record and flushed() waits
    until the sender, which was waiting for records, has sent it. The sender
    used to make a new idle Event at every wake-up, so flushed() waited on
    the one finish() had made, which nothing would set: it returned only at
    the tee's FLUSH_TIMEOUT (0.5 s after every agent exit on a connected
    tee, toward the 2 s an ACP client waits before SIGTERM). Virtual clock:
    on the old code the hour below runs out."""
    q = ObservationQueue()
    link = DaemonLink(TeeOptions(command=["agent"]), q, lambda: {"drops": 0})
    ws = SinkSocket()
    async with trio.open_nursery() as n:
        link.connected = True
        n.start_soon(link._send_loop, ws)
        q.push(wire.piece("client", b'{"jsonrpc":"2.0","method":"x"}\n'))
        while len(q) or not ws.sent:
            await trio.sleep(0.01)
        await trio.sleep(1)  # the sender is back waiting for records
        link.finish(0)
        with trio.move_on_after(3600) as waited:
            await link.flushed()
        assert not waited.cancelled_caught, "flushed() never saw the exit record go out"
        assert b'"exit"' in ws.sent[-1]
        n.cancel_scope.cancel()


# --------------------------------------------------------------------------- wire

def test_records_round_trip():
    msg = (wire.record(wire.CLIENT, b'{"a":1}\n{"b"') + wire.record(wire.AGENT, b"")
           + wire.control({"gap": "agent"}) + wire.control({"exit": 3})
           + b"?\x00\x00\x00\x01z" + b"#\x00\x00\x00\x02{b" + b"<\x00\x00\x09\x00trunc")
    # an unparsable control record is (None, None): refused, for the bridge to count
    assert list(wire.records(msg)) == [
        ("client", b'{"a":1}\n{"b"'), ("agent", b""), (None, {"gap": "agent"}), (None, {"exit": 3}),
        (None, None)]


def test_control_records_and_hellos_are_depth_and_size_bounded():
    """Issue 25 row 3: 200,000 ``[`` in a control record (or a hello) raised
    RecursionError out of the parser and crashed the bridge."""
    deep = b"[" * 200_000
    msg = b"#" + len(deep).to_bytes(4, "big") + deep + wire.control({"gap": "agent"})
    assert list(wire.records(msg)) == [(None, None), (None, {"gap": "agent"})]
    nested = b"{" + b'"a":[' * 5_000 + b"]" * 5_000 + b"}"  # under the size cap, absurdly deep
    assert list(wire.records(b"#" + len(nested).to_bytes(4, "big") + nested)) == [(None, None)]
    assert wire.parse_hello("[" * 200_000) is None
    assert wire.parse_hello('{"aep_acp_tee":1,"tee":"T","agent":"acp","x":' + "[" * 3_000
                            + "]" * 3_000 + "}") is None
    # wrong field types are normalized away, never raised later (a hello's
    # unhashable mid_line member once raised in the daemon's handler)
    h = wire.parse_hello('{"aep_acp_tee":1,"tee":"T","agent":"acp","mid_line":[{}, "agent"],'
                         '"max_line":true,"pid":"1","command":[1],"stats":[1]}')
    assert h is not None and h["mid_line"] == ["agent"] and h["max_line"] is None
    assert h["pid"] is None and h["command"] == "" and h["stats"] == {}


async def test_queue_marks_the_gap_of_each_direction():
    rec = ObservationQueue.OVERHEAD
    q = ObservationQueue(max_bytes=2 * (rec + 10))
    q.push(wire.piece("client", b"c" * 5))  # 10 bytes each
    q.push(wire.piece("agent", b"a" * 5))
    q.push(wire.piece("client", b"d" * 5))  # drops the first client record
    got = list(wire.records(b"".join(part for r in q.take(1 << 20) for part in r)))
    assert got == [("agent", b"aaaaa"), (None, {"gap": "client"}), ("client", b"ddddd")]
    assert q.drops == 1


def test_hello_and_urls():
    h = wire.hello("01ABC", "acp", ["/usr/bin/claude-acp", "--x"], 7, {"drops": 0})
    assert wire.parse_hello(__import__("json").dumps(h)) == {**h, "resume": None}
    assert h["command"] == "claude-acp"
    assert wire.parse_hello('{"aep_acp_tee": 2, "tee": "x"}') is None
    assert wire.parse_hello("not json") is None
    assert wire.tee_url("http://127.0.0.1:8787", "acp") == "ws://127.0.0.1:8787/bridges/acp/acp"
    assert wire.tee_url("https://h:1/", "g") == "wss://h:1/bridges/acp/g"
    assert wire.daemon_problem("ftp://x") and wire.daemon_problem("http://h:port")
    assert wire.daemon_problem("http://[::1]:8787") is None


# --------------------------------------------------------------------------- command line

def parse(*argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_options_defaults_env_and_arguments(tmp_path):
    opts, problem = options_from(parse("--", "agent", "--flag"), {})
    assert problem == "" and opts.command == ["agent", "--flag"]
    assert opts.daemon == "http://127.0.0.1:8787" and opts.name == "acp" and opts.token is None
    opts, _ = options_from(parse("agent"), {"AEP_ACP_DAEMON": "http://10.0.0.1:1/", "AEP_TOKEN": "t0k"})
    assert opts.daemon == "http://10.0.0.1:1" and opts.token == "t0k"
    tok = tmp_path / "tok"
    tok.write_text("s3cret\n")
    opts, _ = options_from(parse("--daemon", "http://h:2", "--token-file", str(tok), "--name",
                                 "gemini", "--", "a"), {"AEP_ACP_DAEMON": "http://x:1"})
    assert (opts.daemon, opts.token, opts.name) == ("http://h:2", "s3cret", "gemini")


@pytest.mark.parametrize("argv", [(), ("--",)])
def test_no_agent_command_is_the_only_refusal(argv):
    opts, problem = options_from(parse(*argv), {})
    assert opts is None and "no agent command" in problem


@pytest.mark.parametrize("argv,needle", [
    (("--daemon", "nope", "--", "a"), "--daemon"), (("--name", "a b", "--", "a"), "--name"),
    (("--token-file", "/nonexistent/x", "--", "a"), "--token-file"),
    (("--max-line", "10", "--", "a"), "--max-line"),
    (("--observe-rate", "0", "--", "a"), "--observe-rate")])
def test_bad_observation_settings_run_the_agent_unobserved(argv, needle):
    """Fail-open (design record "Attach shape"): the tee's own observation
    settings never stop the editor's agent; the problem is said, the agent
    runs with observation off."""
    opts, problem = options_from(parse(*argv), {"AEP_TOKEN": "t0k"})
    assert opts is not None and opts.command == ["a"] and opts.observe is False
    assert needle in problem and opts.token is None  # nothing is sent anywhere


def test_exit_status():
    assert [exit_status(r) for r in (0, 3, -15, -9, None)] == [0, 3, 143, 137, 1]


# --------------------------------------------------------------------------- settings

CONFIG = Path(__file__).parent / "testdata" / "config"


@pytest.mark.parametrize("case", cases(CONFIG))
def test_acp_config_case(case):
    check(case, config.from_env)


def test_the_metadata_names_every_setting_the_code_reads():
    """The daemon side reads its SETTINGS; the tee reads AEP_ACP_DAEMON and
    AEP_TOKEN (documented in the tee's own argument table)."""
    env = RecordingEnv({"HOME": "/h"})
    config.from_env(env)
    own = {s.name for s in config.SETTINGS}
    assert {n for n in env.read if n.startswith("AEP_")} == own - {"AEP_ACP_DAEMON"}
    tee_env = RecordingEnv({})
    options_from(parse("--", "a"), tee_env)
    assert {n for n in tee_env.read if n.startswith("AEP_")} == {"AEP_ACP_DAEMON", "AEP_TOKEN"}


def test_config_is_frozen_and_typed():
    import dataclasses
    cfg = config.AcpConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.deltas = True  # type: ignore[misc]
    with pytest.raises(TypeError, match="max_tees"):
        config.AcpConfig(max_tees="64")  # type: ignore[arg-type]


def test_one_bridge_per_agent_and_problems_on_the_first():
    bridges = from_env({"AEP_ACP_AGENTS": "acp,gemini", "AEP_ACP_MAX_TEES": "x"})
    assert [(b.name, b.agent, b.path) for b in bridges] == [
        ("acp", "acp", "/bridges/acp/acp"), ("acp.gemini", "gemini", "/bridges/acp/gemini")]
    assert bridges[0].preflight() and not bridges[1].preflight()
    assert bridges[0].capabilities()["control"]["accepts"] == []


def test_every_setting_is_known_to_the_supervisor():
    from supervisor.config import known_settings
    assert {s.name for s in config.SETTINGS} | {"AEP_BRIDGE_ACP"} <= known_settings()




@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=80),
                          st.tuples(st.sampled_from(["client", "agent"]), st.binary(max_size=60))
                          .map(lambda t: wire.record(*t))), max_size=10))
def test_fuzz_the_daemon_side_never_raises(parts):
    """Garbage batches through what the daemon runs on them (records ->
    splitter -> story): never an exception."""
    from bridges.acp.join import Story
    story = Story("F")
    splitters = {d: LineSplitter(64) for d in wire.DIRECTIONS}
    for direction, item in wire.records(b"".join(parts)):
        if direction is None:
            assert isinstance(item, dict)
            continue
        for line in splitters[direction].feed(item):
            if isinstance(line, bytes):
                story.feed(direction, line)
    assert story.counters.mapping_errors == 0
