"""A JetStream relay's ``/healthz`` tells the truth about NATS: its
``nats.connected`` (with the counters for the token) and ``ok`` false while
no server answers (it said ``ok: true`` with no ``nats`` block; found by a
fresh-user review), true again once NATS is back."""
from __future__ import annotations

import time

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


def test_relay_healthz_follows_the_nats_link(tmp_path) -> None:
    (tmp_path / "nats").mkdir()
    with NatsCluster(1, tmp_path / "nats") as c:
        d = relay_process(tmp_path / "r", c.url)
        d.start()
        try:
            up = _until(d, True)
            assert up["nats"]["connected"] is True
            assert up["nats"]["stream"] == "AEP" and up["nats"]["relay"].startswith("relay-")
            c.kill(0)
            down = _until(d, False)
            assert down["nats"]["connected"] is False
            c.start(0)
            assert _until(d, True)["nats"]["connected"] is True
        finally:
            d.stop(timeout=30)
