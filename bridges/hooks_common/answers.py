"""A ``control.attention.respond`` answer -> the decision a held hook gives
its vendor. Pure.

Three answer shapes (``shared/aep/docs/adapters.md`` "The PermissionRequest
control loop"; AEP-0006; AEP-0008):

- ``{option}``: one of the ask's option ids (``allow`` / ``deny``);
- ``{text}`` (no option): text equal to an option id or label (trimmed,
  any case) IS that option; any other text is a ``deny`` whose message is
  the text (it reaches the model as guidance), never the permissive choice;
- ``{values}``: an AEP-0006 form's values, checked by :func:`form_error`
  (AEP-0002 §5.3: a missing required field, a value of the wrong type, a
  non-choice for a closed select is refused and the request stays pending).

Every refusal raises :class:`bridges.core.control.Refuse` ``invalid``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from bridges.core.ledger import Refuse

__all__ = ["DENY_MESSAGE", "Decision", "TEXT_MAX", "decide", "form_error"]

TEXT_MAX = 4000
"""Characters of a free-text deny kept for the vendor (a model message)."""

DENY_MESSAGE = "Denied via AEP"


@dataclass(frozen=True)
class Decision:
    """What was decided: ``option`` (the applied option id; ``submit`` for
    a form), ``message`` (the deny text that reaches the model, or
    ``None``), ``values`` (a form's validated values), ``applied`` (the
    ``answer`` recorded on ``attention.answered``, AEP-0008: the applied
    option, plus ``text`` when guidance survives)."""

    option: str
    message: str | None = None
    values: dict[str, Any] | None = None

    @property
    def applied(self) -> dict[str, Any]:
        if self.values is not None:
            return {"values": self.values}
        out: dict[str, Any] = {"option": self.option}
        if self.message and self.message != DENY_MESSAGE:
            out["text"] = self.message
        return out


def _option(answer: dict[str, Any], options: Sequence[dict[str, Any]]) -> Decision:
    ids = [o["id"] for o in options if isinstance(o.get("id"), str)]
    option, text = answer.get("option"), answer.get("text")
    if text is not None and not isinstance(text, str):
        raise Refuse("invalid", "answer.text must be a string")
    if option is None:
        if not text or not text.strip():
            raise Refuse("invalid", "answer needs an option, text or values")
        word = text.strip().lower()
        hits = {o["id"] for o in options
                if word == str(o.get("id", "")).lower() or word == str(o.get("label", "")).lower()}
        if len(hits) == 1:
            option, text = hits.pop(), None
        else:
            return Decision("deny", text.strip()[:TEXT_MAX])
    if option not in ids:
        raise Refuse("invalid", f"answer.option must be one of {', '.join(ids)}")
    if option == "deny":
        msg = text.strip()[:TEXT_MAX] if text and text.strip() else DENY_MESSAGE
        return Decision("deny", msg)
    return Decision(str(option))


def decide(answer: object, options: Sequence[dict[str, Any]] | None,
           fields: Sequence[dict[str, Any]] | None) -> Decision:
    """The decision for ``answer`` to an ask with ``options`` (a permission)
    or ``fields`` (a form). A form takes ``values``; for a one-field form
    an ``option``/``text`` answer is that field's value (AEP-0006's
    degradation path for consumers that predate forms). Raises
    :class:`Refuse` ``invalid``."""
    if not isinstance(answer, dict):
        raise Refuse("invalid", "answer must be an object with option, text or values")
    if fields is not None:
        values = answer.get("values")
        if values is None and len(fields) == 1:
            v = answer.get("option", answer.get("text"))
            values = {fields[0]["id"]: v} if v is not None else None
        problem = form_error(fields, values)
        if problem:
            raise Refuse("invalid", problem)
        assert isinstance(values, dict)
        return Decision("submit", values=dict(values))
    if answer.get("values") is not None:
        raise Refuse("invalid", "this request is a permission, not a form")
    return _option(answer, options or ())


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _value_error(f: dict[str, Any], v: object) -> str | None:
    t, fid = f.get("type"), f.get("id")
    if t == "number":
        return None if _num(v) else f"field {fid} takes a number"
    if t == "boolean":
        return None if isinstance(v, bool) else f"field {fid} takes a boolean"
    if t == "select":
        ids = {c.get("id") for c in f.get("choices") or () if isinstance(c, dict)}
        items = v if isinstance(v, list) and f.get("multi") else [v]
        if not items or not all(isinstance(x, str) and x for x in items):
            return f"field {fid} takes {'choice ids' if f.get('multi') else 'a choice id'}"
        if not f.get("other") and any(x not in ids for x in items):
            cut = f.get("x-truncated")
            more = f" (the request carries {len(ids)} of its {cut['choices']} choices: answer " \
                "the others in the agent)" if isinstance(cut, dict) and "choices" in cut else ""
            return f"field {fid}: not one of its choices{more}"
        return None
    return None if isinstance(v, str) else f"field {fid} takes text"


def form_error(fields: Sequence[dict[str, Any]], values: object) -> str | None:
    """``None`` when ``values`` answers the form ``fields`` (AEP-0002 §5.3),
    else the reason: not an object, a missing required field, an unknown
    field, a value of the wrong type, a non-choice for a closed select."""
    if not isinstance(values, dict):
        return "answer.values must be an object keyed by field id"
    known = {f["id"]: f for f in fields}
    for k in values:
        if k not in known:
            return f"field {k} is not in the request"
    for f in fields:
        v = values.get(f["id"])
        if v is None or v == "" or v == []:
            if f.get("required"):
                return f"field {f['id']} is required"
            continue
        problem = _value_error(f, v)
        if problem:
            return problem
    return None
