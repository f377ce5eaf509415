"""Issue 25, sixth outside attack: an OTLP ``codex.tool_decision`` whose
``tool_name`` was ``$AEP_TOKEN`` and ``decision`` a per-emitter credential
was written verbatim to the session log and fanned out (the same values
through the hooks were redacted). Every metadata string the OTLP bridge
carries now goes through the policy's redaction.

The real daemon (``aep-bridges run``, OTLP/HTTP receiver, Codex profile,
companion and primary), read back from ``/stream`` and every file under
its state directory."""
from __future__ import annotations

import os
import time

import pytest

from tests.integration.hardening.conftest import TOKEN
from tests.support.daemon import DaemonProcess
from tests.support.hardening import otlp_json, otlp_record, post_otlp, stream_events

ALICE = "alice-cred-6b0e91d4aa"


def _leaks(root) -> list[str]:
    hits = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            data = open(os.path.join(dirpath, f), "rb").read()
            if TOKEN.encode() in data or ALICE.encode() in data:
                hits.append(os.path.join(dirpath, f))
    return hits


@pytest.mark.parametrize("primary", ["0", "1"])
def test_the_daemons_credentials_in_otlp_metadata_are_redacted(tmp_path, primary):
    creds = tmp_path / "emitters"
    creds.write_text(f"alice={ALICE}\n")
    os.chmod(creds, 0o600)
    state = tmp_path / "state"
    d = DaemonProcess(state, {"AEP_OTLP_PRIMARY": primary, "AEP_EMITTER_TOKENS": str(creds)},
                      token=TOKEN).start()
    try:
        rec = otlp_record("leak-1", event_name="codex.tool_decision",
                          extra={"tool_name": TOKEN, "decision": ALICE, "source": "config",
                                 "call_id": f"call {TOKEN}"})
        deny = otlp_record("leak-1", event_name="codex.tool_decision",
                           extra={"tool_name": f"x {ALICE}", "decision": "denied", "source": "config",
                                  "call_id": "c1"})
        assert post_otlp(d.http_port, otlp_json([rec, deny])).status_code == 200
        got: list[dict] = []
        for _ in range(100):  # 10 s at most
            got = [e for e in stream_events(d.url, TOKEN) if e.get("session") == "leak-1"]
            if len(got) >= 2:
                break
            time.sleep(0.1)
        assert len(got) >= 2, got
        text = repr(got)
        assert TOKEN not in text and ALICE not in text, text
        assert "[REDACTED:secret]" in text, text
    finally:
        d.stop(timeout=20)
    assert _leaks(state) == []
