"""``aep-bridges respond | cancel | pause | resume``: send one AEP-0004
command to any AEP endpoint, print its ack, wait for its outcome.

The ecosystem's ``aep`` CLI does the same (``aep respond <session>
<request-id> --option allow``; ``aep cancel <session> --run <run-id>``);
these mirror its arguments and its exit statuses, and add the wait for the
outcome (AEP-0004 §3: the ack says "I will try", the outcome Event says
"done"):

- ``0``: accepted, and the outcome Event arrived (printed as a timeline line);
- ``3``: rejected (``control.rejected``, or the relay's ``cause``-matched
  ``error`` frame): the reason on stderr, said in words when the nack
  carries a ``code`` (:data:`NACK_WHY`: ``rejected: already answered (via
  oob)``), since its ``detail`` is capture-gated and absent at ``metadata``;
- ``4``: no ack within the ack window and its retries (the SDK's
  synthesized ``timeout``);
- ``5``: accepted, but no outcome within ``--wait`` seconds;
- ``1``: the endpoint could not be reached or refused the connection;
- ``6``: the endpoint refused the credentials (HTTP 401/403: no token, or
  not the daemon's): ``unauthorized: pass --token or set AEP_TOKEN (the
  daemon's)``, not said as unreachable;
- ``2``: bad arguments (``--values`` not a JSON object, no answer given, a
  request id alone that the endpoint holds no ask for).

The command goes out through the protocol's own sender, the SDK's
``ControlClient`` (a WebSocket duplex on ``/socket``: commands flow only on an
authenticated duplex binding, AEP-0004 §4.1; retries resend the same id).
The outcome is read with the SDK's SSE consumer (``aep_sdk.subscribe``) from
the ack's own position on (``from``, AEP-0003 §7), so an outcome that came
before the consumer connected is replayed, not missed; an Event is the
command's when its ``cause`` is the command, the ack, or an Event already
linked (``attention.resolved`` is caused by ``attention.answered``).

``respond`` first reads whether the ask already ended
(:func:`resolved_as`): then it says ``already resolved: dismissed (...)``
and exits ``3`` without sending. It takes the request's session, or finds it: with only the request
id, the endpoint's held ``attention.requested`` Events are read once
(``GET /stream?from=all&live=0``) and the one with that id names it.

The SDK's consumer and sender are thread-based (the library demands it);
this module runs no event loop."""
from __future__ import annotations

import json
import queue
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TextIO

__all__ = ["AGENT", "Command", "EXIT_NO_ACK", "EXIT_NO_OUTCOME", "EXIT_REJECTED", "EXIT_UNAUTHORIZED",
           "EXIT_UNREACHABLE", "HELD_READ_S", "NACK_WHY", "UNAUTHORIZED", "cancel", "find_session", "held_events", "resolved_as", "pause", "respond", "resume", "send"]

EXIT_UNREACHABLE, EXIT_REJECTED, EXIT_NO_ACK, EXIT_NO_OUTCOME, EXIT_UNAUTHORIZED = 1, 3, 4, 5, 6

#: what a 401/403 from the endpoint is said as (exit :data:`EXIT_UNAUTHORIZED`)
UNAUTHORIZED = "unauthorized: pass --token or set AEP_TOKEN (the daemon's)"

#: the sender's name in the command's ``source`` (``aep://<host>/agent/<AGENT>``)
AGENT = "aep-bridges-cli"

#: a ``control.rejected``'s ``code`` (the hook bridges', ``bridges/hooks_common/control.py``)
#: in words: said instead of the bare reason
NACK_WHY = {"answered-oob": "already answered (via oob)",
            "answered": "already answered",
            "dismissed": "dismissed (the agent moved on)",
            "timed-out": "timed out",
            "closed": "no longer pending",
            "not-held": "no hook waits for the answer (respond_via oob)",
            "settling": "an answer is already settling",
            "unknown-request": "no such open request in this session"}

#: the outcome Events that end the wait, per command type (AEP-0004 §5's table)
_TERMINAL = {
    "control.attention.respond": frozenset({"attention.resolved", "attention.timeout"}),
    "control.cancel": frozenset({"run.cancelled", "run.finished", "run.failed", "session.ended"}),
}


@dataclass(frozen=True)
class Command:
    """One command to send: the ``ControlClient.send`` arguments.
    ``capture`` is what the payload holds (AEP-0001 §9): ``redacted`` when it
    carries an operator's free text (an answer's text, a form's values, a
    cancel's reason), else ``metadata``."""

    type: str
    session: str
    data: dict[str, Any] = field(default_factory=dict)
    subject: str | None = None
    run: str | None = None
    cause: str | None = None
    capture: str = "metadata"


def respond(session: str, request: str, *, option: str | None = None, text: str | None = None,
            values: str | None = None) -> Command:
    """``control.attention.respond`` answering the ``attention.requested``
    Event ``request`` (its ``subject`` and ``cause``, AEP-0004 §5).
    ``values`` is a JSON object (a form's answers, AEP-0006: field id ->
    answer). Raises ``ValueError`` when no answer is given or ``values`` is
    not a JSON object."""
    answer: dict[str, Any] = {}
    if option is not None:
        answer["option"] = option
    if text is not None:
        answer["text"] = text
    if values is not None:
        try:
            parsed = json.loads(values)
        except ValueError as e:
            raise ValueError(f"--values: not JSON ({e})") from None
        if not isinstance(parsed, dict):
            raise ValueError("--values: expected a JSON object of field id -> answer")
        answer["values"] = parsed
    if not answer:
        raise ValueError("give the answer: --option ID, --text TEXT or --values JSON")
    free = text is not None or values is not None
    return Command("control.attention.respond", session, {"answer": answer}, subject=request,
                   cause=request, capture="redacted" if free else "metadata")


def cancel(session: str, *, run: str | None = None, scope: str | None = None,
           reason: str | None = None) -> Command:
    """``control.cancel``: the run (``scope`` ``run``, the default; ``run``
    names it, else the target cancels the open one) or the session."""
    data: dict[str, Any] = {"scope": scope or "run"}
    if reason:
        data["reason"] = reason
    return Command("control.cancel", session, data, run=run,
                   capture="redacted" if reason else "metadata")


def pause(session: str) -> Command:
    """``control.pause`` (empty payload)."""
    return Command("control.pause", session)


def resume(session: str) -> Command:
    """``control.resume`` (empty payload)."""
    return Command("control.resume", session)


HELD_READ_S = 60.0
"""Seconds one ``from=all&live=0`` read of what an endpoint holds may take
in all (a hostile endpoint's endless answer grew ``tail`` without bound: a
sixteenth outside attack on issue 25)."""


def held_events(url: str, token: str | None, flt: dict[str, Any], *,
                timeout: float = 10.0) -> Iterator[dict[str, Any]]:
    """The Events ``url`` holds that match ``flt`` (one ``from=all&live=0``
    read of ``/stream``, oldest first; a line that is not a JSON object is
    skipped). Raises ``httpx.HTTPError`` when the endpoint cannot be read."""
    import httpx
    from httpx_sse import connect_sse

    from .tailstream import bounded_sse
    params = {"filter": json.dumps(flt), "from": "all", "live": "0"}
    headers = {"authorization": f"Bearer {token}"} if token else {}
    end = time.monotonic() + HELD_READ_S
    with httpx.Client(timeout=timeout, trust_env=False) as client, \
            connect_sse(client, "GET", url.rstrip("/") + "/stream", params=params,
                        headers=headers) as source:
        source.response.raise_for_status()
        # an event past 16 MiB, a replay not over within HELD_READ_S: httpx.HTTPError
        for sse in bounded_sse(source.response, end):
            try:
                ev = json.loads(sse.data)
            except ValueError:
                continue
            if isinstance(ev, dict):
                yield ev


def find_session(url: str, token: str | None, request: str, *, timeout: float = 10.0) -> str | None:
    """The session of the ``attention.requested`` Event whose id is
    ``request``, from what ``url`` holds (one ``from=all&live=0`` read of
    ``/stream``, filtered to that type); ``None`` when it holds no such
    Event. Raises ``httpx.HTTPError`` when the endpoint cannot be read, and
    ``ValueError`` when asks of more than one session carry that id: an id
    is unique per emitter only (AEP-0001 §5.1 #2), and anyone who may post
    can copy a fleet ask's id into a session of its own (issue 25), so the
    operator names the session instead of the first claimant winning."""
    found: dict[str, None] = {}  # the sessions holding it, in order
    for ev in held_events(url, token, {"type": "attention.requested"}, timeout=timeout):
        if ev.get("id") == request and isinstance(ev.get("session"), str):
            found.setdefault(ev["session"], None)
            if len(found) > 1:
                break
    if len(found) > 1:
        names = ", ".join(sorted(found)[:2])
        raise ValueError(f"asks of more than one session carry the id {request} ({names}); "
                         "give its session: respond SESSION REQUEST_ID")
    return next(iter(found), None)


def resolved_as(url: str, token: str | None, session: str, request: str, *,
                timeout: float = 10.0) -> tuple[str | None, list[str] | None]:
    """``(how it ended, its option ids)``: the option ids of the ask
    ``request`` of ``session`` as held (``None`` when not held or it
    offers none: a form, a question), and how it already ended, from what
    ``url`` holds (one ``from=all&live=0`` read of ``/stream``, filtered to
    the session's ``attention.requested``, ``.resolved`` and ``.timeout``):
    ``"dismissed (attention.resolved <id> at <time>)"`` (the resolution:
    ``answered``, with its ``attention.answered``'s ``via`` when held:
    ``answered (via oob; ...)``, ``auto``, ``dismissed``) or ``"timed out (...)"``;
    ``None`` when it is still open or the endpoint no longer holds the ask.
    Only an outcome from the ask's own emitter counts (:func:`.gist.ask_key`,
    issue 25: anyone else's ``attention.resolved`` settles nothing).
    ``respond`` asks this first (trial issue 27): after a daemon restart
    the bridge has forgotten an ask it dismissed at shutdown, and the
    command would be refused ``no-route`` instead of saying why. Raises
    ``httpx.HTTPError`` when the endpoint cannot be read."""
    from .gist import ask_key
    types = ["attention.requested", "attention.answered", "attention.resolved",
             "attention.timeout"]
    asks: set[Any] = set()  # the ask's keys (source, session, id) as requested
    ids: list[str] | None = None
    ended: dict[Any, str] = {}
    via: dict[Any, str] = {}  # an attention.answered's data.via (oob: at the agent's terminal)
    for ev in held_events(url, token, {"type": types, "session": session}, timeout=timeout):
        key = ask_key(ev)
        if key is None or key[1] != session or key[2] != request:
            continue
        raw = ev.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if ev.get("type") == "attention.requested":
            asks.add(key)
            opts = data.get("options")
            if isinstance(opts, list) and opts:
                ids = [str(o["id"])[:64] for o in opts[:64]
                       if isinstance(o, dict) and isinstance(o.get("id"), str)]
            continue
        if ev.get("type") == "attention.answered":
            if isinstance(data.get("via"), str):
                via.setdefault(key, data["via"][:32])
            continue
        how = "timed out" if ev.get("type") == "attention.timeout" else \
            str(data.get("resolution") or "resolved")[:32]
        ended.setdefault(key, f"{how} ({{via}}{ev.get('type')} {str(ev.get('id'))[:64]} at "
                              f"{str(ev.get('time'))[:40]})")
    for k in asks:
        if k in ended:
            return ended[k].replace("{via}", f"via {via[k]}; " if k in via and
                                    ended[k].startswith("answered") else "", 1), ids
    return None, ids


def _linked(cmd_type: str, cmd_id: str, ack: dict[str, Any], events: "queue.Queue[dict[str, Any]]",
            deadline: float, show: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
    """Read ``events`` until the command's terminal outcome (returned) or
    ``deadline`` (``None``); every Event linked to the command is shown."""
    linked = {cmd_id, str(ack.get("id"))}
    # the target's own events only: the ack's emitter (session identity is
    # emitter-scoped, AEP-0001 §5.2); another emitter naming the command as
    # its cause in the same session name settles nothing (issue 25)
    target = ack.get("source")
    terminal = _TERMINAL.get(cmd_type)
    while (left := deadline - time.monotonic()) > 0:
        try:
            ev = events.get(timeout=min(left, 0.5))
        except queue.Empty:
            continue
        if ev.get("cause") not in linked or ev.get("id") == ack.get("id") or (
                target is not None and ev.get("source") != target):
            continue
        linked.add(str(ev.get("id")))
        show(ev)
        if terminal is None or ev.get("type") in terminal:
            return ev
    return None


def send(url: str, token: str | None, command: Command, *, ack_window_ms: int = 5000,
         retries: int = 2, wait_s: float = 30.0, out: TextIO | None = None,
         err: TextIO | None = None, client_factory: Callable[..., Any] | None = None,
         subscribe: Callable[..., Any] | None = None) -> int:
    """Send ``command`` to ``url``, print the ack, wait up to ``wait_s``
    seconds for the outcome; returns the exit status (module docstring).
    ``wait_s=0``: return once acked (0 on accepted)."""
    import aep_sdk
    from aep_sdk.errors import TransportError

    from .gist import _safe
    from .tail import Timeline, _console

    out, err = out or sys.stdout, err or sys.stderr
    name = f"aep-bridges {command.type.rsplit('.', 1)[-1]}"
    client = (client_factory or aep_sdk.ControlClient)(
        url, agent=AGENT, host=socket.gethostname() or "localhost", token=token)
    seen_cmd: list[str] = []  # the command's id as sent (retries resend the same)
    rejected: dict[str, Any] = {}  # command id -> its control.rejected's data.code
    try:
        client.connect(connect_timeout_ms=10_000)
        _watch_nacks(client, seen_cmd, rejected)
    except (TransportError, OSError) as e:
        from .tailstream import ELSEWHERE_HINT, refused
        if getattr(e, "status", None) in (401, 403):
            print(f"{name}: {UNAUTHORIZED}", file=err)
            return EXIT_UNAUTHORIZED
        hint = f" ({ELSEWHERE_HINT})" if refused(e) else ""
        print(_safe(f"{name}: cannot reach {url}: {e}{hint}"), file=err)
        return EXIT_UNREACHABLE
    try:
        try:
            ack = client.send(command.type, command.session, data=command.data,
                              subject=command.subject, run=command.run, cause=command.cause,
                              capture=command.capture, ack_window_ms=ack_window_ms,
                              retries=retries)
        except aep_sdk.NackError as e:
            if e.synthesized:
                print(_safe(f"{name}: no ack from session {command.session} ({e.detail}); "
                            "is a bridge serving it?"), file=err)
                return EXIT_NO_ACK
            # the target's own words (issue 25): escaped, one line, never a forged one
            code = rejected.get(seen_cmd[-1]) if seen_cmd else None
            why = NACK_WHY.get(code, f"{e.reason} ({code})") if isinstance(code, str) \
                else e.reason
            print(_safe(f"{name}: rejected: {why}" + (f" ({e.detail})" if e.detail else "")),
                  file=err)
            return EXIT_REJECTED
    finally:
        client.close()
    cmd_id = str(ack.get("cause"))
    print(_safe(f"{name}: accepted by session {command.session} (command {cmd_id}, "
                f"ack {ack.get('id')})"), file=out, flush=True)
    if wait_s <= 0:
        return 0
    return _await_outcome(url, token, command, cmd_id, ack, wait_s=wait_s, out=out, err=err,
                          subscribe=subscribe or aep_sdk.subscribe,
                          render=(Timeline(), _console("auto", out)), name=name)


def _watch_nacks(client: Any, sent: list[str], rejected: dict[str, Any]) -> None:
    """Keep what the SDK's ``NackError`` drops (it carries only ``reason``
    and ``detail``): the id of each command ``client`` sends into ``sent``,
    and each ``control.rejected``'s ``data.code`` by its ``cause`` into
    ``rejected``. Wraps the connected client's duplex (``send_json`` /
    ``recv_json``); a client without one (a test double) is left alone.
    The SDK's reader takes each frame through it before it fails the
    waiting send, so the code is there when the ``NackError`` is raised."""
    duplex: Any = getattr(client, "_duplex", None)
    if duplex is None or not hasattr(duplex, "recv_json") or not hasattr(duplex, "send_json"):
        return

    class _Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(duplex, name)

        def send_json(self, obj: dict[str, Any]) -> None:
            if isinstance(obj, dict) and isinstance(obj.get("id"), str) \
                    and str(obj.get("type", "")).startswith(("control.", "x.")):
                sent.append(obj["id"])
            duplex.send_json(obj)

        def recv_json(self) -> Any:
            msg = duplex.recv_json()
            if isinstance(msg, dict) and msg.get("type") == "control.rejected" \
                    and isinstance(msg.get("cause"), str) and isinstance(msg.get("data"), dict):
                code = msg["data"].get("code")
                if isinstance(code, str):
                    rejected[msg["cause"]] = code[:64]
            return msg
    client._duplex = _Spy()  # noqa: SLF001 (the SDK has no hook for the nack's payload)


def _await_outcome(url: str, token: str | None, command: Command, cmd_id: str,
                   ack: dict[str, Any], *, wait_s: float, out: TextIO, err: TextIO,
                   subscribe: Callable[..., Any], render: tuple[Any, Any], name: str) -> int:
    timeline, console = render
    events: queue.Queue[dict[str, Any]] = queue.Queue()
    # from the ack's own position: the outcome follows it in the session's order
    position = {"session": command.session, "epoch": ack.get("epoch", 0), "seq": ack.get("seq", 0)}
    sub = subscribe(url, events.put, filter={"session": command.session}, token=token,
                    from_=[position] if isinstance(ack.get("seq"), int) else None,
                    backoff_initial_ms=250, backoff_max_ms=2000)

    def show(ev: dict[str, Any]) -> None:
        console.print(timeline.line(ev), no_wrap=True, overflow="ellipsis")
        out.flush()

    try:
        outcome = _linked(command.type, cmd_id, ack, events, time.monotonic() + wait_s, show)
    finally:
        sub.close()
    if outcome is None:
        print(f"{name}: accepted, but no outcome within {wait_s:g} s "
              "(the target may still act: watch aep-bridges tail)", file=err)
        return EXIT_NO_OUTCOME
    return 0
