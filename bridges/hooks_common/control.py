"""The hook family's :class:`bridges.core.control.Controller`: answers held
asks and queues steering. Built only when a gate is open (the bridge's
``AEP_<AGENT>_CONTROL=1`` with ``AEP_TOKEN``, and/or ``AEP_INSTRUCT=1``
with ``AEP_TOKEN``); the fleet's ledger serves it.

=================================  ==========================================================
``control.attention.respond``      the subject is an open ``attention.requested`` whose hook
                                   is held here; the answer (option / AEP-0008 text / AEP-0006
                                   values, :func:`.answers.decide`) becomes the held hook's
                                   reply; ``attention.answered`` + ``.resolved`` after the ack.
                                   An invalid answer is nacked ``invalid`` and the ask stays
                                   pending; an ask answered at the terminal, timed out or no
                                   longer held is ``refused`` (the late command), with why
                                   as ``code`` (``answered-oob``, ``answered``,
                                   ``dismissed``, ``timed-out``, ``not-held``,
                                   ``settling``, ``unknown-request``: ``metadata``, where
                                   the ``detail`` is capture-gated).
``x.<agent>.control.instruct``     ``{text}`` queued for the session (FIFO, at most 20; full:
                                   ``invalid``); delivered on the next eligible hook reply
                                   (``docs/control-steering-design.md``).
=================================  ==========================================================

The "write" is local (the held hook's reply, or the queue), so ``perform``
never waits on the vendor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from bridges.core.control import Refuse, WriteResult

from .answers import Decision, decide
from .hub import HookHub
from .session import QUEUE_MAX, Ask

__all__ = ["ACK_WINDOW_MS", "GUARD_MS", "HookControl", "Plan", "RESPOND", "accepts"]

RESPOND = "control.attention.respond"
#: a late command's nack ``detail`` per :attr:`.session.Ask.closed_as` (its ``code``)
_GONE = {"answered": "the request was already answered (from AEP)",
         "answered-oob": "the request was already answered at the agent (via oob)",
         "dismissed": "the request was dismissed (the agent moved on, or its run ended)",
         "timed-out": "the request timed out",
         "closed": "the request is no longer pending"}
ACK_WINDOW_MS = 10_000
GUARD_MS = 2_000


def accepts(agent: str, *, respond: bool, instruct: bool) -> tuple[str, ...]:
    """The declared ``control.accepts`` for the open gates."""
    out: tuple[str, ...] = ()
    if respond:
        out += (RESPOND,)
    if instruct:
        out += (f"x.{agent}.control.instruct",)
    return out


@dataclass(frozen=True)
class Plan:
    """What :meth:`HookControl.check` decided: a ``respond`` to ``ask`` with
    ``decision``, or an ``instruct`` of ``text`` to ``session``."""

    kind: str
    cmd_id: str
    session: str
    ask: Ask | None = None
    decision: Decision | None = None
    text: str = ""


class HookControl:
    """The controller of one hook bridge run (see the module docstring)."""

    ack_window_ms = ACK_WINDOW_MS
    guard_ms = GUARD_MS

    def __init__(self, hub: HookHub, *, respond: bool, instruct: bool) -> None:
        self.hub = hub
        self.accepts = accepts(hub.profile.agent, respond=respond, instruct=instruct)

    def check(self, cmd: dict[str, Any]) -> Plan:
        """Validate against the hub's state; raises :class:`Refuse`. No I/O."""
        sid = cmd.get("session")
        if not isinstance(sid, str):
            raise Refuse("invalid", "the command names no session")
        raw = cmd.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if cmd.get("type") == RESPOND:
            subject = cmd.get("subject")
            ask = self.hub.sessions.find_ask(subject)
            if ask is None or ask.session != sid:
                gone = self.hub.sessions.why_gone(subject, sid)
                if gone is not None:
                    raise Refuse("refused", _GONE.get(gone, _GONE["closed"]), code=gone)
                raise Refuse("refused", "subject is not an open attention.requested of this session",
                             code="unknown-request")
            if not ask.open:
                why = ask.closed_as or "closed"
                raise Refuse("refused", _GONE.get(why, _GONE["closed"]), code=why)
            if not ask.held:
                raise Refuse("refused", "no hook waits for this answer here (respond_via oob)",
                             code="not-held")
            if ask.settling is not None:
                raise Refuse("refused", "an answer to this request is already settling",
                             code="settling")
            decision = decide(data.get("answer"), ask.options, ask.fields)
            return Plan("respond", str(cmd["id"]), sid, ask=ask, decision=decision)
        text = data.get("text")
        if not isinstance(text, str) or not text.strip():
            raise Refuse("invalid", "data.text must be a non-empty string")
        if len(text) > self.hub.profile.context_max:
            raise Refuse("invalid", f"data.text is over {self.hub.profile.context_max} characters")
        st = self.hub.sessions.get(sid)
        if st is None:
            raise Refuse("refused", "no hook of this session has been seen (or it ended)")
        if len(st.queue) >= QUEUE_MAX:
            raise Refuse("invalid", f"the session's steering queue is full ({QUEUE_MAX})")
        return Plan("instruct", str(cmd["id"]), sid, text=text)

    def note(self, plan: Plan) -> Callable[[], None] | None:
        """Mark the ask as settling (the vendor's next moment must not settle
        it out of band meanwhile); its undo."""
        ask = plan.ask
        if ask is None:
            return None
        ask.settling = plan.cmd_id

        def undo() -> None:
            if ask.settling == plan.cmd_id:
                ask.settling = None
        return undo

    async def perform(self, plan: Plan) -> WriteResult:
        """Hand the decision to the held hook, or queue the instruction."""
        if plan.kind == "instruct":
            self.hub.queue(plan.session, plan.cmd_id, plan.text)
            return WriteResult(200)
        ask, decision = plan.ask, plan.decision
        assert ask is not None and decision is not None
        if not ask.open:
            why = ask.closed_as or "closed"
            raise Refuse("refused", _GONE.get(why, _GONE["closed"]), code=why)
        ask.state, ask.decision, ask.closed_as = "answered", decision, "answered"
        ask.done.set()

        async def outcome() -> None:
            await self.hub.answered(ask, decision, plan.cmd_id)
        return WriteResult(200, after_ack=outcome)
