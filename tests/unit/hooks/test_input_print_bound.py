"""Ninth outside attack on issue 25, finding 1: a session kept per key
digests of every key of each of its last 64 tool inputs and wrote them to
its state file at every moment; 24 hooks of 200,000-key inputs made hooks
take 6.6 s (a gated hook fails open), 1.4 GB of memory and 609 MiB of
state, and the restore dropped what the writer wrote (over 256 keys). A
print is now bounded (:data:`PRINT_KEYS` keys of :data:`PRINT_KEY_MAX`
characters, else one digest), and the writer and the reader agree."""
from __future__ import annotations

import json

from bridges.hooks_common.runs import PERSIST_REQUESTED, entry, restore_entry
from bridges.hooks_common.session import (
    PRINT_KEY_MAX,
    PRINT_KEYS,
    REQUESTED_MAX,
    SessionState,
    input_print,
    same_print,
)

S = "sess-big"


def _pre(i, tool_input):
    return {"hook_event_name": "PreToolUse", "session_id": S, "tool_name": "mcp__x",
            "tool_use_id": f"toolu_{i}", "tool_input": tool_input}


def test_a_sessions_state_line_stays_small_whatever_the_inputs():
    big = {f"k{j}": "v" * 8 for j in range(5_000)}
    long_keys = {("k" * 300) + str(j): j for j in range(PRINT_KEYS)}
    st = SessionState(S, run="run_1", run_started="ev_s", run_t0=1)
    for i in range(REQUESTED_MAX):
        st.remember_tool(_pre(i, big if i % 2 else long_keys), f"ev_{i}", i)
    line = json.dumps(entry(st))
    # 64 prints of ~2 KB at most (was: 64 x 5,000 digests, ~16 MB)
    assert len(line) < REQUESTED_MAX * 3_000, len(line)
    back = SessionState(S)
    assert restore_entry(back, json.loads(line))
    # the reader keeps what the writer wrote (the newest PERSIST_REQUESTED)
    assert back.requested == st.requested[-PERSIST_REQUESTED:]


def test_pairing_still_works_for_small_and_large_inputs():
    big = {f"k{j}": j for j in range(PRINT_KEYS + 1)}
    st = SessionState(S, run="run_1", run_started="ev_s", run_t0=1)
    st.remember_tool(_pre(1, {"command": "ls"}), "ev_small", 1)
    st.remember_tool(_pre(2, big), "ev_big", 2)
    ask = {"hook_event_name": "PermissionRequest", "session_id": S, "tool_name": "mcp__x"}
    assert st.requested_id({**ask, "tool_input": {"command": "ls"}}) == "ev_small"
    # a small input seen again with a key more: the shared keys pair it
    assert st.requested_id({**ask, "tool_input": {"command": "ls", "cwd": "/w"}}) == "ev_small"
    assert st.requested_id({**ask, "tool_input": dict(big)}) == "ev_big"
    assert st.requested_id({**ask, "tool_input": {**big, "k0": -1}}) is None
    assert len(input_print(big)) == PRINT_KEYS  # the first keys in sorted order
    assert list(input_print({"k" * PRINT_KEY_MAX: 1})) == ["k" * PRINT_KEY_MAX]
    (long,) = input_print({"k" * (PRINT_KEY_MAX + 1): 1})
    assert long.startswith("#") and len(long) <= PRINT_KEY_MAX
    assert same_print(input_print(big), big) and not same_print(input_print(big), {"k0": -1})


def test_a_16_key_input_pairs_with_its_permission_request_that_adds_a_key():
    """Tenth outside attack, finding 5: an input of exactly :data:`PRINT_KEYS`
    keys (or with a key over :data:`PRINT_KEY_MAX`) was printed as one
    digest, and Codex's ``PermissionRequest`` adds ``description``: the
    ``attention.requested`` lost its cause."""
    exact = {f"k{j:02}": j for j in range(PRINT_KEYS)}
    long_key = {"command": "ls", "x" * (PRINT_KEY_MAX + 1): 1}
    st = SessionState(S, run="run_1", run_started="ev_s", run_t0=1)
    st.remember_tool(_pre(1, exact), "ev_exact", 1)
    st.remember_tool(_pre(2, long_key), "ev_long", 2)
    ask = {"hook_event_name": "PermissionRequest", "session_id": S, "tool_name": "mcp__x"}
    assert st.requested_id({**ask, "tool_input": {**exact, "description": "d"}}) == "ev_exact"
    assert st.requested_id({**ask, "tool_input": {**long_key, "description": "d"}}) == "ev_long"
    back = SessionState(S)
    assert restore_entry(back, json.loads(json.dumps(entry(st))))
    assert back.requested_id({**ask, "tool_input": {**exact, "description": "d"}}) == "ev_exact"
