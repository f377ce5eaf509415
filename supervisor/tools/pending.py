"""``aep-bridges respond --pending`` and ``respond`` with no request id:
the asks still open at an endpoint.

An ask is open when the endpoint holds its ``attention.requested`` and no
outcome of it (``attention.answered`` / ``.resolved`` / ``.timeout`` from
the same emitter, in the same session: :func:`.gist.ask_key`, AEP-0002
§7), read from one replay-only request (``GET
/stream?from=all&live=0``, AEP-0003 §3.3) filtered server-side to those
types. :func:`show` lists them (id, agent, session, age, kind, the
request's ``prompt`` as captured: at ``metadata`` the synthesized
``"{agent} requests {kind}: {subject}"``; its option ids ``[allow|deny]``
or a form's fields ``{...}``, as ``timeline`` shows them); :func:`choose` picks the one
open ask for ``respond`` with no id, and refuses with the list when there
are none or several (the newest is no safer a guess than the oldest).
"""
from __future__ import annotations

import time
from datetime import datetime
from typing import Any, TextIO

from .control import held_events
from .gist import OUTCOMES, AskKey, _options, _s, _safe, ask_key
from .tailstream import settle

__all__ = ["EXIT_CHOICE", "PENDING_MAX", "age", "choose", "open_asks", "pick", "show"]

EXIT_CHOICE = 2
"""``respond`` with no id and not exactly one open ask: a bad argument."""
PENDING_MAX = 10_000
"""The most open asks read (the oldest are dropped past it)."""


def open_asks(url: str, token: str | None, *, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The ``attention.requested`` Events ``url`` holds with no outcome,
    oldest first. Raises ``httpx.HTTPError`` when the endpoint cannot be
    read."""
    asked: dict[AskKey, dict[str, Any]] = {}
    done: dict[AskKey, str] = {}
    for ev in held_events(url, token, {"type": ["attention.requested", *OUTCOMES]},
                          timeout=timeout):
        key = ask_key(ev)
        if key is None:
            continue
        if ev.get("type") == "attention.requested":
            asked[key] = ev
            while len(asked) > PENDING_MAX:
                del asked[next(iter(asked))]
        else:
            settle(ev, done)
    return [ev for key, ev in asked.items() if key not in done]


def age(ev: dict[str, Any], now: float | None = None) -> str:
    """How long ago ``ev`` happened (``12s``, ``4m``, ``3h``, ``2d``; ``?``
    for a time that does not parse)."""
    try:
        t = datetime.fromisoformat(str(ev.get("time")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "?"
    s = max(0, int((time.time() if now is None else now) - t))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _line(ev: dict[str, Any], now: float | None) -> str:
    raw = ev.get("data")
    data: dict[str, Any] = raw if isinstance(raw, dict) else {}
    what = data.get("prompt") or ev.get("subject") or ""
    return _safe(f"{ev.get('id')}  {_s(ev.get('agent'), 24)}  session {_s(ev.get('session'), 48)}  "
                 f"{age(ev, now)} ago  {_s(data.get('kind') or 'ask', 16)}: {_s(what, 80)}"
                 f"{_options(data)}")


def show(asks: list[dict[str, Any]], out: TextIO, *, now: float | None = None) -> None:
    """One line per open ask, oldest first, and how to answer one."""
    if not asks:
        print("no pending asks", file=out)
        return
    for ev in asks:
        print(_line(ev, now), file=out)
    print("answer one: aep-bridges respond [SESSION] REQUEST_ID --option ID "
          "(--text TEXT, --values JSON)", file=out)


def choose(asks: list[dict[str, Any]], err: TextIO) -> tuple[str, str] | int:
    """``(session, request id)`` of the one open ask, or :data:`EXIT_CHOICE`
    with why (and the list) on ``err``: none open, or several."""
    usable = [ev for ev in asks if isinstance(ev.get("session"), str) and isinstance(ev.get("id"), str)]
    if len(usable) == 1:
        return usable[0]["session"], usable[0]["id"]
    if not usable:
        print("aep-bridges respond: no pending asks to answer", file=err)
    else:
        print(f"aep-bridges respond: {len(usable)} asks are pending; name one "
              "(respond REQUEST_ID):", file=err)
        show(usable, err)
    return EXIT_CHOICE


def pick(url: str, token: str | None, listing: bool) -> tuple[str, str] | int:
    """``respond --pending`` (``listing``): the open asks on stdout, exit 0;
    ``respond`` with no id: the one open ask's ``(session, id)``, or
    :data:`EXIT_CHOICE` (:func:`choose`). Raises ``httpx.HTTPError`` when
    the endpoint cannot be read."""
    import sys
    asks = open_asks(url, token)
    if listing:
        show(asks, sys.stdout)
        return 0
    return choose(asks, sys.stderr)
