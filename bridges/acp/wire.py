"""The tee -> daemon wire: one WebSocket per tee on the daemon's own listener.

Endpoint: ``GET /bridges/acp/{name}`` upgraded to a WebSocket on
``AEP_LISTEN`` (the embedded relay's listener, or the health listener in
uplink mode), ``{name}`` the AEP agent id the tee observes as (one of the
daemon's ``AEP_ACP_AGENTS``; another name is refused 404). With
``AEP_TOKEN`` set on the daemon, the upgrade carries
``Authorization: Bearer <token>`` (401 otherwise). The Host guard of the
relay applies; an upgrade carrying a browser ``Origin`` is refused 403.

Messages, tee -> daemon (the daemon sends nothing but close frames):

1. one TEXT message first, the hello::

       {"aep_acp_tee": 1, "tee": "<ULID>", "agent": "<name>",
        "command": "<basename of argv[0]>", "pid": 1234,
        "stats": {"drops": 0, "oversize": 0}}

   ``tee`` is minted once per tee process: it qualifies run ids and names
   the tee's connection session, so a reconnect continues the same story
   and a restarted tee never re-mints a run id.
2. then BINARY messages, each a batch of records, each record
   ``TAG + payload + b"\\n"``: ``>`` a line the client sent to the agent,
   ``<`` a line the agent sent to the client (the line's bytes verbatim,
   without its ``\\n``; lines never contain ``\\n``), ``#`` a control
   record (compact JSON): ``{"oversize": {"dir": "client"|"agent",
   "bytes": N}}`` for a line over the tee's parse cap (passed through,
   not observed), ``{"stats": {"drops": N, "oversize": N}}``, and
   ``{"exit": STATUS, "stats": {...}}`` when the agent exited.

Pure helpers; the tee (:mod:`bridges.acp.tee`) and the daemon side
(:mod:`bridges.acp.bridge`) both use them.
"""
from __future__ import annotations

import json
import os
import re
import urllib.parse
from typing import Any, Iterator

from aep_sdk import ulid

CLIENT = "client"
AGENT = "agent"
TAGS = {CLIENT: b">", AGENT: b"<"}
_DIRS = {ord(">"): CLIENT, ord("<"): AGENT}
CONTROL = ord("#")
VERSION = 1
PATH_PREFIX = "/bridges/acp/"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def new_tee_id() -> str:
    return ulid()


def valid_name(name: str) -> bool:
    """An agent id the tee may ask for: letters, digits, ``_``, ``-``."""
    return bool(_NAME.match(name or ""))


def path_for(name: str) -> str:
    return f"{PATH_PREFIX}{name}"


def daemon_problem(url: str) -> str | None:
    """``None`` for a usable ``http(s)://host:port`` daemon URL."""
    p = urllib.parse.urlsplit(url)
    if p.scheme not in ("http", "https", "ws", "wss") or not p.hostname:
        return f"--daemon {url!r}: expected http(s)://host:port"
    try:
        _ = p.port
    except ValueError:
        return f"--daemon {url!r}: the port is not a number"
    return None


def tee_url(daemon: str, name: str) -> str:
    """``http://h:p`` -> ``ws://h:p/bridges/acp/{name}`` (``https`` -> ``wss``)."""
    p = urllib.parse.urlsplit(daemon)
    scheme = {"http": "ws", "https": "wss"}.get(p.scheme, p.scheme)
    return urllib.parse.urlunsplit((scheme, p.netloc, p.path.rstrip("/") + path_for(name), "", ""))


def hello(tee: str, name: str, command: list[str], pid: int, stats: dict[str, int]) -> dict[str, Any]:
    return {"aep_acp_tee": VERSION, "tee": tee, "agent": name,
            "command": os.path.basename(command[0]) if command else "", "pid": pid,
            "stats": stats}


def record(direction: str, line: bytes | int) -> bytes:
    """One record for a line (``bytes``) or an over-cap line's size (``int``)."""
    if isinstance(line, int):
        return control({"oversize": {"dir": direction, "bytes": line}})
    return TAGS[direction] + line + b"\n"


def control(obj: dict[str, Any]) -> bytes:
    return b"#" + json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def parse_hello(text: str) -> dict[str, Any] | None:
    """The hello, or ``None`` when the message is not one this daemon speaks."""
    try:
        h = json.loads(text)
    except ValueError:
        return None
    if not isinstance(h, dict) or h.get("aep_acp_tee") != VERSION:
        return None
    tee = h.get("tee")
    if not isinstance(tee, str) or not _NAME.match(tee):
        return None
    return h


def records(message: bytes) -> Iterator[tuple[str, bytes] | tuple[None, dict[str, Any]]]:
    """The records of one batch: ``(direction, line)`` or ``(None, control)``;
    unknown tags and unparsable control records are skipped."""
    for rec in message.split(b"\n"):
        if not rec:
            continue
        tag = rec[0]
        if tag in _DIRS:
            yield _DIRS[tag], rec[1:]
        elif tag == CONTROL:
            try:
                obj = json.loads(rec[1:])
            except ValueError:
                continue
            if isinstance(obj, dict):
                yield None, obj
