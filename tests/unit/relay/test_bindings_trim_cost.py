"""Round 8 outside attack, finding 7 (issue 25): a full table's eviction
looked for the least recently used credential binding by scanning the whole
table, and found none in a table of the fleet's bindings: O(excess x cap).
An unauthenticated flood's journal (or a tokenless hook flood) made the
next start take minutes before the listener came up (every hook failing
open meanwhile), and a credential's first binding ~60 ms of the loop. The
work is counted in executed lines of ``bindings.py`` (no timing: these
machines are noisy): linear in what is loaded, whatever the table holds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import supervisor.relay.bindings as bindings_mod
from supervisor.relay.bindings import FLEET, Bindings, named

CAP = 400
EXCESS = 1200
PER_BINDING = 100  # executed lines a binding may cost (put + its share of trims)


def _count_lines(fn):
    """Run ``fn()``; return how many lines of ``bindings.py`` ran."""
    target = bindings_mod.__file__
    n = 0

    def local(frame, event, arg):
        nonlocal n
        if event == "line":
            n += 1
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename == target else None

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return n


def _journal(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(v) + "\n" for v in lines))


def test_start_after_a_fleet_flood_costs_linear_work(tmp_path):
    path = tmp_path / "relay-bindings.jsonl"
    # the fleet's bindings over the cap, one credential's binding among them
    lines = [{"s": f"hook-{i}", "p": FLEET, "src": "aep://h/agent/claude-code"}
             for i in range(CAP + EXCESS)]
    lines.insert(CAP // 2, {"s": "cred-1", "p": named("alice"), "src": "urn:alice"})
    _journal(path, lines)
    t = Bindings(CAP, 120.0)
    work = _count_lines(lambda: t.open(path, 0.0))
    assert len(t) == CAP
    # the credential's binding is the least recently used non-fleet one: it goes first
    assert t.get("cred-1") is None
    # the newest of the fleet's are kept
    assert t.get(f"hook-{CAP + EXCESS - 1}") is not None
    assert work < PER_BINDING * len(lines), work
    t.close()


def test_a_credentials_first_binding_in_a_fleet_table_is_not_a_scan(tmp_path):
    t = Bindings(CAP, 120.0)
    for i in range(CAP):
        t.bind_fleet(f"hook-{i}", "aep://h/agent/claude-code", 0.0)
    work = _count_lines(
        lambda: [t.bind(f"cred-{i}", named("alice"), "urn:alice", 1.0) for i in range(50)])
    # the fleet's bindings go last: in a table of them a credential's new binding is
    # the one let go (as before); finding it is never a walk over the table
    assert work < PER_BINDING * 50, work
    assert len(t) == CAP
    assert t.get("cred-49") is None and t.get("hook-0") is not None


def test_the_oldest_credential_binding_is_chosen_across_principals(tmp_path):
    t = Bindings(4, 120.0)
    t.bind("a1", named("alice"), "urn:alice", 0.0)
    t.bind("b1", named("bob"), "urn:bob", 0.0)
    t.bind_fleet("f1", "aep://h/agent/claude-code", 0.0)
    t.bind_fleet("f2", "aep://h/agent/claude-code", 0.0)
    t.bind("a1", named("alice"), "urn:alice", 1.0)  # alice's is used again: bob's is older
    t.bind("c1", named("carol"), "urn:carol", 2.0)  # a fifth, carol's first: the oldest
    assert t.get("b1") is None  # credential's binding goes (the fleet's last)
    assert all(t.get(s) is not None for s in ("a1", "c1", "f1", "f2"))
