"""The control gate: the bridge's ONLY write path to the vendor.

Exactly three REST writes exist in this package, all here, all reachable
only through a :class:`ControlGate` (this vendor family's
:class:`~bridges.core.control.Controller`), which a run of the bridge
constructs only when the gate is honored (primary mode AND ``AEP_TOKEN`` set AND
``AEP_{VENDOR}_SSE_CONTROL=1``; :meth:`bridges.sse_common.bridge.SseBridge.control_honored`):

- the permission reply (``POST /permission/{id}/reply {reply, message?}``;
  for asks that came on the pinned ``permission.updated`` surface,
  ``POST /session/{id}/permissions/{id} {response}``),
- the question reply (``POST /question/{id}/reply {answers}``),
- the abort (``POST /session/{id}/abort``).

The receiver reads through :class:`ReadOnlyClient`, which has no method that
can send anything but ``GET``. With the gate closed the bridge declares
``accepts: []`` and hands the fleet no controller (every command is nacked
``unsupported``).

Design: ``shared/aep/docs/adapter-opencode-design.md`` ("The control gate",
"respond", "cancel", "Ack discipline"); AEP-0004 §5, AEP-0008 (text answers),
AEP-0006 (form values). The answer rules are pure functions
(:func:`permission_answer`, :func:`form_answer`), unit-tested alone.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import httpx

from bridges.core.control import ACK_WINDOW_MS, Refuse, Undo, Unreachable, WriteResult
from bridges.core.rest import BadAnswer, fetch, parse_json

from .mapping import PERMISSION_OPTIONS
from .profile import SseProfile
from .tracker import Ask, Tracker

log = logging.getLogger("aep.sse.control")

ACCEPTS = ("control.attention.respond", "control.cancel")


# ---------------------------------------------------------------- pure answer rules

def permission_answer(answer: object, *, message_route: bool) -> tuple[str, str | None, dict]:
    """Resolve a ``control.attention.respond`` answer against a permission
    ask offering the vendor's ``once``/``always``/``reject``.

    Returns ``(reply, message, applied)``: the vendor reply, the reply
    message (only a ``reject`` carries one), and the answer as applied (what
    ``attention.answered`` records). Rules: ``option`` maps verbatim; a
    text-only answer naming an option (its id case-insensitively, or exactly
    one label) counts as that option (AEP-0008); other text applies
    ``reject`` with the text as the message when the reply route carries one
    (``message_route``), else is refused ``invalid`` (never the permissive
    choice); ``values`` is refused ``invalid``. Raises :class:`Refuse`."""
    if not isinstance(answer, dict):
        raise Refuse("invalid", "answer must be an object")
    if answer.get("values") is not None:
        raise Refuse("invalid", "values answer a form; this is a permission request")
    option, text = answer.get("option"), answer.get("text")
    if text is not None and not isinstance(text, str):
        raise Refuse("invalid", "answer.text must be a string")
    ids = [i for i, _ in PERMISSION_OPTIONS]
    if option is not None:
        if option not in ids:
            raise Refuse("invalid", f"answer.option must be one of {', '.join(ids)}")
        message = text.strip() if option == "reject" and text and text.strip() else None
        if message and not message_route:
            raise Refuse("invalid", "this ask's reply route carries no message")
        applied: dict[str, Any] = {"option": option}
        if message:
            applied["text"] = message
        return option, message, applied
    if not text or not text.strip():
        raise Refuse("invalid", "answer needs an option or text")
    word = text.strip().casefold()
    for i, _label in PERMISSION_OPTIONS:
        if word == i.casefold():
            return i, None, {"option": i}
    by_label = [i for i, label in PERMISSION_OPTIONS if word == label.casefold()]
    if len(by_label) == 1:
        return by_label[0], None, {"option": by_label[0]}
    if not message_route:
        raise Refuse("invalid", "free text would be a reject with a message, "
                                "and this ask's reply route carries none")
    return "reject", text.strip(), {"option": "reject", "text": text.strip()}


def form_answer(ask: Ask, answer: object) -> tuple[list[list[str]], dict]:
    """Resolve a ``values`` answer against a question ask (AEP-0006): one
    vendor answer list per question, in order, each choice id resolved back
    to the ORIGINAL vendor label (redaction never rewrites what the vendor
    receives); ``other`` free text rides verbatim. Refused ``invalid``: no
    ``values``, a required field missing, a non-choice string on a select
    without ``other``, a wrong value type. Returns ``(answers, applied)``."""
    if not isinstance(answer, dict) or not isinstance(answer.get("values"), dict):
        raise Refuse("invalid", "a form request is answered with answer.values")
    values = answer["values"]
    answers = [_field_answer(f, q, values.get(f["id"]))
               for f, q in zip(ask.fields, ask.questions, strict=False)]
    return answers, {"values": dict(values)}


def _field_answer(f: dict[str, Any], q: Any, v: Any) -> list[str]:
    """One field's vendor answer list (see :func:`form_answer`)."""
    fid = f["id"]
    if v is None or v == [] or v == "":
        if f.get("required"):
            raise Refuse("invalid", f"field {fid} is required")
        return []
    if f["type"] == "string":
        if not isinstance(v, str):
            raise Refuse("invalid", f"field {fid} takes a string")
        return [v]
    if isinstance(v, list) and not f.get("multi"):
        raise Refuse("invalid", f"field {fid} takes one choice")
    labels = _choice_labels(f, q)
    out: list[str] = []
    for x in v if isinstance(v, list) else [v]:
        if not isinstance(x, str):
            raise Refuse("invalid", f"field {fid} takes choice ids")
        label = labels.get(x)
        if isinstance(label, str):
            out.append(label)
        elif f.get("other"):
            out.append(x)
        else:
            raise Refuse("invalid", f"{x!r} is not a choice of field {fid}")
    return out


def _choice_labels(f: dict[str, Any], q: Any) -> dict[str, Any]:
    """Choice id (1-based index) -> the vendor's ORIGINAL option label."""
    options = q.get("options") if isinstance(q, dict) else None
    labels = [o.get("label") if isinstance(o, dict) else None
              for o in (options if isinstance(options, list) else [])]
    return {c["id"]: labels[int(c["id"]) - 1] for c in f.get("choices", [])
            if c["id"].isdigit() and 0 < int(c["id"]) <= len(labels)}


# ---------------------------------------------------------------- the gate

class ReadOnlyClient:
    """The receiver's HTTP handle: ``GET`` only, by construction (it wraps an
    ``httpx.AsyncClient`` and exposes no other verb)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        """``GET path``, read within :func:`bridges.core.rest.fetch`'s bounds
        (raises its ``BadAnswer``, a ``ValueError``; ``httpx.HTTPError``)."""
        return await fetch(self._client, "GET", path, **kw)

    def stream_get(self, path: str, **kw: Any):
        """``client.stream("GET", ...)`` (an async context manager)."""
        return self._client.stream("GET", path, **kw)


@dataclass(frozen=True)
class Plan:
    """One planned write, from :meth:`ControlGate.check` to
    :meth:`ControlGate.perform` (the ledger carries it): the route, its
    ``?directory=`` query, the JSON body, and ``arm`` (sets the tracker's
    note for this command, returns its undo)."""

    command: str
    path: str
    params: dict[str, str]
    body: dict[str, Any] | None
    arm: Callable[[], Undo]


class ControlGate:
    """This vendor family's :class:`~bridges.core.control.Controller` for
    one run of the bridge.

    ``client``: an ``httpx.AsyncClient`` with the vendor's base URL and
    credentials (owned by the run); ``tracker``: the run's receiver state,
    read by :meth:`check` and noted by :meth:`note`; ``persist``: saves the
    tracker's persistent part (the run's state file) after a note changes
    it; ``guard_ms``: the REST-settled ack guard."""

    accepts = ACCEPTS
    ack_window_ms = ACK_WINDOW_MS

    def __init__(self, profile: SseProfile, client: httpx.AsyncClient, tracker: Tracker, *,
                 guard_ms: int = 8000, persist: Callable[[], None] | None = None) -> None:
        self.profile = profile
        self._client = client
        self.tracker = tracker
        self.guard_ms = guard_ms
        self._persist = persist or (lambda: None)

    def _params(self, session: str) -> dict[str, str]:
        st = self.tracker.sessions.get(session)
        return {"directory": st.directory} if st is not None and st.directory else {}

    # -- check: validate against the last-observed state, plan the write --
    def check(self, cmd: dict[str, Any]) -> Plan:
        """The write plan for ``cmd``; raises :class:`Refuse` (nothing is
        written, nothing noted)."""
        session = cmd["session"]
        data: dict[str, Any] = cmd["data"] if isinstance(cmd.get("data"), dict) else {}
        if cmd.get("type") == "control.cancel":
            return self._plan_cancel(session, cmd, data)
        if cmd.get("type") == "control.attention.respond":
            return self._plan_respond(session, cmd, data)
        # the ledger's accepts gate runs first; belt and braces
        raise Refuse("unsupported", f"{cmd.get('type')} is not accepted")

    def _plan_cancel(self, session: str, cmd: dict[str, Any], data: dict[str, Any]) -> Plan:
        scope = data.get("scope")
        if scope == "session":
            raise Refuse("refused", "scope session is not supported: the only session-ending "
                                    "write deletes the session (destruction, not cancellation)")
        if scope != "run":
            raise Refuse("invalid", "control.cancel needs scope run")
        run = self.tracker.open_run(session)
        if run is None:
            raise Refuse("refused", "no run is open in this session")
        if isinstance(cmd.get("run"), str) and cmd["run"] != run:
            raise Refuse("refused", f"run {cmd['run']} is not the open run")
        st = self.tracker.sessions[session]
        if st.cancel is not None and st.cancel.run == run:
            raise Refuse("refused", "a cancel of this run is already in flight")
        command = cmd["id"]
        return Plan(command, self.profile.route("abort", session=session), self._params(session),
                    None, lambda: self.tracker.arm_cancel(session, command, run))

    def _plan_respond(self, session: str, cmd: dict[str, Any], data: dict[str, Any]) -> Plan:
        subject = cmd.get("subject")
        if not isinstance(subject, str) or not subject:
            raise Refuse("invalid", "control.attention.respond needs the request id as subject")
        ask = self.tracker.find_ask(session, subject)
        if ask is None:
            raise Refuse("refused", "unknown or already settled attention request")
        if ask.settling is not None:
            raise Refuse("refused", "an answer to this request is already in flight")
        command = cmd["id"]
        answer = data.get("answer")
        if ask.kind == "form":
            answers, applied = form_answer(ask, answer)
            path = self.profile.route("question_reply", request=ask.vendor_id)
            body: dict[str, Any] = {"answers": answers}
        else:
            legacy = ask.surface == "legacy"
            reply, message, applied = permission_answer(answer, message_route=not legacy)
            if legacy:
                path = self.profile.route("permission_reply_legacy", session=session,
                                          request=ask.vendor_id)
                body = {"response": reply}
            else:
                path = self.profile.route("permission_reply", request=ask.vendor_id)
                body = {"reply": reply}
                if message:
                    body["message"] = message
        return Plan(command, path, self._params(session), body,
                    lambda: self.tracker.arm_answer(ask, command, applied))

    # -- note: the settling mark / pendingCancel note, before the write --
    def note(self, plan: Plan) -> Undo:
        """Set the plan's note (persisted at once, so a restart mid-write
        still links the outcome); the undo clears it (and persists)."""
        undo = plan.arm()
        self._persist()

        def undo_and_persist() -> None:
            undo()
            self._persist()
        return undo_and_persist

    # -- perform: the one POST --
    async def perform(self, plan: Plan) -> WriteResult:
        """The plan's POST; transport failures (and no answer within
        :data:`bridges.core.rest.DEADLINE`) are :class:`Unreachable`; the
        status is the answer: a body past the bounds is dropped."""
        try:
            r = await fetch(self._client, "POST", plan.path, params=plan.params, json=plan.body,
                            status_only=True)
        except (httpx.TransportError, httpx.TimeoutException, BadAnswer) as e:
            raise Unreachable(f"{self.profile.agent} unreachable ({type(e).__name__})") from None
        return WriteResult(r.status_code, None if r.is_success else _detail(r))


def _detail(r: httpx.Response) -> str:
    """The vendor's error line (``message`` of its JSON error, else text)."""
    try:
        body = parse_json(r.content)
    except ValueError:
        return r.text.strip()[:200] or r.reason_phrase
    if isinstance(body, dict):
        for k in ("message", "error", "_tag"):
            v = body.get(k)
            if isinstance(v, str) and v:
                return v[:200]
            if isinstance(v, dict) and isinstance(v.get("message"), str):
                return v["message"][:200]
    return str(body)[:200]
