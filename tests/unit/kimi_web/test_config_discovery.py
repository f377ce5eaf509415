"""Settings, discovery from ``KIMI_CODE_HOME`` and the control decision."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bridges.core.capture import CapturePolicy
from bridges.core.ledger import Refuse
from bridges.kimi_web import from_env
from bridges.kimi_web.config import NAMES, SETTINGS
from bridges.kimi_web.config import from_env as config_from_env
from bridges.kimi_web.control import decide
from bridges.kimi_web.discovery import NotFound, live_instances, read_token, resolve
from supervisor.config import known_settings, load


def test_control_needs_primary_and_a_token():
    _, p = config_from_env({"AEP_KIMI_WEB_CONTROL": "1"})
    assert any("AEP_KIMI_WEB_PRIMARY" in x for x in p) and any("AEP_TOKEN" in x for x in p)
    cfg, p = config_from_env({"AEP_KIMI_WEB_CONTROL": "1", "AEP_KIMI_WEB_PRIMARY": "1", "AEP_TOKEN": "t"})
    assert p == [] and cfg.control_open


def test_fleet_knows_every_setting():
    assert NAMES <= known_settings()
    assert {s.name for s in SETTINGS} >= {"AEP_KIMI_WEB_URL", "AEP_KIMI_WEB_TOKEN", "AEP_KIMI_WEB_PRIMARY",
                                          "AEP_KIMI_WEB_CONTROL", "AEP_KIMI_WEB_ACK_GUARD_MS"}
    cfg, problems = load({"AEP_BRIDGE_KIMI_WEB": "1"}, check_ports=False)
    assert problems == [] and "kimi_web" in [s.key for s in cfg.enabled]


def test_factory_capabilities():
    b = from_env({"AEP_KIMI_WEB_PRIMARY": "1", "AEP_KIMI_WEB_CONTROL": "1", "AEP_TOKEN": "t"},
                 policy=CapturePolicy())
    assert b.capabilities()["control"]["accepts"] == ["control.attention.respond", "control.cancel"]
    assert b.agent == "kimi-code" and b.preflight() == []
    off = from_env({}, policy=CapturePolicy())
    assert off.capabilities()["control"]["accepts"] == [] and off.capabilities()["emits"] == ["control", "x.kimi-code"]


def _instance(home: Path, sid: str, pid: int, port: int, started: int) -> None:
    d = home / "server" / "instances"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{sid}.json").write_text(json.dumps({"server_id": sid, "pid": pid, "host": "127.0.0.1",
                                               "port": port, "started_at": started,
                                               "heartbeat_at": started, "host_version": "2.1.0"}))


def _token(home: Path, value: str = "tok-1", mode: int = 0o600) -> None:
    p = home / "server.token"
    p.write_text(value)
    os.chmod(p, mode)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_discovery_skips_stale_instances_and_picks_the_newest(tmp_path):
    _instance(tmp_path, "01STALE", _dead_pid(), 1111, 3)
    _instance(tmp_path, "01OLD", os.getpid(), 2222, 1)
    _instance(tmp_path, "01NEW", os.getpid(), 3333, 2)
    (tmp_path / "server" / "instances" / "junk.json").write_text("{not json")
    _token(tmp_path)
    assert [i.server_id for i in live_instances(tmp_path)] == ["01NEW", "01OLD"]
    cfg, _ = config_from_env({"KIMI_CODE_HOME": str(tmp_path)})
    ep = resolve(cfg)
    assert ep.url == "http://127.0.0.1:3333" and ep.token == "tok-1" and ep.server_id == "01NEW"
    assert "tok-1" not in repr(ep)


def test_discovery_follows_a_rotated_token(tmp_path):
    _instance(tmp_path, "01A", os.getpid(), 3333, 1)
    _token(tmp_path, "tok-1")
    cfg, _ = config_from_env({"KIMI_CODE_HOME": str(tmp_path)})
    assert resolve(cfg).token == "tok-1"
    _token(tmp_path, "tok-2")
    assert resolve(cfg).token == "tok-2"


def test_no_live_instance_or_token(tmp_path):
    cfg, _ = config_from_env({"KIMI_CODE_HOME": str(tmp_path)})
    with pytest.raises(NotFound, match="no live kimi web"):
        resolve(cfg)
    with pytest.raises(NotFound, match="no server.token"):
        read_token(tmp_path)
    _token(tmp_path, "tok", 0o644)
    with pytest.raises(NotFound, match="0600") as e:
        read_token(tmp_path)
    assert "tok" not in str(e.value).replace(str(tmp_path), "").replace("token", "")


def test_overrides_win(tmp_path):
    cfg, _ = config_from_env({"KIMI_CODE_HOME": str(tmp_path), "AEP_KIMI_WEB_URL": "http://127.0.0.1:9/",
                              "AEP_KIMI_WEB_TOKEN": "given"})
    ep = resolve(cfg)
    assert (ep.url, ep.token, ep.server_id) == ("http://127.0.0.1:9", "given", None)


@pytest.mark.parametrize("answer,body,applied", [
    ({"option": "approved"}, {"decision": "approved"}, {"option": "approved"}),
    ({"option": "approved_for_session"}, {"decision": "approved", "scope": "session"},
     {"option": "approved_for_session"}),
    ({"option": "rejected", "text": " too risky "}, {"decision": "rejected", "feedback": "too risky"},
     {"option": "rejected", "text": "too risky"}),
    ({"text": "Approve"}, {"decision": "approved"}, {"option": "approved"}),
    ({"text": "rejected"}, {"decision": "rejected"}, {"option": "rejected"}),
    ({"text": "please use ls"}, {"decision": "rejected", "feedback": "please use ls"},
     {"option": "rejected", "text": "please use ls"}),
    ({"option": "approved", "text": "ignored"}, {"decision": "approved"}, {"option": "approved"}),
])
def test_decide(answer, body, applied):
    d = decide(answer)
    assert d["body"] == body and d["applied"] == applied


@pytest.mark.parametrize("answer", [None, {}, {"option": "yes"}, {"text": "  "}, {"values": {"a": 1}},
                                    {"text": 3}])
def test_decide_refuses(answer):
    with pytest.raises(Refuse) as e:
        decide(answer)
    assert e.value.reason == "invalid"



def test_a_pid_of_another_user_is_live_only_with_a_fresh_heartbeat(monkeypatch):
    """Review finding 6: ``EPERM`` means someone else's process holds the
    pid: the server running as another user (its heartbeat is fresh) or a
    crashed server's pid reused (its heartbeat is old): stale."""
    from bridges.kimi_web import discovery as D

    def eperm(pid, sig):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(D.os, "kill", eperm)
    now = 1_800_000_000.0
    assert D.pid_alive(4242, now - 10, now=now) is True
    assert D.pid_alive(4242, (now - 10) * 1000, now=now) is True  # milliseconds
    assert D.pid_alive(4242, now - 3600, now=now) is False
    assert D.pid_alive(4242, 0.0, now=now) is True  # no heartbeat to tell by
