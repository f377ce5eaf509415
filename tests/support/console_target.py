"""A stub control target for the console's tests (issue 28): an emitter on
the relay's ``/socket`` (the SDK's blocking duplex, ``aep_sdk.control.open_duplex``)
that declares ``control.attention.respond`` and ``control.cancel``, emits
what a test asks (an AEP-0006 form, a hostile prompt, a flood of events),
and answers commands as an emitter must (AEP-0004 §3; AEP-0006's rule: a
``values`` that misses a required field or names no choice is
``control.rejected{reason: "invalid"}``). Fault injection and forms only:
the real answers go to real OpenCode."""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any

from aep_sdk.control import open_duplex
from aep_sdk.emit import ulid

ACCEPTS = ["control.attention.respond", "control.cancel", "x.stub.control.poke"]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def form_problem(fields: list[dict[str, Any]], values: Any) -> str | None:
    """Why ``values`` does not answer ``fields`` (AEP-0006), or ``None``."""
    if not isinstance(values, dict):
        return "values must be an object"
    for f in fields:
        v = values.get(f["id"])
        if v is None:
            if f.get("required"):
                return f"{f['id']} is required"
            continue
        if f["type"] == "number":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return f"{f['id']} must be a number"
            if ("min" in f and v < f["min"]) or ("max" in f and v > f["max"]):
                return f"{f['id']} is out of range"
        elif f["type"] == "boolean" and not isinstance(v, bool):
            return f"{f['id']} must be a boolean"
        elif f["type"] == "select":
            ids = {c["id"] for c in f["choices"]}
            picks = v if f.get("multi") else [v]
            if not isinstance(picks, list) or not all(isinstance(p, str) for p in picks):
                return f"{f['id']} must name choices"
            if not f.get("other") and any(p not in ids for p in picks):
                return f"{f['id']} names no choice"
    return None


class StubTarget:
    """One session of a stub agent on ``url``'s ``/socket`` with ``token``.
    ``commands``: every command delivered to it, in order."""

    def __init__(self, url: str, token: str | None, *, agent: str = "stub",
                 session: str = "stub-session-1", ack_window_ms: int = 10000,
                 lose_first: bool = False) -> None:
        self.url, self.token, self.agent, self.session = url, token, agent, session
        self.source = f"aep://stub-box/agent/{agent}/session/{session}"
        self.seq = 0
        # a new epoch per target: a second target of the same session (an emitter
        # restarted) must not reuse the positions a relay that remembers its
        # logs across its own restart still holds (AEP-0001 epochs)
        self.epoch = time.time_ns() // 1_000_000
        self.commands: list[dict[str, Any]] = []
        self.ack_window_ms = ack_window_ms
        #: fault injection: the first delivery of each command is lost (no
        #: decision, no ack); a redelivery (the same id) is then decided once
        self.lose_first = lose_first
        self._acks: dict[tuple[Any, Any], dict[str, Any] | None] = {}
        self.asks: dict[str, dict[str, Any]] = {}
        self.run: str | None = None
        self._lock = threading.Lock()
        self._hello = threading.Event()
        self._got = threading.Condition()
        self._duplex: Any = None

    def __enter__(self) -> "StubTarget":
        self._duplex = open_duplex(self.url, token=self.token, connect_timeout_ms=10_000)
        self._send({"type": "hello", "versions": ["0.1"], "role": "emitter",
                    "identity": {"agent": self.agent, "instance": "stub-box/1"},
                    "capabilities": {"emits": ["session", "run", "attention", "control"],
                                     "control": {"accepts": ACCEPTS,
                                                 "ack_window_ms": self.ack_window_ms}}})
        threading.Thread(target=self._read, name="stub-target", daemon=True).start()
        if not self._hello.wait(10):
            raise AssertionError("stub target: no hello from the relay")
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._duplex.close()
        except Exception:  # noqa: BLE001 -- closing a socket that is gone
            pass

    def _send(self, obj: dict[str, Any]) -> None:
        with self._lock:
            self._duplex.send_json(obj)

    def emit(self, type_: str, data: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """Emit one sequenced event of this session; returns it."""
        with self._lock:
            ev = {"aep": "0.1", "id": ulid(), "type": type_, "time": _now(), "source": self.source,
                  "agent": self.agent, "session": self.session, "seq": self.seq, "epoch": self.epoch,
                  "data": data if data is not None else {}, **kw}
            self.seq += 1
            self._duplex.send_json(ev)
        if type_ == "attention.requested":
            self.asks[ev["id"]] = ev
        return ev

    def wait_commands(self, n: int, timeout: float = 30) -> list[dict[str, Any]]:
        """Block until ``n`` commands arrived; all of them."""
        with self._got:
            if not self._got.wait_for(lambda: len(self.commands) >= n, timeout):
                raise AssertionError(f"stub target: {len(self.commands)} commands, wanted {n}")
            return list(self.commands)

    def _read(self) -> None:
        while True:
            try:
                msg = self._duplex.recv_json()
            except Exception:  # noqa: BLE001 -- the socket closed under the reader
                return
            if msg is None:
                return
            t = msg.get("type")
            if t == "hello":
                self._hello.set()
            elif t == "ping":
                self._send({"type": "pong", "t": msg.get("t")})
            elif isinstance(t, str) and t.startswith(("control.", "x.")) and "seq" not in msg:
                with self._got:
                    self.commands.append(msg)
                    self._got.notify_all()
                key = (msg.get("source"), msg.get("id"))
                if key not in self._acks and self.lose_first:
                    self._acks[key] = None  # lost: neither decided nor acknowledged
                elif self._acks.get(key) is not None:  # AEP-0004 §3: the recorded ack again
                    self._send(self._acks[key])  # type: ignore[arg-type]
                else:
                    self._acks[key] = self._answer(msg)

    def _answer(self, cmd: dict[str, Any]) -> dict[str, Any]:
        t = cmd["type"]
        if t == "control.attention.respond":
            ask = self.asks.get(cmd.get("subject", ""))
            answer = (cmd.get("data") or {}).get("answer") or {}
            problem = "no such request" if ask is None else None
            if ask is not None and ask["data"].get("kind") == "form":
                problem = form_problem(ask["data"]["fields"], answer.get("values"))
            if problem:
                return self.emit("control.rejected", {"reason": "invalid", "detail": problem},
                                 cause=cmd["id"], severity="notice", capture="redacted")
            ack = self.emit("control.accepted", {}, cause=cmd["id"], severity="notice")
            answered = self.emit("attention.answered", {"answer": answer, "via": "control"},
                                 cause=cmd["id"], subject=ask["id"], capture="redacted")
            self.emit("attention.resolved", {"resolution": "answered"}, cause=answered["id"],
                      subject=ask["id"])
            return ack
        if t == "control.cancel":
            ack = self.emit("control.accepted", {}, cause=cmd["id"], severity="notice")
            if self.run:
                self.emit("run.cancelled", {"by": "control"}, cause=cmd["id"], run=self.run)
                self.run = None
            return ack
        return self.emit("control.accepted", {}, cause=cmd["id"], severity="notice")
