"""The console in a real browser (issue 28), against ``aep-bridges relay``
(its own process) and a stub target on ``/socket`` (forms, hostile text,
run controls; the real OpenCode asks are in ``test_console_opencode.py``):
headless Debian Chromium driven by selenium (:mod:`tests.support.browser`).

Covered here: the page's headers (strict CSP, no inline anything) and the
WebSocket ``Origin`` rule (same origin yes, a foreign one 403); the token
flow (a wrong token refused, the right one works, never in the URL or a
cookie, kept in sessionStorage only); the watch-only page of a daemon
without a token; an AEP-0006 form whose bad value is refused in the page
before anything is sent; a payload of HTML and ``</script>`` shown as text;
run controls offered from the target's ``hello`` only."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import pytest

from supervisor.console import CSP
from tests.support.browser import Page, open_browser
from tests.support.console_target import StubTarget
from tests.support.daemon import DaemonProcess

TOKEN = "console-test-token-0123456789"
HOSTILE = '<img src=x onerror="window.__pwned=1"></script><script>window.__pwned=2</script>'

FORM = [
    {"id": "count", "type": "number", "label": "How many", "required": True, "min": 1, "max": 10},
    {"id": "db", "type": "select", "label": "Database", "required": True, "other": True,
     "choices": [{"id": "pg", "label": "Postgres"}, {"id": "lite", "label": "SQLite"}]},
    {"id": "tags", "type": "select", "label": "Tags", "multi": True,
     "choices": [{"id": "a", "label": "alpha"}, {"id": "b", "label": "beta"}]},
    {"id": "dry", "type": "boolean", "label": "Dry run"},
    {"id": "note", "type": "string", "label": "Note"},
]


@pytest.fixture
def relay(tmp_path: Path):
    # the virtualized-lists test posts 300 new sessions in one batch: past the
    # relay's default new-session budget (100 a request), which is not under test here
    d = DaemonProcess(tmp_path / "state", args=("relay",), token=TOKEN,
                      env={"AEP_RELAY_MAX_NEW_SESSIONS": "1000"}).start()
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log()


def login(page: Page, url: str, token: str = TOKEN) -> None:
    page.open(url + "/")
    page.one("#token-form:not([hidden])", "the token form")
    page.one("#token-input").send_keys(token)
    page.one("#token-submit").click()
    page.wait(lambda: page.one("#conn").text == "live", "a live socket")


def block_socket(page: Page) -> None:
    """The page can open no WebSocket until :func:`unblock_socket` (each
    attempt fails as a refused connection would: the page retries). Fault
    injection in the page itself, not DevTools' ``Network.setBlockedURLs``:
    that let a reconnect through in about one run of forty (the page was
    live again right after the restart, "the page to notice the restart"
    timed out)."""
    page.js("""
        if (!window.__realWebSocket) window.__realWebSocket = window.WebSocket;
        const blocked = function () { throw new DOMException('blocked by the test', 'SecurityError'); };
        for (const k of ['CONNECTING', 'OPEN', 'CLOSING', 'CLOSED']) blocked[k] = window.__realWebSocket[k];
        window.WebSocket = blocked;""")


def unblock_socket(page: Page) -> None:
    page.js("window.WebSocket = window.__realWebSocket")


def held(url: str, session: str) -> int:
    """Events the relay at ``url`` holds of ``session`` (a replay-only SSE read)."""
    r = httpx.get(url + "/stream", params={"from": "all", "live": "0",
                                            "filter": json.dumps({"session": session})},
                  headers={"authorization": f"Bearer {TOKEN}"}, trust_env=False, timeout=30)
    return sum(1 for line in r.text.splitlines() if line.startswith("data: "))


def upgrade_status(url: str, origin: str, host_header: str | None = None) -> int:
    """The status of a raw ``/socket`` upgrade carrying ``origin``."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall((f"GET /socket HTTP/1.1\r\nHost: {host_header or host + ':' + port}\r\n"
                   "Upgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   f"Sec-WebSocket-Version: 13\r\nOrigin: {origin}\r\n"
                   f"Authorization: Bearer {TOKEN}\r\n\r\n").encode())
        return int(s.recv(200).split(b" ", 2)[1])


def test_headers_origin_and_token_flow(relay: DaemonProcess) -> None:
    r = httpx.get(relay.url + "/", trust_env=False)
    assert r.status_code == 200 and r.headers["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in CSP and r.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in r.text and " style=" not in r.text  # nothing inline
    js = httpx.get(relay.url + "/console/app.js", trust_env=False)
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "innerHTML" not in js.text and "insertAdjacentHTML" not in js.text
    # a foreign page may not open the socket; the page's own origin may
    assert upgrade_status(relay.url, "http://evil.example") == 403
    assert upgrade_status(relay.url, relay.url) == 101
    # a rebound name is its own "same origin", and still refused by the Host guard
    port = relay.url.rsplit(":", 1)[1]
    assert upgrade_status(relay.url, f"http://evil.example:{port}", f"evil.example:{port}") == 403
    # a rebinding Host is refused before the page is served
    assert httpx.get(relay.url + "/", headers={"host": "evil.example"},
                     trust_env=False).status_code == 403
    with open_browser() as page:
        page.open(relay.url + "/")
        page.one("#token-form:not([hidden])", "the token form")
        page.one("#token-input").send_keys("not-the-token")
        page.one("#token-submit").click()
        page.wait(lambda: "refused" in page.one("#token-error").text, "the refusal")
        assert page.one("#conn").text != "live"
        assert page.js("return sessionStorage.getItem('aep-token')") is None
        page.one("#token-input").send_keys(TOKEN)
        page.one("#token-submit").click()
        page.wait(lambda: page.one("#conn").text == "live", "a live socket")
        assert TOKEN not in page.driver.current_url
        urls = page.requested_urls()
        host = relay.url.removeprefix("http://")
        assert f"ws://{host}/socket" in urls and f"{relay.url}/healthz" in urls
        assert not [u for u in urls if TOKEN in u or "access_token" in u], urls
        assert page.js("return document.cookie") == ""
        assert page.js("return sessionStorage.getItem('aep-token')") == TOKEN
        assert page.driver.get_cookies() == []
        page.driver.refresh()  # the tab keeps it: no second ask
        page.wait(lambda: page.one("#conn").text == "live", "live again after a reload")
        assert page.one("#token-form").get_attribute("hidden") is not None
        assert page.console_errors() == []
    with open_browser() as page:  # another tab (profile) asks again
        page.open(relay.url + "/")
        page.one("#token-form:not([hidden])", "the token form in a new browser")


def test_form_validation_hostile_text_and_controls(relay: DaemonProcess) -> None:
    form_hostile_text_and_controls(relay)


def test_the_same_against_the_jetstream_relay(tmp_path: Path) -> None:
    """The page speaks only the relay's bindings: the same scenario against
    ``aep-bridges relay`` with ``AEP_NATS_URL`` (a real 1-node nats-server)."""
    from tests.support.js_relay_harness import relay_process
    from tests.support.nats import NatsCluster

    (tmp_path / "nats").mkdir()
    with NatsCluster(1, tmp_path / "nats") as cluster:
        d = relay_process(tmp_path / "relay", cluster.url, token=TOKEN).start()
        try:
            form_hostile_text_and_controls(d)
        finally:
            assert d.stop() == 0, d.log()


def form_hostile_text_and_controls(relay: DaemonProcess) -> None:
    with StubTarget(relay.url, TOKEN) as target, open_browser() as page:
        target.emit("session.started", {})
        target.run = target.emit("run.started", {}, run="run-1")["run"]
        hostile = target.emit("attention.requested", {
            "kind": "permission", "prompt": HOSTILE, "respond_via": ["control"],
            "options": [{"id": "once", "label": HOSTILE}, {"id": "reject", "label": "Reject"}]},
            subject="bash", run="run-1", capture="redacted")
        form = target.emit("attention.requested", {
            "kind": "form", "prompt": "Set up the project", "fields": FORM,
            "respond_via": ["control"]}, run="run-1", capture="redacted")
        login(page, relay.url)
        card = page.card(hostile["id"])
        assert HOSTILE in card.find_element("css selector", ".prompt").text
        assert card.find_element("css selector", '[data-option="once"]').text == HOSTILE
        assert page.js("return document.querySelectorAll('img, #inbox script').length") == 0
        assert page.js("return window.__pwned === undefined")

        fcard = page.answerable(form["id"])
        num = fcard.find_element("css selector", '[data-field="count"] input')
        num.send_keys("500")  # above max: the page refuses it before sending
        fcard.find_element("css selector", '[data-field="db"] input[value="lite"]').click()
        fcard.find_element("css selector", ".send-form").click()
        err = fcard.find_element("css selector", ".form-error")
        page.wait(lambda: "at most 10" in err.text, "the form's refusal")
        assert num.get_attribute("aria-invalid") == "true"
        num.clear()
        num.send_keys("7")
        fcard.find_element("css selector", '[data-field="tags"] input[value="b"]').click()
        fcard.find_element("css selector", '[data-field="dry"] input').click()
        fcard.find_element("css selector", ".send-form").click()
        try:
            cmds = target.wait_commands(1)
        except AssertionError as e:  # what the page and the relay said, for the record
            raise AssertionError(f"{e}; the card says {page.status(form['id'])!r}; "
                                 f"the relay's log:\n{relay.log()[-4000:]}") from None
        # the first command to arrive is the valid one: the bad value never left the page
        assert cmds[0]["type"] == "control.attention.respond" and cmds[0]["subject"] == form["id"]
        assert cmds[0]["data"]["answer"] == {"values": {"count": 7, "db": "lite", "tags": ["b"],
                                                        "dry": True}}
        assert cmds[0]["cause"] == form["id"] and "seq" not in cmds[0]
        page.wait(lambda: "accepted" in page.status(form["id"])
                  and "resolved: answered" in page.status(form["id"]), "ack and outcome on the card")
        page.one(f'#settled-list [data-ask="{form["id"]}"]', "the card settled")

        # run controls: offered from the target's hello (cancel, its x.* verb), not pause
        page.one(f'[data-session="{target.session}"]').click()
        sel = '#controls [data-verb="control.cancel"]'
        page.wait(lambda: page.one(sel, "the cancel button").text == "Cancel run", "Cancel run")
        page.one('#controls [data-verb="x.stub.control.poke"]', "the vendor verb")
        assert not page.css('#controls [data-verb="control.pause"]')
        page.wait(lambda: page.one(sel).click() or True, "the click")  # (re-rendered: retried)
        cmds = target.wait_commands(2)
        assert cmds[1]["type"] == "control.cancel" and cmds[1]["run"] == "run-1"
        assert cmds[1]["data"] == {"scope": "run"}
        page.wait(lambda: "accepted" in page.one("#controls").text, "the cancel's ack")
        page.wait(lambda: "control.cancel → run.cancelled" in page.one("#controls").text,
                  "the cancel's outcome")
        page.one("#session-filter").send_keys("no-such-agent")
        page.wait(lambda: not page.css("[data-session]"), "the list filtered")
        page.one("#session-filter").clear()
        page.one("#session-filter").send_keys(target.agent)
        page.one(f'[data-session="{target.session}"]', "the session found by its agent")
        page.wait(lambda: "idle" in page.one(f'[data-session="{target.session}"]').text
                  or "waiting" in page.one(f'[data-session="{target.session}"]').text,
                  "the run cancelled")
        assert page.js("return window.__pwned === undefined")
        assert page.console_errors() == []


def test_watch_only_without_a_token(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "state", args=("relay",)).start()
    try:
        with StubTarget(d.url, None) as target, open_browser() as page:
            ask = target.emit("attention.requested", {
                "kind": "permission", "prompt": "run ls?", "respond_via": ["control"],
                "options": [{"id": "once", "label": "Allow once"}]}, subject="bash",
                capture="redacted")
            page.open(d.url + "/")
            page.wait(lambda: "watch-only" in page.one("#mode").text, "the watch-only banner")
            card = page.card(ask["id"])
            assert card.find_element("css selector", '[data-option="once"]').get_attribute("disabled")
            assert page.one("#token-form").get_attribute("hidden") is not None
    finally:
        assert d.stop() == 0, d.log()


class StickyRelay(DaemonProcess):
    """``aep-bridges relay`` that keeps its port across a restart."""

    def _pick_ports(self) -> None:
        if getattr(self, "port", None) is None:
            super()._pick_ports()


def test_a_restart_that_sets_or_drops_the_token(tmp_path: Path) -> None:
    """The daemon restarts under an open page with ``AEP_TOKEN`` newly set:
    the page asks for it (it does not retry a refused socket for ever);
    restarted again without one, the page goes back to watch-only."""
    d = StickyRelay(tmp_path / "state", args=("relay",)).start()
    try:
        with open_browser() as page:
            page.open(d.url + "/")
            page.wait(lambda: "watch-only" in page.one("#mode").text, "the watch-only banner")
            page.wait(lambda: page.one("#conn").text == "live", "a live socket")
            d.stop()
            d.token = TOKEN
            d.start()
            page.one("#token-form:not([hidden])", "the token form after the restart")
            assert "AEP_TOKEN" in page.one("#token-error").text
            page.one("#token-input").send_keys(TOKEN)
            page.one("#token-submit").click()
            page.wait(lambda: page.one("#conn").text == "live", "live with the token")
            assert "control on" in page.one("#mode").text
            d.stop()
            d.token = None
            d.start()
            page.wait(lambda: "watch-only" in page.one("#mode").text, "watch-only again")
            page.wait(lambda: page.one("#conn").text == "live", "live without a token")
            assert page.js("return sessionStorage.getItem('aep-token')") is None
    finally:
        d.stop()


def test_reconnect_after_a_restart_without_duplicate_or_missing_card(tmp_path: Path) -> None:
    """The relay restarts while the page is open, and a new session asks
    before the page is back (its socket blocked meanwhile): the page
    resumes from its positions, learns the new session from the relay's
    ``sessions`` frame and replays it; every card once, the old one still
    there."""
    d = StickyRelay(tmp_path / "state", args=("relay",), token=TOKEN).start()
    try:
        with open_browser() as page:
            with StubTarget(d.url, TOKEN, session="before") as first:
                ask1 = first.emit("attention.requested", {
                    "kind": "permission", "prompt": "before the restart", "respond_via": ["control"],
                    "options": [{"id": "once", "label": "Allow once"}]}, subject="bash")
                login(page, d.url)
                page.card(ask1["id"])
            block_socket(page)
            assert d.restart() == 0
            page.wait(lambda: page.one("#conn").text != "live", "the page to notice the restart")
            with StubTarget(d.url, TOKEN, session="during") as second:
                ask2 = second.emit("attention.requested", {
                    "kind": "permission", "prompt": "while the page was away",
                    "respond_via": ["control"],
                    "options": [{"id": "once", "label": "Allow once"}]}, subject="bash")
                second.emit("progress.status", {}, subject="busy")
                # the stub's frames are in flight: the page must come back only once
                # the relay holds both (else its catch-up finds no new session and
                # they arrive live instead, catchups 0: the race a reviewer once saw)
                page.wait(lambda: held(d.url, "during") == 2, "the relay to hold both events")
                unblock_socket(page)
                page.wait(lambda: page.one("#conn").text == "live", "the page back")
                page.card(ask2["id"])
                assert page.js("return window.aepConsole.catchups") == 1
                page.wait(lambda: page.js(
                    "return window.aepConsole.sessions.get('during').count") == 2, "both events")
                assert len(page.css(f'[data-ask="{ask1["id"]}"]')) == 1
                assert len(page.css(f'[data-ask="{ask2["id"]}"]')) == 1
                # the new card answers through the new relay
                page.wait(lambda: page.one(f'[data-ask="{ask2["id"]}"] [data-option="once"]')
                          .is_enabled(), "the option enabled")
                page.one(f'[data-ask="{ask2["id"]}"] [data-option="once"]').click()
                assert second.wait_commands(1)[0]["subject"] == ask2["id"]
                page.wait(lambda: "resolved: answered" in page.status(ask2["id"]), "the outcome")
    finally:
        assert d.stop() == 0, d.log()


def test_keyboard_only_and_a_phone_sized_screen(relay: DaemonProcess) -> None:
    """Answering without a mouse (``j`` to the first ask, ``1`` for its
    first option; ``t`` then words for the next), and the same page on a
    390 px wide screen: one column, nothing wider than the screen."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    opts = [{"id": "once", "label": "Allow once"}, {"id": "reject", "label": "Reject"}]
    with StubTarget(relay.url, TOKEN) as target, open_browser(width=390, height=844) as page:
        a1 = target.emit("attention.requested", {"kind": "permission", "prompt": "first",
                                                 "respond_via": ["control"], "options": opts},
                         subject="bash")
        a2 = target.emit("attention.requested", {"kind": "permission", "prompt": "second",
                                                 "respond_via": ["control"], "options": opts},
                         subject="bash")
        login(page, relay.url)
        page.card(a2["id"])
        assert len(page.js("return getComputedStyle(document.querySelector('main'))"
                           ".gridTemplateColumns").split()) == 1
        assert page.js("return document.documentElement.scrollWidth <= window.innerWidth")
        page.wait(lambda: page.one(f'[data-ask="{a1["id"]}"] [data-option="once"]').is_enabled(),
                  "the options enabled")
        keys = ActionChains(page.driver)
        keys.send_keys("j").perform()
        page.wait(lambda: page.js("return document.activeElement.dataset.ask") == a1["id"],
                  "the first card focused")
        keys.send_keys("1").perform()
        cmd = target.wait_commands(1)[0]
        assert cmd["subject"] == a1["id"] and cmd["data"]["answer"] == {"option": "once"}
        page.wait(lambda: "resolved" in page.status(a1["id"]), "the first answered")
        page.js("document.activeElement.blur()")
        keys.send_keys("j").perform()
        page.wait(lambda: page.js("return document.activeElement.dataset.ask") == a2["id"],
                  "the second card focused")
        keys.send_keys("t").perform()
        page.wait(lambda: page.js("return document.activeElement.tagName") == "TEXTAREA", "t")
        keys.send_keys("no thanks").send_keys(Keys.TAB).send_keys(Keys.ENTER).perform()
        cmd = target.wait_commands(2)[1]
        assert cmd["subject"] == a2["id"] and cmd["data"]["answer"] == {"text": "no thanks"}
        assert cmd["capture"] == "redacted"
        page.wait(lambda: "resolved" in page.status(a2["id"]), "the second answered")


def test_sessions_and_timeline_by_keyboard(relay: DaemonProcess) -> None:
    """The session list and the timeline without a mouse: Tab reaches a
    session row, it keeps its focus while events re-render the list (the
    rows are rebuilt on every change), Enter opens its timeline, and Enter
    on a timeline line shows its envelope."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    with StubTarget(relay.url, TOKEN) as target, open_browser() as page:
        target.emit("session.started", {})
        login(page, relay.url)
        row = f'[data-session="{target.session}"]'
        page.one(row, "the session row")
        page.one("#session-filter").click()
        keys = ActionChains(page.driver)
        keys.send_keys(Keys.TAB).send_keys(Keys.TAB).perform()  # the list, then its first row
        page.wait(lambda: page.js("return document.activeElement.dataset.session") == target.session,
                  "the session row focused by Tab")
        for _ in range(3):  # each event re-renders the list under the focused row
            target.emit("progress.status", {"status": "busy"})
        page.wait(lambda: page.js("return window.aepConsole.events") >= 4, "the new events")
        page.wait(lambda: "4 events" in page.one(row).text, "the row re-rendered")
        assert page.js("return document.activeElement.dataset.session") == target.session
        ActionChains(page.driver).send_keys(Keys.ENTER).perform()
        page.wait(lambda: page.one("#timeline-title").text == target.session, "the timeline opened")
        line = page.one("#timeline-spacer [data-event]", "a timeline line")
        assert line.get_attribute("tabindex") == "0"
        page.js("arguments[0].focus()", line)
        ActionChains(page.driver).send_keys(Keys.ENTER).perform()
        page.wait(lambda: '"type": "session.started"' in page.one("#envelope").text
                  or '"type": "progress.status"' in page.one("#envelope").text, "the envelope")


def test_a_malformed_ask_reads_as_its_json(relay: DaemonProcess) -> None:
    """A bridge bug (an object where the spec says string) shows the value
    as JSON on the card, its option and its form label, not
    "[object Object]"; the HTML inside stays text."""
    with StubTarget(relay.url, TOKEN) as target, open_browser() as page:
        prompt = {"nested": HOSTILE}
        ask = target.emit("attention.requested", {
            "kind": "permission", "prompt": prompt, "respond_via": ["control"],
            "options": [{"id": "once", "label": ["a", 1]}]}, subject="bash", capture="redacted")
        form = target.emit("attention.requested", {
            "kind": "form", "prompt": "p", "respond_via": ["control"],
            "fields": [{"id": "n", "type": "string", "label": {"x": 1}}]}, capture="redacted")
        login(page, relay.url)
        card = page.card(ask["id"])
        assert card.find_element("css selector", ".prompt").text == json.dumps(prompt, separators=(",", ":"))
        assert card.find_element("css selector", '[data-option="once"]').text == '["a",1]'
        assert '{"x":1}' in page.card(form["id"]).find_element("css selector", '[data-field="n"]').text
        assert "[object Object]" not in page.text()
        assert page.js("return window.__pwned === undefined")


def test_a_notification_for_an_ask_while_the_tab_is_hidden(relay: DaemonProcess) -> None:
    """The Notification API is the browser's (stubbed here to record, as a
    headless tab can neither be hidden nor show one): a new ask raises one
    only while the tab is hidden, titled with the agent, its prompt as text."""
    with StubTarget(relay.url, TOKEN) as target, open_browser() as page:
        login(page, relay.url)
        page.js("""
            window.__shown = [];
            window.Notification = class { constructor(t, o) { window.__shown.push([t, o.body]); } };
            window.Notification.permission = 'granted';
            window.__hidden = false;
            Object.defineProperty(document, 'hidden', { get: () => window.__hidden });""")
        seen = target.emit("attention.requested", {"kind": "input", "prompt": "while you look"},
                           subject="q")
        page.card(seen["id"])
        page.js("window.__hidden = true")
        away = target.emit("attention.requested", {"kind": "input", "prompt": HOSTILE}, subject="q")
        page.card(away["id"])
        assert page.js("return window.__shown") == [["An agent asks: stub", HOSTILE]]


def test_more_positions_than_the_relay_takes_falls_back_to_all(tmp_path: Path) -> None:
    """A reconnect with more resume positions than ``AEP_MAX_FROM`` is
    refused ``limit-exceeded`` by the relay: the page subscribes again from
    ``all`` (deduplicated) instead of staying deaf."""
    d = StickyRelay(tmp_path / "state", args=("relay",), token=TOKEN,
                    env={"AEP_MAX_FROM": "1"}).start()
    ask = {"kind": "permission", "prompt": "p", "respond_via": ["control"],
           "options": [{"id": "once", "label": "Allow once"}]}
    try:
        with open_browser() as page:
            with StubTarget(d.url, TOKEN, session="a") as a, StubTarget(d.url, TOKEN, session="b") as b:
                first = [a.emit("attention.requested", ask, subject="x"),
                         b.emit("attention.requested", ask, subject="x")]
                login(page, d.url)
                for f in first:
                    page.card(f["id"])
            assert d.restart() == 0
            page.wait(lambda: page.js("return window.aepConsole.catchups") == 1, "the fallback")
            with StubTarget(d.url, TOKEN, session="a") as again:
                later = again.emit("attention.requested", ask, subject="x")
                page.card(later["id"])
            for f in [*first, later]:
                assert len(page.css(f'[data-ask="{f["id"]}"]')) == 1
    finally:
        assert d.stop() == 0, d.log()


GIST_CASES = [
    ("tool.requested", {"tool": {"name": "bash"}}, None),
    ("tool.completed", {"tool": {"name": "bash"}, "duration_ms": 12}, None),
    ("tool.failed", {"tool": {"name": "bash"}, "error": {"message": "exit   1\nboom"}}, None),
    ("tool.denied", {"tool": "edit", "by": "policy"}, None),
    ("run.started", {"trigger": "user"}, None),
    ("run.finished", {"duration_ms": 5}, None),
    ("run.failed", {"reason": "crash"}, None),
    ("run.cancelled", {"by": "control"}, None),
    ("attention.requested", {"kind": "permission", "prompt": "x" * 80,
                             "options": [{"id": "once", "label": "Once"}, {"id": "no", "label": "No"}]},
     "bash"),
    ("attention.requested", {"kind": "form", "prompt": "f", "fields": FORM}, None),
    ("attention.answered", {"answer": {"values": {"count": 3}}, "via": "control"}, "01ASK"),
    ("attention.answered", {"answer": {"option": "once"}}, None),
    ("attention.resolved", {"resolution": "answered"}, None),
    ("attention.timeout", {}, None),
    ("session.started", {"client": {"name": "codex"}, "gen_ai.request.model": "m"}, None),
    ("session.ended", {}, None),
    ("control.rejected", {"reason": "invalid"}, None),
    ("control.accepted", {}, "01CMD"),
    ("control.cancel", {"scope": "run"}, None),
    ("error.raised", {"error": {"type": "E"}}, None),
    ("progress.status", {}, "busy"),
    ("progress.task.updated", {"task": {"title": "write the fix"}}, None),
]


def test_timeline_gists_are_tails(relay: DaemonProcess) -> None:
    """The timeline's one-line gists are ``aep-bridges tail``'s (its
    family gists; vendor types get a shorter ``k=v`` summary)."""
    from supervisor.tools.gist import gist

    with open_browser() as page:
        login(page, relay.url)
        for type_, data, subject in GIST_CASES:
            ev = {"type": type_, "data": data, **({"subject": subject} if subject else {})}
            assert page.js("return window.aepConsole.gist(arguments[0])", ev) == gist(ev), type_


def test_lists_are_virtualized(relay: DaemonProcess) -> None:
    """3,000 events in one session and 300 sessions: the page holds them
    all (counts, scrolling) but draws only the rows in view."""
    import json as _json

    lines = []
    for s in range(300):
        n = 3000 if s == 0 else 2
        for i in range(n):
            lines.append(_json.dumps({
                "aep": "0.1", "id": f"v{s}-{i}", "type": "progress.status", "subject": f"step {i}",
                "source": f"aep://box/agent/codex/session/v{s}", "agent": "codex",
                "session": f"v{s:03d}", "seq": i, "epoch": 0,
                "time": f"2026-12-01T10:00:{s % 60:02d}.{i % 1000:03d}Z", "data": {}}))
    r = httpx.post(relay.url + "/events", content="\n".join(lines) + "\n", trust_env=False,
                   timeout=60, headers={"authorization": f"Bearer {TOKEN}", "aep-version": "0.1",
                                        "content-type": "application/x-ndjson"})
    assert r.status_code == 202, r.text
    with open_browser() as page:
        login(page, relay.url)
        page.wait(lambda: page.js("return window.aepConsole.events") == len(lines), "every event")
        # (drawn at the next redraw: the page coalesces them)
        page.wait(lambda: page.one("#session-count").text == "300", "300 sessions drawn")
        assert 0 < len(page.css("#sessions-spacer .row")) < 40
        assert not page.css('[data-session="v000"]')  # out of view: not drawn
        page.one("#session-filter").send_keys("v000")
        page.one('[data-session="v000"]', "the big session, filtered").click()
        page.wait(lambda: page.css("#timeline-spacer .row"), "the timeline")
        rows = page.css("#timeline-spacer .row")
        assert 0 < len(rows) < 60
        assert "step 2999" in rows[-1].text  # opened at its newest line
        page.js("document.getElementById('timeline-scroll').scrollTop = 0")
        page.wait(lambda: "step 0" in page.css("#timeline-spacer .row")[0].text, "the top")
        assert page.js("return document.getElementsByTagName('*').length") < 400


def _post(url: str, *events: dict) -> httpx.Response:
    return httpx.post(url + "/events", content="".join(json.dumps(e) + "\n" for e in events),
                      trust_env=False, timeout=30,
                      headers={"authorization": f"Bearer {TOKEN}", "aep-version": "0.1",
                               "content-type": "application/x-ndjson"})


def test_a_forged_outcome_from_another_session_leaves_the_ask_in_the_inbox(
        relay: DaemonProcess) -> None:
    """Issue 25 (attack 5): anyone who may post reads a fleet ask's id from
    the stream and posts, in a session of its own, ``attention.resolved``
    (and ``attention.timeout``) naming that id as ``subject``. An outcome
    settles only the ask its own emitter raised in its own session
    (AEP-0001 §5.2, AEP-0002 §7): the ask stays in the inbox until its own
    emitter resolves it."""
    with StubTarget(relay.url, TOKEN, agent="victim", session="victim-1") as target, \
            open_browser() as page:
        target.emit("session.started", {})
        ask = target.emit("attention.requested", {
            "kind": "permission", "prompt": "deploy prod", "respond_via": ["control"],
            "options": [{"id": "once", "label": "Allow"}]}, subject="Bash")
        login(page, relay.url)
        page.card(ask["id"])
        page.wait(lambda: page.one("#inbox-count").text == "1", "the ask counted")
        forged = [{"aep": "0.1", "id": f"FORGED{i}", "type": t, "time": ask["time"],
                   "agent": "alice-agent", "source": "urn:alice:1", "session": sess, "seq": i + 1,
                   "severity": "notice", "subject": ask["id"], "data": d}
                  for i, (t, sess, d) in enumerate([
                      ("attention.resolved", "alice-own", {"resolution": "answered"}),
                      ("attention.timeout", "alice-own", {}),
                      ("attention.resolved", "alice-two", {"resolution": "dismissed"})])]
        r = _post(relay.url, *forged)
        assert r.status_code == 202, r.text
        keys = [f"urn:alice:1|{f['id']}" for f in forged]
        page.wait(lambda: page.js("return arguments[0].every((k) => window.aepConsole.seen.has(k))",
                                  keys), "the forgeries read by the page")
        # a later ask of the victim drawn: the page has redrawn after the forgeries
        later = target.emit("attention.requested", {"kind": "input", "prompt": "later"}, subject="q")
        page.card(later["id"])
        page.wait(lambda: page.one("#inbox-count").text == "2", "both asks counted")
        assert page.css(f'#inbox-list [data-ask="{ask["id"]}"]'), page.text()
        assert not page.css(f'#settled-list [data-ask="{ask["id"]}"]')
        assert "resolved" not in page.status(ask["id"]) and "timed out" not in page.status(ask["id"])
        # its own emitter, in its own session, does settle it
        target.emit("attention.resolved", {"resolution": "dismissed"}, subject=ask["id"])
        page.one(f'#settled-list [data-ask="{ask["id"]}"]', "the ask settled by its emitter")
        page.wait(lambda: page.one("#inbox-count").text == "1", "one ask left")
        assert page.console_errors() == []
