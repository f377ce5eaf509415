"""The daemon as an operator runs it: ``aep-bridges run`` in its own process.

Refusal of bad configuration before anything binds (exit 2, one line per
problem), OTLP in -> JSONL + SDK consumer out, ``/healthz`` with and without
the token, and SIGTERM -> orderly exit 0."""
from __future__ import annotations

import json
import socket
import subprocess
import time

import httpx

from tests.support.daemon import Collector, console_script, run_daemon
from tests.support.net import free_port
from tests.support.schema import validate_event


def otlp_json(conversation: str, name: str = "codex.conversation_starts", **attrs) -> dict:
    kv = [{"key": "event.name", "value": {"stringValue": name}},
          {"key": "conversation.id", "value": {"stringValue": conversation}},
          {"key": "model", "value": {"stringValue": "mock-model"}}]
    kv += [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]
    return {"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "codex_exec"}}]},
        "scopeLogs": [{"logRecords": [{"timeUnixNano": str(time.time_ns()), "attributes": kv}]}],
    }]}


def test_bad_configuration_is_refused_before_anything_binds(tmp_path):
    port = free_port()
    env = {"AEP_LISTEN": f"127.0.0.1:{port}", "AEP_BRIDGE_BOGUS": "1", "AEP_BUFFER": "x",
           "AEP_CAPTURE": "most", "AEP_OTLP_GRPC_LISTEN": "nowhere"}
    with run_daemon(tmp_path, env, wait=False) as d:
        assert d.proc.wait(timeout=30) == 2
        lines = [ln for ln in d.log().splitlines() if ln.strip()]
    assert all(ln.startswith("aep-bridges: config: ") for ln in lines), lines
    text = "\n".join(lines)
    for needle in ("AEP_BRIDGE_BOGUS", "AEP_BUFFER", "AEP_CAPTURE"):
        assert needle in text
    # nothing bound: the relay port is still free
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_bridge_preflight_problems_are_refused_too(tmp_path):
    with run_daemon(tmp_path, {"AEP_OTLP_GRPC_LISTEN": "nowhere"}, wait=False) as d:
        assert d.proc.wait(timeout=30) == 2
    assert "AEP_OTLP_GRPC_LISTEN" in d.log()


def test_port_in_use_is_refused(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with run_daemon(tmp_path, {"AEP_LISTEN": f"127.0.0.1:{port}"}, wait=False) as d:
            assert d.proc.wait(timeout=30) == 2
    assert f"AEP_LISTEN=127.0.0.1:{port}: address in use" in d.log()


def test_check_subcommand(tmp_path):
    ok = subprocess.run(console_script() + ["check", "--no-ports"], capture_output=True, text=True,
                        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert ok.returncode == 0 and "otlp_in" in ok.stdout
    bad = subprocess.run(console_script() + ["check"], capture_output=True, text=True,
                         env={"HOME": str(tmp_path), "AEP_BRIDGE_ACP": "1",
                              "AEP_ACP_AGENTS": "not an id"}, timeout=60)
    assert bad.returncode == 2 and "AEP_ACP_AGENTS" in bad.stderr


def test_check_creates_nothing_and_a_relative_state_dir_is_refused(tmp_path):
    """``check`` reports a missing state directory as to be created (it
    creates nothing); a relative AEP_STATE_DIR is refused by check and run."""
    base = {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    state = tmp_path / "a" / "state"
    ok = subprocess.run(console_script() + ["check"], capture_output=True, text=True,
                        env={**base, "AEP_STATE_DIR": str(state)}, timeout=60, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert f"state directory {state} will be created" in ok.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))
    for cmd in (["check"], ["check", "--no-ports"], ["run"]):
        bad = subprocess.run(console_script() + cmd, capture_output=True, text=True,
                             env={**base, "AEP_STATE_DIR": "rel/state"}, timeout=60, cwd=tmp_path)
        assert bad.returncode == 2 and "AEP_STATE_DIR='rel/state': must be an absolute path" \
            in bad.stderr, (cmd, bad.stderr)
    assert not (tmp_path / "rel").exists()


def test_otlp_to_jsonl_and_sdk_stream_then_sigterm(tmp_path):
    token = "t0k-" + "x" * 20
    with run_daemon(tmp_path, {"AEP_TOKEN": token}) as d:
        col = Collector(d.url, token=token, filter={"agent": "codex"})
        try:
            time.sleep(0.5)  # the SDK consumer attaches live-only
            http = d.env["AEP_OTLP_HTTP_LISTEN"]
            r = httpx.post(f"http://{http}/v1/logs", json=otlp_json("conv-d1"), timeout=10)
            assert r.status_code == 200, r.text
            ev = col.first(lambda e: e.get("session") == "conv-d1")
        finally:
            col.close()
        # primary mode by default (issue 29): the conversation start is session.started
        assert ev["type"] == "session.started"
        assert ev["agent"] == "codex" and ev["source"].endswith("/agent/codex/session/conv-d1")
        validate_event(ev)
        log_file = tmp_path / "state" / "logs" / "codex" / "conv-d1.jsonl"
        assert json.loads(log_file.read_text().splitlines()[0])["id"] == ev["id"]

        anon = d.healthz()
        authed = d.healthz(token)
        assert anon["ok"] is True and anon["relay"] is True
        assert anon["bridges"]["otlp_in.codex"] == {"ok": True, "relay": True, "source": True,
                                                    "control": False}
        assert "counts" not in anon and "counts" in authed
        assert authed["counts"]["events"] >= 1 and authed["counts"]["jsonl_lines"] >= 1

        t0 = time.monotonic()
        status = d.stop(timeout=15)
        elapsed = time.monotonic() - t0
    assert status == 0, d.log()
    assert elapsed < 15  # generous: the daemon's own hard deadline is 5 s
    assert '"received SIGTERM: draining"' in d.log() or "received SIGTERM" in d.log()
    assert "otlp_in.codex: primary mode" in d.log()  # said at start
    assert token not in d.log()


def test_epoch_increases_across_daemon_restarts(tmp_path):
    epochs = []
    for _ in range(2):
        with run_daemon(tmp_path) as d:
            http = d.env["AEP_OTLP_HTTP_LISTEN"]
            httpx.post(f"http://{http}/v1/logs", json=otlp_json("conv-e"), timeout=10)
            time.sleep(0.3)
            assert d.stop() == 0
        lines = (tmp_path / "state" / "logs" / "codex" / "conv-e.jsonl").read_text().splitlines()
        epochs.append(json.loads(lines[-1])["epoch"])
    assert epochs[1] > epochs[0]


def test_sigint_also_drains(tmp_path):
    import signal
    with run_daemon(tmp_path) as d:
        d.proc.send_signal(signal.SIGINT)
        assert d.proc.wait(timeout=15) == 0


def test_core_and_bridge_problems_are_reported_together(tmp_path):
    env = {"AEP_BUFFER": "abc", "AEP_OTLP_VENDOR": "foo", "AEP_OTLP_PRIMARY": "maybe",
           "AEP_LOG_LEVEL": "loud", "AEP_LISTN": "x"}
    with run_daemon(tmp_path, env, wait=False) as d:
        assert d.proc.wait(timeout=30) == 2
    log = d.log()
    for needle in ("AEP_BUFFER='abc'", "unknown vendor 'foo'", "AEP_OTLP_PRIMARY='maybe'",
                   "AEP_LOG_LEVEL='loud'", "warning: AEP_LISTN is not a setting"):
        assert needle in log, log
    assert "Traceback" not in log


def test_check_no_ports_skips_every_port_probe(tmp_path):
    with socket.socket() as busy, socket.socket() as busy2:
        for b in (busy, busy2):
            b.bind(("127.0.0.1", 0))
            b.listen()
        port, port2 = busy.getsockname()[1], busy2.getsockname()[1]
        env = {"HOME": str(tmp_path), "AEP_OTLP_GRPC_LISTEN": f"127.0.0.1:{port}",
               "AEP_LISTEN": f"127.0.0.1:{port2}", "AEP_OTLP_HTTP_LISTEN": "127.0.0.1:0"}
        loose = subprocess.run(console_script() + ["check", "--no-ports"], capture_output=True,
                               text=True, env=env, timeout=60)
        strict = subprocess.run(console_script() + ["check"], capture_output=True, text=True,
                                env=env, timeout=60)
    assert loose.returncode == 0, loose.stderr
    assert strict.returncode == 2 and "address in use" in strict.stderr


def test_unwritable_state_dir_is_refused(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    with run_daemon(tmp_path, {"AEP_STATE_DIR": str(blocker / "state")}, wait=False) as d:
        assert d.proc.wait(timeout=30) == 2
    assert "AEP_STATE_DIR=" in d.log() and "not writable" in d.log()


def test_a_second_signal_during_the_drain_still_exits_0(tmp_path):
    import signal
    with run_daemon(tmp_path) as d:
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        d.proc.send_signal(signal.SIGINT)
        assert d.proc.wait(timeout=15) == 0, d.log()


def test_a_consumer_stuck_on_http2_flow_control_cannot_hold_the_exit(tmp_path):
    """An h2 (prior knowledge) SSE consumer announcing a zero window once
    blocked the relay's shielded send on flow control and held the exit;
    HTTP/2 is now refused at the connection, and the exit is clean."""
    import signal

    import h2.config
    import h2.connection
    import h2.settings

    with run_daemon(tmp_path) as d:
        host, port = d.url.removeprefix("http://").rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
        try:
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            conn.initiate_connection()
            conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, [(":method", "GET"), (":path", "/stream"), (":scheme", "http"),
                                    (":authority", f"{host}:{port}")], end_stream=True)
            s.sendall(conn.data_to_send())
            s.settimeout(10)
            assert s.recv(65536) == b""  # refused: the server closed, no HTTP/2 frames
            http = d.env["AEP_OTLP_HTTP_LISTEN"]
            for i in range(20):
                httpx.post(f"http://{http}/v1/logs", json=otlp_json(f"conv-h2-{i}"), timeout=10)
            time.sleep(0.5)
            t0 = time.monotonic()
            d.proc.send_signal(signal.SIGTERM)
            status = d.proc.wait(timeout=30)  # the stuck client is still connected
            elapsed = time.monotonic() - t0
        finally:
            s.close()
    # HTTP/2 is refused outright (hypercorn's h2 sends buffer without bound
    # behind a zero window), so nothing is stuck and the drain is clean
    assert status == 0, (status, d.log())
    assert elapsed < 30


def test_relay_and_otlp_on_one_port_is_refused(tmp_path):
    port = free_port()
    with run_daemon(tmp_path, {"AEP_LISTEN": f"127.0.0.1:{port}",
                               "AEP_OTLP_HTTP_LISTEN": f"127.0.0.1:{port}"}, wait=False) as d:
        assert d.proc.wait(timeout=30) == 2
    assert "is also a listener of otlp_in.codex" in d.log()


def test_a_second_daemon_on_one_state_directory_is_refused(tmp_path):
    """Two daemons on one state directory would both write its session logs
    and state files (a review lost 1 line of 600 that way): the second one,
    on ports of its own, exits 2 naming the first one's pid, before it binds
    or writes anything. A kill -9 leaves no stale lock behind."""
    import signal
    with run_daemon(tmp_path) as first:
        logs = tmp_path / "state" / "logs"

        def written() -> list[str]:  # the first one's spare files are still being made
            return sorted(str(p) for p in logs.rglob("*") if ".spare" not in p.parts)
        before = written()
        with run_daemon(tmp_path, wait=False) as second:
            assert second.proc.wait(timeout=30) == 2
        text = second.log()
        assert f"in use by aep-bridges pid {first.proc.pid}" in text, text
        assert "AEP_STATE_DIR=" in text
        with socket.socket() as s:  # the refused one bound nothing
            s.bind(("127.0.0.1", second.port))
        assert written() == before
        # the same ports too: the ports' refusal names the holder as well
        same = {k: first.env[k] for k in ("AEP_LISTEN", "AEP_OTLP_GRPC_LISTEN",
                                          "AEP_OTLP_HTTP_LISTEN")}
        with run_daemon(tmp_path, same, wait=False) as twin:
            assert twin.proc.wait(timeout=30) == 2
        assert f"in use by aep-bridges pid {first.proc.pid}" in twin.log(), twin.log()
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
        with run_daemon(tmp_path) as third:  # the dead holder's lock went with it
            r = httpx.get(third.url + "/healthz", timeout=10)
            assert r.status_code in (200, 401, 503)


def test_standalone_relay_reports_no_earlier_session_log(tmp_path):
    # issue 29: `aep-bridges relay` over the state directory of an earlier
    # daemon reported that daemon's session-log bytes in /healthz
    logs = tmp_path / "state" / "logs" / "codex"
    logs.mkdir(parents=True)
    earlier = logs / "conv-old.jsonl"
    earlier.write_bytes(b'{"aep":"0.1"}\n' * 500)
    with run_daemon(tmp_path, {"AEP_TOKEN": "t0k3n-relay"}, args=("relay",), healthy=True) as d:
        counts = d.healthz("t0k3n-relay")["counts"]
        assert counts["jsonl_bytes"] == 0 and counts["jsonl_lines"] == 0
    assert earlier.stat().st_size == 7000  # not the relay's to repair or sweep


def test_timeline_and_validate_read_the_daemons_own_session_log(tmp_path):
    # issue 29: `aep-bridges timeline FILE` and `validate FILE` on a real log
    with run_daemon(tmp_path) as d:
        http = d.env["AEP_OTLP_HTTP_LISTEN"]
        r = httpx.post(f"http://{http}/v1/logs", json=otlp_json("conv-tl"), timeout=10)
        assert r.status_code == 200
        assert d.stop() == 0
    log = tmp_path / "state" / "logs" / "codex" / "conv-tl.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    shown = subprocess.run(console_script() + ["timeline", str(log)], capture_output=True,
                           text=True, env=env, timeout=60)
    assert shown.returncode == 0 and not shown.stderr, shown.stderr
    rows = [ln for ln in shown.stdout.splitlines() if not ln.startswith("── ")]
    assert len(rows) == len(events)
    assert all(e["type"] in row for e, row in zip(events, rows, strict=True))
    checked = subprocess.run(console_script() + ["validate", str(log)], capture_output=True,
                             text=True, env=env, timeout=60)
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout.strip() == f"{log}: {len(events)} event(s), all valid"
    # a line broken by hand is named with its number
    broken = tmp_path / "broken.jsonl"
    broken.write_text(log.read_text() + '{"aep": "0.1", "type": "Bad"}\n')
    checked = subprocess.run(console_script() + ["validate", str(broken)], capture_output=True,
                             text=True, env=env, timeout=60)
    assert checked.returncode == 1 and f"{broken}:{len(events) + 1}: " in checked.stdout


def test_an_opencode_bridge_with_no_server_says_what_to_start(tmp_path):
    # issue 29: a bare "ConnectError" left a new user guessing
    url = f"http://127.0.0.1:{free_port()}"
    with run_daemon(tmp_path, {"AEP_BRIDGE_OTLP_IN": "0", "AEP_BRIDGE_OPENCODE_SSE": "1",
                               "AEP_OPENCODE_URL": url}) as d:
        deadline = time.monotonic() + 30
        while "ConnectError" not in d.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert d.stop() == 0
    assert f"failed: ConnectError (nothing answers there: is `opencode serve` running at {url}?" \
        in d.log(), d.log()[-2000:]
