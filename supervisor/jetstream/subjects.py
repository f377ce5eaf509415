"""The JetStream subject scheme, KV keys and message ids (issue 14). Pure.

One stream per deployment, named by ``AEP_NATS_STREAM`` (``S``, default
``AEP``); every name below starts with it, so two deployments sharing one
NATS cluster never see each other's subjects::

    S.ev.<agent>.<session>     one event (payload: the event's JSON bytes,
                               exactly the JSONL line without its newline)
    S.cmd.<daemon>             commands for one daemon (request/reply)
    KV  S_claims               <agent>.<session>.<daemon> -> one daemon's claim
                               of one session (its declared control block)
    KV  S_daemons              <daemon> -> the daemon's hello identity

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
"""
from __future__ import annotations

import base64
import re
from typing import Any, Mapping, Sequence

_PLAIN = re.compile(r"[A-Za-z0-9_-]+")
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


def claim_key(agent: str | None, session: str | None, daemon: str) -> str:
    """``<agent>.<session>.<daemon>``: one daemon's claim of one session in
    the claims bucket. One key per claimant, so two daemons claiming one
    session are two keys and the relay can answer ``ambiguous`` exactly
    (AEP-0004 §4.2); ``<agent>.<session>.*`` lists a session's claimants."""
    return f"{token(agent)}.{token(session)}.{token(daemon)}"


def claim_prefix(agent: str | None, session: str | None) -> str:
    """The KV key filter of every claim of one session: ``<agent>.<session>.*``."""
    return f"{token(agent)}.{token(session)}.*"


def parse_claim_key(key: str) -> tuple[str, str | None, str]:
    """``(agent, session, daemon)``, the inverse of :func:`claim_key`;
    raises ``ValueError``."""
    parts = key.split(".")
    if len(parts) != 3:
        raise ValueError(f"not a claim key: {key!r}")
    s = untoken(parts[1])
    return untoken(parts[0]), (s or None), untoken(parts[2])


def msg_id(event: Mapping[str, Any]) -> str | None:
    """``Nats-Msg-Id`` for ``event``: ``"<id> <source>"``; ``None`` when
    either is missing (then the server cannot dedupe it, and nothing
    pretends it can)."""
    eid, source = event.get("id"), event.get("source")
    if isinstance(eid, str) and eid and isinstance(source, str) and source:
        return f"{eid} {source}"
    return None


__all__: Sequence[str] = (
    "STREAM_NAME", "claim_key", "claim_prefix", "claims_bucket", "command_subject", "daemons_bucket",
    "event_subject", "event_subject_of", "events_wildcard", "filter_subjects", "msg_id",
    "parse_claim_key", "parse_event_subject", "token", "untoken",
)
