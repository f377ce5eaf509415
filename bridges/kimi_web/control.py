"""The opt-in control gate: exactly two REST writes through the shared
command ledger.

Design record: ``shared/aep/docs/adapter-kimi-code-design.md`` ("The kimi
web channel": opt-in control); AEP-0004 §3/§5 (acks, respond, cancel),
AEP-0008 (text answers). Built only when the gate is open
(``AEP_KIMI_WEB_CONTROL=1``, primary mode, ``AEP_TOKEN``);
:meth:`KimiWebControl.write` is reachable only as the ledger's ``write``.

=============================  ====================================================================
command                        REST write (bearer header, never a URL token)
=============================  ====================================================================
``control.attention.respond``  ``POST /api/v1/sessions/{sid}/approvals/{approval_id}``
                               ``{decision: approved|rejected, scope?: "session", feedback?}``
``control.cancel`` (``run``)   ``POST /api/v1/sessions/{sid}/prompts/{prompt_id}:abort`` (the turn's
                               prompt id is the run id; 2.1.0 ignores the WS ``abort`` frame)
=============================  ====================================================================

Shape: :class:`bridges.core.control.Controller` (``check`` -> a
:class:`Plan`, ``note`` it, ``perform`` it); the bridge hands it to the
fleet in its per-run :class:`bridges.kimi_web.bridge.KimiWebRun`, and the
fleet's ledger (``supervisor.fleet.run_bridge``) serves it. Checks run before any write from the tracker's last-observed state: the
session is attached, the ask is an open permission ask (the subject is its
``attention.requested`` id, or the vendor approval id), no answer to it is
already settling; cancel needs the run open (scope ``session`` is refused:
a kimi session has no end to command). Vendor answers (HTTP 200 with a
non-zero ``code``): 40902 (already resolved), 41001 (expired), 40401/40404/
40402 (gone) are ``refused`` with the vendor's reason; 40901 is ``busy``;
a transport failure is ``busy`` (:class:`bridges.core.ledger.Unreachable`).
The outcome is the vendor's own broadcast (``event.approval.resolved``,
``turn.ended`` cancelled), cause-linked through the note :meth:`KimiWebControl.note` sets.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from bridges.core.control import Refuse, WriteResult

from . import mapping as M
from .receiver import AuthRefused, Receiver, VendorError
from .rest import seg
from .tracker import SessionState

RESPOND = "control.attention.respond"
CANCEL = "control.cancel"
ACCEPTS = (RESPOND, CANCEL)
ACK_WINDOW_MS = 10_000
REFUSED_CODES = {40902: "the approval is already resolved", 41001: "the approval expired",
                 40401: "the session does not exist", 40404: "the approval does not exist",
                 40402: "the prompt is not running"}
BUSY_CODES = {40901: "the session is busy"}
FEEDBACK_MAX = 4000


def decide(answer: Any) -> dict[str, Any]:
    """A ``control.attention.respond`` answer -> the vendor body ``{decision,
    scope?, feedback?}`` plus ``applied`` (the answer as applied, recorded on
    ``attention.answered``).

    - ``option``: ``approved`` / ``approved_for_session`` (``scope:
      "session"``) / ``rejected`` (with ``text`` as the feedback when given).
    - AEP-0008 text only: trimmed, case-insensitively equal to an option id
      or exactly one label -> that option; any other text is a
      ``rejected`` decision with the text as ``feedback`` (it reaches the
      model; never the permissive choice).

    Raises :class:`Refuse` ``invalid`` for anything else."""
    if not isinstance(answer, dict):
        raise Refuse("invalid", "answer must be an object with option or text")
    option, text = answer.get("option"), answer.get("text")
    if text is not None and not isinstance(text, str):
        raise Refuse("invalid", "answer.text must be a string")
    if answer.get("values") is not None:
        raise Refuse("invalid", "this request is a permission, not a form")
    ids = [i for i, _ in M.APPROVAL_OPTIONS]
    if option is None:
        if not text or not text.strip():
            raise Refuse("invalid", "answer needs an option or text")
        word = text.strip().lower()
        hits = {i for i, lbl in M.APPROVAL_OPTIONS if word in (i, lbl.lower())}
        if len(hits) == 1:
            option, text = hits.pop(), None
        else:
            option = "rejected"
    if option not in ids:
        raise Refuse("invalid", f"answer.option must be one of {', '.join(ids)}")
    feedback = text.strip()[:FEEDBACK_MAX] if option == "rejected" and text and text.strip() else None
    body: dict[str, Any] = {"decision": "approved" if option.startswith("approved") else "rejected"}
    if option == "approved_for_session":
        body["scope"] = "session"
    applied: dict[str, Any] = {"option": option}
    if feedback:
        body["feedback"] = feedback
        applied["text"] = feedback
    return {"body": body, "applied": applied}


@dataclass(frozen=True)
class Plan:
    """What :meth:`KimiWebControl.check` decided for one command: the REST
    ``path`` and ``body``, the ``cmd_id``, and the state the note marks
    (the ``ask`` and the ``applied`` answer, or the session ``state`` whose
    run is cancelled)."""

    kind: str  # "respond" | "cancel"
    cmd_id: str
    path: str
    body: dict[str, Any]
    state: Any
    ask: Any = None
    applied: dict[str, Any] | None = None


class KimiWebControl:
    """The :class:`bridges.core.control.Controller` of one bridge run:
    ``receiver`` supplies the state (its tracker) and the REST client (the
    current endpoint and token)."""

    accepts = ACCEPTS
    ack_window_ms = ACK_WINDOW_MS

    def __init__(self, receiver: Receiver, *, guard_ms: int = 8000) -> None:
        self.receiver = receiver
        self.tracker = receiver.tracker
        self.guard_ms = guard_ms

    # -- check -> plan ----------------------------------------------------------
    def _state(self, cmd: dict[str, Any]) -> SessionState:
        sid = cmd.get("session")
        st = self.tracker.sessions.get(sid) if isinstance(sid, str) else None
        if st is None or sid not in self.receiver.subscribed:
            raise Refuse("refused", "no kimi web session with this id is attached")
        return st

    def check(self, cmd: dict[str, Any]) -> Plan:
        """Validate against the last-observed state and return the plan;
        raises :class:`Refuse` (see the module docstring). No I/O."""
        st = self._state(cmd)
        data = M.obj(cmd.get("data"))
        if cmd.get("type") == RESPOND:
            ask = self.tracker.find_ask(st.id, cmd.get("subject"))
            if ask is None:
                raise Refuse("refused", "subject is not an open attention.requested of this session")
            if ask.kind != "permission":
                raise Refuse("unsupported", "question answers are observed read-only")
            if ask.settling is not None:
                raise Refuse("refused", "an answer to this request is already settling")
            d = decide(data.get("answer"))
            return Plan("respond", cmd["id"], f"/sessions/{seg(st.id)}/approvals/{seg(ask.vendor_id)}",
                        d["body"], st, ask=ask, applied=d["applied"])
        scope = data.get("scope")
        if scope == "session":
            raise Refuse("refused", "a kimi session has no end to command (abort cancels a run)")
        if scope != "run":
            raise Refuse("invalid", "data.scope must be run")
        if st.run is None:
            raise Refuse("refused", "no run is active in this session")
        if isinstance(cmd.get("run"), str) and cmd["run"] != st.run:
            raise Refuse("refused", "the command's run is not the active run")
        if st.run.startswith("turn-"):
            raise Refuse("refused", "the active turn has no prompt id to abort")
        return Plan("cancel", cmd["id"], f"/sessions/{seg(st.id)}/prompts/{seg(st.run)}:abort", {}, st)

    def note(self, plan: Plan) -> Callable[[], None]:
        """The note the vendor's outcome is cause-linked through; its undo."""
        cid = plan.cmd_id
        if plan.kind == "respond":
            ask = plan.ask
            ask.settling, ask.applied = cid, plan.applied

            def undo() -> None:
                if ask.settling == cid:
                    ask.settling, ask.applied = None, None
            return undo
        st = plan.state
        st.cancel_note = cid

        def undo_cancel() -> None:
            if st.cancel_note == cid:
                st.cancel_note = None
        return undo_cancel

    # -- the two writes ------------------------------------------------------------
    async def perform(self, plan: Plan) -> WriteResult:
        """The only REST writes this bridge makes (see the module docstring)."""
        try:
            await self.receiver.request("POST", plan.path, plan.body)
        except VendorError as e:
            if e.code in REFUSED_CODES:
                raise Refuse("refused", f"kimi web {e.code}: {REFUSED_CODES[e.code]}") from None
            if e.code in BUSY_CODES:
                raise Refuse("busy", f"kimi web {e.code}: {BUSY_CODES[e.code]}") from None
            raise Refuse("refused", f"kimi web {e.code}: {e.msg}") from None
        except AuthRefused:
            raise Refuse("busy", "kimi web refused the token") from None
        return WriteResult(200)
