"""Tenth outside attack on issue 25, finding 2: a session's ``runs.json``
entry reached ~200 KiB (256 open tool ids of 256 characters, 64 prints
with 256-character tool names), rewritten at every moment. The entry now
holds the newest :data:`PERSIST_TOOLS` tools and :data:`PERSIST_REQUESTED`
prints, names and ids over :data:`KEY_MAX` as their digest form, and the
lookups after a restore use that same form."""
from __future__ import annotations

import json

from bridges.hooks_common.runs import PERSIST_REQUESTED, PERSIST_TOOLS, entry, restore_entry
from bridges.hooks_common.session import (
    KEY_MAX,
    PRINT_KEY_MAX,
    PRINT_KEYS,
    REQUESTED_MAX,
    TOOLS_MAX,
    SessionState,
    bounded_key,
)

S = "sess-entry"


def _pre(i, name, call, tool_input):
    return {"hook_event_name": "PreToolUse", "session_id": S, "tool_name": name,
            "tool_use_id": call, "tool_input": tool_input}


def test_the_worst_case_entry_stays_small():
    st = SessionState(S, run="r" * 40, run_started="e" * 40, run_t0=1_765_000_000_000,
                      last_run="l" * 40)
    wide = {f"{j:02}".ljust(PRINT_KEY_MAX, "k"): "v" for j in range(PRINT_KEYS + 4)}
    for i in range(TOOLS_MAX + 8):
        for name, call in (("n" * 256 + str(i), "t" * 256 + str(i)),      # digest form
                           (f"{i}".ljust(KEY_MAX, "n"), f"{i}".ljust(KEY_MAX, "t"))):
            st.remember_tool(_pre(i, name, call, wide), f"{i}".ljust(40, "E"), 1_765_000_000_000)
    assert len(st.tools) == TOOLS_MAX and len(st.requested) == REQUESTED_MAX
    line = json.dumps(entry(st))
    assert len(line) < 40 * 1024, len(line)  # was ~200 KiB
    raw = json.loads(line)
    assert len(raw["tools"]) == PERSIST_TOOLS and len(raw["requested"]) == PERSIST_REQUESTED
    assert all(len(k) <= KEY_MAX for k in raw["tools"])


def test_a_long_id_and_name_pair_after_a_restore():
    call, name = "t" * 300, "mcp__" + "n" * 300
    st = SessionState(S, run="run_1", run_started="ev_s", run_t0=1)
    st.remember_tool(_pre(1, name, call, {"command": "ls"}), "ev_1", 1)
    back = SessionState(S)
    assert restore_entry(back, json.loads(json.dumps(entry(st))))
    assert bounded_key(call) in back.tools  # the hub's lookup form
    ask = {"hook_event_name": "PermissionRequest", "session_id": S, "tool_name": name,
           "tool_input": {"command": "ls", "description": "d"}}
    assert back.requested_id(ask) == "ev_1"
