"""The console at scale (issue 28, "Resilience and scale"): 1,000 sessions
and 20,000 events in the page, then how fast it answers a click.

``aep-bridges relay`` (its own process, a token) holds 20,000 events over
1,000 sessions (20 each, posted as NDJSON before the page opens); a stub
target on ``/socket`` (:class:`tests.support.console_target.StubTarget`)
owns one more session and raises the asks. The page (headless Debian
Chromium, selenium) replays all of it, then, ``ASKS`` times, a new ask
arrives and is answered by a click on its option. Reported:

- the replay: seconds from opening the page to every event counted, and
  the DOM's size after it (elements: bounded, whatever the event count);
- per click, measured in the page (``performance.now()``): click -> the card
  says ``sent`` (the page's own reaction) and click -> ``accepted by the
  agent`` (the command through the relay to the target and its ack back),
  p50 / max;
- the same clicks again while new events stream in (a thread posting
  batches of 200 to the relay as fast as it takes them, ~20 a second);
- a session picked from the list: click -> its timeline drawn.

Figures for one machine (2 shared cores here), not assertions.
``python -m benchmarks console`` (``scripts/dev bench console``)."""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.browser import open_browser  # noqa: E402
from tests.support.console_target import StubTarget  # noqa: E402
from tests.support.daemon import DaemonProcess  # noqa: E402

TOKEN = "console-bench-token-0123456789"
SESSIONS = 1000
PER_SESSION = 20
ASKS = 20

# the click, then the first frame where the card's status shows `want`
CLICK_JS = """
const [sel, want, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const b = document.querySelector(sel);
const card = b.closest('.card');
const t0 = performance.now();
b.click();
(function poll() {
  const st = card.querySelector('.status');
  if (st && st.textContent.includes(want)) { done(performance.now() - t0); return; }
  requestAnimationFrame(poll);
})();
"""
BOTH_JS = """
const [sel, done] = [arguments[0], arguments[arguments.length - 1]];
const b = document.querySelector(sel);
const card = b.closest('.card');
const t0 = performance.now();
let sent = null;
b.click();
(function poll() {
  const text = card.querySelector('.status').textContent;
  if (sent === null && text.includes('sent')) sent = performance.now() - t0;
  if (text.includes('accepted by the agent')) { done([sent, performance.now() - t0]); return; }
  requestAnimationFrame(poll);
})();
"""
TIMELINE_JS = """
const [sel, done] = [arguments[0], arguments[arguments.length - 1]];
const row = document.querySelector(sel);
const t0 = performance.now();
row.click();
(function poll() {
  if (document.querySelectorAll('#timeline-spacer .row').length) { done(performance.now() - t0); return; }
  requestAnimationFrame(poll);
})();
"""


def _events() -> list[bytes]:
    """Two NDJSON bodies (the relay takes 10,000 a batch): 20 events for
    each of 1,000 sessions, shaped like a bridge's."""
    lines = []
    for s in range(SESSIONS):
        sid = f"bench-{s:04d}"
        src = f"aep://bench/agent/codex/session/{sid}"
        for i in range(PER_SESSION):
            t = ("session.started" if i == 0 else "run.started" if i == 1
                 else "run.finished" if i == PER_SESSION - 1 else "tool.completed")
            ev = {"aep": "0.1", "id": f"{sid}-{i}", "type": t, "source": src, "agent": "codex",
                  "session": sid, "seq": i, "epoch": 0,
                  "time": f"2026-12-01T10:{s // 60 % 60:02d}:{s % 60:02d}.{i:03d}Z",
                  "run": f"{sid}-run", "data": {}}
            if t == "tool.completed":
                ev["data"] = {"tool": {"name": "bash"}, "ok": True}
            lines.append(json.dumps(ev))
    half = len(lines) // 2
    return [("\n".join(lines[:half]) + "\n").encode(), ("\n".join(lines[half:]) + "\n").encode()]


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="aep-console-bench-") as tmp:
        d = DaemonProcess(Path(tmp) / "state", args=("relay",), token=TOKEN,
                          env={"AEP_MAX_SESSIONS": "5000",
                               "AEP_RELAY_MAX_NEW_SESSIONS": "1000"}).start()
        try:
            for body in _events():
                r = httpx.post(d.url + "/events", content=body, timeout=60, trust_env=False,
                               headers={"authorization": f"Bearer {TOKEN}", "aep-version": "0.1",
                                        "content-type": "application/x-ndjson"})
                r.raise_for_status()
            with StubTarget(d.url, TOKEN) as target, open_browser() as page:
                target.emit("session.started", {})
                total = SESSIONS * PER_SESSION + 1
                t0 = time.perf_counter()
                page.open(d.url + "/")
                page.one("#token-input").send_keys(TOKEN)
                page.one("#token-submit").click()
                page.wait(lambda: page.js("return window.aepConsole.events") >= total,
                          "every event in the page", timeout=300)
                replay_s = time.perf_counter() - t0
                page.wait(lambda: page.one("#session-count").text == str(SESSIONS + 1), "the count")
                elements = page.js("return document.getElementsByTagName('*').length")
                page.driver.set_script_timeout(60)
                sent, acked = [], []
                flood = Flood(d.url)
                for i in range(2 * ASKS):
                    if i == ASKS:  # the second half under a live flood of new events
                        flood.start()
                    ask = target.emit("attention.requested", {
                        "kind": "permission", "prompt": f"bench ask {i}", "respond_via": ["control"],
                        "options": [{"id": "once", "label": "Allow once"}]}, subject="bash",
                        capture="redacted")
                    page.card(ask["id"])
                    sel = f'[data-ask="{ask["id"]}"] [data-option="once"]'
                    page.wait(lambda sel=sel: page.js(
                        "const b = document.querySelector(arguments[0]); return b && !b.disabled", sel),
                        "the option enabled")
                    a, b = page.driver.execute_async_script(BOTH_JS, sel)
                    sent.append(a)
                    acked.append(b)
                flood.stop()
                target.wait_commands(2 * ASKS)
                pick = page.driver.execute_async_script(TIMELINE_JS, '[data-session]')
                after = page.js("return document.getElementsByTagName('*').length")
        finally:
            d.stop()
    return {"events": total, "sessions": SESSIONS + 1, "replay_s": replay_s,
            "elements": elements, "elements_after": after,
            "sent_p50": statistics.median(sent[:ASKS]), "sent_max": max(sent[:ASKS]),
            "acked_p50": statistics.median(acked[:ASKS]), "acked_max": max(acked[:ASKS]),
            "fsent_p50": statistics.median(sent[ASKS:]), "fsent_max": max(sent[ASKS:]),
            "facked_p50": statistics.median(acked[ASKS:]), "facked_max": max(acked[ASKS:]),
            "flood_rate": flood.rate(), "timeline_ms": pick, "asks": ASKS}


class Flood:
    """A thread posting new events (batches of 200 over the bench's
    sessions) as fast as the relay takes them, until :meth:`stop`."""

    def __init__(self, url: str) -> None:
        import threading
        self.url, self.sent, self.t0, self.t1 = url, 0, 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.t1 = time.perf_counter()

    def rate(self) -> float:
        return self.sent / max(self.t1 - self.t0, 1e-9)

    def _run(self) -> None:
        seq = PER_SESSION
        with httpx.Client(trust_env=False, timeout=30) as c:
            while not self._stop.is_set():
                lines = []
                for s in range(200):
                    sid = f"bench-{(seq * 200 + s) % SESSIONS:04d}"
                    lines.append(json.dumps({
                        "aep": "0.1", "id": f"{sid}-f{seq}-{s}", "type": "progress.status",
                        "source": f"aep://bench/agent/codex/session/{sid}", "agent": "codex",
                        "session": sid, "seq": seq * 200 + s, "epoch": 0,
                        "time": "2026-12-01T11:00:00.000Z", "subject": "busy", "data": {}}))
                seq += 1
                c.post(self.url + "/events", content="\n".join(lines) + "\n",
                       headers={"authorization": f"Bearer {TOKEN}", "aep-version": "0.1",
                                "content-type": "application/x-ndjson"}).raise_for_status()
                self.sent += len(lines)
                time.sleep(0.05)


def main(argv: list[str]) -> None:
    r = run()
    print(f"console: {r['events']:,} events over {r['sessions']:,} sessions replayed into the page "
          f"in {r['replay_s']:.1f} s; DOM {r['elements']} elements (after {r['asks']} asks: "
          f"{r['elements_after']})")
    print(f"  click -> 'sent' on the card:            p50 {r['sent_p50']:6.1f} ms  max "
          f"{r['sent_max']:6.1f} ms  ({r['asks']} clicks)")
    print(f"  click -> 'accepted by the agent' (relay round trip): p50 {r['acked_p50']:6.1f} ms  "
          f"max {r['acked_max']:6.1f} ms")
    print(f"  the same {r['asks']} clicks while {r['flood_rate']:,.0f} new events/s stream in: "
          f"'sent' p50 {r['fsent_p50']:.1f} ms max {r['fsent_max']:.1f} ms; 'accepted' p50 "
          f"{r['facked_p50']:.1f} ms max {r['facked_max']:.1f} ms")
    print(f"  click a session -> its timeline drawn:  {r['timeline_ms']:.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
