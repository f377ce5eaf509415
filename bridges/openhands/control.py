"""The opt-in control gate: exactly five gated REST writes via the shared
command ledger.

Design record: ``shared/aep/docs/bridge-openhands-design.md`` ("The opt-in
control gate", "The approval loop becomes answerable", "Pause and resume",
"control.cancel is not adopted", "send_input", "interrupt", "Ack discipline:
REST-settled"); AEP-0004 §3/§5/§6; AEP-0008 (text answers).

This module is constructed only when the gate is open (``AEP_TOKEN`` set AND
``AEP_OPENHANDS_CONTROL=1``); :meth:`OpenHandsControl.write` is the bridge's
only write path to the vendor, and it is reachable only through the
ledger's ``write`` callback. The five writes:

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
stream and the vendor receives nothing. Outcomes are the vendor's own status
flips (the receiver cause-links them through the notes ``arm`` sets);
``send_input``'s outcome is ``x.openhands.input.sent {}`` at REST 2xx, never
echoing the text.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Callable

import httpx
import trio

from bridges.core.ledger import CommandLedger, Refuse, Unreachable, WriteResult

from . import mapping as M
from .receiver import Receiver, Settings, Settling, rest_client

log = logging.getLogger("aep.bridge.openhands.control")

RESPOND = "control.attention.respond"
PAUSE = "control.pause"
RESUME = "control.resume"
SEND_INPUT = "x.openhands.control.send_input"
INTERRUPT = "x.openhands.control.interrupt"
ACCEPTS = (RESPOND, PAUSE, RESUME, SEND_INPUT, INTERRUPT)
ACK_WINDOW_MS = 10_000
INPUT_MAX = 4000
OPTIONS = ({"id": "approve", "label": "Approve"}, {"id": "deny", "label": "Deny"})
WRITE_TIMEOUT = 30.0


def decorate(emission: dict[str, Any]) -> None:
    """Gated on, the confirmation ask becomes answerable (record: a
    receiver-side decoration; the pure table and the gated-off payload are
    unchanged)."""
    emission["data"]["options"] = [dict(o) for o in OPTIONS]
    emission["data"]["respond_via"] = ["control"]


def decide_answer(answer: Any) -> tuple[bool, str | None, dict[str, Any]]:
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


class OpenHandsControl:
    """The gated control handler for one server. ``receiver`` supplies the
    last-observed state and carries the notes; ``client`` (optional, for
    tests) is the POST client (built from ``settings`` otherwise)."""

    def __init__(self, settings: Settings, receiver: Receiver, *,
                 client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self.receiver = receiver
        self._client = client
        self._input_box: OrderedDict[str, dict[str, bool]] = OrderedDict()

    @property
    def declaration(self) -> dict[str, Any]:
        return {"accepts": list(ACCEPTS), "ack_window_ms": ACK_WINDOW_MS}

    async def serve(self, ctx: Any) -> None:
        """Run the ledger over ``ctx.commands`` until the bridge stops."""
        own = self._client is None
        client = self._client or rest_client(self.settings, timeout=WRITE_TIMEOUT)
        self._client = client
        try:
            async with CommandLedger(ctx, ACCEPTS, ack_window_ms=ACK_WINDOW_MS,
                                     guard_ms=self.settings.guard_ms) as ledger:
                await ledger.serve(ctx.commands, check=self.check, write=self.write,
                                   arm=self.arm, on_accepted=self.on_accepted)
        finally:
            if own:
                with trio.CancelScope(shield=True):
                    await client.aclose()

    # ------------------------------------------------------------------ guards
    def _conversation(self, cmd: dict[str, Any]):
        conv = self.receiver.conversations.get(cmd.get("session"))
        if conv is None or conv.ended:
            raise Refuse("refused", "no OpenHands conversation with this session is attached")
        return conv

    def check(self, cmd: dict[str, Any]) -> None:
        """Refuse before any write (``Refuse``); see the module docstring."""
        conv = self._conversation(cmd)
        t = cmd.get("type")
        data = cmd.get("data") if isinstance(cmd.get("data"), dict) else {}
        status = conv.status or "unknown"
        if t == RESPOND:
            if conv.status != M.WAITING or conv.attention_id is None:
                raise Refuse("refused", f"no confirmation is pending (the conversation is {status})")
            if cmd.get("subject") != conv.attention_id:
                raise Refuse("refused", "subject is not the live pending attention.requested")
            if conv.settling is not None:
                raise Refuse("refused", "a response to this request is already settling")
            decide_answer(data.get("answer"))
        elif t in (PAUSE, INTERRUPT):
            if conv.status != M.RUNNING:
                raise Refuse("refused", f"{t} is honored only while the conversation is running "
                                        f"(it is {status})")
        elif t == RESUME:
            if conv.status == M.WAITING:
                raise Refuse("refused", "the conversation is waiting_for_confirmation: the vendor's run "
                                        "would silently accept the pending action; answer it with "
                                        "control.attention.respond")
            if conv.status != M.PAUSED:
                raise Refuse("refused", f"control.resume is honored only from paused (it is {status})")
        elif t == SEND_INPUT:
            text = data.get("text")
            if not isinstance(text, str) or not text.strip():
                raise Refuse("invalid", "data.text must be a non-empty string")
            if len(text) > INPUT_MAX:
                raise Refuse("invalid", f"data.text is over {INPUT_MAX} characters")

    def arm(self, cmd: dict[str, Any]) -> Callable[[], None] | None:
        """Set the pending note the vendor's flip will be cause-linked
        through; the returned ``disarm`` clears exactly this note."""
        conv = self._conversation(cmd)
        t, cid = cmd.get("type"), cmd["id"]
        if t == RESPOND:
            _, _, applied = decide_answer((cmd.get("data") or {}).get("answer"))
            conv.settling = Settling(cid, applied)

            def disarm() -> None:
                if conv.settling is not None and conv.settling.cmd_id == cid:
                    conv.settling = None
            return disarm
        note = {PAUSE: "pause", RESUME: "resume", INTERRUPT: "interrupt"}.get(t)
        if note is not None:
            conv.notes[note] = cid

            def disarm_note() -> None:
                if conv.notes.get(note) == cid:
                    del conv.notes[note]
            return disarm_note
        if t == SEND_INPUT:
            self._input_box[cid] = {"ok": False, "acked": False}
            while len(self._input_box) > 1024:
                self._input_box.popitem(last=False)
        return None

    # ------------------------------------------------------------------ the five writes
    async def write(self, cmd: dict[str, Any]) -> WriteResult:
        """The only REST writes this bridge makes. Transport failures are
        :class:`Unreachable` (acked ``busy``); the detail never carries the
        key (it is a header, and only the status and the vendor's detail
        text are reported)."""
        assert self._client is not None
        cid = cmd["session"]
        t = cmd.get("type")
        data = cmd.get("data") if isinstance(cmd.get("data"), dict) else {}
        base = f"/api/conversations/{cid}"
        if t == RESPOND:
            accept, reason, _ = decide_answer(data.get("answer"))
            body: dict[str, Any] = {"accept": accept}
            if not accept and reason:
                body["reason"] = reason
            path = f"{base}/events/respond_to_confirmation"
        elif t == PAUSE:
            path, body = f"{base}/pause", None
        elif t == RESUME:
            path, body = f"{base}/run", None
        elif t == INTERRUPT:
            path, body = f"{base}/interrupt", None
        elif t == SEND_INPUT:
            path = f"{base}/events"
            body = {"role": "user", "content": [{"type": "text", "text": data["text"]}],
                    "run": False}  # pinned: never a run trigger, never an implicit approval
        else:  # pragma: no cover - the ledger only calls write for declared types
            raise Refuse("unsupported")
        try:
            r = await self._client.post(path, json=body)
        except (httpx.TransportError, OSError):
            raise Unreachable("OpenHands agent server unreachable") from None
        result = WriteResult(r.status_code, _detail(r))
        if t == SEND_INPUT and 200 <= r.status_code < 300:
            box = self._input_box.get(cmd["id"])
            if box is not None:
                box["ok"] = True
                if box["acked"]:  # the guard already acked: the outcome follows now
                    await self._input_sent(cmd)
        return result

    async def on_accepted(self, cmd: dict[str, Any], ack: dict[str, Any]) -> None:
        if cmd.get("type") != SEND_INPUT:
            return
        box = self._input_box.get(cmd["id"])
        if box is None:
            return
        box["acked"] = True
        if box["ok"]:
            await self._input_sent(cmd)

    async def _input_sent(self, cmd: dict[str, Any]) -> None:
        self._input_box.pop(cmd["id"], None)
        await self.receiver.emit_outcome(cmd["session"], {"type": "x.openhands.input.sent", "data": {},
                                                          "severity": "notice"}, cmd["id"])


def _detail(r: httpx.Response) -> str | None:
    if 200 <= r.status_code < 300:
        return None
    try:
        body = r.json()
    except ValueError:
        return (r.text or "")[:200] or None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return body["detail"][:200]
    return None
