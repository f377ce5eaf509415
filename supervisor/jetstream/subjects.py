"""The JetStream subject scheme, KV keys and message ids (issue 14). Pure.

One stream per deployment, named by ``AEP_NATS_STREAM`` (``S``, default
``AEP``); every name below starts with it, so two deployments sharing one
NATS cluster never see each other's subjects::

    S.ev.<agent>.<session>     one event (payload: the event's JSON bytes,
                               exactly the JSONL line without its newline)
    S.cmd.<daemon>             commands for one daemon (request/reply)
    KV  S_claims               <agent>.<session>.<daemon>.<bridge> -> one
                               bridge's claim of one session (its declared
                               control block)
    KV  S_daemons              <daemon> -> the daemon's hello identity
    KV  S_bindings             <session> -> the principal that owns it
                               (supervisor/jetstream/owners.py)

so an AEP ``attr-match`` filter on ``agent`` and ``session`` becomes a
subject filter (``S.ev.codex.>``, ``S.ev.*.<session>``) and the server,
not the relay, does that part of the filtering.

**Tokens.** A subject token may not hold ``.``, ``*``, ``>`` or white
space, and a KV key only ``[-/_=.A-Za-z0-9]``. :func:`token` keeps a value
made of ``[A-Za-z0-9_-]`` as it is (the common case: ``codex``, ULIDs,
UUIDs) and writes anything else as ``=`` + unpadded base64url of its UTF-8
bytes, which uses only ``[A-Za-z0-9_-]`` itself; a value that starts with
``=`` is always encoded, so the mapping is one to one and
:func:`untoken` inverts it. An absent session (agent-scoped events) is the
token ``=`` (base64 of nothing: the empty string).

**Message id.** ``Nats-Msg-Id`` is ``<id> <source>`` (AEP-0001 §7.4:
``(source, id)`` is the dedupe key; ids hold no space), so a redelivery
after a reconnect is dropped by the server inside its duplicate window.

**Event headers** (every message on ``S.ev.>``; :func:`event_headers`), so
a relay resolves resume positions and filters without parsing the JSON:

====================  =========================================================
``Nats-Msg-Id``       ``<id> <source>`` (absent when either is missing)
``Aep-Pos``           ``<epoch>:<seq>``, the event's AEP position in its
                      session (absent for ``agent.*`` and seq-less events);
                      :func:`parse_pos` reads it
``Aep-Severity``      the event's severity, ``info`` when the envelope omits it
``Aep-Type``          the event's ``type``
``Aep-Source``        the event's ``source``
``Aep-Daemon``        the publishing daemon's id (``<host>-<10 ULID chars>``)
====================  =========================================================

Per session, the stream holds events in the order the daemon emitted them:
the publisher has at most one unacknowledged publish per subject (a
session's next event leaves only after the server acknowledged the one
before), pipelining across sessions only.

**Claims** (KV ``S_claims``, key :func:`claim_key`, bucket TTL =
``AEP_NATS_CLAIM_TTL``, re-put every TTL/3 while the daemon runs, deleted
when the daemon stops or its bridge stops claiming the session). The value
is JSON (:func:`claim_value`)::

    {"v": 1, "daemon": "<daemon id>", "bridge": "<bridge name>",
     "agent": "<agent>", "session": "<session>",
     "identity": {"agent": ..., "instance": ...},   # the bridge's hello identity, verbatim
     "control": {"accepts": [...], "ack_window_ms": N},   # the hello's block, verbatim; absent: none
     "emits": [...],                                # the hello's block, verbatim; absent: none
     "at": <unix ms of this put>}

A session has as many claims as claimants (bridges, on any daemons):
exactly one claimant under :func:`claim_prefix` routes; none is
``no-route``, several ``ambiguous``; a type outside the claim's
``control.accepts`` is ``unsupported`` (AEP-0004 §4.2, §4.5). Keys of the
older shape ``<agent>.<session>.<daemon>`` (daemons before the bridge was
in the key) are still read, their bridge taken from the value
(:func:`claimants` counts a claim present in both shapes once).
A JetStream relay claims the sessions of the emitters on its own
``/socket`` the same way: ``daemon`` is the relay's id (``relay-<hex>``,
no ``S_daemons`` entry), ``bridge`` names the connection, and the relay
answers ``S.cmd.<relay id>`` with the same replies.

**Daemons** (KV ``S_daemons``, key ``token(daemon)``, same TTL and
refresh; :func:`daemon_value`)::

    {"v": 1, "daemon": "<id>", "host": "<host>", "pid": N, "epoch": N,
     "started": "<RFC 3339>", "at": <unix ms>,
     "bridges": [{"name": ..., "hello": {...the emitter hello...}}, ...]}

**Commands** (request/reply on ``S.cmd.<daemon>``): the request payload is
the command envelope's JSON (UTF-8, as the sender wrote it; the relay has
authenticated the sender and checked the envelope); no headers are needed.
The daemon hands it to the member bridge owning the session exactly as the
embedded relay routes (the bridge's inbox, then its ledger, which dedupes
``(source, id)``: a relay retry is acked once). The reply payload is JSON
(:func:`command_reply`, :func:`parse_command_reply`)::

    {"v": 1, "status": "accepted", "daemon": "<id>", "bridge": "<name>"}
    {"v": 1, "status": "refused", "daemon": "<id>", "code": "<code>", "detail": "..."}

``accepted`` means handed to the bridge's inbox (accepted for delivery, not
the AEP ack: the ack and the outcome come as ordinary events on
``S.ev.<agent>.<session>``, ``cause`` = the command id). ``code`` is one of
:data:`REFUSAL_CODES`: ``no-route`` (no bridge of this daemon claims the
session: a stale claim), ``ambiguous`` (two of its bridges do),
``unsupported`` (the owner's hello does not declare the type), ``invalid``
(not a JSON object with a string ``type`` and ``session``), ``busy`` (the
bridge's inbox is full: dropped and counted, as in the embedded relay; the
sender's retry with the same id recovers it).
"""
from __future__ import annotations

import base64
import json
import re
from typing import Any, Mapping, Sequence

_PLAIN = re.compile(r"[A-Za-z0-9_-]+")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")
STREAM_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What ``AEP_NATS_STREAM`` may be: a JetStream stream name that is also
one subject token and a KV bucket prefix."""


def token(value: str | None) -> str:
    """``value`` as one subject token / KV key segment (see the module
    docstring). ``None`` and ``""`` -> ``"="``."""
    if value and _PLAIN.fullmatch(value):
        return value
    raw = (value or "").encode("utf-8", "surrogatepass")
    return "=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def untoken(tok: str) -> str:
    """The inverse of :func:`token`. Raises ``ValueError`` on a token
    :func:`token` cannot have produced."""
    if not tok.startswith("="):
        if not _PLAIN.fullmatch(tok):
            raise ValueError(f"not a subject token: {tok!r}")
        return tok
    body = tok[1:]
    if body and not _PLAIN.fullmatch(body):
        raise ValueError(f"not a subject token: {tok!r}")
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8", "surrogatepass")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not a subject token: {tok!r}") from e


def event_subject(stream: str, agent: str | None, session: str | None) -> str:
    """``S.ev.<agent>.<session>``."""
    return f"{stream}.ev.{token(agent)}.{token(session)}"


def event_subject_of(stream: str, event: Mapping[str, Any]) -> str:
    """The subject of an AEP event (its ``agent`` and ``session``; a
    non-string value is treated as absent)."""
    agent, session = event.get("agent"), event.get("session")
    return event_subject(stream, agent if isinstance(agent, str) else None,
                         session if isinstance(session, str) else None)


def parse_event_subject(stream: str, subject: str) -> tuple[str, str | None]:
    """``(agent, session)`` of an event subject (session ``None`` for the
    ``=`` token). Raises ``ValueError`` for any other subject."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[0] != stream or parts[1] != "ev":
        raise ValueError(f"not an event subject of {stream}: {subject!r}")
    session = untoken(parts[3])
    return untoken(parts[2]), (session or None)


def events_wildcard(stream: str) -> str:
    """Every event subject of the stream: ``S.ev.>``."""
    return f"{stream}.ev.>"


def filter_subjects(stream: str, agents: Sequence[str] | None,
                    sessions: Sequence[str] | None) -> list[str]:
    """Subject filters covering exactly the events whose agent is one of
    ``agents`` and whose session is one of ``sessions`` (``None``: any).
    The cross product; ``[S.ev.>]`` when both are ``None``. The caller
    applies the rest of an attr-match filter in process."""
    a = [token(x) for x in agents] if agents is not None else ["*"]
    s = [token(x) for x in sessions] if sessions is not None else ["*"]
    if agents is None and sessions is None:
        return [events_wildcard(stream)]
    return [f"{stream}.ev.{x}.{y}" for x in a for y in s]


def command_subject(stream: str, daemon: str) -> str:
    """``S.cmd.<daemon>``: where one daemon listens for commands."""
    return f"{stream}.cmd.{token(daemon)}"


def claims_bucket(stream: str) -> str:
    """The KV bucket of session claims: ``S_claims``."""
    return f"{stream}_claims"


def daemons_bucket(stream: str) -> str:
    """The KV bucket of live daemons: ``S_daemons``."""
    return f"{stream}_daemons"


def bindings_bucket(stream: str) -> str:
    """The KV bucket of session bindings: ``S_bindings``
    (:mod:`supervisor.jetstream.owners`)."""
    return f"{stream}_bindings"


def binding_value(*, principal: str, source: str, owner: str, at_ms: int) -> bytes:
    """The JSON value of one session binding (:mod:`supervisor.jetstream.owners`)."""
    return json.dumps({"v": SHAPE_VERSION, "principal": principal, "source": source,
                       "owner": owner, "at": at_ms},
                      separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def claim_key(agent: str | None, session: str | None, daemon: str, bridge: str | None) -> str:
    """``<agent>.<session>.<daemon>.<bridge>``: one claimant's claim of one
    session in the claims bucket, the claimant being one bridge of one
    daemon (or one ``/socket`` connection of a relay). One key per
    claimant, so two daemons, or two bridges of one daemon, claiming one
    session are two keys and the relay answers ``ambiguous`` exactly
    (AEP-0004 §4.2), the roster lists both (AEP-0003 §4.1), and one
    bridge's release never deletes the other's claim.
    ``bridge=None`` makes the older shape ``<agent>.<session>.<daemon>``
    (one key per daemon, written by daemons before the bridge was in the
    key): readers still accept it (:func:`parse_claim_key`, :func:`claimants`);
    nothing writes it any more."""
    key = f"{token(agent)}.{token(session)}.{token(daemon)}"
    return key if bridge is None else f"{key}.{token(bridge)}"


def claim_prefix(agent: str | None, session: str | None) -> str:
    """The KV key filter of every claim of one session, either key shape:
    ``<agent>.<session>.>``."""
    return f"{token(agent)}.{token(session)}.>"


def session_claims_filter(session: str | None) -> str:
    """The KV key filter of every claim of ``session`` by any agent, either
    key shape: ``*.<session>.>``."""
    return f"*.{token(session)}.>"


def parse_claim_key(key: str) -> tuple[str, str | None, str, str | None]:
    """``(agent, session, daemon, bridge)``, the inverse of
    :func:`claim_key`; ``bridge`` is ``None`` for the older three-token
    shape (the claim's value names it). Raises ``ValueError``."""
    parts = key.split(".")
    if len(parts) not in (3, 4):
        raise ValueError(f"not a claim key: {key!r}")
    s = untoken(parts[1])
    bridge = untoken(parts[3]) if len(parts) == 4 else None
    return untoken(parts[0]), (s or None), untoken(parts[2]), bridge


def claimants(entries: Sequence[tuple[str, bytes]]
              ) -> list[tuple[str, str | None, str, str | None, dict[str, Any]]]:
    """The distinct claimants in claims-bucket ``(key, value)`` entries:
    ``(agent, session, daemon, bridge, value)``, in first-seen order, one
    per ``(agent, session, daemon, bridge)``; an older-shape key's bridge
    is its value's ``bridge``, so a claim written in both shapes (a daemon
    upgraded in place, its old key not yet expired) counts once, as the
    new-shape entry. Malformed keys, values that do not parse
    (:func:`parse_value`) and a value whose ``bridge`` contradicts its
    key are skipped. Pure; never raises."""
    out: dict[tuple[str, str | None, str, str | None], tuple[dict[str, Any], bool]] = {}
    for key, raw in entries:
        try:
            agent, session, daemon, bridge = parse_claim_key(key)
        except ValueError:
            continue
        value = parse_value(raw)
        if value is None:
            continue
        named = value.get("bridge")
        named = named if isinstance(named, str) else None
        legacy = bridge is None
        if legacy:
            bridge = named
        elif named is not None and named != bridge:
            continue
        ident = (agent, session, daemon, bridge)
        have = out.get(ident)
        if have is None or (have[1] and not legacy):
            out[ident] = (value, legacy)
    return [(*ident, value) for ident, (value, _) in out.items()]


def msg_id(event: Mapping[str, Any]) -> str | None:
    """``Nats-Msg-Id`` for ``event``: ``"<id> <source>"``; ``None`` when
    either is missing (then the server cannot dedupe it, and nothing
    pretends it can)."""
    eid, source = event.get("id"), event.get("source")
    if isinstance(eid, str) and eid and isinstance(source, str) and source:
        return f"{eid} {source}"
    return None


MSG_ID = "Nats-Msg-Id"
POS = "Aep-Pos"
SEVERITY = "Aep-Severity"
TYPE = "Aep-Type"
SOURCE = "Aep-Source"
DAEMON = "Aep-Daemon"
HEADERS = (MSG_ID, POS, SEVERITY, TYPE, SOURCE, DAEMON)
"""The header names of an event message (the module docstring's table)."""

REFUSAL_CODES = ("no-route", "ambiguous", "unsupported", "invalid", "busy")
"""The ``code`` of a refused command reply (see the module docstring)."""

SHAPE_VERSION = 1
"""``v`` of every KV value and command reply (a reader ignores other ``v``)."""


def _ascii(value: str) -> str:
    # header values are one line of printable ASCII; AEP ids, sources and
    # types are, and anything else is escaped rather than break the header block
    if _PRINTABLE.fullmatch(value):
        return value
    return _UNPRINTABLE.sub(lambda m: "\\u%04x" % (ord(m[0]) & 0xFFFF), value)


def event_headers(event: Mapping[str, Any], daemon: str) -> dict[str, str]:
    """The headers of ``event``'s message (the module docstring's table).
    Pure; never raises on a malformed envelope (a field of the wrong type
    is left out)."""
    h: dict[str, str] = {}
    mid = msg_id(event)
    if mid is not None:
        h[MSG_ID] = _ascii(mid)
    epoch, seq = event.get("epoch"), event.get("seq")
    if isinstance(epoch, int) and isinstance(seq, int) and not isinstance(epoch, bool) \
            and not isinstance(seq, bool):
        h[POS] = f"{epoch}:{seq}"
    sev = event.get("severity")
    h[SEVERITY] = _ascii(sev) if isinstance(sev, str) and sev else "info"
    for name, key in ((TYPE, "type"), (SOURCE, "source")):
        v = event.get(key)
        if isinstance(v, str) and v:
            h[name] = _ascii(v)
    h[DAEMON] = _ascii(daemon)
    return h


def parse_pos(value: str | None) -> tuple[int, int] | None:
    """``(epoch, seq)`` of an ``Aep-Pos`` value; ``None`` when absent or
    not ``<int>:<int>`` (never raises)."""
    if not value:
        return None
    a, sep, b = value.partition(":")
    if not sep or not a.isdigit() or not b.isdigit():
        return None
    return int(a), int(b)


def claim_value(*, daemon: str, bridge: str, hello: Mapping[str, Any], agent: str,
                session: str | None, at_ms: int) -> bytes:
    """The JSON value of one claim (module docstring, "Claims"): ``hello``
    is the bridge's emitter hello; its ``identity`` and the ``control`` /
    ``emits`` of its ``capabilities`` are copied verbatim."""
    ident = hello.get("identity")
    caps = hello.get("capabilities")
    caps = caps if isinstance(caps, Mapping) else {}
    body: dict[str, Any] = {"v": SHAPE_VERSION, "daemon": daemon, "bridge": bridge,
                            "agent": agent, "session": session,
                            "identity": dict(ident) if isinstance(ident, Mapping) else {}}
    for k in ("control", "emits"):
        if k in caps:
            body[k] = caps[k]
    body["at"] = at_ms
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def parse_value(raw: bytes | None) -> dict[str, Any] | None:
    """A claim / daemon value or command reply as a dict; ``None`` for
    anything that is not a JSON object of :data:`SHAPE_VERSION` (never
    raises)."""
    if not raw:
        return None
    try:
        v = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return v if isinstance(v, dict) and v.get("v") == SHAPE_VERSION else None


def daemon_value(*, daemon: str, host: str, pid: int, epoch: int, started: str,
                 hellos: Mapping[str, Mapping[str, Any]], at_ms: int) -> bytes:
    """The JSON value of a daemon's ``S_daemons`` entry (module docstring,
    "Daemons"); ``hellos``: bridge name -> its emitter hello."""
    body = {"v": SHAPE_VERSION, "daemon": daemon, "host": host, "pid": pid, "epoch": epoch,
            "started": started, "at": at_ms,
            "bridges": [{"name": n, "hello": dict(h)} for n, h in hellos.items()]}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def command_reply(daemon: str, *, bridge: str | None = None, code: str | None = None,
                  detail: str = "") -> bytes:
    """The reply to a command request: ``accepted`` (handed to ``bridge``)
    when ``code`` is ``None``, else ``refused`` with ``code`` (one of
    :data:`REFUSAL_CODES`; ``ValueError`` otherwise) and ``detail``."""
    body: dict[str, Any] = {"v": SHAPE_VERSION, "daemon": daemon}
    if code is None:
        body.update(status="accepted", bridge=bridge)
    else:
        if code not in REFUSAL_CODES:
            raise ValueError(f"not a refusal code: {code!r}")
        body.update(status="refused", code=code, detail=detail)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def parse_command_reply(raw: bytes | None) -> tuple[str, str | None, str]:
    """``(status, code, detail)`` of a command reply: ``("accepted", None,
    "")``, ``("refused", code, detail)``, or ``("invalid", None, why)`` for
    a reply that is neither (never raises)."""
    v = parse_value(raw)
    if v is None:
        return ("invalid", None, "not a command reply")
    if v.get("status") == "accepted":
        return ("accepted", None, "")
    if v.get("status") == "refused" and v.get("code") in REFUSAL_CODES:
        d = v.get("detail")
        return ("refused", str(v["code"]), d if isinstance(d, str) else "")
    return ("invalid", None, "not a command reply")


__all__: Sequence[str] = (
    "DAEMON", "HEADERS", "MSG_ID", "POS", "REFUSAL_CODES", "SEVERITY", "SHAPE_VERSION", "SOURCE",
    "TYPE", "binding_value", "bindings_bucket", "claim_value", "command_reply", "daemon_value", "event_headers", "parse_command_reply",
    "parse_pos", "parse_value",
    "STREAM_NAME", "claim_key", "claim_prefix", "claims_bucket", "command_subject", "daemons_bucket",
    "event_subject", "event_subject_of", "events_wildcard", "filter_subjects", "msg_id",
    "claimants", "parse_claim_key", "parse_event_subject", "session_claims_filter", "token",
    "untoken",
)
