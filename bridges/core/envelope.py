"""Envelope stamping (AEP-0001 §5, §7): ULID ids, ``source`` URIs,
per-session monotonic ``seq``, a never-repeating ``epoch``, default severity,
and the capture gate applied to every payload (AEP-0003 §9.1, §9.5).

Design: ``shared/DESIGN.md`` ("Envelope stamping is shared")."""
from __future__ import annotations

import json
import logging
import os
import socket
import time as _time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from . import capture as _capture
from .aep import AEP_VERSION
from .paths import write_atomic

if TYPE_CHECKING:
    from .bridge import Emission, Gating

log = logging.getLogger("aep.core.envelope")

# Default severity per type where AEP-0002 recommends one; the emission's own
# ``severity`` wins. Everything else is ``info`` (omitted on the wire).
_DEFAULT_SEVERITY = {
    "attention.requested": "notice",
    "attention.timeout": "warning",
    "error.raised": "error",
    "run.failed": "error",
    "tool.failed": "warning",
    "tool.denied": "notice",
    "control.rejected": "notice",
    "control.accepted": "notice",
    "session.started": "notice",
    "session.ended": "notice",
    "run.cancelled": "notice",
}


def rfc3339(dt: datetime | None = None) -> str:
    """``2026-11-30T12:00:00.123Z`` (UTC, millisecond precision)."""
    dt = dt or datetime.now(timezone.utc)
    return dt.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# a random byte -> one character (its low 5 bits; 256 = 8 x 32, so uniform)
_BYTE_TO_CHAR = bytes((ord(_CROCKFORD[b % 32]) for b in range(256)))
_POOL_IDS = 256


class Ulids:
    """ULIDs built exactly as the SDK builds them (``aep_sdk.ulid``: the
    millisecond time in 10 Crockford base32 characters, then 16 characters
    each from one random byte, 80 random bits), made for the stamper's hot
    path: the random bytes come from ``os.urandom`` in blocks of
    :data:`_POOL_IDS` ids (one system call per block, not one per id), are
    spelled with one ``bytes.translate``, and the time part is spelled once
    per millisecond. Not thread-safe (one per stamper)."""

    def __init__(self) -> None:
        self._pool = b""
        self._pos = 0
        self._ms = -1
        self._time = ""

    def __call__(self, now_ms: int | None = None) -> str:
        """A new id; ``now_ms``: the time part (default: the clock)."""
        t = _time.time_ns() // 1_000_000 if now_ms is None else now_ms
        if t != self._ms:
            self._ms, self._time = t, _time_part(t)
        pos = self._pos
        if pos + 16 > len(self._pool):
            self._pool, pos = os.urandom(16 * _POOL_IDS), 0
        self._pos = pos + 16
        return self._time + self._pool[pos:pos + 16].translate(_BYTE_TO_CHAR).decode("ascii")


def _time_part(ms: int) -> str:
    out = ""
    for _ in range(10):
        out = _CROCKFORD[ms % 32] + out
        ms //= 32
    return out


def is_agent_scoped(type_: str) -> bool:
    """``agent.*`` events omit ``session``/``run``/``step``/``seq`` (AEP-0001 §5.2)."""
    return type_.startswith("agent.")


class EpochStore:
    """Hands out the daemon's epoch: a counter persisted at
    ``{state_dir}/epoch`` and bumped once per daemon start, so no session ever
    sees an epoch twice across restarts (AEP-0001 §7 rule 2).

    When the state directory cannot be written the epoch is seeded from the
    wall clock in seconds (monotonic across restarts on any sane host); the
    fallback is logged once."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / "epoch"

    def next_epoch(self) -> int:
        """``max(persisted + 1, now in seconds)``: strictly above every epoch
        this state dir handed out, and above any clock-seeded epoch a start
        with an unwritable state dir may have used (so the fallback can
        never make a later epoch regress)."""
        seed = int(_time.time())
        try:
            prev = int(json.loads(self.path.read_text())["epoch"])
        except FileNotFoundError:
            prev = -1
        except (OSError, ValueError, KeyError, TypeError, OverflowError) as e:
            log.warning("epoch file unreadable (%s); seeding from the clock", type(e).__name__)
            prev = -1
        epoch = max(prev + 1, seed)
        try:
            write_atomic(self.path, json.dumps({"epoch": epoch}), fsync=True)
        except OSError as e:
            log.warning("cannot persist epoch under %s (%s); seeded from the clock",
                        self.path.parent, e.strerror or type(e).__name__)
        return epoch


class Stamper:
    """Turns emissions into envelopes for one emitter identity.

    ``agent``: the AEP agent id; ``host``: the ``source`` authority;
    ``epoch``: this daemon run's epoch; ``policy``: the capture posture.
    Not thread-safe; one per bridge, used from trio tasks only."""

    def __init__(self, agent: str, *, epoch: int = 0, host: str | None = None,
                 policy: _capture.CapturePolicy | None = None) -> None:
        self.agent = agent
        self.host = host or socket.gethostname() or "localhost"
        self.epoch = epoch
        self.policy = policy or _capture.CapturePolicy()
        self._seq: dict[str, int] = {}
        self._ulid = Ulids()
        self._sources: dict[str, str] = {}  # session -> source (one per sequenced session)
        self._sources_of = (self.host, self.agent)
        # type -> ceiling under ``_ceilings_of`` (``policy`` may be replaced)
        self._ceilings: dict[str, str] = {}
        self._ceilings_of = self.policy

    def source(self, session: str | None) -> str:
        base = f"aep://{self.host}/agent/{self.agent}"
        return f"{base}/session/{session}" if session else base

    def _ceiling(self, type_: str) -> str:
        if self._ceilings_of is not self.policy:
            self._ceilings, self._ceilings_of = {}, self.policy
        c = self._ceilings.get(type_)
        if c is None:
            c = self._ceilings[type_] = self.policy.ceiling_for(type_)
        return c

    def knows(self, session: str) -> bool:
        """Whether this stamper has stamped a sequenced event for ``session``."""
        return session in self._seq

    def next_seq(self, session: str) -> int:
        seq = self._seq.get(session, 0)
        self._seq[session] = seq + 1
        return seq

    def stamp(self, session: str | None, emission: Emission, *, run: str | None = None,
              cause: str | None = None, time: datetime | str | None = None,
              severity: str | None = None,
              extensions: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Build one envelope. ``emission`` is ``{type, data?, subject?,
        step?, severity?, gating?}`` (``gating``: hints for
        :func:`bridges.core.capture.gate`, not emitted). The payload passes
        the capture gate at the ceiling for its type; ``capture`` is stamped
        with the level honored.
        Raises ``ValueError`` for an ill-formed extension attribute
        (AEP-0001 §5.4) or a session-scoped type without a session."""
        type_ = emission["type"]
        agent_scoped = is_agent_scoped(type_)
        if not agent_scoped and not session:
            raise ValueError(f"{type_} is session-scoped and needs a session")
        source: str | None
        if agent_scoped or session is None:
            source = self.source(None)
        else:
            if self._sources_of[0] is not self.host or self._sources_of[1] is not self.agent:
                self._sources, self._sources_of = {}, (self.host, self.agent)
            source = self._sources.get(session)
            if source is None:
                source = self._sources[session] = self.source(session)
        ev: dict[str, Any] = {
            "aep": AEP_VERSION,
            "id": self._ulid(),
            "type": type_,
            "time": time if isinstance(time, str) else rfc3339(time),
            "source": source,
            "agent": self.agent,
        }
        if extensions:
            from aep_sdk.emit import _check_extensions  # the SDK's §5.4 gate
            ev.update(_check_extensions(dict(extensions)))
        if emission.get("subject") is not None:
            ev["subject"] = emission["subject"]
        if not agent_scoped:
            ev["session"] = session
            if run is not None:
                ev["run"] = run
            if emission.get("step") is not None:
                ev["step"] = emission["step"]
            ev["seq"] = self.next_seq(session)  # type: ignore[arg-type]
            ev["epoch"] = self.epoch
        if cause is not None:
            ev["cause"] = cause
        sev = severity or emission.get("severity") or _DEFAULT_SEVERITY.get(type_)
        if sev and sev != "info":
            ev["severity"] = sev
        ceiling = self._ceiling(type_)
        # ``gating``: optional hints for the gate, never put on the wire
        # (``form_fields``, ``levels``, ``structural``; see capture.gate).
        hints: Gating = emission.get("gating") or {}
        data, level = _capture.gate(
            type_, emission.get("data"), ceiling, self.policy,
            agent=self.agent, subject=emission.get("subject"),
            form_fields=hints.get("form_fields"), levels=hints.get("levels"),
            structural=hints.get("structural") or ())
        ev["capture"] = level
        if data:
            ev["data"] = data
        return ev
