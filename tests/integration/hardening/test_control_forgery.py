"""Issue 25, forged control: row 6 (a forged ack) and the degraded
"one event into another's session makes its commands ambiguous".

The real ``aep-bridges relay`` subprocess with a token; the real SDK
``ControlClient`` sends the command, the real SDK duplex (``open_duplex``)
is the target emitter and the attacker (a token holder: the token is
what every party of one deployment shares).
"""
from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from aep_sdk.control import ControlClient, NackError, open_duplex

from tests.support.daemon import DaemonProcess
from tests.support.hardening import event, post_events

TOKEN = "forgery-token"
CONTROL = {"accepts": ["control.cancel"], "ack_window_ms": 10_000}


@pytest.fixture(scope="module")
def relay(tmp_path_factory):
    d = DaemonProcess(tmp_path_factory.mktemp("forgery") / "state", args=("relay",), token=TOKEN)
    d.start()
    yield d
    d.stop(timeout=20)


def _emitter(url: str, agent: str, control: dict[str, Any] | None = CONTROL, *,
             role: str = "emitter", token: str = TOKEN) -> Any:
    duplex = open_duplex(url, token=token, connect_timeout_ms=10_000)
    caps: dict[str, Any] = {"emits": ["tool", "control"]}
    if control is not None:
        caps["control"] = control
    duplex.send_json({"type": "hello", "versions": ["0.1"], "role": role,
                      "identity": {"agent": agent, "instance": f"{agent}/1"},
                      "capabilities": caps})
    assert duplex.recv_json()["type"] == "hello"
    return duplex


def _answers(duplex: Any, frame: dict[str, Any]) -> list[dict[str, Any]]:
    """Send ``frame``, then a ping: every frame before the pong."""
    duplex.send_json(frame)
    duplex.send_json({"type": "ping", "t": 1})
    out = []
    for _ in range(50):
        got = duplex.recv_json()
        assert got is not None
        if got.get("type") == "pong":
            return out
        out.append(got)
    raise AssertionError(f"no pong: {out}")


def _ack(cmd: dict[str, Any], agent: str, seq: int, type_: str, **data: Any) -> dict[str, Any]:
    ev = event(seq, cmd["session"], agent=agent, type=type_, id=f"{agent}-ack-{cmd['id']}-{seq}")
    ev["cause"] = cmd["id"]
    ev["data"] = data
    return ev


def _send_in_thread(url: str, session: str, token: str = TOKEN
                    ) -> tuple[threading.Thread, dict[str, Any]]:
    """The SDK ``ControlClient`` sending one ``control.cancel`` from a
    thread: ``out`` gets ``ack`` or ``nack`` (``error``: it never sent)."""
    out: dict[str, Any] = {}

    def run() -> None:
        client = ControlClient(url, agent="operator", host="laptop", token=token)
        try:
            client.connect(connect_timeout_ms=10_000)
        except Exception as e:  # noqa: BLE001 -- reported to the test
            out["error"] = e
            return
        try:
            out["ack"] = client.send("control.cancel", session, ack_window_ms=20_000, retries=0)
        except NackError as e:
            out["nack"] = (e.reason, e.detail)
        finally:
            client.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _healthz(url: str) -> dict[str, Any]:
    r = httpx.get(url + "/healthz", headers={"authorization": f"Bearer {TOKEN}"},
                  timeout=10, trust_env=False)
    return r.json()


def _connections(url: str) -> int:
    """The relay's connected parties (``/socket`` and in-process)."""
    return int(_healthz(url)["relay_counts"]["connections"])


def _wait_connections(url: str, n: int) -> None:
    """Until the relay counts ``n`` connections (a closed duplex is gone
    from it), bounded."""
    for _ in range(200):
        if _connections(url) == n:
            return
        time.sleep(0.05)
    raise AssertionError(f"the relay still counts {_connections(url)} connections, not {n}")


def _relay_counters(url: str) -> dict[str, int]:
    return _healthz(url)["relay_counts"]["counters"]


def _metric(url: str, line_start: str) -> float:
    text = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {TOKEN}"},
                     timeout=10, trust_env=False).text
    for ln in text.splitlines():
        if ln.startswith(line_start):
            return float(ln.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in /metrics")


def test_a_forged_ack_is_refused_and_the_real_target_decides(relay):
    session = "forged-ack-1"
    target = _emitter(relay.url, "victim")
    # a party that claims no session (the ack gate alone stands in its way)
    attacker = _emitter(relay.url, "attacker", None, role="consumer")
    try:
        assert _answers(target, event(1, session, agent="victim")) == []
        before = _relay_counters(relay.url).get("refused_acks", 0)
        sender, out = _send_in_thread(relay.url, session)
        cmd = target.recv_json()  # the command, routed to its one claimant
        assert cmd is not None and cmd["type"] == "control.cancel", cmd
        # the attacker read the command's id on the stream and forges the nack
        forged = _ack(cmd, "attacker", 1, "control.rejected", reason="refused")
        forged["session"] = session
        r = post_events(relay.url, [forged], token=TOKEN)
        assert r.status_code == 403 and r.json()["error"] == "unauthorized", r.text
        answers = _answers(attacker, _ack(cmd, "attacker", 2, "control.rejected",
                                          reason="refused"))
        assert [(a["type"], a["code"]) for a in answers] == [("error", "unauthorized")], answers
        # the real target decides; the sender settles on its decision
        assert _answers(target, _ack(cmd, "victim", 2, "control.accepted")) == []
        sender.join(30)
        assert "ack" in out, out
        assert out["ack"]["agent"] == "victim" and out["ack"]["cause"] == cmd["id"]
        # a second, different decision of the decided command: refused too
        late = _answers(target, _ack(cmd, "victim", 3, "control.rejected", reason="refused"))
        assert [a.get("code") for a in late] == ["unauthorized"], late
        # and the recorded ack sent again (a retry's recovery) still passes
        assert _answers(target, _ack(cmd, "victim", 2, "control.accepted")) == []
        assert _relay_counters(relay.url)["refused_acks"] - before == 3
        assert _metric(relay.url, 'aep_bridges_relay_refused_total{reason="ack"}') >= 3
    finally:
        target.close()
        attacker.close()


def test_an_event_in_another_emitters_session_does_not_make_its_commands_ambiguous(relay):
    session = "owned-session-1"
    owner = _emitter(relay.url, "owner")
    intruder = _emitter(relay.url, "intruder", control=None)
    try:
        assert _answers(owner, event(1, session, agent="owner")) == []
        refused = _answers(intruder, event(1, session, agent="intruder"))
        assert [a.get("code") for a in refused] == ["invalid-event"], refused
        sender, out = _send_in_thread(relay.url, session)
        cmd = owner.recv_json()
        assert cmd is not None and cmd["type"] == "control.cancel", (cmd, out)
        assert _answers(owner, _ack(cmd, "owner", 2, "control.accepted")) == []
        sender.join(30)
        assert "ack" in out, out
        assert _relay_counters(relay.url)["refused_owned_session"] >= 1
        assert _metric(relay.url, 'aep_bridges_relay_refused_total{reason="owned_session"}') >= 1
        # once the owner is gone its session stays held for it (AEP_CLAIM_GRACE;
        # the squat it stops: test_session_squat.py): the intruder is still refused
        gone = _connections(relay.url) - 1
        owner.close()
        _wait_connections(relay.url, gone)
        again = _answers(intruder, event(2, session, agent="intruder"))
        assert [a.get("code") for a in again] == ["invalid-event"], again
        assert "AEP_CLAIM_GRACE" in again[0]["detail"], again
    finally:
        owner.close()
        intruder.close()
