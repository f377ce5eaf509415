"""The opt-in control gate: exactly five gated REST writes via the shared
command ledger.

Design record: ``shared/aep/docs/bridge-openhands-design.md`` ("The opt-in
control gate", "The approval loop becomes answerable", "Pause and resume",
"control.cancel is not adopted", "send_input", "interrupt", "Ack discipline:
REST-settled"); AEP-0004 §3/§5/§6; AEP-0008 (text answers).

:class:`OpenHandsControl` is this bridge's
:class:`~bridges.core.control.Controller`; a run of the bridge constructs it
only when the gate is open (``AEP_TOKEN`` set AND
``AEP_OPENHANDS_CONTROL=1``) and hands it to the fleet, whose ledger is the
only caller of :meth:`OpenHandsControl.perform`, the bridge's only write
path to the vendor. The five writes:

=====================================  =============================================================
command                                REST write (``X-Session-API-Key`` header)
=====================================  =============================================================
``control.attention.respond``          ``POST /api/conversations/{id}/events/respond_to_confirmation``
``control.pause``                      ``POST /api/conversations/{id}/pause``
``control.resume``                     ``POST /api/conversations/{id}/run``
``x.openhands.control.send_input``     ``POST /api/conversations/{id}/events`` (``run`` pinned false)
``x.openhands.control.interrupt``      ``POST /api/conversations/{id}/interrupt``
=====================================  =============================================================

Guards run BEFORE any write, from the receiver's last-observed status (the
same state that drives run synthesis), so a refusal is consistent with the
stream and the vendor receives nothing. :meth:`OpenHandsControl.check`
resolves the whole write into a :class:`Plan`. Outcomes are the vendor's own
status flips (the receiver cause-links them through the notes
:meth:`OpenHandsControl.note` sets); ``send_input``'s outcome is
``x.openhands.input.sent {}`` at REST 2xx, after the ack (the write's
``after_ack``), never echoing the text.

An approval is written only once the vendor's run that raised the ask is
over (:meth:`Conversation.run_wound_down`, at most :data:`WIND_DOWN_WAIT`):
the real server drops one posted while that task winds down. A snapshot
after it with the ask still pending has it written again
(:meth:`OpenHandsControl._until_taken`, counted
``control_respond_rewritten``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from bridges.core.bridge import Emission
from bridges.core.control import ACK_WINDOW_MS, Refuse, Undo, Unreachable, WriteResult
from bridges.core.rest import BadAnswer, fetch, parse_json

from . import mapping as M
from .config import OpenHandsConfig
from .conversation import Settling
from .receiver import Conversation, Receiver

log = logging.getLogger("aep.bridge.openhands.control")

RESPOND = "control.attention.respond"
PAUSE = "control.pause"
RESUME = "control.resume"
SEND_INPUT = "x.openhands.control.send_input"
INTERRUPT = "x.openhands.control.interrupt"
ACCEPTS = (RESPOND, PAUSE, RESUME, SEND_INPUT, INTERRUPT)
INPUT_MAX = 4000
OPTIONS = ({"id": "approve", "label": "Approve"}, {"id": "deny", "label": "Deny"})
WRITE_TIMEOUT = 30.0
RETRIES = 3
"""Times a dropped approval is written again (:meth:`OpenHandsControl._until_taken`)."""
WIND_DOWN_WAIT = 30.0
"""Seconds an approval waits for the vendor's run task to be over
(:meth:`Conversation.run_wound_down`) before it is written anyway: the
server's own bound on that wind-down (its wait for pending callbacks)."""


def decorate(emission: Emission) -> None:
    """Gated on, the confirmation ask becomes answerable (record: a
    receiver-side decoration; the pure table and the gated-off payload are
    unchanged)."""
    emission["data"]["options"] = [dict(o) for o in OPTIONS]
    emission["data"]["respond_via"] = ["control"]


def decide_answer(answer: object) -> tuple[bool, str | None, dict[str, Any]]:
    """``control.attention.respond`` ``answer`` -> ``(accept, reason,
    applied)``. ``applied`` is the answer as actually applied, recorded on
    ``attention.answered``.

    - ``option`` ``approve`` -> accept; ``deny`` -> reject with ``text`` as
      the reason when given, else the vendor's default (``reason`` ``None``).
    - AEP-0008: a text-only answer that, trimmed, case-insensitively equals
      an option's ``id`` or exactly one option's ``label`` counts as that
      option (the word is the decision, not a reason); any other text
      DENIES with the text as the reason (never the permissive choice).

    Raises :class:`Refuse` ``invalid`` for anything else (no answer object,
    an unknown option, ``values``, empty text)."""
    if not isinstance(answer, dict):
        raise Refuse("invalid", "answer must be an object with option or text")
    option, text = answer.get("option"), answer.get("text")
    if text is not None and not isinstance(text, str):
        raise Refuse("invalid", "answer.text must be a string")
    if option is not None:
        if option not in ("approve", "deny"):
            raise Refuse("invalid", "answer.option must be approve or deny")
        if option == "approve":
            return True, None, {"option": "approve"}
        reason = text.strip() if text and text.strip() else None
        return False, reason, ({"option": "deny", "text": reason} if reason else {"option": "deny"})
    if answer.get("values") is not None:
        raise Refuse("invalid", "this request is a permission, not a form")
    if not text or not text.strip():
        raise Refuse("invalid", "answer needs option approve/deny or text")
    word = text.strip().lower()
    matches = [o["id"] for o in OPTIONS if word == o["id"] or word == o["label"].lower()]
    if len(set(matches)) == 1:
        return (True, None, {"option": "approve"}) if matches[0] == "approve" \
            else (False, None, {"option": "deny"})
    reason = text.strip()
    return False, reason, {"option": "deny", "text": reason}


NOTES = {PAUSE: "pause", RESUME: "resume", INTERRUPT: "interrupt"}
"""The conversation note each status-flipping command sets (the receiver
cause-links the flip to it, :meth:`Receiver._note_cause`)."""


@dataclass(frozen=True)
class Plan:
    """One planned write, from :meth:`OpenHandsControl.check` to
    :meth:`OpenHandsControl.perform` (the ledger carries it).

    ``command``: the command id; ``type``: the command type; ``conv``: the
    receiver's conversation (the note goes there); ``path`` / ``body``: the
    POST; ``applied``: the answer as applied (a respond only, recorded on
    ``attention.answered``)."""

    command: str
    type: str
    conv: Conversation
    path: str
    body: dict[str, Any] | None
    applied: dict[str, Any] | None = None


class OpenHandsControl:
    """The gated controller for one run against one server. ``config``:
    the bridge's (``guard_ms``); ``receiver``: the run's receiver (the
    last-observed state; carries the notes); ``client``: the run's POST
    client (``None`` only in tests that never perform)."""

    accepts = ACCEPTS
    ack_window_ms = ACK_WINDOW_MS

    def __init__(self, config: OpenHandsConfig, receiver: Receiver, *,
                 client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.guard_ms = config.guard_ms
        self.receiver = receiver
        self._client = client

    @property
    def declaration(self) -> dict[str, Any]:
        return {"accepts": list(ACCEPTS), "ack_window_ms": ACK_WINDOW_MS}

    # ------------------------------------------------------------------ guards
    def _conversation(self, cmd: dict[str, Any]) -> Conversation:
        conv = self.receiver.conversations.get(cmd.get("session"))  # type: ignore[arg-type]
        if conv is None or conv.ended:
            raise Refuse("refused", "no OpenHands conversation with this session is attached")
        return conv

    def check(self, cmd: dict[str, Any]) -> Plan:
        """The plan for ``cmd``, or :class:`Refuse` before any write; see
        the module docstring."""
        conv = self._conversation(cmd)
        t = cmd.get("type")
        data: dict[str, Any] = cmd["data"] if isinstance(cmd.get("data"), dict) else {}
        base = f"/api/conversations/{cmd['session']}"
        if t == RESPOND:
            return self._plan_respond(cmd, conv, data, base)
        if t in (PAUSE, INTERRUPT):
            _refuse_unless(conv, M.RUNNING, f"{t} is honored only while the conversation is "
                                            f"running (it is {conv.status or 'unknown'})")
            return Plan(cmd["id"], t, conv, f"{base}/{NOTES[t]}", None)
        if t == RESUME:
            if conv.status == M.WAITING:
                raise Refuse("refused", "the conversation is waiting_for_confirmation: the vendor's run "
                                        "would silently accept the pending action; answer it with "
                                        "control.attention.respond")
            _refuse_unless(conv, M.PAUSED, "control.resume is honored only from paused "
                                           f"(it is {conv.status or 'unknown'})")
            return Plan(cmd["id"], t, conv, f"{base}/run", None)
        if t == SEND_INPUT:
            text = data.get("text")
            if not isinstance(text, str) or not text.strip():
                raise Refuse("invalid", "data.text must be a non-empty string")
            if len(text) > INPUT_MAX:
                raise Refuse("invalid", f"data.text is over {INPUT_MAX} characters")
            # pinned: never a run trigger, never an implicit approval
            body = {"role": "user", "content": [{"type": "text", "text": text}], "run": False}
            return Plan(cmd["id"], t, conv, f"{base}/events", body)
        raise Refuse("unsupported", f"{t} is not accepted")  # the ledger gates types first

    @staticmethod
    def _plan_respond(cmd: dict[str, Any], conv: Conversation, data: dict[str, Any],
                      base: str) -> Plan:
        if conv.status != M.WAITING or conv.attention_id is None:
            raise Refuse("refused", "no confirmation is pending (the conversation is "
                                    f"{conv.status or 'unknown'})")
        if cmd.get("subject") != conv.attention_id:
            raise Refuse("refused", "subject is not the live pending attention.requested")
        if conv.settling is not None:
            raise Refuse("refused", "a response to this request is already settling")
        accept, reason, applied = decide_answer(data.get("answer"))
        body: dict[str, Any] = {"accept": accept}
        if not accept and reason:
            body["reason"] = reason
        return Plan(cmd["id"], RESPOND, conv, f"{base}/events/respond_to_confirmation", body,
                    applied)

    def note(self, plan: Plan) -> Undo | None:
        """Set the pending note the vendor's flip will be cause-linked
        through; the returned undo clears exactly this note."""
        conv, cid = plan.conv, plan.command
        if plan.type == RESPOND:
            assert plan.applied is not None
            conv.settling = Settling(cid, plan.applied)

            def undo_settling() -> None:
                if conv.settling is not None and conv.settling.cmd_id == cid:
                    conv.settling = None
            return undo_settling
        note = NOTES.get(plan.type)
        if note is None:
            return None  # send_input: its outcome is the write's after_ack
        conv.notes[note] = cid

        def undo_note() -> None:
            if conv.notes.get(note) == cid:
                del conv.notes[note]
        return undo_note

    # ------------------------------------------------------------------ the five writes
    async def perform(self, plan: Plan) -> WriteResult:
        """The only REST writes this bridge makes. Transport failures are
        :class:`Unreachable` (acked ``busy``); the detail never carries the
        key (it is a header, and only the status and the vendor's detail
        text are reported). A 2xx ``send_input`` carries its outcome as
        ``after_ack``."""
        assert self._client is not None
        approve = plan.type == RESPOND and plan.body is not None and plan.body.get("accept") is True
        if approve:
            await _approvable(plan)
        snaps = plan.conv.snaps
        try:  # the status is the answer: a body past the bounds is dropped
            r = await fetch(self._client, "POST", plan.path, json=plan.body, status_only=True)
        except (httpx.TransportError, OSError, BadAnswer):
            raise Unreachable("OpenHands agent server unreachable") from None
        result = WriteResult(r.status_code, _detail(r))
        if approve and 200 <= r.status_code < 300:
            result.after_ack = lambda: self._until_taken(plan, snaps)
        if plan.type == SEND_INPUT and 200 <= r.status_code < 300:
            result.after_ack = lambda: self._input_sent(plan)
        return result

    async def _until_taken(self, plan: Plan, snaps: int) -> None:
        """After an accepted approval: a snapshot the socket delivers once the
        write was sent (``conv.snaps`` past ``snaps``) while the ask is still
        pending (no flip out of ``waiting_for_confirmation``, the settling
        note still this command's) says the vendor dropped it: its run task
        was still winding down, which the connect snapshot of a socket
        attached in that window cannot show. The approval is written again
        (at most :data:`RETRIES` times, within :data:`WIND_DOWN_WAIT`); for
        the vendor a repeat while a run is live is a no-op."""
        assert self._client is not None
        conv = plan.conv
        with trio.move_on_after(WIND_DOWN_WAIT):
            for _ in range(RETRIES):
                while conv.snaps == snaps and _pending(plan) and not conv.detached:
                    if conv.wound is None:
                        conv.wound = trio.Event()
                    await conv.wound.wait()
                if not _pending(plan) or conv.detached:
                    return
                snaps = conv.snaps
                log.info("OpenHands conversation %s: the vendor dropped the approval %s (its run was "
                         "still winding down); writing it again", conv.id, plan.command)
                self.receiver.ctx.health.count("control_respond_rewritten")
                try:
                    await fetch(self._client, "POST", plan.path, json=plan.body, status_only=True)
                except (httpx.TransportError, OSError, BadAnswer):
                    return

    async def _input_sent(self, plan: Plan) -> None:
        await self.receiver.emit_outcome(plan.conv.id, {"type": "x.openhands.input.sent",
                                                        "data": {}, "severity": "notice"},
                                         plan.command)


async def _approvable(plan: Plan) -> None:
    """Wait (at most :data:`WIND_DOWN_WAIT`) until the vendor's run that
    raised the confirmation is over: the real server drops an approval
    posted while that task winds down (``respond_to_confirmation`` treats
    the task as "already running", answers 200 and never runs the action;
    the flake behind ``test_approve_over_control``). Raises :class:`Refuse`
    when the confirmation was settled meanwhile (nothing is written: an
    approval of a conversation no longer waiting would start a run)."""
    conv = plan.conv
    with trio.move_on_after(WIND_DOWN_WAIT):
        while not conv.run_wound_down() and not conv.detached:
            if conv.wound is None:
                conv.wound = trio.Event()
            await conv.wound.wait()
    if not conv.run_wound_down():
        log.warning("OpenHands conversation %s: the vendor's run did not wind down within %ss; "
                    "approving anyway", conv.id, WIND_DOWN_WAIT)
    if not _pending(plan):
        raise Refuse("refused", "the confirmation was settled before the approval was written")


def _pending(plan: Plan) -> bool:
    """The ask ``plan`` answers is still pending and settling by it."""
    conv = plan.conv
    return conv.status == M.WAITING and conv.settling is not None and conv.settling.cmd_id == plan.command


def _refuse_unless(conv: Conversation, status: str, why: str) -> None:
    if conv.status != status:
        raise Refuse("refused", why)


def _detail(r: httpx.Response) -> str | None:
    if 200 <= r.status_code < 300:
        return None
    try:
        body = parse_json(r.content)
    except ValueError:
        return (r.text or "")[:200] or None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return body["detail"][:200]
    return None
