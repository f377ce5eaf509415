"""The console in a real browser (issue 28), the gaps that kept it open:
a session that began and ended while the page was away is replayed (the
relay's ``sessions`` frame), a retried answer is the same command (the same
id, AEP-0004 §2.3), and the fleet's counters read in words. Against
``aep-bridges relay`` (its own process), a stub target on ``/socket`` for
the faults, headless Debian Chromium driven by selenium."""
from __future__ import annotations

from pathlib import Path

import httpx

from tests.integration.console.test_console_page import (
    TOKEN,
    StickyRelay,
    block_socket,
    held,
    login,
    unblock_socket,
)
from tests.support.browser import open_browser
from tests.support.console_target import StubTarget
from tests.support.daemon import DaemonProcess

ASK = {"kind": "permission", "prompt": "run ls?", "respond_via": ["control"],
       "options": [{"id": "once", "label": "Allow once"}, {"id": "reject", "label": "Reject"}]}



def _row_text(page, session: str) -> str:
    """The session row's text, looked up now (the list re-renders rows)."""
    rows = page.css(f'[data-session="{session}"]')
    return rows[0].text if rows else ""

def a_session_that_came_and_went(url: str) -> tuple[StubTarget, dict, dict]:
    """A target that starts a session, asks, is answered by another
    party's outcome, ends the session and leaves: nothing of it is live."""
    with StubTarget(url, TOKEN, session="came-and-went") as gone:
        gone.emit("session.started", {})
        ask = gone.emit("attention.requested", ASK, subject="bash")
        out = gone.emit("attention.resolved", {"resolution": "timeout"}, subject=ask["id"])
        gone.emit("session.ended", {})
    return gone, ask, out


def test_a_session_begun_and_ended_during_a_network_drop_is_replayed(tmp_path: Path) -> None:
    """The page's socket drops (the relay stays up); meanwhile a session
    starts, asks, settles and ends, its emitter gone (so the roster never
    names it). Back, the page lists it as ended, with its card settled, and
    the session it knew before is neither lost nor doubled."""
    d = DaemonProcess(tmp_path / "state", args=("relay",), token=TOKEN).start()
    try:
        a_network_drop(d)
    finally:
        assert d.stop() == 0, d.log()


def test_the_same_drop_against_the_jetstream_relay(tmp_path: Path) -> None:
    """The same against ``aep-bridges relay`` with ``AEP_NATS_URL`` (a real
    1-node nats-server): its ``sessions`` answer comes from the stream."""
    from tests.support.js_relay_harness import relay_process
    from tests.support.nats import NatsCluster

    (tmp_path / "nats").mkdir()
    with NatsCluster(1, tmp_path / "nats") as cluster:
        d = relay_process(tmp_path / "relay", cluster.url, token=TOKEN).start()
        try:
            a_network_drop(d)
        finally:
            assert d.stop() == 0, d.log()


def a_network_drop(d: DaemonProcess) -> None:
    """The drop, the session that came and went, the page back (the tests above)."""
    with StubTarget(d.url, TOKEN, session="before") as first, open_browser() as page:
        ask1 = first.emit("attention.requested", ASK, subject="bash")
        login(page, d.url)
        page.card(ask1["id"])
        block_socket(page)
        page.js("window.aepConsole.ws.close()")  # the drop
        page.wait(lambda: page.one("#conn").text != "live", "the page to notice the drop")
        gone, ask2, _ = a_session_that_came_and_went(d.url)
        page.wait(lambda: held(d.url, gone.session) == 4, "the relay to hold the session")
        unblock_socket(page)
        page.wait(lambda: page.one("#conn").text == "live", "the page back")
        page.one(f'[data-session="{gone.session}"]', "the session that came and went")
        # the row is looked up on every poll: the list re-renders it (a row
        # held from before went stale: "no it ended", the page showing it ended)
        page.wait(lambda: ("ended" in (t := _row_text(page, gone.session)) and "4 events" in t),
                  "it ended, 4 events")
        page.one(f'#settled-list [data-ask="{ask2["id"]}"]', "its ask, settled")
        assert "resolved: timeout" in page.status(ask2["id"])
        assert len(page.css(f'[data-ask="{ask1["id"]}"]')) == 1
        assert page.js("return window.aepConsole.sessions.get('before').count") == 1
        assert page.js("return window.aepConsole.hellos") == 2


def test_a_session_begun_and_ended_during_a_restart_is_replayed(tmp_path: Path) -> None:
    """The same across a restart of the relay (which restores its buffers
    from the session logs): the session that came and went while the page
    was away is there, ended."""
    d = StickyRelay(tmp_path / "state", args=("relay",), token=TOKEN).start()
    try:
        with open_browser() as page:
            with StubTarget(d.url, TOKEN, session="before") as first:
                ask1 = first.emit("attention.requested", ASK, subject="bash")
                login(page, d.url)
                page.card(ask1["id"])
            block_socket(page)
            assert d.restart() == 0
            page.wait(lambda: page.one("#conn").text != "live", "the page to notice the restart")
            gone, ask2, _ = a_session_that_came_and_went(d.url)
            page.wait(lambda: held(d.url, gone.session) == 4, "the relay to hold the session")
            unblock_socket(page)
            page.wait(lambda: page.one("#conn").text == "live", "the page back")
            page.one(f'[data-session="{gone.session}"]', "the session that came and went")
            page.wait(lambda: "ended" in _row_text(page, gone.session), "it ended")
            page.one(f'#settled-list [data-ask="{ask2["id"]}"]', "its ask, settled")
            assert len(page.css(f'[data-ask="{ask1["id"]}"]')) == 1
    finally:
        assert d.stop() == 0, d.log()


def test_a_retry_after_the_ack_window_is_the_same_command(tmp_path: Path) -> None:
    """The target loses the first delivery (no ack within its declared
    window): the card says so, and clicking the same option again sends
    the same command (one id reaches the target, twice); the target
    decides once, and the card shows one acknowledgement and the outcome."""
    d = DaemonProcess(tmp_path / "state", args=("relay",), token=TOKEN).start()
    try:
        with StubTarget(d.url, TOKEN, ack_window_ms=1500, lose_first=True) as target, \
                open_browser() as page:
            ask = target.emit("attention.requested", ASK, subject="bash")
            login(page, d.url)
            opt = f'[data-ask="{ask["id"]}"] [data-option="once"]'
            page.wait(lambda: page.one(opt).is_enabled(), "the option enabled")
            # (the target's declared window comes with the roster)
            page.wait(lambda: page.js("return window.aepConsole.roster.size") == 1, "the roster")
            page.one(opt).click()
            try:
                first = target.wait_commands(1)[0]
            except AssertionError as e:  # what the page and the relay said, for the record
                raise AssertionError(f"{e}; the card says {page.status(ask['id'])!r}; console "
                                     f"live={page.js('return window.aepConsole.live')!r}; "
                                     f"the relay's log:\n{d.log()[-4000:]}") from None
            page.wait(lambda: "no acknowledgement" in page.status(ask["id"]), "the window to pass")
            page.wait(lambda: page.one(opt).is_enabled(), "the option again, to retry")
            other = page.one(f'[data-ask="{ask["id"]}"] [data-option="reject"]').is_enabled()
            page.one(opt).click()
            again = target.wait_commands(2)[1]
            assert again == first  # the same envelope: the same id, source and answer
            assert not other  # a different answer while the first is undecided: not offered
            page.wait(lambda: "resolved: answered" in page.status(ask["id"]), "the outcome")
            status = page.status(ask["id"])
            assert status.count("accepted by the agent") == 1, status
            assert {c["id"] for c in target.commands} == {first["id"]}
    finally:
        assert d.stop() == 0, d.log()


def test_fleet_counters_read_in_words(tmp_path: Path) -> None:
    """The fleet panel names a bridge's counters in words, the raw
    ``/healthz`` key in each one's tooltip, and leaves zero counters out."""
    d = DaemonProcess(tmp_path / "state", token=TOKEN).start()
    try:
        r = httpx.post(f"http://127.0.0.1:{d.http_port}/v1/logs", json={"resourceLogs": []},
                       trust_env=False, timeout=30)
        assert r.status_code == 200, r.text
        with open_browser() as page:
            login(page, d.url)
            span = page.one('#fleet-list [data-key="otlp.requests"]', "the requests counter")
            assert span.get_attribute("title") == "otlp.requests"
            assert span.text == "requests 1"
            shown = page.css("#fleet-list .counter")
            assert all("_" not in s.text and "." not in s.text for s in shown), [s.text for s in shown]
            assert not [s.text for s in shown if s.text.endswith(" 0")]
            # the reading order: traffic, control, faults, then what is filtered by design
            order = page.driver.execute_async_script("""
                const done = arguments[arguments.length - 1];
                import('/console/fleet.js').then((m) => done(m.counterOrder({
                    duplicates: 3, socket_errors: 1, frames: 9, control_commands: 2,
                    'otlp.saturated': 0, some_new_failures: 4}).map(([k]) => k)));""")
            assert order == ["frames", "control_commands", "socket_errors", "some_new_failures",
                             "duplicates"]
    finally:
        assert d.stop() == 0, d.log()


def test_a_run_control_retried_is_the_same_command(tmp_path: Path) -> None:
    """The same for a run control: Cancel run lost at first, the window
    passes (the page says so), Cancel run again re-sends the same command;
    one acknowledgement, then the outcome (``run.cancelled``)."""
    d = DaemonProcess(tmp_path / "state", args=("relay",), token=TOKEN).start()
    try:
        with StubTarget(d.url, TOKEN, ack_window_ms=1500, lose_first=True) as target, \
                open_browser() as page:
            target.emit("session.started", {})
            target.run = target.emit("run.started", {}, run="run-1")["run"]
            login(page, d.url)
            page.wait(lambda: page.js("return window.aepConsole.roster.size") == 1, "the roster")
            page.one(f'[data-session="{target.session}"]').click()
            sel = '#controls [data-verb="control.cancel"]'
            page.wait(lambda: page.one(sel).text == "Cancel run" and page.one(sel).is_enabled(),
                      "Cancel run")
            page.wait(lambda: page.one(sel).click() or True, "the click")  # (re-rendered: retried)
            first = target.wait_commands(1)[0]
            page.wait(lambda: "no acknowledgement" in page.one("#controls").text, "the window to pass")
            page.wait(lambda: page.one(sel).click() or True, "the click again")
            again = target.wait_commands(2)[1]
            assert again == first
            page.wait(lambda: "control.cancel → run.cancelled" in page.one("#controls").text,
                      "the outcome")
            text = page.one("#controls").text
            assert text.count("accepted by the agent") == 1, text
            assert {c["id"] for c in target.commands} == {first["id"]}
    finally:
        assert d.stop() == 0, d.log()
