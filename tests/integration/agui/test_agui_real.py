"""The real peers through the real daemon: the pydantic-ai AG-UI server
(``pydantic-ai-slim[ag-ui]``, ``TestModel``, one tool) behind the daemon's
AG-UI bridge, the real ``@ag-ui/client`` 1.0.0 ``HttpAgent`` on Node and
httpx as the UI, and the protocol's SDK consumer on the daemon's relay.

- transparency: the bytes the UI receives through the proxy are the bytes
  the agent server sent (its tap), for the same run;
- the real client accepts the proxied stream (its ``verifyEvents`` runs over
  it) and rebuilds the same messages as direct;
- the AEP stream shows the mapped story, schema-valid;
- ``ag-ui-validate`` (PyPI 0.4.0), when it can read the capture, finds no
  violation in what went through the proxy.
"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import trio

from tests.support.agui import STORY, AguiDaemon, AguiServer, node_client_run, post_run
from tests.support.schema import validate_stream
from tests.support.vendors import skip_loudly

pytestmark = pytest.mark.vendor


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = AguiServer(tmp_path_factory.mktemp("agui-server")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def daemon(server, tmp_path_factory):
    d = AguiDaemon(tmp_path_factory.mktemp("agui-daemon") / "state", server.url,
                   token="agui-test-token-0123456789")
    d.start()
    yield d
    d.stop()


def ids() -> tuple[str, str]:
    u = uuid.uuid4().hex[:10]
    return f"thread-{u}", f"run-{u}"


def shape(messages: list[dict]) -> list[dict]:
    """The messages the client rebuilt, without the ids pydantic-ai makes up
    fresh for every run (uuid4 message ids)."""
    out = []
    for m in messages:
        s = {"role": m.get("role"), "content": m.get("content")}
        if m.get("toolCalls"):
            s["toolCalls"] = [{"id": t["id"], "name": t["function"]["name"],
                               "arguments": t["function"]["arguments"]} for t in m["toolCalls"]]
        if m.get("toolCallId"):
            s["toolCallId"] = m["toolCallId"]
        out.append(s)
    return out


async def test_the_ui_receives_exactly_what_the_agent_sent(server, daemon):
    thread, run = ids()
    status, headers, body = await trio.to_thread.run_sync(
        lambda: post_run(daemon.proxy_url, thread, run))
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert body == server.sent(run)
    assert b'"type":"RUN_FINISHED"' in body


async def test_concurrent_runs_through_the_proxy_are_each_what_the_agent_sent(server, daemon):
    runs = [ids() for _ in range(8)]
    got: dict[str, bytes] = {}

    async def one(thread: str, run: str) -> None:
        status, _, body = await trio.to_thread.run_sync(
            lambda: post_run(daemon.proxy_url, thread, run))
        assert status == 200
        got[run] = body

    async with trio.open_nursery() as nursery:
        for thread, run in runs:
            nursery.start_soon(one, thread, run)
    for _, run in runs:
        assert got[run] == server.sent(run) and b'"type":"RUN_FINISHED"' in got[run]


async def test_the_real_client_accepts_the_proxied_stream_and_rebuilds_the_same_messages(
        server, daemon):
    t1, r1 = ids()
    t2, r2 = ids()
    direct = await trio.to_thread.run_sync(lambda: node_client_run(server.url + "/", t1, r1))
    proxied = await trio.to_thread.run_sync(lambda: node_client_run(daemon.proxy_url + "/", t2, r2))
    assert direct["ok"] and proxied["ok"], (direct.get("error"), proxied.get("error"))
    assert [e["type"] for e in proxied["events"]] == [e["type"] for e in direct["events"]]
    assert shape(proxied["messages"]) == shape(direct["messages"])
    rebuilt = shape(proxied["messages"])
    assert [m["role"] for m in rebuilt] == ["user", "assistant", "tool", "tool", "activity",
                                            "assistant"]
    assert [t["name"] for t in rebuilt[1]["toolCalls"]] == ["lookup", "plan"]
    assert proxied["state"] == direct["state"] == {"goal": "a", "steps": 3}  # snapshot + delta
    # and what the client decoded through the proxy is what the agent sent
    sent = [json.loads(line[6:]) for line in server.sent(r2).decode().split("\n")
            if line.startswith("data: ")]
    assert proxied["events"] == sent


async def test_the_aep_stream_tells_the_mapped_story(server, daemon):
    thread, run = ids()
    sub = daemon.subscribe(filter={"agent": "agui"})
    try:
        await trio.to_thread.run_sync(lambda: node_client_run(daemon.proxy_url + "/", thread, run))
        story = await sub.wait_for(
            lambda c: c.of(thread, "run.finished") and c.of(thread), what="the run on the AEP stream")
        events = sub.of(thread)
    finally:
        sub.close()
    assert story
    assert tuple(e["type"] for e in events) == STORY
    assert {e["run"] for e in events} == {run} and {e["agent"] for e in events} == {"agui"}
    assert [e["data"]["tool"]["name"] for e in events if e["type"] == "tool.completed"] == [
        "lookup", "plan"]
    assert [e.get("step") for e in events if e["type"].startswith("state.")] == ["planning"] * 2
    assert all(e["capture"] in ("metadata", "none") for e in events)
    validate_stream(events)


async def test_health_and_a_command_is_refused_unsupported(daemon):
    from tests.support.daemon import command
    body = await trio.to_thread.run_sync(daemon.healthz)
    agui = body["bridges"]["agui"]
    assert {k: agui[k] for k in ("ok", "relay", "source", "control")} == {
        "ok": True, "relay": True, "source": True, "control": False}
    assert "agui.client_disconnects" not in agui.get("counters", {})  # every run ran to its end
    thread, run = ids()
    await trio.to_thread.run_sync(lambda: post_run(daemon.proxy_url, thread, run))
    reason, _ = await command(daemon, "control.cancel", thread)
    assert reason == "unsupported"  # read-only: control.accepts is []


def validate_capture(path) -> dict:
    exe = Path(sys.executable).with_name("ag-ui-validate")
    if not exe.exists():
        skip_loudly("ag-ui-validate (test extra, PyPI 0.4.0) is not installed")
    proc = subprocess.run([str(exe), "--json", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_ag_ui_validate_finds_nothing_wrong_in_the_proxied_stream(daemon, tmp_path):
    thread, run = ids()
    _, _, body = post_run(daemon.proxy_url, thread, run)
    capture = tmp_path / "proxied.sse"
    capture.write_bytes(body)
    report = validate_capture(capture)
    assert report["eventCount"] == body.count(b"\n\ndata: ") + 1
    assert report["summary"] == {"errors": 0, "warnings": 0, "info": 0}, report["diagnostics"]
    # the check can fail: the same stream without its RUN_FINISHED is an error
    cut = b"\n\n".join(p for p in body.split(b"\n\n") if b"RUN_FINISHED" not in p)
    broken = tmp_path / "broken.sse"
    broken.write_bytes(cut)
    assert validate_capture(broken)["summary"]["errors"] >= 1


def validate_live(url: str) -> dict:
    exe = Path(sys.executable).with_name("ag-ui-validate")
    if not exe.exists():
        skip_loudly("ag-ui-validate (test extra, PyPI 0.4.0) is not installed")
    proc = subprocess.run([str(exe), "--json", url], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_ag_ui_validate_live_through_the_proxy_judges_it_as_the_agent_direct(server, daemon):
    """Live mode also checks what a capture cannot: the Content-Type, chunk
    timing, keep-alives, an abnormal end."""
    direct, proxied = validate_live(server.url + "/"), validate_live(daemon.proxy_url + "/")
    assert proxied["summary"] == direct["summary"] == {"errors": 0, "warnings": 0, "info": 0}
    assert proxied["eventCount"] == direct["eventCount"] > 0
    assert proxied["skipped"] == direct["skipped"]
