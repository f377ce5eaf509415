"""The command shim (``bridges/hooks_common/shim.py``) as the vendor runs it,
``<python> -S -E shim.py <agent> ...``, against a stub of the daemon's hook
endpoint on loopback (``tests/support/hook_stub.py``): it answers, holds,
stays silent, is down, fails with a 5xx, answers a body that is not JSON.
Whatever happens the shim exits 0 with nothing but a decision on stdout
(exit 2 would block the agent), and a moment the daemon did not take is
spooled (the wire contract, sections 2 and 3)."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import trio

from bridges.hooks_common import shim
from tests.support.hook_stub import HookStub
from tests.support.net import free_port

SHIM = str(Path(shim.__file__).resolve())
PAYLOAD = {"session_id": "s-1", "hook_event_name": "PreToolUse", "tool_name": "Bash",
           "tool_input": {"command": "echo hi"}, "cwd": "/tmp"}
DECISION = (b'{"hookSpecificOutput":{"hookEventName":"PreToolUse",'
            b'"permissionDecision":"allow"}}')


async def run_shim(url: str, spool: Path, stdin: bytes | None = None, *extra: str,
                   env: dict[str, str] | None = None, agent: str = "codex"):
    cmd = [sys.executable, "-S", "-E", SHIM, agent, "--daemon", url, "--spool", str(spool),
           *extra]
    # a generous give-up budget (tests/conftest.py): at load 7+ on 2 cores the stub's
    # answer can take over the default second; the give-up test sets its own
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(spool.parent),
            "AEP_HOOK_BUDGET_MS": os.environ.get("AEP_HOOK_BUDGET_MS", "30000")}
    with trio.fail_after(60):
        return await trio.run_process(
            cmd, stdin=json.dumps(PAYLOAD).encode() if stdin is None else stdin,
            capture_stdout=True, capture_stderr=True, check=False, env={**base, **(env or {})})


def spooled(spool: Path, agent: str = "codex") -> list[dict]:
    f = spool / f"{agent}.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def assert_clean(proc) -> None:
    assert proc.returncode == 0
    assert b"Traceback" not in proc.stdout and b"Traceback" not in proc.stderr


@pytest.fixture
async def stub(nursery):
    s = HookStub()
    await nursery.start(s.serve)
    return s


async def test_answered_decision_is_printed_with_the_contract_headers(stub, tmp_path):
    stub.decision, stub.token = DECISION, "file-token"
    token = tmp_path / "token"
    token.write_text("file-token\n")
    proc = await run_shim(stub.url, tmp_path / "spool", None, "--token-file", str(token))
    assert_clean(proc)
    assert proc.stdout == DECISION
    (seen,) = stub.requests
    assert seen.path == "/hooks/codex"
    assert json.loads(seen.body) == PAYLOAD
    assert seen.headers["x-aep-hook-transport"] == "command"
    assert re.fullmatch(r"[0-9a-f]{32}", seen.headers["x-aep-hook-id"])
    assert seen.headers["content-type"] == "application/json"
    assert_signed(seen, "file-token")
    assert not spooled(tmp_path / "spool")


def assert_signed(seen, token: str) -> None:
    """The request is signed with ``token`` (bridges/core/signed.py) and the token
    itself is nowhere in it."""
    from bridges.core.signed import SignedRequests, body_matches
    assert token not in seen.headers["authorization"]
    assert token.encode() not in seen.body
    raw = [(k.encode(), v.encode()) for k, v in seen.headers.items()]
    assert SignedRequests(token).verify(raw, seen.path) == seen.headers["x-aep-hook-id"]
    assert body_matches(raw, seen.body)
    assert SignedRequests("another-token").verify(raw, seen.path) is None


@pytest.mark.parametrize("mode", ["answer", "hold", "400"])
async def test_a_listener_that_cannot_prove_it_holds_the_token_gets_no_say(stub, tmp_path, mode):
    """A process squatting the daemon's port while it is down (a fifth outside attack,
    issue 25): with the old shim it received ``Bearer <AEP_TOKEN>`` and its "allow" was
    the agent's decision. Now it sees a MAC of one moment, nothing it answers is printed
    (not even after a hold it announces), and the moment is spooled for the daemon."""
    stub.mode, stub.decision, stub.hold_ms, stub.hold_s = mode, DECISION, 60_000, 8.0
    proc = await run_shim(stub.url, tmp_path / "spool", env={"AEP_TOKEN": "the-real-token"})
    assert_clean(proc)
    assert proc.stdout == b""
    assert b"did not prove" in proc.stderr
    (seen,) = stub.requests
    assert "the-real-token" not in repr(seen.headers)
    assert stub.finished == (1 if mode != "hold" else 0)  # a hold is not waited out
    (line,) = spooled(tmp_path / "spool")
    assert line["id"] == seen.headers["x-aep-hook-id"]


@pytest.mark.parametrize("mode", ["answer", "hold"])
async def test_with_no_token_a_decision_is_never_printed(stub, tmp_path, mode):
    """With no AEP_TOKEN the daemon makes no decision (its control gate needs a
    token), and the shim cannot tell it from a process holding its port: an
    "allow" from whatever answers is not the agent's decision (round 11 of issue
    25's known limits: the tokenless shim obeyed any listener). ``{}`` still is."""
    stub.mode, stub.decision, stub.hold_ms, stub.hold_s = mode, DECISION, 5000, 0.1
    proc = await run_shim(stub.url, tmp_path / "spool", env={})
    assert_clean(proc)
    assert proc.stdout == b""
    assert b"with no AEP_TOKEN" in proc.stderr and b"ignored" in proc.stderr
    assert not spooled(tmp_path / "spool")  # the daemon (if it was one) has the moment
    stub.mode, stub.decision = "answer", b"{}"
    proc = await run_shim(stub.url, tmp_path / "spool", env={})
    assert_clean(proc)
    assert proc.stdout == b"{}" and b"ignored" not in proc.stderr


@pytest.mark.parametrize("what", ["body", "hold"])
async def test_a_listener_between_shim_and_daemon_can_change_nothing(stub, tmp_path, what):
    """The daemon's proofs cover its status, its hold and its decision (a sixth outside
    attack: the proof covered only the hook id, so a relay on the path kept it and
    swapped the decision for an "allow", or stretched the hold)."""
    stub.token, stub.decision = "the-real-token", b"{}"
    if what == "body":
        stub.forged_body = DECISION
    else:
        stub.mode, stub.hold_ms, stub.hold_s, stub.forged_hold_ms = "hold", 50, 0.1, 600_000
    proc = await run_shim(stub.url, tmp_path / "spool", env={"AEP_TOKEN": "the-real-token"})
    assert_clean(proc)
    assert proc.stdout == b""
    assert (b"proof does not match" if what == "body" else b"did not prove") in proc.stderr


async def test_a_wrong_proof_is_no_proof(stub, tmp_path):
    stub.decision, stub.token = DECISION, "a-guessed-token"
    proc = await run_shim(stub.url, tmp_path / "spool", env={"AEP_TOKEN": "the-real-token"})
    assert_clean(proc)
    assert proc.stdout == b"" and len(spooled(tmp_path / "spool")) == 1


async def test_the_token_comes_from_the_environment_and_ids_differ(stub, tmp_path):
    stub.token = "env-token"
    for _ in range(2):
        proc = await run_shim(stub.url, tmp_path / "spool", env={"AEP_TOKEN": "env-token"})
        assert_clean(proc)
        assert proc.stdout == b"{}"
    a, b = stub.requests
    assert_signed(a, "env-token")
    assert a.headers["x-aep-hook-id"] != b.headers["x-aep-hook-id"]


async def test_a_held_answer_is_waited_for_past_the_first_second(stub, tmp_path):
    stub.mode, stub.decision, stub.hold_ms, stub.hold_s = "hold", DECISION, 5000, 1.3
    stub.token = "the-real-token"
    proc = await run_shim(stub.url, tmp_path / "spool", env={"AEP_TOKEN": "the-real-token"})
    assert_clean(proc)
    assert proc.stdout == DECISION
    assert stub.finished == 1 and not spooled(tmp_path / "spool")


async def test_a_hold_that_outlives_its_announced_limit_gives_no_decision(stub, tmp_path):
    stub.mode, stub.hold_ms = "hold-forever", 50  # the shim waits 50 ms + 2 s
    proc = await run_shim(stub.url, tmp_path / "spool")
    assert_clean(proc)
    assert proc.stdout == b""
    assert stub.finished == 0  # still holding: the shim left first
    assert not spooled(tmp_path / "spool")  # the daemon has the moment (it answered headers)


async def test_a_silent_daemon_is_given_up_and_the_moment_spooled(stub, tmp_path):
    stub.mode = "silent"  # 30 s without a byte
    proc = await run_shim(stub.url, tmp_path / "spool", env={"AEP_HOOK_BUDGET_MS": "1000"})
    assert_clean(proc)
    assert proc.stdout == b""
    assert stub.finished == 0  # the shim gave up while the stub still said nothing
    (line,) = spooled(tmp_path / "spool")
    assert line["id"] == stub.requests[0].headers["x-aep-hook-id"]
    assert line["agent"] == "codex" and line["payload"] == PAYLOAD
    assert isinstance(line["spooled_at_ms"], int)
    assert b"spooled" in proc.stderr


async def test_a_daemon_that_is_down_spools(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc = await run_shim(url, tmp_path / "spool", b"not json at all")
    assert_clean(proc)
    assert proc.stdout == b""
    (line,) = spooled(tmp_path / "spool")
    assert line["payload"] == "not json at all"  # raw text when it is not a JSON object
    assert re.fullmatch(r"[0-9a-f]{32}", line["id"])
    assert (tmp_path / "spool").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "spool" / "codex.jsonl").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", ["5xx", "404"])
async def test_a_failing_daemon_spools(stub, tmp_path, mode):
    stub.mode = mode
    proc = await run_shim(stub.url, tmp_path / "spool")
    assert_clean(proc)
    assert proc.stdout == b""
    (line,) = spooled(tmp_path / "spool")
    assert line["id"] == stub.requests[0].headers["x-aep-hook-id"]


async def test_a_400_is_not_spooled(stub, tmp_path):
    stub.mode = "400"  # the daemon took (and logged) it: no replay
    proc = await run_shim(stub.url, tmp_path / "spool", b"[1, 2]")
    assert_clean(proc)
    assert proc.stdout == b"" and not spooled(tmp_path / "spool")


async def test_a_body_that_is_not_json_is_not_printed(stub, tmp_path):
    stub.mode = "not-json"
    proc = await run_shim(stub.url, tmp_path / "spool")
    assert_clean(proc)
    assert proc.stdout == b""
    assert b"not a JSON object" in proc.stderr
    assert not spooled(tmp_path / "spool")


async def test_a_json_value_that_is_not_an_object_is_not_printed(stub, tmp_path):
    stub.decision = b'"allow"'
    proc = await run_shim(stub.url, tmp_path / "spool")
    assert_clean(proc)
    assert proc.stdout == b""


@pytest.mark.parametrize("args", [[], ["--daemon"], ["codex", "--bogus"],
                                  ["codex", "--daemon", "ftp://x"],
                                  ["codex", "--daemon", "http://[::1"]])
async def test_a_bad_command_line_exits_0_without_a_traceback(tmp_path, args):
    cmd = [sys.executable, "-S", "-E", SHIM, *args]
    proc = await trio.run_process(cmd, stdin=b"{}", capture_stdout=True, capture_stderr=True,
                                  check=False, env={"HOME": str(tmp_path)})
    assert_clean(proc)
    assert proc.stdout == b""
    assert proc.stderr.startswith(b"aep-bridges hook: ")


async def test_an_unwritable_spool_still_exits_0(tmp_path):
    blocker = tmp_path / "spool"
    blocker.write_text("a file where the directory should be")
    proc = await run_shim(f"http://127.0.0.1:{free_port()}", blocker)
    assert_clean(proc)
    assert proc.stdout == b"" and b"could not spool" in proc.stderr


async def test_the_console_script_reaches_the_shim(stub, tmp_path):
    stub.decision, stub.token = DECISION, "the-real-token"
    exe = Path(sys.executable).with_name("aep-bridges")
    proc = await trio.run_process(
        [str(exe), "hook", "claude-code", "--daemon", stub.url, "--spool", str(tmp_path)],
        stdin=b"{}", capture_stdout=True, capture_stderr=True, check=False,
        env={**os.environ, "AEP_TOKEN": "the-real-token"})
    assert_clean(proc)
    assert proc.stdout == DECISION
    assert stub.requests[0].path == "/hooks/claude-code"


async def test_the_installed_command_line_answers_importing_nothing_heavy(stub, tmp_path):
    """The line the installer writes, run as the vendors run it (``sh -c``):
    a ``{}`` answer (the common case) needs neither os (only site loads it),
    json (re, enum) nor socket.py: they would cost more than the shim's work."""
    from supervisor.hookinstall.common import shim_command
    cmd = shim_command("codex", daemon=stub.url, python=sys.executable)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPROFILEIMPORTTIME": "1",
           "HOME": str(tmp_path), "AEP_HOOK_BUDGET_MS": "30000"}
    proc = await trio.run_process(["sh", "-c", cmd], stdin=b"{}", capture_stdout=True,
                                  capture_stderr=True, check=False, env=env)
    assert_clean(proc)
    assert proc.stdout == b"{}"
    assert b"import time:" not in proc.stderr  # -E: PYTHON* variables are ignored
    cmd = cmd.replace(" -S -E ", " -S -E -X importtime ", 1)
    proc = await trio.run_process(["sh", "-c", cmd], stdin=b"{}", capture_stdout=True,
                                  capture_stderr=True, check=False, env=env)
    assert_clean(proc)
    assert proc.stdout == b"{}"
    imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert {"shim", "_socket"} <= imported  # the measurement sees the shim's imports
    heavy = imported & {"os", "json", "re", "enum", "socket", "http.client", "typing", "fcntl"}
    assert not heavy, heavy


@pytest.mark.parametrize("status", ["401", "403"])
async def test_refused_credentials_are_said_plainly_and_still_spooled(stub, tmp_path, status):
    # trial issue 27: a wrong token read "daemon unavailable (...: HTTP 401)", as if the
    # daemon were down, while the moment it refused was spooled and later taken unheld
    stub.mode = status
    proc = await run_shim(stub.url, tmp_path / "spool", env={"AEP_TOKEN": "not-the-daemons"})
    assert_clean(proc)
    assert proc.stdout == b""
    err = proc.stderr.decode()
    assert f"the daemon refused the hook's credentials (HTTP {status}): the agent's " \
        "AEP_TOKEN / --token-file does not match the daemon's" in err
    assert "unavailable" not in err and "not-the-daemons" not in err
    (line,) = spooled(tmp_path / "spool")  # the contract: any status but 200/400 spools
    assert line["id"] == stub.requests[0].headers["x-aep-hook-id"]
