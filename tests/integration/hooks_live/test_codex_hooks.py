"""The real Codex 0.171.0 runs command hooks from ``config.toml``, offline against
the Responses mock: what the installer and the codex hook bridge rely on.

- hooks trusted through ``[hooks.state."<key>"] trusted_hash`` (the algorithm in
  ``tests/support/codex_hooks.py``, written down in
  ``tests/fixtures/codex_hooks_real/README.md``) fire, with no bypass flag;
- untrusted hooks, and hooks whose trusted hash no longer matches, are skipped
  without a word (the run succeeds, nothing on stderr about it);
- ``codex exec --approve-for-me`` with an escalation request fires
  ``PermissionRequest`` (no ``tool_use_id``); the hook's ``behavior: allow`` runs
  the command, ``deny`` + ``message`` refuses it and the message reaches the model
  as the tool's output;
- ``PreToolUse`` ``permissionDecision: deny`` + reason: the command does not run
  and the reason reaches the model.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import codex as cx
from tests.support import codex_hooks as ch

pytestmark = pytest.mark.vendor


@pytest.fixture(scope="module")
def codex_bin() -> Path:
    return cx.codex_binary()


def _check(hr: ch.HookRun) -> None:
    assert hr.run.returncode == 0, hr.run.describe()
    assert not hr.mock.problems and not hr.mock.egress()


async def test_trusted_hooks_fire_in_exec(codex_bin, tmp_path):
    hr = await ch.run_hooked_exec(codex_bin, tmp_path)
    _check(hr)
    events = [h.event for h in hr.hooked]
    for ev in ("SessionStart", "UserPromptSubmit", "PreModelRequest", "PostModelRequest",
               "PreToolUse", "PostToolUse", "Stop", "SessionEnd"):
        assert ev in events, events
    pre = next(h.body for h in hr.hooked if h.event == "PreToolUse")
    assert pre["tool_use_id"] == hr.mock.tool_calls[0][0]
    assert pre["tool_input"] == {"command": "echo hello"}
    assert {"session_id", "turn_id", "transcript_path", "cwd", "permission_mode"} <= set(pre)
    assert pre["session_id"] == hr.run.thread_id


@pytest.mark.parametrize("how", ["untrusted", "hash-mismatch"])
async def test_untrusted_hooks_are_skipped_silently(codex_bin, tmp_path, how, monkeypatch):
    if how == "hash-mismatch":  # trusted for another command line: "modified"
        real = ch.trusted_hash
        monkeypatch.setattr(ch, "trusted_hash",
                            lambda event, command, **kw: real(event, command + " ", **kw))
    hr = await ch.run_hooked_exec(codex_bin, tmp_path, trust=how == "hash-mismatch")
    _check(hr)
    assert hr.hooked == []
    assert hr.mock.tool_outputs(), "the run itself went on"
    assert "hook" not in hr.run.stderr.lower()


@pytest.mark.parametrize("behavior", ["allow", "deny"])
async def test_exec_permission_request_answered_by_the_hook(codex_bin, tmp_path, behavior):
    outside = tmp_path / "outside.txt"
    message = "AEP-CX-41: ask the on-call first"
    hr = await ch.run_hooked_exec(
        codex_bin, tmp_path, command=f"touch {outside} && echo made", **ch.ESCALATED_FLAGS,
        events=("PreToolUse", "PermissionRequest", "PostToolUse"),
        stdout={"PermissionRequest": ch.permission_decision(behavior, message)})
    _check(hr)
    (req,) = [h.body for h in hr.hooked if h.event == "PermissionRequest"]
    assert "tool_use_id" not in req
    assert req["tool_input"]["command"] == f"touch {outside} && echo made"
    (out,) = hr.mock.tool_outputs()
    if behavior == "allow":
        assert outside.exists() and "made" in out["output"]
    else:
        assert not outside.exists()
        assert message in out["output"]
        assert not [h for h in hr.hooked if h.event == "PostToolUse"]


async def test_exec_pretooluse_deny_reason_reaches_the_model(codex_bin, tmp_path):
    marker = tmp_path / "ran.txt"
    reason = "AEP-CX-PRE-9: use the staging box"
    deny = json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                              "permissionDecision": "deny",
                                              "permissionDecisionReason": reason}})
    hr = await ch.run_hooked_exec(codex_bin, tmp_path, command=f"touch {marker}",
                                  events=("PreToolUse", "PostToolUse"),
                                  stdout={"PreToolUse": deny})
    _check(hr)
    assert not marker.exists()
    (out,) = hr.mock.tool_outputs()
    assert reason in out["output"], out


async def test_trusted_hash_matches_codex_for_every_event(codex_bin, tmp_path):
    """Codex's own hooks/list calls every hook :func:`hooks_toml` wrote trusted: all 14
    events, with the default timeout (600 s, 1 s for SessionEnd/Interrupt) and with an
    explicit one (clamped to 3 s for those two: the hash uses the clamp), and a command
    with quotes and a non-ASCII character."""
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    source = home / ".codex" / "config.toml"
    cmd = "printf '%s' \"é\" >/dev/null"
    text = ch.hooks_toml(source, {ev: cmd for ev in ch.HOOK_EVENTS})
    source.write_text(text)
    listed = await ch.hooks_list(codex_bin, home, work)
    assert not listed["warnings"] and not listed["errors"], listed
    status = {h["key"]: h["trustStatus"] for h in listed["hooks"]}
    assert status == {ch.hook_key(source, ev): "trusted" for ev in ch.HOOK_EVENTS}
    source.write_text(ch.hooks_toml(source, {ev: cmd for ev in ch.HOOK_EVENTS}, timeout=130))
    listed = await ch.hooks_list(codex_bin, home, work)
    assert {h["trustStatus"] for h in listed["hooks"]} == {"trusted"}, listed
    clamped = {h["eventName"]: h["timeoutSec"] for h in listed["hooks"]}
    assert clamped["sessionEnd"] == clamped["interrupt"] == 3 and clamped["stop"] == 130


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "codex_hooks_real"


@pytest.mark.parametrize("name", ["exec-shell", "exec-permission-deny"])
async def test_live_payloads_match_the_fixtures(codex_bin, tmp_path, name):
    """The committed captures still describe the pinned Codex: per event, how many
    deliveries and which top-level keys. A Codex bump that changes them fails here:
    regenerate (``python -m tests.support.codex_hooks``) and re-read the README."""
    from collections import Counter
    how, kwargs = ch.SCENARIOS[name]
    kw = dict(kwargs)
    if "command" in kw:
        kw["command"] = kw["command"].replace("@ROOT@", str(tmp_path))
    hr = await ch.run_hooked_exec(codex_bin, tmp_path, **kw)
    _check(hr)

    def shape(pairs):
        counts, keys = Counter(), {}
        for event, body in pairs:
            counts[event] += 1
            keys.setdefault(event, set()).update(body)
        return counts, keys

    committed = [(p.stem.split("-", 1)[1], json.loads(p.read_text()))
                 for p in sorted((FIXTURES / name).glob("*.json"))]
    assert shape((h.event, h.body) for h in hr.hooked) == shape(committed)


@pytest.mark.parametrize("event, first", [("SessionStart", 0), ("UserPromptSubmit", 0),
                                          ("PreToolUse", 1), ("PostToolUse", 1)])
async def test_additional_context_reaches_the_next_model_request(codex_bin, tmp_path, event,
                                                                first):
    """Steering's carrier on Codex: ``hookSpecificOutput.additionalContext`` printed by
    these hooks is in the next Responses request (the first for the session/prompt
    hooks, the one after the tool for the tool hooks)."""
    note = f"AEP-CX-STEER-{event}: prefer the staging database"
    out = json.dumps({"hookSpecificOutput": {"hookEventName": event, "additionalContext": note}})
    hr = await ch.run_hooked_exec(codex_bin, tmp_path, events=(event,), stdout={event: out})
    _check(hr)
    reqs = hr.mock.responses_requests()
    assert [note in r.body.decode() for r in reqs].index(True) == first
