"""``scripts/dev demo``: the whole path, offline, in a couple of minutes.

What runs (everything on loopback, in one temporary directory that is
removed at the end; nothing touches your ``~/.codex`` or ``~/.config``):

1. a mock model: the tests' scripted providers
   (:class:`tests.support.mock_responses.MockResponsesServer` for Codex,
   :class:`tests.support.opencode.MockChatProvider` for OpenCode): only the
   LLM is faked;
2. the real ``opencode serve`` (npm ``opencode-ai``, from the vendor cache;
   installed with npm on first use) with ``bash`` set to ask permission;
3. the daemon, ``aep-bridges run``, with the OTel inbound bridge (primary)
   and the OpenCode bridge (primary, control on, a throwaway token);
4. ``aep-bridges tail --from all``, printing the timeline to this terminal;
5. the real Codex CLI (npm ``@openai/codex``) running one
   ``codex exec --skip-git-repo-check`` whose model asks for a shell call,
   exporting its OpenTelemetry logs to the daemon: ``session.started``,
   ``tool.completed`` arrive in the tail;
6. one OpenCode prompt whose model asks for ``bash``: the permission ask
   arrives as ``attention.requested`` (PENDING in the tail), and the demo
   answers it through the daemon with the protocol SDK's ``ControlClient``
   (``control.attention.respond``), as a dashboard would; the tool runs and
   the run finishes.

Then everything is stopped (the daemon with SIGTERM: its exit status is
checked) and the directory removed. Exit 0 when every step was seen, 1
otherwise (with the logs' tails). Bounded: ``--timeout`` seconds in all
(default 300).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from tests.support import codex as codex_mod
from tests.support.daemon import DaemonProcess, console_script, send_command
from tests.support.mock_responses import MockResponsesServer
from tests.support.opencode import OPENCODE, MockChatProvider, VendorServer, install

TOKEN = "demo-token-not-a-secret-0123456789"


def say(text: str) -> None:
    """A narration line (the tail's lines come from its own process)."""
    print(f"\ndemo ▸ {text}", flush=True)


class DemoDaemon(DaemonProcess):
    """The daemon with the OTel inbound bridge and the OpenCode bridge,
    both primary, OpenCode's control gate on."""

    token = TOKEN
    scrub = ("AEP_", "OPENCODE_", "KILO_")

    def __init__(self, state: Path, opencode: VendorServer) -> None:
        self.opencode = opencode
        super().__init__(state)

    def vendor_env(self) -> dict[str, str]:
        return {"AEP_BRIDGE_OTLP_IN": "1", "AEP_OTLP_PRIMARY": "1",
                "AEP_BRIDGE_OPENCODE_SSE": "1", "AEP_OPENCODE_URL": self.opencode.url,
                "AEP_OPENCODE_PASSWORD": self.opencode.password,
                "AEP_OPENCODE_SSE_PRIMARY": "1", "AEP_OPENCODE_SSE_CONTROL": "1"}


async def _wait(collector, pred, what: str, timeout: float = 60):
    return await collector.wait_for(pred, timeout=timeout, what=what)


async def _codex_part(tmp: Path, daemon: DemoDaemon, stream, tail: Tail) -> None:
    say(f"Codex {codex_mod.CODEX_VERSION}: installing/locating the real CLI (npm, vendor cache)")
    binary = await trio.to_thread.run_sync(codex_mod.codex_binary)
    mock = MockResponsesServer()
    async with trio.open_nursery() as n:
        await n.start(mock.serve)
        cfg = codex_mod.config_toml(model_base_url=mock.base_url, model="mock-codex-model",
                                    exporter_kind="otlp-grpc",
                                    otlp_endpoint=f"http://127.0.0.1:{daemon.grpc_port}",
                                    environment="aep-demo")
        say("codex exec --skip-git-repo-check 'Run `echo hello` ...' (mock model: one shell call); "
            f"[otel] exporter = otlp-grpc -> 127.0.0.1:{daemon.grpc_port}")
        run = await codex_mod.run_codex_exec(binary, tmp / "codex-home", codex_mod.PROMPT, cfg,
                                             proxy_url=mock.base_url.rsplit("/v1", 1)[0],
                                             timeout=120)
        n.cancel_scope.cancel()
    if run.returncode != 0:
        raise RuntimeError(f"codex failed:\n{run.describe()}")
    conv = run.thread_id
    await _wait(stream, lambda s: s.of(conv, "tool.completed"), "Codex tool.completed")
    await trio.sleep(0.3)  # the export's last records
    await tail.caught_up(len(stream.events))
    # said once the tail has shown them: the lines it refers to are above it
    say(f"codex exited 0 (conversation {conv}); its OTLP export reached the daemon: "
        f"the {len(stream.of(conv))} codex events above")


async def _held_for_console(stream, sid: str, ask: dict, hold: float | None) -> bool:
    """Leave ``ask`` pending for a person in the console: until it is
    resolved (``hold`` ``None``: ``--console``, no limit but the demo's
    deadline) or ``hold`` seconds pass. ``True`` when it was answered there."""
    def resolved(s):
        return [e for e in s.of(sid, "attention.resolved") if e.get("subject") == ask["id"]]
    if hold is None:
        say("waiting for you to answer the ask in the console (--console)")
        await stream.wait_for(resolved, timeout=float("inf"), what="the ask answered in the console")
        return True
    with trio.move_on_after(hold):
        await stream.wait_for(resolved, timeout=hold + 1, what="the ask answered in the console")
        return True
    return False


async def _opencode_part(server: VendorServer, daemon: DemoDaemon, stream, tail: Tail,
                         hold: float | None = 0) -> None:
    async with server.client() as c:
        sid = await server.new_session(c)
        say(f"OpenCode {OPENCODE.version}: POST /session/{sid}/prompt_async "
            "(mock model: one bash call; bash is set to ask permission)")
        await server.prompt_async(c, sid, "AEP_BASH echo hello from opencode")
    ask = (await _wait(stream, lambda s: s.of(sid, "attention.requested"),
                       "OpenCode attention.requested"))[0]
    await tail.caught_up(len(stream.events))
    await trio.sleep(1.0)  # the PENDING line stays on screen a moment
    if hold is None or hold > 0:
        say(f"the ask is pending in the console: {daemon.url}/ (token {TOKEN})"
            + ("" if hold is None else f"; answered for you in {hold:.0f} s otherwise"))
        if await _held_for_console(stream, sid, ask, hold):
            say("answered (in the console or with aep-bridges respond); the tool runs:")
            await _wait(stream, lambda s: s.of(sid, "run.finished"), "OpenCode run.finished")
            await trio.sleep(0.3)
            await tail.caught_up(len(stream.events))
            return
    say(f"answering the ask through the daemon: control.attention.respond "
        f"subject={ask['id']} answer={{option: once}} (aep_sdk.ControlClient on /socket)")
    status, ack = await trio.to_thread.run_sync(lambda: send_command(
        daemon, "control.attention.respond", sid, subject=ask["id"], cause=ask["id"],
        data={"answer": {"option": "once"}}))
    if status != "accepted":
        raise RuntimeError(f"the daemon refused the answer: {status} {ack}")
    say(f"acknowledged: control.accepted (cause {ack.get('cause')}); the tool runs:")
    await _wait(stream, lambda s: s.of(sid, "run.finished"), "OpenCode run.finished")
    await trio.sleep(0.3)  # the server's last updates after the run
    await tail.caught_up(len(stream.events))


def _skipped() -> type[BaseException]:
    """The loud-skip exception :mod:`tests.support.vendors` raises when a
    vendor cannot be installed (pytest's ``Skipped``)."""
    import pytest
    return pytest.skip.Exception


class Tail:
    """``aep-bridges tail --from all`` on the daemon, its lines forwarded to
    this terminal (colored, at this terminal's width, when it is one) and
    counted, so the demo moves on only once the tail has shown what
    happened (:meth:`caught_up`)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.proc: trio.Process | None = None
        self._changed = trio.Event()

    async def run(self, daemon: DemoDaemon, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AEP_TOKEN": TOKEN,
               "LANG": os.environ.get("LANG", "C.UTF-8"), "TERM": os.environ.get("TERM", "dumb")}
        args = ["tail", "--url", daemon.url, "--from", "all"]
        if sys.stdout.isatty():
            args += ["--color", "always"]
            env["COLUMNS"] = str(shutil.get_terminal_size().columns)
        self.proc = await trio.lowlevel.open_process(console_script() + args, env=env,
                                                     stdin=subprocess.DEVNULL,
                                                     stdout=subprocess.PIPE)
        task_status.started()
        assert self.proc.stdout is not None
        buf = b""
        async for chunk in self.proc.stdout:
            buf += chunk
            *done, buf = buf.split(b"\n")
            for raw in done:
                line = raw.decode(errors="replace")
                print(line, flush=True)
                self.lines.append(line)
            self._changed.set()
            self._changed = trio.Event()

    async def caught_up(self, events: int, timeout: float = 30) -> None:
        """Wait until the tail has printed at least ``events`` lines."""
        with trio.fail_after(timeout):
            while len(self.lines) < events:
                await self._changed.wait()

    async def stop(self) -> None:
        """SIGINT (the tail's clean exit), SIGKILL past 10 s; shielded, so it
        runs even when the demo was cancelled by its deadline."""
        if self.proc is None or self.proc.returncode is not None:
            return
        with trio.CancelScope(shield=True):
            self.proc.send_signal(signal.SIGINT)
            with trio.move_on_after(10):
                await self.proc.wait()
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()


async def demo(tmp: Path, hold: float | None = 0) -> int:
    """Run the demo in ``tmp``; returns the exit status. ``hold``: seconds
    the OpenCode ask waits for an answer in the console before the demo
    answers it (``None``: until answered there, ``--console``)."""
    provider = MockChatProvider()
    server = daemon = stream = None
    tail = Tail()
    status = 1
    try:
        async with trio.open_nursery() as n:
            await n.start(provider.serve)
            say(f"starting the real `opencode serve` (npm {OPENCODE.package}@{OPENCODE.version}) "
                "against a mock model")
            binary = await trio.to_thread.run_sync(lambda: install(OPENCODE))
            server = VendorServer(OPENCODE, binary, tmp / "opencode", provider.base_url)
            await server.start()
            daemon = DemoDaemon(tmp / "state", server)
            await trio.to_thread.run_sync(daemon.start)
            say(f"daemon up: relay {daemon.url} (token {TOKEN[:8]}…), OTLP/gRPC "
                f"127.0.0.1:{daemon.grpc_port}; bridges: otlp_in (primary), opencode_sse "
                "(primary, control on); `aep-bridges tail` follows its /stream, one line an event")
            say(f"console: open {daemon.url}/ in a browser (token {TOKEN}) to watch and answer")
            await n.start(tail.run, daemon)
            stream = daemon.subscribe()  # the demo's own eyes, to know when to go on
            await _codex_part(tmp, daemon, stream, tail)
            await _opencode_part(server, daemon, stream, tail, hold)
            n.cancel_scope.cancel()
        count = len(stream.events)
        status = 0
        say(f"demo complete: {count} events through the daemon; cleaning up")
    # (pytest's Skipped: npm or the registry unavailable, tests.support.vendors)
    except (Exception, _skipped()) as e:  # noqa: BLE001 -- a demo reports, then cleans up
        say(f"demo FAILED: {e}")
        if daemon is not None:
            print("--- daemon log (tail) ---\n" + daemon.log()[-3000:], file=sys.stderr)
        if server is not None:
            print("--- opencode log (tail) ---\n" + server.tail(2000), file=sys.stderr)
    finally:
        if stream is not None:
            stream.close()
        await tail.stop()
        if daemon is not None:
            code = daemon.stop(timeout=20)
            if code != 0:
                say(f"the daemon exited {code} (expected 0)")
                status = 1
        if server is not None:
            server.stop()
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/dev demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=300, help="seconds for the whole demo")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--hold", type=float, default=20, metavar="SECONDS",
                        help="how long the OpenCode ask stays pending for the console before "
                             "the demo answers it itself (default 20)")
    parser.add_argument("--console", action="store_true",
                        help="hold the OpenCode ask until it is answered in the console "
                             "(the deadline becomes an hour unless --timeout is given)")
    args = parser.parse_args(argv)
    hold = None if args.console else max(args.hold, 0)
    if args.console and "--timeout" not in (argv if argv is not None else sys.argv[1:]):
        args.timeout = 3600
    tmp = Path(tempfile.mkdtemp(prefix="aep-demo-"))
    say(f"working in {tmp} ({'kept' if args.keep else 'removed'} at the end)")
    t0 = time.monotonic()

    async def bounded() -> int:
        with trio.move_on_after(args.timeout) as scope:
            return await demo(tmp, hold)
        if scope.cancelled_caught:
            say(f"demo FAILED: not done within {args.timeout:.0f} s")
        return 1

    try:
        status = trio.run(bounded)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"{'done' if status == 0 else 'failed'} in {time.monotonic() - t0:.0f} s; "
        f"{tmp} {'kept' if args.keep else 'removed'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
