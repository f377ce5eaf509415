"""Envelope stamping (AEP-0001 §5, §7): ULID ids, ``source`` URIs,
per-session monotonic ``seq``, a never-repeating ``epoch``, default severity,
and the capture gate applied to every payload (AEP-0003 §9.1, §9.5).

Design: ``shared/DESIGN.md`` ("Envelope stamping is shared")."""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import time as _time
from collections.abc import Collection
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Generator, Mapping, NotRequired, Required, Sequence, TypedDict
from urllib.parse import quote

from . import capture as _capture
from .aep import AEP_VERSION, SEVERITY_RANK, scrub_surrogates
from .paths import write_atomic

log = logging.getLogger("aep.core.envelope")


class Gating(TypedDict, total=False):
    """Hints for the capture gate (:func:`bridges.core.capture.gate`), read
    by the stamper and never put on the wire: ``levels`` grades payload keys
    a type's table does not (``{"summary": "redacted"}``); ``structural``
    names keys kept at every level (a form's ``prompt``); ``form_fields``:
    an AEP-0006 form's fields, for gating ``answer.values``; ``plain``
    (``True``, beside a ``levels`` mapping only; ``False`` or beside
    ``levels`` ``None`` is no claim): the emitter asserts its ``data`` is
    a fresh dict of JSON scalars under ``str`` keys naming no key
    ``levels`` declares (nor a prefix of one), so the gate of an
    unregistered type would keep it as it is at ``metadata``: the
    stamper's run path takes it without the copy
    (:meth:`bridges.core.envelope.Stamper.stamp_run`; an OTLP recipe makes
    the claim, :meth:`bridges.otlp_in.profiles.Profile.recipes`)."""

    levels: Mapping[str, str]
    structural: Collection[str]
    form_fields: object
    plain: bool


class Emission(TypedDict):
    """One mapped moment, shaped like a mapping pin's ``expected`` object:
    ``type`` (required: the key the capture gate and the stamper gate by,
    :func:`bridges.core.capture.gate`), and optionally ``data`` (the payload,
    JSON-shaped, gated to the type's ceiling), ``subject``, ``step``,
    ``severity`` (overrides the type's default) and ``gating`` (the gate's
    hints, :class:`Gating`; not emitted)."""

    type: Required[str]
    data: NotRequired[dict[str, Any]]
    subject: NotRequired[str]
    step: NotRequired[str]
    severity: NotRequired[str]
    gating: NotRequired[Gating]


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


def ms_text(ms: int) -> str:
    """:func:`rfc3339` of the instant ``ms`` milliseconds after the Unix
    epoch (``ms >= 0``), from integers alone (no float rounding): what the
    stamper writes for "now" (the millisecond its clock read falls in)."""
    sec, milli = divmod(ms, 1000)
    return _time.strftime("%Y-%m-%dT%H:%M:%S", _time.gmtime(sec)) + f".{milli:03d}Z"


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# a random byte -> one character (its low 5 bits; 256 = 8 x 32, so uniform)
_BYTE_TO_CHAR = bytes((ord(_CROCKFORD[b % 32]) for b in range(256)))
_POOL_IDS = 256
MAX_SOURCES = 4096
"""Sessions whose ``source`` a :class:`Stamper` keeps spelled at once
(a cache, emptied when full; the per-session ``seq`` is kept apart)."""


# the last two time characters of a ULID (10 bits of its milliseconds)
_LOW2 = tuple(_CROCKFORD[i >> 5] + _CROCKFORD[i & 31] for i in range(1024))


class Ulids:
    """ULIDs built exactly as the SDK builds them (``aep_sdk.ulid``: the
    millisecond time in 10 Crockford base32 characters, then 16 characters
    each from one random byte, 80 random bits), made for the stamper's hot
    path: the random bytes come from ``os.urandom`` in blocks of
    :data:`_POOL_IDS` ids (one system call per block, not one per id), the
    whole block is spelled with one ``bytes.translate`` (each id is then a
    slice of it), and the time part is spelled once per millisecond, its
    first 8 characters once per 1,024 ms (a trickle of events, each in a
    millisecond of its own, looks up the last two; issue 11). Not
    thread-safe (one per stamper)."""

    def __init__(self) -> None:
        self._chars = ""
        self._pos = 0
        self._ms = -1
        self._time = ""
        self._hi = -1  # ``ms >> 10`` that ``_hi_text`` spells
        self._hi_text = ""

    def __call__(self, now_ms: int | None = None) -> str:
        """A new id; ``now_ms``: the time part (default: the clock)."""
        return self.at(_time.time_ns() // 1_000_000 if now_ms is None else now_ms)

    def at(self, t: int) -> str:
        """A new id whose time part is ``t`` (milliseconds since the epoch)."""
        if t != self._ms:
            hi = t >> 10
            if hi != self._hi:
                self._hi, self._hi_text = hi, _time_part(t)[:8]
            self._ms, self._time = t, self._hi_text + _LOW2[t & 1023]
        pos = self._pos
        if pos + 16 > len(self._chars):
            self._chars = os.urandom(16 * _POOL_IDS).translate(_BYTE_TO_CHAR).decode("ascii")
            pos = 0
        self._pos = pos + 16
        return self._time + self._chars[pos:pos + 16]


def _time_part(ms: int) -> str:
    out = ""
    for _ in range(10):
        out = _CROCKFORD[ms % 32] + out
        ms //= 32
    return out


_SEGMENT_SAFE = "!$&'()*+,;=:@"  # RFC 3986 pchar beyond the unreserved characters, minus "/"
# a session made of these only is its own segment (what quote() leaves alone)
_PLAIN_SEGMENT = re.compile(r"[A-Za-z0-9_.~!$&'()*+,;=:@-]*\Z")


def session_segment(session: str) -> str:
    """``session`` as one RFC 3986 path segment of ``source``: unchanged when
    it is made of URI path characters (every vendor id seen so far), else
    percent-encoded as UTF-8 (a space, a control character, ``/``, ``%``,
    non-ASCII, a lone surrogate), so ``source`` stays a valid URI whatever a vendor names its
    sessions and two sessions never share one (one to one, but for lone
    surrogates, which become U+FFFD as in the ``session`` field)."""
    if _PLAIN_SEGMENT.match(session):  # every vendor id seen so far: one regex, no quote
        return session
    # a lone surrogate (a vendor's JSON ``\\ud800``) has no UTF-8 form: U+FFFD,
    # as the fleet writes the ``session`` field itself (scrub_surrogates)
    return quote(scrub_surrogates(session), safe=_SEGMENT_SAFE)


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
    ``agent``, ``host`` and ``policy`` may be replaced (a bridge that learns
    a secret adds it to the policy): what the stamper worked out from them
    is dropped then. Not thread-safe; one per bridge, used from trio tasks
    only.

    The hot path (:meth:`stamp`) reads the clock once per event (the ULID's
    time and ``time`` come from the same read), spells the time once per
    millisecond, and keeps per type what the type decides (scope, default
    severity, ceiling, the capture gate's :class:`~bridges.core.capture.GatePlan`)
    and per session its ``source``."""

    def __init__(self, agent: str, *, epoch: int = 0, host: str | None = None,
                 policy: _capture.CapturePolicy | None = None) -> None:
        self._agent = agent
        self._host = host or socket.gethostname() or "localhost"
        self._policy = policy or _capture.CapturePolicy()
        self.epoch = epoch
        self._seq: dict[str, int] = {}
        self._ulid = Ulids().at
        self._when_ms = -1  # the millisecond ``_when`` spells
        self._when = ""
        self._when_sec: int | None = None  # the second ``_when_prefix`` spells
        self._when_prefix = ""
        self._reset()

    def _reset(self) -> None:
        self._base = f"aep://{self._host}/agent/{self._agent}"
        # vendor session -> (source, the session as stamped); one per sequenced session
        self._sources: dict[str, tuple[str, str]] = {}
        # type -> (session-scoped, default severity, the gate's plan at its ceiling)
        self._types: dict[str, tuple[bool, str | None, _capture.GatePlan]] = {}

    @property
    def agent(self) -> str:
        return self._agent

    @agent.setter
    def agent(self, value: str) -> None:
        self._agent = value
        self._reset()

    @property
    def host(self) -> str:
        return self._host

    @host.setter
    def host(self, value: str) -> None:
        self._host = value
        self._reset()

    @property
    def policy(self) -> _capture.CapturePolicy:
        return self._policy

    @policy.setter
    def policy(self, value: _capture.CapturePolicy) -> None:
        self._policy = value
        self._reset()

    def source(self, session: str | None) -> str:
        """``aep://{host}/agent/{agent}[/session/{session}]`` (AEP-0001 §5.1
        #6); the session is one percent-encoded path segment (see
        :func:`session_segment`)."""
        return f"{self._base}/session/{session_segment(session)}" if session else self._base

    def _type_plan(self, type_: str) -> tuple[bool, str | None, _capture.GatePlan]:
        plan = (not is_agent_scoped(type_), _DEFAULT_SEVERITY.get(type_),
                _capture.gate_plan(type_, self._policy.ceiling_for(type_)))
        if len(self._types) >= 4096:  # vendor type names are open-ended
            self._types.clear()
        self._types[type_] = plan
        return plan

    def _learn(self, session: str) -> tuple[str, str]:
        """:meth:`_session_of`, kept for the session's next events. The table
        is a cache (its values are derived from the name alone): it is
        emptied at :data:`MAX_SOURCES` sessions, so a daemon that sees new
        sessions all day does not keep one entry per session it ever saw
        (a soak: ~200 bytes a session). A session over 256 characters is
        spelled every time, not kept (4,096 of them up to 4 KiB, each
        spelled up to 12 characters a character: ~200 MiB; an eighth
        outside attack's finding 4)."""
        if len(session) > 256:
            return self._session_of(session)
        if len(self._sources) >= MAX_SOURCES:
            self._sources.clear()
        known = self._sources[session] = self._session_of(session)
        return known

    def _session_of(self, session: str) -> tuple[str, str]:
        """``(source, session as stamped)``: a lone surrogate (no UTF-8 form)
        becomes U+FFFD here, once, so the ``seq`` and the ``source`` are the
        session's the wire carries (the fleet replaces it in the event the
        same way): two vendor sessions that differ only in lone surrogates
        are one AEP session with one gap-free ``seq``, never two sessions
        numbered from 0 under one name (fresh-user review: the relay refused
        the second ``(epoch, seq)`` and the bridge's health went red)."""
        if _PLAIN_SEGMENT.match(session):  # ASCII, its own segment (session_segment)
            return f"{self._base}/session/{session}" if session else self._base, session
        clean = scrub_surrogates(session)
        return self.source(clean), clean

    def knows(self, session: str) -> bool:
        """Whether this stamper has stamped a sequenced event for ``session``."""
        return scrub_surrogates(session) in self._seq

    def next_seq(self, session: str) -> int:
        session = scrub_surrogates(session)
        seq = self._seq.get(session, 0)
        self._seq[session] = seq + 1
        return seq

    def _now(self, ms: int) -> str:
        """:func:`ms_text` of ``ms``, spelled once per millisecond, its
        date and time of day once per second (issue 11: a trickle of
        events, each in a millisecond of its own)."""
        if ms != self._when_ms:
            sec, milli = divmod(ms, 1000)
            if sec != self._when_sec:
                self._when_sec = sec
                self._when_prefix = _time.strftime("%Y-%m-%dT%H:%M:%S.", _time.gmtime(sec))
            self._when_ms, self._when = ms, f"{self._when_prefix}{milli:03d}Z"
        return self._when

    def unstamp(self, envelope: Mapping[str, Any]) -> None:
        """Take back ``envelope``, the last one :meth:`stamp` returned (no
        stamp since): its ``seq`` is handed out again and a session it was
        the first of is unknown again (:meth:`knows`), as if it had never
        been stamped. For a sender that could not put it anywhere
        (:meth:`bridges.core.bridge.BridgeContext.emit_nowait`)."""
        session, seq = envelope.get("session"), envelope.get("seq")
        if isinstance(seq, int) and self._seq.get(session) == seq + 1:  # type: ignore[arg-type]
            if seq == 0:
                del self._seq[session]  # type: ignore[arg-type]
            else:
                self._seq[session] = seq  # type: ignore[index]

    def stamp_run(self, session: str, emissions: Sequence[Emission],
                  times: Sequence[datetime | str | None], start: int = 0,
                  stop: int | None = None) -> Generator[dict[str, Any], None, None]:
        """``stamp(session, emissions[i], time=times[i])`` for ``i`` from
        ``start`` (to ``stop``, default the end), lazily: each envelope is
        stamped when the iterator is advanced, so a consumer that cannot
        place one takes it back with :meth:`unstamp` and stops. One run of
        one session, what one OTLP export request holds: the session's
        ``source``, the per-type plans and the clock (one read per run: the
        ULIDs' time part) are looked up once instead of once per event.

        Equal to those :meth:`stamp` calls envelope for envelope (with the
        clock standing still over the run; held by
        ``tests/unit/core/test_stamp_run.py``). The iterator ends early,
        before the emission at the index the consumer counted to, at an
        emission the run does not take (an unknown severity, an
        agent-scoped type, no session): that one's answer is
        :meth:`stamp`'s own (``ValueError``), for the caller to ask."""
        stop = len(emissions) if stop is None else stop
        if not session or start >= stop:
            return
        known = self._sources.get(session)
        if known is None:
            known = self._learn(session)
        source, clean = known
        types = self._types
        ulid, policy, agent, epoch = self._ulid, self._policy, self._agent, self.epoch
        seqs = self._seq
        ms = _time.time_ns() // 1_000_000
        last_type: object = None
        scoped = False
        default_severity: str | None = None
        gate: Any = None
        for i in range(start, stop):
            emission = emissions[i]
            type_ = emission["type"]
            if type_ is not last_type:
                plan = types.get(type_)
                if plan is None:
                    plan = self._type_plan(type_)
                scoped, default_severity, gate = plan
                last_type = type_
            if not scoped:
                return  # agent-scoped: stamp() decides
            sev = emission.get("severity") or default_severity
            if sev and sev != "info" and (sev.__class__ is not str or sev not in SEVERITY_RANK):
                return  # refused by stamp(), before a seq is taken
            subject = emission.get("subject")
            # the gate first: the one step that can raise (a payload that is not
            # JSON), and nothing of this event is taken yet then
            data, level = gate.gate_hinted(emission.get("data"), policy, agent, subject,
                                           emission.get("gating"))
            time = times[i]
            ev: dict[str, Any] = {
                "aep": AEP_VERSION,
                "id": ulid(ms),
                "type": type_,
                "time": self._now(ms) if time is None else
                time if isinstance(time, str) else rfc3339(time),
                "source": source,
                "agent": agent,
            }
            if subject is not None:
                ev["subject"] = subject
            ev["session"] = clean
            step = emission.get("step")
            if step is not None:
                ev["step"] = step
            seq = seqs.get(clean, 0)
            seqs[clean] = seq + 1
            ev["seq"] = seq
            ev["epoch"] = epoch
            if sev and sev != "info":
                ev["severity"] = sev
            ev["capture"] = level
            if data:
                ev["data"] = data
            yield ev

    def stamp(self, session: str | None, emission: Emission, *, run: str | None = None,
              cause: str | None = None, time: datetime | str | None = None,
              severity: str | None = None,
              extensions: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Build one envelope. ``emission`` is ``{type, data?, subject?,
        step?, severity?, gating?}`` (``gating``: hints for
        :func:`bridges.core.capture.gate`, not emitted). The payload passes
        the capture gate at the ceiling for its type; ``capture`` is stamped
        with the level honored. ``time``: a datetime or a string already in
        the :func:`rfc3339` form (default: now, the millisecond of the
        ULID's time part).
        Raises ``ValueError`` for an ill-formed extension attribute
        (AEP-0001 §5.4), a severity outside AEP-0001 §8.1 or a
        session-scoped type without a session (nothing stamped: no ``seq``
        is taken)."""
        type_ = emission["type"]
        plan = self._types.get(type_)
        if plan is None:
            plan = self._type_plan(type_)
        scoped, default_severity, gate = plan
        sev = severity or emission.get("severity") or default_severity
        if sev and sev != "info" and (sev.__class__ is not str or sev not in SEVERITY_RANK):
            # refused before a seq is taken (a gap) and before the relay would
            # drop the event: AEP-0001 §8.1 is a closed set
            raise ValueError(f"{type_}: unknown severity {sev!r}")
        if scoped:
            if not session:
                raise ValueError(f"{type_} is session-scoped and needs a session")
            known = self._sources.get(session)
            if known is None:
                known = self._learn(session)
            source, session = known
        else:
            source = self._base
        ms = _time.time_ns() // 1_000_000
        ev: dict[str, Any] = {
            "aep": AEP_VERSION,
            "id": self._ulid(ms),
            "type": type_,
            "time": self._now(ms) if time is None else
            time if isinstance(time, str) else rfc3339(time),
            "source": source,
            "agent": self._agent,
        }
        if extensions:
            from aep_sdk.emit import _check_extensions  # the SDK's §5.4 gate
            ev.update(_check_extensions(dict(extensions)))
        subject = emission.get("subject")
        if subject is not None:
            ev["subject"] = subject
        if scoped:
            ev["session"] = session
            if run is not None:
                ev["run"] = run
            step = emission.get("step")
            if step is not None:
                ev["step"] = step
            seqs = self._seq
            seq = seqs.get(session, 0)  # type: ignore[arg-type]
            seqs[session] = seq + 1  # type: ignore[index]
            ev["seq"] = seq
            ev["epoch"] = self.epoch
        if cause is not None:
            ev["cause"] = cause
        if sev and sev != "info":
            ev["severity"] = sev
        # ``gating``: optional hints for the gate, never put on the wire
        # (``form_fields``, ``levels``, ``structural``; see capture.gate).
        hints = emission.get("gating")
        if hints:
            data, level = gate.gate(
                emission.get("data"), self._policy, agent=self._agent, subject=subject,
                form_fields=hints.get("form_fields"), levels=hints.get("levels"),
                structural=hints.get("structural") or ())
        else:
            data, level = gate.gate(emission.get("data"), self._policy, agent=self._agent,
                                    subject=subject)
        ev["capture"] = level
        if data:
            ev["data"] = data
        return ev
