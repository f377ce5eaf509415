"""What the NATS link says while its first connect is refused (issue 14:
credentials are never logged): nats-py retries that connect inside
``nats.connect`` and tells only its error callback, so the callback is
the operator's one view of why; the real-server side of this is
tests/integration/jetstream/test_auth.py."""
from __future__ import annotations

import logging
import ssl

import nats.errors

from supervisor.jetstream.link import _connect_options
from tests.integration.jetstream.fleet_support import nats_config

SECRET = "hunter2-not-logged"


async def test_a_refused_first_connect_warns_each_new_reason_once_redacted(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="aep.nats")
    cfg = nats_config(f"nats://aep:{SECRET}@127.0.0.1:4222,tls://10.0.0.2:4222")
    error_cb = _connect_options(cfg, "t", [])["error_cb"]
    auth = nats.errors.Error("nats: 'Authorization Violation'")
    reset = ConnectionResetError(104, "Connection reset by peer")
    leak = OSError(f"cannot reach nats://aep:{SECRET}@127.0.0.1:4222")
    for _ in range(5):
        await error_cb(auth)
        await error_cb(reset)
    await error_cb(leak)
    await error_cb(ssl.SSLCertVerificationError(1, "certificate verify failed"))
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    shown = "nats://***@127.0.0.1:4222, tls://10.0.0.2:4222"
    assert warned == [
        f"nats: cannot connect to {shown} (Error: nats: 'Authorization Violation'); retrying",
        f"nats: cannot connect to {shown} (ConnectionResetError: [Errno 104] Connection reset "
        "by peer); retrying",
        f"nats: cannot connect to {shown} (OSError: cannot reach nats://***@127.0.0.1:4222); "
        "retrying",
        f"nats: cannot connect to {shown} (SSLCertVerificationError: certificate verify "
        "failed); retrying",
    ]
    assert len(caplog.records) == 12  # the repeats: debug
    assert SECRET not in caplog.text


async def test_reconnect_failures_warn_once_per_kind_per_outage(caplog) -> None:
    # a mid-run outage: nats-py reports every failed reconnect (0.5 s apart);
    # 45 warnings in 22 s before (fresh-user review), one per kind now
    caplog.set_level(logging.DEBUG, logger="aep.nats")

    class FakeLink:
        counters = {"errors": 0, "reconnects": 0, "disconnects": 0}

        class nc:
            connected_url = None
            is_closed = False

    box = [FakeLink()]
    opts = _connect_options(nats_config("nats://127.0.0.1:4222"), "t", box)  # type: ignore[list-item]
    refused = ConnectionRefusedError(111, "Connection refused")
    for _ in range(10):
        await opts["error_cb"](refused)
    await opts["error_cb"](TimeoutError())
    await opts["reconnected_cb"]()
    await opts["error_cb"](refused)  # a new outage: said again
    warned = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and "Refused" in r.getMessage()]
    assert len(warned) == 2
    assert FakeLink.counters["errors"] == 12


def test_outage_logs_each_kind_once_and_its_recovery_once(caplog) -> None:
    import logging

    from supervisor.jetstream.link import Outage
    logger = logging.getLogger("aep.test.outage")
    caplog.set_level(logging.DEBUG, logger="aep.test.outage")
    o = Outage(logger)
    assert o.recovered("consumers", "back") is False  # nothing was down: silent
    assert [o.failed("consumers", "down %d", i) for i in range(5)] == [True] + [False] * 4
    assert o.failed("subscribe", "other kind") is True
    assert o.down("consumers") and o.recovered("consumers", "back") is True
    assert o.recovered("consumers", "back") is False
    assert o.failed("consumers", "down again") is True
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [("WARNING", "down 0")] + [("DEBUG", f"down {i}") for i in range(1, 5)] + [
        ("WARNING", "other kind"), ("INFO", "back"), ("WARNING", "down again")]
    assert o.spells == {"consumers": 2, "subscribe": 1}
