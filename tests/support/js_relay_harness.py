"""The JetStream relay for the tests (issue 14): in process on a loopback
port against a real nats-server (:func:`running_js_relay`), as the real
``aep-bridges relay`` subprocess (:func:`relay_process`), a direct stream
publisher standing in for a daemon's JetStream sink (:class:`StreamPublisher`:
the same subjects and headers), and an AEP SDK emitter attached to a relay's
``/socket`` that answers commands with the SDK's ``ControlTarget``
(:class:`SocketEmitter`)."""
from __future__ import annotations

import json
import threading
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator

import trio

from supervisor.jetstream.config import NatsConfig, from_env
from supervisor.jetstream.link import Link, aio, open_link
from supervisor.jetstream.relay import JetStreamRelay
from supervisor.jetstream.subjects import event_headers, event_subject_of
from supervisor.relay.serve import serve_relay
from tests.support.daemon import DaemonProcess

TOKEN = "js-relay-test-token"


def nats_config(url: str, **env: str) -> NatsConfig:
    """The ``AEP_NATS_*`` config for ``url`` plus ``env`` (``AEP_NATS_*`` names)."""
    cfg, problems = from_env({"AEP_NATS_URL": url, **env})
    assert cfg is not None, problems
    return cfg


@asynccontextmanager
async def running_js_relay(url: str, *, env: dict[str, str] | None = None,
                           **relay_kw: Any) -> AsyncIterator[tuple[JetStreamRelay, str]]:
    """``async with running_js_relay(cluster.url, token=...) as (relay, base):``
    a :class:`JetStreamRelay` served on 127.0.0.1 (port 0), closed in order."""
    cfg = nats_config(url, **(env or {}))
    stop = trio.Event()
    async with open_link(cfg, name="test relay") as link, trio.open_nursery() as outer:
        relay = JetStreamRelay(link, cfg, **relay_kw)
        await outer.start(relay.run)
        async with trio.open_nursery() as inner:
            host, port = await inner.start(partial(serve_relay, relay, ("127.0.0.1", 0),
                                                   shutdown=stop))
            try:
                yield relay, f"http://{host}:{port}"
            finally:
                stop.set()
        outer.cancel_scope.cancel()


def relay_process(state: Path, url: str, *, token: str | None = TOKEN,
                  env: dict[str, str] | None = None) -> DaemonProcess:
    """The real ``aep-bridges relay`` with ``AEP_NATS_URL=url`` (not started)."""
    return DaemonProcess(state, {"AEP_NATS_URL": url, **(env or {})}, args=("relay",),
                         token=token)


async def ensure_stream(link: Link, name: str = "AEP", **config: Any) -> None:
    """Create the stream ``name`` with ``config`` (e.g. ``max_msgs=10``,
    ``num_replicas=3``) before any relay or publisher makes the default one."""
    await aio(link.js.add_stream)(name=name, subjects=[f"{name}.ev.>"], allow_direct=True,
                                  **config)


class StreamPublisher:
    """Publishes AEP events straight into the stream as a daemon's sink
    does (subject ``S.ev.<agent>.<session>``, ``Nats-Msg-Id``, the position
    and severity headers), retrying until acknowledged (through a leader
    change). ``published``: the events acknowledged, in order."""

    def __init__(self, link: Link, stream: str = "AEP") -> None:
        self.link = link
        self.stream = stream
        self.published: list[dict[str, Any]] = []

    async def publish(self, ev: dict[str, Any], *, deadline: float = 60.0) -> int:
        headers = event_headers(ev, "test-publisher")
        body = json.dumps(ev, separators=(",", ":")).encode()
        with trio.fail_after(deadline):
            while True:
                try:
                    ack = await aio(self.link.js.publish)(event_subject_of(self.stream, ev), body,
                                                          headers=headers, timeout=2.0)
                    self.published.append(ev)
                    return int(ack.seq)
                except Exception:  # noqa: BLE001 -- no leader yet / reconnecting: retry
                    await trio.sleep(0.2)


class SocketEmitter:
    """An emitter on a relay's ``/socket`` built from the AEP SDK: the
    blocking ``open_duplex``, an ``Emitter``/``SessionEmitter`` whose sink is
    the socket, and a ``ControlTarget`` answering the commands routed to it
    (``executed``: the commands it accepted). A reader thread handles frames."""

    def __init__(self, url: str, *, token: str | None, agent: str = "codex",
                 host: str = "box-a", accepts: list[str] | None = None) -> None:
        import aep_sdk
        from aep_sdk.control import ControlTarget, open_duplex
        self.duplex = open_duplex(url, token=token, connect_timeout_ms=10_000)
        self.accepts = accepts or []
        hello: dict[str, Any] = {
            "type": "hello", "versions": ["0.1"], "role": "emitter",
            "identity": {"agent": agent, "instance": f"{host}/{agent}"},
            "capabilities": {"emits": ["run", "tool", "control"]}}
        if accepts is not None:
            hello["capabilities"]["control"] = {"accepts": accepts, "ack_window_ms": 10_000}
        self._lock = threading.Lock()
        self.frames: list[dict[str, Any]] = []
        self.executed: list[dict[str, Any]] = []
        self.duplex.send_json(hello)
        self.emitter = aep_sdk.Emitter(agent, host, self._send)
        self._targets: dict[str, Any] = {}
        self._ControlTarget = ControlTarget
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _send(self, ev: dict[str, Any]) -> None:
        with self._lock:
            self.duplex.send_json(ev)

    def session(self, sid: str) -> Any:
        s = self.emitter.session(sid)
        self._targets[sid] = self._ControlTarget(s, self.accepts)
        return s

    def _read(self) -> None:
        while True:
            try:
                frame = self.duplex.recv_json()
            except Exception:  # noqa: BLE001 -- the socket closed under us
                return
            if frame is None:
                return
            self.frames.append(frame)
            t = frame.get("type")
            if isinstance(t, str) and t.startswith("control.") and frame.get("session") in self._targets:
                self._targets[frame["session"]].handle(frame, self.executed.append)

    def close(self) -> None:
        try:
            self.duplex.close()
        except Exception:  # noqa: BLE001 -- already closed
            pass


def roster_of(url: str) -> list[dict[str, Any]]:
    """The relay's roster at ``url`` as the AEP SDK's ``ControlClient`` sees it."""
    import aep_sdk
    client = aep_sdk.ControlClient(url, agent="tester", host="laptop", token=TOKEN)
    client.connect(connect_timeout_ms=10_000)
    try:
        return client.roster()
    finally:
        client.close()
