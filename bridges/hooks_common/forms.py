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

Bounds (an MCP server, a third party, writes the schema; a 1,000,000-value
enum made a 23 MB event and held the event loop 6 s, issue 25): at most
:data:`FIELDS_MAX` fields and :data:`CHOICES_MAX` choices per field are
carried, labels at most :data:`LABEL_MAX` characters (cut ones end in
``…``), the prompt :data:`PROMPT_MAX`. A choice or field id longer than
:data:`ID_MAX` or that the run's redaction would change is left out (an
answer must name the vendor's value exactly: an id is never cut or
rewritten). What is left out is said in the payload's open members
(AEP-0002 §5.4): a field ``{"x-truncated": {"choices": <how many the
vendor offered>}}``, the form ``{"x-truncated": {"fields": <how many>}}``.
A form without all its fields is answerable only in the agent's own UI
(``respond_via: ["oob"]``: an answer could not cover the fields left out);
an answer naming a choice left out is refused ``invalid`` (not one of the
field's choices, :mod:`.answers`), never mapped to another value.
"""
from __future__ import annotations

from typing import Any

from bridges.core.bridge import Emission
from bridges.core.capture import redact_text
from bridges.core.posture import Posture

from .bounds import TRUNCATED, clip
from .mapping import obj, s

__all__ = ["ASK", "CHOICES_MAX", "FIELDS_MAX", "ID_MAX", "LABEL_MAX", "PROMPT_MAX",
           "answered_values", "question_answers", "question_fields", "questions_form",
           "schema_form"]

ASK = "attention.requested"
FIELDS_MAX = 16
"""Fields of one form carried (AskUserQuestion has 1-4; MCP forms are small)."""
CHOICES_MAX = 64
"""Choices of one select field carried."""
LABEL_MAX = 512
"""Characters of a field's or a choice's label carried."""
ID_MAX = 256
"""Longest field or choice id carried (never cut: an answer names it)."""
PROMPT_MAX = 4000
"""Characters of a form's prompt (the vendor's message) carried."""


def _id_ok(posture: Posture, v: str) -> bool:
    """Whether ``v`` may be a field or choice id as it is: at most
    :data:`ID_MAX` characters and unchanged by the run's redaction (an id is
    metadata and must reach the vendor back exactly)."""
    return 0 < len(v) <= ID_MAX and redact_text(v, posture.policy) == v


def _marked(items: list[Any], total: int, what: str, into: dict[str, Any]) -> None:
    if len(items) < total:
        into[TRUNCATED] = {what: total}


def _options(raw: object) -> tuple[list[dict[str, Any]], int]:
    """An ``AskUserQuestion`` question's choices (1-based index ids) and
    how many options it had."""
    opts = raw if isinstance(raw, list) else []
    return ([{"id": str(j), "label": clip(s(obj(o).get("label")) or str(j), LABEL_MAX)}
             for j, o in enumerate(opts[:CHOICES_MAX], 1) if isinstance(o, dict)],
            sum(1 for o in opts if isinstance(o, dict)))


def _questions(tool_input: object) -> list[dict[str, Any]]:
    qs = obj(tool_input).get("questions")
    return [q for q in qs if isinstance(q, dict)] if isinstance(qs, list) else []


def question_fields(tool_input: object) -> list[dict[str, Any]]:
    """The ``field_spec`` list of an ``AskUserQuestion`` tool input (the
    first :data:`FIELDS_MAX` questions, bounded as the module docstring
    says)."""
    fields = []
    for i, q in enumerate(_questions(tool_input)[:FIELDS_MAX], 1):
        header, text = s(q.get("header")), s(q.get("question")) or ""
        choices, total = _options(q.get("options"))
        f: dict[str, Any] = {"id": str(i), "type": "select",
                             "label": clip(f"{header}: {text}" if header else text, LABEL_MAX),
                             "required": True, "other": True, "choices": choices}
        _marked(choices, total, "choices", f)
        if q.get("multiSelect") is True:
            f["multi"] = True
        fields.append(f)
    return fields


def _form(posture: Posture, prompt: str, fields: list[dict[str, Any]], total: int,
          structural: tuple[str, ...]) -> Emission:
    whole = len(fields) >= total
    data: dict[str, Any] = {"kind": "form", "prompt": prompt, "fields": fields,
                            "respond_via": ["control" if posture.answerable and whole else "oob"]}
    _marked(fields, total, "fields", data)
    return {"type": ASK, "data": data, "gating": {"structural": structural, "form_fields": fields}}


def questions_form(posture: Posture, tool_input: object) -> Emission:
    """The ``AskUserQuestion`` form (see the module docstring)."""
    fields = question_fields(tool_input)
    n = len(_questions(tool_input))
    em = _form(posture, f"{posture.agent} asks {n} question{'' if n == 1 else 's'}", fields, n,
               ("prompt",))
    em["subject"] = "AskUserQuestion"
    return em


def _schema_field(posture: Posture, key: str, prop: dict[str, Any],
                  required: bool) -> dict[str, Any]:
    label = clip(s(prop.get("title")) or key, LABEL_MAX)
    enum = prop.get("enum")
    if isinstance(enum, list) and enum:
        raw = prop.get("enumNames")
        names: list[Any] = raw if isinstance(raw, list) else []
        choices = [{"id": str(v), "label": clip(str(names[i]) if i < len(names) else str(v),
                                                LABEL_MAX)}
                   for i, v in enumerate(enum[:CHOICES_MAX]) if _id_ok(posture, str(v))]
        f = {"id": key, "type": "select", "label": label, "required": required,
             "choices": choices}
        _marked(choices, len(enum), "choices", f)
        return f
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
    keys = [k for k in props if isinstance(k, str)]
    fields = [_schema_field(posture, k, obj(props[k]), k in req)
              for k in keys[:FIELDS_MAX] if _id_ok(posture, k)]
    structural: tuple[str, ...] = ()
    if posture.content(ASK) and s(message):
        prompt = clip(str(message), PROMPT_MAX)
    else:
        n = len(fields)
        prompt = f"{posture.agent} requests input ({n} field{'' if n == 1 else 's'})"
        structural = ("prompt",)
    em = _form(posture, prompt, fields, len(keys), structural)
    if subject:
        em["subject"] = subject
    return em


def _labels(q: dict[str, Any]) -> dict[str, str]:
    """A question's choice ids -> its options' own labels (uncut: the
    vendor is answered in its own words, never in a carried, cut label)."""
    opts = q.get("options")
    return {str(j): str(obj(o).get("label") or j)
            for j, o in enumerate(opts if isinstance(opts, list) else [], 1)
            if isinstance(o, dict)}


def question_answers(tool_input: object, fields: list[dict[str, Any]],
                     values: dict[str, Any]) -> dict[str, str]:
    """``answers`` for ``AskUserQuestion``'s ``updatedInput``: each
    question's text -> its answer as labels (a choice id becomes its
    option's own label; "Other" text stays as typed; several are
    ``", "``-joined)."""
    qs = _questions(tool_input)
    out: dict[str, str] = {}
    for i, f in enumerate(fields):
        v = values.get(f["id"])
        if v is None or i >= len(qs):
            continue
        labels = _labels(qs[i])
        items = v if isinstance(v, list) else [v]
        out[str(qs[i].get("question", ""))] = ", ".join(
            labels.get(x, x) if isinstance(x, str) else str(x) for x in items)
    return out


def answered_values(fields: list[dict[str, Any]], moment: dict[str, Any]) -> dict[str, Any] | None:
    """The form values an ``AskUserQuestion`` tool moment reports as
    answered in the agent's own dialog (``tool_input.answers``: question
    text -> labels, ``", "``-joined for several): a label becomes its
    choice id (one the form carries), other text stays (``other``).
    ``None`` when it reports none."""
    inp = obj(moment.get("tool_input"))
    answers = obj(inp.get("answers"))
    qs = _questions(inp)
    out: dict[str, Any] = {}
    for i, f in enumerate(fields):
        if i >= len(qs):
            break
        given = answers.get(str(qs[i].get("question", "")))
        if not isinstance(given, str) or not given:
            continue
        carried = {c["id"] for c in f.get("choices") or ()}
        ids = {label: cid for cid, label in _labels(qs[i]).items() if cid in carried}
        parts = given.split(", ") if f.get("multi") else [given]
        picked = [ids.get(x, x) for x in parts]
        out[f["id"]] = picked if f.get("multi") else picked[0]
    return out or None
