"""Validate AEP events against ``shared/aep/schemas/`` (JSON Schema 2020-12).

- :func:`validate_event`: one envelope against ``aep-event.schema.json``,
  its payload against ``schemas/types/<type>.schema.json`` when the type is
  registered, plus capture honesty read straight from the schemas'
  ``x-aep-capture`` annotations (independent of the daemon's own table in
  :mod:`bridges.core.captable`): no payload field above the event's
  ``capture`` (AEP-0001 §8.2(a)), no payload at all at ``none``. Raises
  ``AssertionError`` with every problem found.
- :func:`validate_stream`: every event, then the cross-event rules the
  invalid corpus (``conformance/fixtures/invalid/cases.json``) pins:
  ``(source, id)`` collisions, ``seq``/``epoch`` regressions, run and
  session terminal exclusivity, attention requests left open at
  ``session.ended``, one ack decision per command, and the AEP-0006
  ``values`` rule against the request's ``field_spec`` list.

Compiled validators are cached per process; schemas are read once.
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from typing import Any, Iterable

from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from .shared import aep_dir

_LEVELS = ("none", "metadata", "redacted", "full")
_RANK = {lvl: i for i, lvl in enumerate(_LEVELS)}

# RFC 3339 date-time (jsonschema's own checker needs an optional package).
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})$")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[^\s]*$")

_formats = FormatChecker(formats=())


@_formats.checks("date-time", raises=ValueError)
def _is_datetime(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339.match(value):
        raise ValueError(f"{value!r} is not an RFC 3339 date-time")
    datetime.fromisoformat(value.replace("z", "Z").replace("t", "T").replace("Z", "+00:00"))
    return True


@_formats.checks("uri", raises=ValueError)
def _is_uri(value: object) -> bool:
    if isinstance(value, str) and not _URI.match(value):
        raise ValueError(f"{value!r} is not an absolute URI")
    return True


@lru_cache(maxsize=1)
def _schemas() -> tuple[Registry, dict[str, Any], dict[str, Any]]:
    root = aep_dir() / "schemas"
    envelope = json.loads((root / "aep-event.schema.json").read_text())
    resources = [(envelope["$id"], envelope)]
    types: dict[str, Any] = {}
    for p in sorted((root / "types").glob("*.schema.json")):
        s = json.loads(p.read_text())
        resources.append((s["$id"], s))
        types[p.name[: -len(".schema.json")]] = s
    registry = Registry().with_resources(
        (uri, Resource.from_contents(s, default_specification=DRAFT202012))
        for uri, s in resources)
    return registry, envelope, types


@lru_cache(maxsize=1)
def registered_types() -> dict[str, dict[str, Any]]:
    """``schemas/registry/types.json`` entries by type."""
    reg = json.loads((aep_dir() / "schemas" / "registry" / "types.json").read_text())
    return {t["type"]: t for t in reg["types"]}


@lru_cache(maxsize=None)
def _validator(name: str) -> Draft202012Validator:
    registry, envelope, types = _schemas()
    schema = envelope if name == "" else types[name]
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=registry, format_checker=_formats)


def type_schema(type_: str) -> dict[str, Any] | None:
    """The payload schema of a registered type, else ``None``."""
    return _schemas()[2].get(type_)


def _where(path: Iterable[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out or "(root)"


def _label(ev: Any) -> str:
    if isinstance(ev, dict):
        return f"{ev.get('type')!s} id={ev.get('id')!s}"
    return type(ev).__name__


def capture_problems(type_: str, data: Any, capture: str) -> list[str]:
    """Fields of ``data`` whose ``x-aep-capture`` annotation (read from the
    type's schema) exceeds ``capture``."""
    schema = type_schema(type_)
    if schema is None or not isinstance(data, dict):
        return []
    limit = _RANK.get(capture, _RANK["metadata"])
    out: list[str] = []

    def visit(s: dict[str, Any], v: Any, path: str) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                sub = (s.get("properties") or {}).get(k)
                if not isinstance(sub, dict):
                    continue
                p = f"{path}.{k}" if path else k
                lvl = sub.get("x-aep-capture", "metadata")
                if _RANK.get(lvl, 0) > limit:
                    out.append(f"data.{p} is gated {lvl} but the event claims capture {capture}")
                    continue
                visit(sub, x, p)
        elif isinstance(v, list) and isinstance(s.get("items"), dict):
            it = s["items"]
            lvl = it.get("x-aep-capture", "metadata")
            for i, x in enumerate(v):
                if _RANK.get(lvl, 0) > limit:
                    out.append(f"data.{path}[{i}] is gated {lvl} but the event claims capture {capture}")
                    continue
                visit(it, x, f"{path}[{i}]")

    visit(schema, data, "")
    return out


def event_problems(ev: Any) -> list[str]:
    """Every problem :func:`validate_event` would report (empty: valid)."""
    problems: list[str] = []
    try:
        json.dumps(ev, allow_nan=False)
    except (TypeError, ValueError) as e:
        return [f"not serializable as JSON: {e}"]
    for err in sorted(_validator("").iter_errors(ev), key=lambda e: list(e.absolute_path)):
        problems.append(f"envelope{_where(err.absolute_path)}: {err.message}")
    if not isinstance(ev, dict):
        return problems
    type_ = ev.get("type")
    capture = ev.get("capture", "metadata")
    data = ev.get("data")
    if isinstance(type_, str) and type_schema(type_) is not None:
        if capture == "none":
            if data not in (None, {}):
                problems.append("capture none carries a payload (envelope only, AEP-0001 §8.2)")
        else:
            payload = data if data is not None else {}
            for err in sorted(_validator(type_).iter_errors(payload),
                              key=lambda e: list(e.absolute_path)):
                problems.append(f"data{_where(err.absolute_path)}: {err.message}")
            problems += capture_problems(type_, payload, capture)
    elif capture == "none" and data not in (None, {}):
        problems.append("capture none carries a payload (envelope only, AEP-0001 §8.2)")
    return problems


def validate_event(ev: Any) -> None:
    """Assert ``ev`` is a valid AEP 0.1 event (see the module docstring).
    Raises ``AssertionError`` listing every problem."""
    problems = event_problems(ev)
    if problems:
        raise AssertionError(f"invalid AEP event ({_label(ev)}):\n  " + "\n  ".join(problems)
                             + f"\n  event: {json.dumps(ev, default=str)[:2000]}")


_TERMINAL_RUN = {"run.finished", "run.failed", "run.cancelled"}
_ACKS = {"control.accepted", "control.rejected"}


def stream_problems(events: Iterable[Any]) -> list[str]:
    """Every problem :func:`validate_stream` would report."""
    evs = list(events)
    problems: list[str] = []
    for i, ev in enumerate(evs):
        problems += [f"event {i} ({_label(ev)}): {p}" for p in event_problems(ev)]
    seen: dict[tuple[Any, Any], str] = {}
    position: dict[tuple[Any, Any], tuple[int, int]] = {}
    run_terminal: dict[tuple[Any, Any, Any], Any] = {}
    session_end: dict[tuple[Any, Any], Any] = {}
    open_requests: dict[tuple[Any, Any], dict[Any, Any]] = {}
    requests: dict[tuple[Any, Any, Any], list[Any]] = {}
    acks: dict[tuple[Any, Any], Any] = {}
    for i, ev in enumerate(evs):
        if not isinstance(ev, dict):
            continue
        where = f"event {i} ({_label(ev)})"
        src, eid, type_ = ev.get("source"), ev.get("id"), ev.get("type")
        canon = json.dumps(ev, sort_keys=True, default=str)
        prev = seen.get((src, eid))
        if prev is not None:
            if prev != canon:
                problems.append(f"{where}: (source, id) reused for different content "
                                "(AEP-0001 §5.1 #2, §7.4)")
            continue  # a redelivery: dedupe, no further rules
        seen[(src, eid)] = canon
        session = ev.get("session")
        skey = (ev.get("agent"), session)
        if session is not None and isinstance(ev.get("seq"), int):
            epoch = ev.get("epoch", 0) if isinstance(ev.get("epoch", 0), int) else 0
            pos = (epoch, ev["seq"])
            last = position.get((src, session))
            if last is not None:
                if epoch < last[0]:
                    problems.append(f"{where}: epoch {epoch} after epoch {last[0]} "
                                    "(AEP-0001 §7.2: epochs never regress)")
                elif epoch == last[0] and pos[1] <= last[1]:
                    problems.append(f"{where}: seq {pos[1]} at or below {last[1]} within epoch "
                                    f"{epoch} (AEP-0001 §7.2)")
            if last is None or pos > last:
                position[(src, session)] = pos
        data = ev.get("data") if isinstance(ev.get("data"), dict) else {}
        if type_ in _TERMINAL_RUN and session is not None and ev.get("run") is not None:
            k = (skey[0], session, ev["run"])
            if k in run_terminal:
                problems.append(f"{where}: second terminal for run {ev['run']!r} after "
                                f"{run_terminal[k]} (AEP-0002 §2 convention 5)")
            else:
                run_terminal[k] = type_
        if type_ == "attention.requested" and session is not None:
            open_requests.setdefault(skey, {})[eid] = True
            if isinstance(data.get("fields"), list):
                requests[(skey[0], session, eid)] = data["fields"]
        if type_ in ("attention.resolved", "attention.timeout") and session is not None:
            open_requests.get(skey, {}).pop(ev.get("subject"), None)
        if type_ == "session.ended" and session is not None:
            if skey in session_end:
                problems.append(f"{where}: second session.ended for session {session!r} "
                                "(AEP-0002 §2 convention 5)")
            session_end[skey] = eid
            pending = open_requests.get(skey) or {}
            if pending:
                problems.append(f"{where}: session ends with attention request(s) "
                                f"{sorted(map(str, pending))} still open (AEP-0002 §7.2)")
        if type_ in _ACKS and ev.get("cause") is not None:
            k = (session, ev["cause"])
            if k in acks:
                problems.append(f"{where}: second ack for command {ev['cause']!r} "
                                "(AEP-0004 §3: one ack decision per command)")
            else:
                acks[k] = eid
        if type_ in ("attention.answered", "control.attention.respond"):
            values = (data.get("answer") or {}).get("values") \
                if isinstance(data.get("answer"), dict) else None
            fields = requests.get((skey[0], session, ev.get("subject")))
            if isinstance(values, dict) and fields is not None:
                problems += [f"{where}: {p}" for p in
                             _values_problems(fields, values, ev.get("capture", "metadata"))]
    return problems


def _values_problems(fields: list[Any], values: dict[str, Any], capture: str) -> list[str]:
    specs = {f.get("id"): f for f in fields if isinstance(f, dict)}
    out = []
    for k, v in values.items():
        spec = specs.get(k)
        if spec is None:
            out.append(f"answer.values.{k} answers no field of the request (AEP-0006)")
            continue
        t = spec.get("type")
        choices = spec.get("choices") if isinstance(spec.get("choices"), list) else []
        ids = {c["id"] for c in choices if isinstance(c, dict) and isinstance(c.get("id"), str)}
        free = False
        if t == "select":
            items = v if isinstance(v, list) else [v]
            off = [x for x in items if x not in ids]
            if off and not spec.get("other"):
                out.append(f"answer.values.{k}: {off!r} is not a choices[].id and the field "
                           "has no other:true (AEP-0002 §5.3, AEP-0006)")
            free = bool(off)
        elif t == "string":
            free = True
        if free and _RANK.get(capture, 1) < _RANK["redacted"]:
            out.append(f"answer.values.{k} is free text at capture {capture} "
                       "(redacted minimum, AEP-0006)")
    return out


def validate_stream(events: Iterable[Any]) -> None:
    """Assert a sequence of events is valid one by one AND together (see
    the module docstring). Raises ``AssertionError`` listing every
    problem."""
    problems = stream_problems(events)
    if problems:
        raise AssertionError("invalid AEP stream:\n  " + "\n  ".join(problems))


def validated(events: Iterable[Any]) -> list[Any]:
    """:func:`validate_event` on each event (its message shows the event),
    then :func:`validate_stream` on them together; returns them as a list,
    e.g. ``evs = validated(stream.of(session))``."""
    evs = list(events)
    for ev in evs:
        validate_event(ev)
    validate_stream(evs)
    return evs
