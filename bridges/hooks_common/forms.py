"""AEP-0006 forms from hook moments, and their answers back. Pure.

- :func:`questions_form`: Claude Code's ``AskUserQuestion`` tool input
  (1-4 questions) -> ONE ``attention.requested kind: form``, one
  ``field_spec`` per question (``select``, ``required``, ``other: true``,
  ``multi`` mirroring ``multiSelect``, 1-based ids); the prompt is a
  structural synthesis (pin ``ask_user_question``, mappings/claude-code.json).
- :func:`schema_form`: an MCP elicitation's restricted flat schema
  (Claude Code's ``Elicitation`` hook) -> a form whose field ids are the
  property keys and choice ids the enum values (closed selects; pin
  ``elicitation``). At a metadata ceiling the prompt is a structural
  synthesis, ``{agent} requests input (N fields)``.
- :func:`question_answers`: validated form values -> the tool's
  ``answers`` map (question text -> the chosen labels, ``", "``-joined).

Labels are model or server content: the stamper's gate degrades them to
their ids at ``metadata`` (``[metadata*]``).
"""
from __future__ import annotations

from typing import Any

from bridges.core.bridge import Emission
from bridges.core.posture import Posture

from .mapping import obj, s

__all__ = ["ASK", "answered_values", "question_answers", "question_fields", "questions_form",
           "schema_form"]

ASK = "attention.requested"


def question_fields(tool_input: object) -> list[dict[str, Any]]:
    """The ``field_spec`` list of an ``AskUserQuestion`` tool input."""
    qs = obj(tool_input).get("questions")
    questions = [q for q in qs if isinstance(q, dict)] if isinstance(qs, list) else []
    fields = []
    for i, q in enumerate(questions, 1):
        q = obj(q)
        header, text = s(q.get("header")), s(q.get("question")) or ""
        f: dict[str, Any] = {"id": str(i), "type": "select",
                             "label": f"{header}: {text}" if header else text,
                             "required": True, "other": True,
                             "choices": [{"id": str(j), "label": s(obj(o).get("label")) or str(j)}
                                         for j, o in enumerate(q.get("options") or [], 1)
                                         if isinstance(o, dict)]}
        if q.get("multiSelect") is True:
            f["multi"] = True
        fields.append(f)
    return fields


def questions_form(posture: Posture, tool_input: object) -> Emission:
    """The ``AskUserQuestion`` form (see the module docstring)."""
    fields = question_fields(tool_input)
    n = len(fields)
    return {"type": ASK,
            "data": {"kind": "form",
                     "prompt": f"{posture.agent} asks {n} question{'' if n == 1 else 's'}",
                     "fields": fields, "respond_via": ["control" if posture.answerable else "oob"]},
            "subject": "AskUserQuestion",
            "gating": {"structural": ("prompt",), "form_fields": fields}}


def _schema_field(key: str, prop: dict[str, Any], required: bool) -> dict[str, Any]:
    label = s(prop.get("title")) or key
    enum = prop.get("enum")
    if isinstance(enum, list) and enum:
        raw = prop.get("enumNames")
        names: list[Any] = raw if isinstance(raw, list) else []
        choices = [{"id": str(v), "label": str(names[i]) if i < len(names) else str(v)}
                   for i, v in enumerate(enum)]
        return {"id": key, "type": "select", "label": label, "required": required,
                "choices": choices}
    t = prop.get("type")
    kind = "number" if t in ("integer", "number") else "boolean" if t == "boolean" else "string"
    return {"id": key, "type": kind, "label": label, "required": required}


def schema_form(posture: Posture, message: object, schema: object,
                subject: str | None = None) -> Emission:
    """The MCP elicitation form (see the module docstring)."""
    sch = obj(schema)
    props = obj(sch.get("properties"))
    raw = sch.get("required")
    req: list[Any] = raw if isinstance(raw, list) else []
    fields = [_schema_field(k, obj(p), k in req) for k, p in props.items() if isinstance(k, str)]
    structural: tuple[str, ...] = ()
    if posture.content(ASK) and s(message):
        prompt = str(message)
    else:
        n = len(fields)
        prompt = f"{posture.agent} requests input ({n} field{'' if n == 1 else 's'})"
        structural = ("prompt",)
    em: Emission = {"type": ASK,
                    "data": {"kind": "form", "prompt": prompt, "fields": fields,
                             "respond_via": ["control" if posture.answerable else "oob"]},
                    "gating": {"structural": structural, "form_fields": fields}}
    if subject:
        em["subject"] = subject
    return em


def question_answers(tool_input: object, fields: list[dict[str, Any]],
                     values: dict[str, Any]) -> dict[str, str]:
    """``answers`` for ``AskUserQuestion``'s ``updatedInput``: each
    question's text -> its answer as labels (a choice id becomes its label;
    "Other" text stays as typed; several are ``", "``-joined)."""
    qs = [q for q in obj(tool_input).get("questions") or () if isinstance(q, dict)] \
        if isinstance(obj(tool_input).get("questions"), list) else []
    out: dict[str, str] = {}
    for i, f in enumerate(fields):
        v = values.get(f["id"])
        if v is None or i >= len(qs):
            continue
        labels = {c["id"]: c["label"] for c in f.get("choices") or ()}
        items = v if isinstance(v, list) else [v]
        out[str(obj(qs[i]).get("question", ""))] = ", ".join(
            labels.get(x, str(x)) if isinstance(x, str) else str(x) for x in items)
    return out


def answered_values(fields: list[dict[str, Any]], moment: dict[str, Any]) -> dict[str, Any] | None:
    """The form values an ``AskUserQuestion`` tool moment reports as
    answered in the agent's own dialog (``tool_input.answers``: question
    text -> labels, ``", "``-joined for several): a label becomes its
    choice id, other text stays (``other``). ``None`` when it reports none."""
    inp = obj(moment.get("tool_input"))
    answers = obj(inp.get("answers"))
    raw = inp.get("questions")
    qs: list[Any] = raw if isinstance(raw, list) else []
    out: dict[str, Any] = {}
    for i, f in enumerate(fields):
        if i >= len(qs):
            break
        given = answers.get(str(obj(qs[i]).get("question", "")))
        if not isinstance(given, str) or not given:
            continue
        ids = {c["label"]: c["id"] for c in f.get("choices") or ()}
        parts = given.split(", ") if f.get("multi") else [given]
        picked = [ids.get(x, x) for x in parts]
        out[f["id"]] = picked if f.get("multi") else picked[0]
    return out or None
