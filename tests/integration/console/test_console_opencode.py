"""The console against the real OpenCode (issue 28): ``opencode serve``
(npm ``opencode-ai``, pinned in ``tests/support/opencode.py``) against the
scripted mock model, the daemon with its OpenCode bridge (primary, control
on, a token), and the page in headless Debian Chromium (selenium).

A person's clicks, end to end: a permission ask answered by clicking its
option (the tool ran: its output reached the model); OpenCode's question
tool (an AEP-0006 form) answered in the page; a refusal in words
(AEP-0008: the reject option with the reason, which reaches the model); a
cancel on a running run; the daemon restarted under the open page (one
card, answered after the restart). ``AEP_CONSOLE_SCREENSHOT=<path>`` saves
the README's screenshot from the first test."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
import trio

from tests.support.browser import Page, open_browser
from tests.support.daemon import Collector
from tests.support.opencode import VENDORS, MockProviderProcess, SseDaemon, VendorServer, install

pytestmark = pytest.mark.vendor


class StickyDaemon(SseDaemon):
    """:class:`SseDaemon` that keeps its ports across a restart (the open
    page reconnects to the same address)."""

    def _pick_ports(self) -> None:
        if getattr(self, "port", None) is None:
            super()._pick_ports()


class Env:
    def __init__(self, server: VendorServer, provider: MockProviderProcess,
                 daemon: StickyDaemon, stream: Collector, page: Page) -> None:
        self.server, self.provider, self.daemon, self.stream, self.page = \
            server, provider, daemon, stream, page

    def prompt(self, text: str) -> str:
        """A new OpenCode session with ``text`` queued; its id."""
        async def go() -> str:
            async with self.server.client() as c:
                sid = await self.server.new_session(c)
                await self.server.prompt_async(c, sid, text)
                return sid
        return trio.run(go)

    def ask_of(self, sid: str) -> dict:
        return self.stream.first(lambda e: e.get("session") == sid
                                 and e["type"] == "attention.requested", 60, "attention.requested")

    def of(self, sid: str, type_: str, timeout: float = 60) -> dict:
        return self.stream.first(lambda e: e.get("session") == sid and e["type"] == type_,
                                 timeout, type_)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("console-opencode")
    spec = VENDORS["opencode"]
    provider = MockProviderProcess().start()
    server = VendorServer(spec, install(spec), tmp / "server", provider.base_url)
    daemon = stream = None
    try:
        server.start_sync()
        daemon = StickyDaemon(server, tmp / "daemon").start()
        stream = daemon.subscribe()
        with open_browser() as page:
            page.open(daemon.url + "/")
            page.one("#token-input").send_keys(daemon.token)
            page.one("#token-submit").click()
            page.wait(lambda: page.one("#conn").text == "live", "a live socket")
            yield Env(server, provider, daemon, stream, page)
            # script errors or CSP violations; the restart's refused connections are expected
            assert [e for e in page.console_errors() if "Uncaught" in e
                    or "Content Security Policy" in e] == []
    finally:
        if stream is not None:
            stream.close()
        status = daemon.stop() if daemon is not None else 0
        server.stop()
        provider.stop()
        assert status == 0, daemon.log() if daemon else ""


def test_permission_answered_by_a_click(env: Env) -> None:
    sid = env.prompt("AEP_BASH echo console-approved")
    ask = env.ask_of(sid)
    card = env.page.answerable(ask["id"])
    button = env.page.wait(lambda: [b for b in card.find_elements("css selector", ".options button")
                                    if b.text == "Allow once"], "the Allow once button")[0]
    shot = os.environ.get("AEP_CONSOLE_SCREENSHOT")
    if shot:  # the README's picture: a real pending OpenCode ask
        env.page.one(f'[data-session="{sid}"]').click()
        env.page.wait(lambda: env.page.css("#timeline-spacer .row"), "the timeline")
        env.page.driver.save_screenshot(str(Path(shot)))
    button.click()
    answered = env.of(sid, "attention.answered")
    assert answered["data"]["answer"] == {"option": "once"} and answered["subject"] == ask["id"]
    env.of(sid, "run.finished")
    # the vendor ran the tool: its output went back to the model
    assert any("console-approved" in t for t in env.provider.tool_results())
    env.page.wait(lambda: "accepted" in env.page.status(ask["id"])
                  and "resolved: answered" in env.page.status(ask["id"]), "ack and outcome")
    assert len(env.page.css(f'[data-ask="{ask["id"]}"]')) == 1


def test_question_form_answered_in_the_page(env: Env) -> None:
    """OpenCode's own question tool is an AEP-0006 form: its choice picked
    by label in the page reaches the model."""
    sid = env.prompt("AEP_QUESTION")
    ask = env.ask_of(sid)
    assert ask["data"]["kind"] == "form"
    card = env.page.answerable(ask["id"])
    sqlite = env.page.wait(lambda: [lab for lab in card.find_elements("css selector", ".field label")
                                    if lab.text.strip() == "SQLite"], "the SQLite choice")[0]
    sqlite.click()
    card.find_element("css selector", ".send-form").click()
    answered = env.of(sid, "attention.answered")
    field = ask["data"]["fields"][0]
    choice = next(c["id"] for c in field["choices"] if c["label"] == "SQLite")
    assert answered["data"]["answer"] == {"values": {field["id"]: choice}}
    env.of(sid, "run.finished")
    assert any('"SQLite"' in t for t in env.provider.tool_results())
    env.page.wait(lambda: "resolved: answered" in env.page.status(ask["id"]), "the outcome")


def test_free_text_reject_reaches_the_vendor(env: Env) -> None:
    reason = "not on this branch, console says use make clean"
    sid = env.prompt("AEP_BASH rm -rf build")
    ask = env.ask_of(sid)
    card = env.page.answerable(ask["id"])
    card.find_element("css selector", "textarea.answer-text").send_keys(reason)
    card.find_element("css selector", ".send-text").click()
    # the click took: the card says it sent (else the failure shows the page as it was)
    env.page.wait(lambda: "sent: text" in env.page.status(ask["id"]), "the card's 'sent: text'")
    answered = env.of(sid, "attention.answered")
    assert answered["data"]["answer"] == {"option": "reject", "text": reason}
    env.of(sid, "tool.denied")
    env.of(sid, "run.finished")
    assert any(reason in t for t in env.provider.tool_results())
    env.page.wait(lambda: "resolved" in env.page.status(ask["id"]), "the outcome on the card")


def test_cancel_a_real_run(env: Env) -> None:
    before = env.provider.slow_chunks()
    sid = env.prompt("AEP_SLOW")
    started = env.of(sid, "run.started")
    env.page.wait(lambda: env.provider.slow_chunks() >= before + 3, "the slow stream running")
    env.page.one(f'[data-session="{sid}"]', "the session row").click()
    sel = '#controls [data-verb="control.cancel"]'
    env.page.wait(lambda: env.page.one(sel, "the cancel button").text == "Cancel run",
                  "the run known to the page")
    env.page.wait(lambda: env.page.one(sel).click() or True, "the click")  # (re-rendered: retried)
    cancelled = env.of(sid, "run.cancelled")
    assert cancelled["run"] == started["run"] and cancelled["data"] == {"by": "control"}
    env.page.wait(lambda: "accepted" in env.page.one("#controls").text, "the ack in the page")
    env.page.wait(lambda: "idle" in env.page.one(f'[data-session="{sid}"]').text, "the run over")


def test_daemon_restarted_under_the_page(env: Env) -> None:
    sid = env.prompt("AEP_BASH echo across-a-restart")
    ask = env.ask_of(sid)
    env.page.card(ask["id"])
    env.stream.close()
    hellos = env.page.js("return window.aepConsole.hellos")
    assert env.daemon.restart() == 0
    env.stream = env.daemon.subscribe()
    # (the page may be back before restart() returns: count its hellos, not its moods)
    env.page.wait(lambda: env.page.js("return window.aepConsole.hellos") > hellos
                  and env.page.one("#conn").text == "live", "the page reconnected", timeout=60)
    # the re-announced ask (same envelope) is one card, still answerable
    env.of(sid, "progress.status")  # the new daemon re-claimed the session
    card = env.page.card(ask["id"])
    assert len(env.page.css(f'[data-ask="{ask["id"]}"]')) == 1
    button = [b for b in card.find_elements("css selector", ".options button") if b.text == "Allow once"][0]
    env.page.wait(lambda: button.is_enabled(), "the answer enabled again")
    button.click()
    env.of(sid, "run.finished")
    assert any("across-a-restart" in t for t in env.provider.tool_results())
    env.page.wait(lambda: "resolved: answered" in env.page.status(ask["id"]), "the outcome")
    # an ask made after the restart is there too, once
    sid2 = env.prompt("AEP_BASH echo after-the-restart")
    ask2 = env.ask_of(sid2)
    env.page.card(ask2["id"])
    assert len(env.page.css(f'[data-ask="{ask2["id"]}"]')) == 1
    n = env.page.js("return window.aepConsole.sessions.get(arguments[0]).count", sid)
    distinct = {(e["source"], e["id"]) for e in env.stream.events if e.get("session") == sid}
    assert n >= len(distinct)
