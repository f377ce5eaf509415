"""A JetStream relay's ``/healthz`` tells the truth about NATS: its
``nats.connected`` (with the counters for the token) and ``ok`` false while
no server answers (it said ``ok: true`` with no ``nats`` block; found by a
fresh-user review), true again once NATS is back; its ``/metrics`` has the
``nats_*`` series, named as the daemon's (it had none)."""
from __future__ import annotations

import json
import re
import time

import httpx

from tests.support.js_relay_harness import TOKEN, relay_process
from tests.support.nats import NatsCluster


def _until(d, want_ok: bool, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    body: dict = {}
    while time.monotonic() < deadline:
        body = d.healthz(TOKEN)
        if body.get("ok") is want_ok:
            return body
        time.sleep(0.2)
    raise AssertionError(f"/healthz never said ok={want_ok}: {body}")


def _metrics(d) -> dict[str, float]:
    """``name{labels} -> value`` of the relay's ``/metrics`` (the token's)."""
    text = httpx.get(d.url + "/metrics", headers={"authorization": f"Bearer {TOKEN}"},
                     timeout=10, trust_env=False).text
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(aep_bridges_nats_[a-z_]+(?:\{[^}]*\})?) (\S+)", line)
        if m:
            out[m[1]] = float(m[2])
    return out


def _post(d, ev: dict) -> int:
    return httpx.post(d.url + "/events", content=json.dumps(ev), timeout=30, trust_env=False,
                      headers={"authorization": f"Bearer {TOKEN}", "aep-version": "0.1",
                               "content-type": "application/json"}).status_code


def test_relay_healthz_follows_the_nats_link(tmp_path) -> None:
    (tmp_path / "nats").mkdir()
    with NatsCluster(1, tmp_path / "nats") as c:
        d = relay_process(tmp_path / "r", c.url)
        d.start()
        try:
            up = _until(d, True)
            assert up["nats"]["connected"] is True
            assert up["nats"]["stream"] == "AEP" and up["nats"]["relay"].startswith("relay-")
            from tests.support.relay_harness import event
            assert _post(d, event(0)) == 202
            m = _metrics(d)
            assert m["aep_bridges_nats_connected"] == 1.0
            assert m["aep_bridges_nats_published_total"] == 1.0
            assert m["aep_bridges_nats_disconnects_total"] == 0.0
            assert m['aep_bridges_nats_commands_total{outcome="forwarded"}'] == 0.0
            for name in ("publish_errors_total", "reconnects_total", "consumers",
                         "consumers_made_total", "consumers_remade_total",
                         "bad_stream_messages_total"):
                assert f"aep_bridges_nats_{name}" in m, (name, m)
            c.kill(0)
            down = _until(d, False)
            assert down["nats"]["connected"] is False
            m = _metrics(d)
            assert m["aep_bridges_nats_connected"] == 0.0
            assert m["aep_bridges_nats_disconnects_total"] == 1.0
            c.start(0)
            assert _until(d, True)["nats"]["connected"] is True
            assert _metrics(d)["aep_bridges_nats_reconnects_total"] == 1.0
        finally:
            d.stop(timeout=30)
