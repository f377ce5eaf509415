"""``aep-bridges validate FILE|-``: AEP 0.1 events checked against the
protocol's JSON schemas (JSON Schema 2020-12), with line numbers.

- each event: the envelope against ``aep-event.schema.json``, its payload
  against ``types/<type>.schema.json`` when the type is registered, and
  capture honesty read from the schemas' ``x-aep-capture`` annotations (no
  payload field above the event's ``capture``, AEP-0001 §8.2(a); no
  payload at all at ``none``);
- the events together: ``(source, id)`` reused for other content,
  ``seq``/``epoch`` regressions (AEP-0001 §7.2), a second run or session
  terminal (AEP-0002 §2 convention 5), attention requests left open at
  ``session.ended`` (§7.2), a second ack for one command (AEP-0004 §3), and
  a form answer's ``values`` against the request's fields (AEP-0006): the
  rules the conformance corpus ``fixtures/invalid/cases.json`` pins.

The schemas are the copy shipped in ``supervisor/tools/schemas/`` (the SDK
ships generated types, not the schemas; its README says how the copy is
kept equal to the protocol's). :class:`Schemas` takes any such directory:
the test suite points it at ``../shared/aep/schemas`` (the ground truth), so
one implementation serves both.

:func:`run` reads JSONL (a file, a rotated ``.gz`` segment, or ``-`` for
stdin) and prints one line per problem, ``FILE:LINE: (type id=...): problem``,
through the timeline's escaping (an event's own words never reach the
terminal raw); a line over :data:`MAX_LINE` bytes is one such problem, never
read whole (a small ``.gz`` can inflate to gigabytes on one line); exit 0
(all valid), 1 (problems), 2 (unreadable input)."""
from __future__ import annotations

import gzip
import hashlib
import json
import re
import sys
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Iterator, TextIO

from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from .gist import _safe

__all__ = ["MAX_LINE", "LongLine", "SHIPPED", "Schemas", "check_lines", "parsed", "read_lines", "run",
           "shipped"]

SHIPPED = Path(__file__).with_name("schemas")
"""The schemas shipped with the package (package data)."""

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


class Schemas:
    """The schemas under ``root`` (``aep-event.schema.json``, ``types/``,
    ``registry/types.json``), read and compiled once, at first use.
    Raises ``OSError`` / ``ValueError`` there when a file is missing or bad."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._validators: dict[str, Draft202012Validator] = {}

    @cached_property
    def _loaded(self) -> tuple[Registry, dict[str, Any], dict[str, Any]]:
        root = self.root
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

    @cached_property
    def registered_types(self) -> dict[str, dict[str, Any]]:
        """``registry/types.json`` entries by type."""
        reg = json.loads((self.root / "registry" / "types.json").read_text())
        return {t["type"]: t for t in reg["types"]}

    def validator(self, name: str) -> Draft202012Validator:
        """The compiled validator of a type's payload (``""``: the envelope)."""
        if (v := self._validators.get(name)) is None:
            registry, envelope, types = self._loaded
            schema = envelope if name == "" else types[name]
            Draft202012Validator.check_schema(schema)
            v = self._validators[name] = Draft202012Validator(
                schema, registry=registry, format_checker=_formats)
        return v

    def type_schema(self, type_: str) -> dict[str, Any] | None:
        """The payload schema of a registered type, else ``None``."""
        return self._loaded[2].get(type_)

    def capture_problems(self, type_: str, data: Any, capture: str) -> list[str]:
        """Fields of ``data`` whose ``x-aep-capture`` annotation (read from the
        type's schema) exceeds ``capture``."""
        schema = self.type_schema(type_)
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

    def event_problems(self, ev: Any) -> list[str]:
        """Every problem of one event (empty: valid); never raises."""
        problems: list[str] = []
        try:
            json.dumps(ev, allow_nan=False)
        except (TypeError, ValueError) as e:
            return [f"not serializable as JSON: {e}"]
        for err in sorted(self.validator("").iter_errors(ev), key=lambda e: list(e.absolute_path)):
            problems.append(f"envelope{_where(err.absolute_path)}: {err.message}")
        if not isinstance(ev, dict):
            return problems
        type_ = ev.get("type")
        capture = ev.get("capture", "metadata")
        data = ev.get("data")
        if isinstance(type_, str) and self.type_schema(type_) is not None:
            if capture == "none":
                if data not in (None, {}):
                    problems.append("capture none carries a payload (envelope only, AEP-0001 §8.2)")
            else:
                payload = data if data is not None else {}
                for err in sorted(self.validator(type_).iter_errors(payload),
                                  key=lambda e: list(e.absolute_path)):
                    problems.append(f"data{_where(err.absolute_path)}: {err.message}")
                problems += self.capture_problems(type_, payload, capture)
        elif capture == "none" and data not in (None, {}):
            problems.append("capture none carries a payload (envelope only, AEP-0001 §8.2)")
        return problems

    def stream_problems(self, events: Iterable[Any]) -> list[str]:
        """Every problem of ``events`` one by one (``event <i> (...): ...``)
        and together (module docstring): each event's own, then what the
        cross-event rules say of it, read in one pass (no event is kept)."""
        problems: list[str] = []
        rules = _StreamRules()
        for i, ev in enumerate(events):
            label = _label(ev)
            problems += [f"event {i} ({label}): {p}" for p in self.event_problems(ev)]
            if isinstance(ev, dict):
                problems += [f"event {i} ({label}): {p}" for p in rules.feed(ev)]
        return problems


def _where(path: Iterable[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out or "(root)"


def _label(ev: Any) -> str:
    """The event's ``type id=ID``, what of it there is; a line with neither
    (or no JSON object) is said to be no AEP event, never ``None id=None``."""
    if not isinstance(ev, dict):
        return f"not an AEP event: a JSON {type(ev).__name__}"
    etype, eid = ev.get("type"), ev.get("id")
    if not isinstance(etype, str) and not isinstance(eid, str):
        return "not an AEP event"
    return (f"{etype if isinstance(etype, str) else 'no type'}"
            + (f" id={eid}" if isinstance(eid, str) else ", no id"))


_TERMINAL_RUN = {"run.finished", "run.failed", "run.cancelled"}
_ACKS = {"control.accepted", "control.rejected"}


class _StreamRules:
    """The cross-event rules, fed one event at a time (in stream order);
    :meth:`feed` returns that event's problems."""

    def __init__(self) -> None:
        #: (source, id) -> a digest of the event's content (not the content: a
        #: long log would be held whole)
        self.seen: dict[tuple[Any, Any], bytes] = {}
        self.position: dict[tuple[Any, Any], tuple[int, int]] = {}
        self.run_terminal: dict[tuple[Any, Any, Any], Any] = {}
        self.session_end: dict[tuple[Any, Any], Any] = {}
        self.open_requests: dict[tuple[Any, Any], dict[Any, Any]] = {}
        self.requests: dict[tuple[Any, Any, Any], list[Any]] = {}
        self.acks: dict[tuple[Any, Any], Any] = {}

    def feed(self, ev: dict[str, Any]) -> list[str]:
        src, eid = ev.get("source"), ev.get("id")
        if not isinstance(eid, str):  # no id, nothing to dedupe by (the schema said so)
            return self._order(ev) + self._terminals(ev) + self._attention(ev) + self._acks(ev)
        canon = hashlib.blake2b(json.dumps(ev, sort_keys=True, default=str).encode(
            "utf-8", "surrogatepass"), digest_size=16).digest()
        prev = self.seen.get((src, eid))
        if prev is not None:  # a redelivery: dedupe, no further rules
            return [] if prev == canon else [
                "(source, id) reused for different content (AEP-0001 §5.1 #2, §7.4)"]
        self.seen[(src, eid)] = canon
        return self._order(ev) + self._terminals(ev) + self._attention(ev) + self._acks(ev)

    def _order(self, ev: dict[str, Any]) -> list[str]:
        session = ev.get("session")
        if session is None or not isinstance(ev.get("seq"), int):
            return []
        epoch = ev.get("epoch", 0) if isinstance(ev.get("epoch", 0), int) else 0
        pos, key = (epoch, ev["seq"]), (ev.get("source"), session)
        last = self.position.get(key)
        out = []
        if last is not None:
            if epoch < last[0]:
                out.append(f"epoch {epoch} after epoch {last[0]} (AEP-0001 §7.2: epochs never regress)")
            elif epoch == last[0] and pos[1] <= last[1]:
                out.append(f"seq {pos[1]} at or below {last[1]} within epoch {epoch} (AEP-0001 §7.2)")
        if last is None or pos > last:
            self.position[key] = pos
        return out

    def _terminals(self, ev: dict[str, Any]) -> list[str]:
        type_, session = ev.get("type"), ev.get("session")
        if session is None:
            return []
        skey = (ev.get("agent"), session)
        if type_ in _TERMINAL_RUN and ev.get("run") is not None:
            k = (skey[0], session, ev["run"])
            if k in self.run_terminal:
                return [f"second terminal for run {ev['run']!r} after {self.run_terminal[k]} "
                        "(AEP-0002 §2 convention 5)"]
            self.run_terminal[k] = type_
        if type_ == "session.ended":
            out = []
            if skey in self.session_end:
                out.append(f"second session.ended for session {session!r} (AEP-0002 §2 convention 5)")
            self.session_end[skey] = ev.get("id")
            pending = self.open_requests.get(skey) or {}
            if pending:
                out.append(f"session ends with attention request(s) {sorted(map(str, pending))} "
                           "still open (AEP-0002 §7.2)")
            return out
        return []

    def _attention(self, ev: dict[str, Any]) -> list[str]:
        type_, session, eid = ev.get("type"), ev.get("session"), ev.get("id")
        raw = ev.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        skey = (ev.get("agent"), session)
        if type_ == "attention.requested" and session is not None:
            self.open_requests.setdefault(skey, {})[eid] = True
            if isinstance(data.get("fields"), list):
                self.requests[(skey[0], session, eid)] = data["fields"]
        if type_ in ("attention.resolved", "attention.timeout") and session is not None:
            self.open_requests.get(skey, {}).pop(ev.get("subject"), None)
        if type_ in ("attention.answered", "control.attention.respond"):
            answer = data.get("answer")
            values = answer.get("values") if isinstance(answer, dict) else None
            fields = self.requests.get((skey[0], session, ev.get("subject")))
            if isinstance(values, dict) and fields is not None:
                return _values_problems(fields, values, ev.get("capture", "metadata"))
        return []

    def _acks(self, ev: dict[str, Any]) -> list[str]:
        if ev.get("type") not in _ACKS or ev.get("cause") is None:
            return []
        k = (ev.get("session"), ev["cause"])
        if k in self.acks:
            return [f"second ack for command {ev['cause']!r} (AEP-0004 §3: one ack decision per command)"]
        self.acks[k] = ev.get("id")
        return []


def _values_problems(fields: list[Any], values: dict[str, Any], capture: str) -> list[str]:
    specs = {f.get("id"): f for f in fields if isinstance(f, dict)}
    out = []
    for k, v in values.items():
        spec = specs.get(k)
        if spec is None:
            out.append(f"answer.values.{k} answers no field of the request (AEP-0006)")
            continue
        t = spec.get("type")
        listed = spec.get("choices")
        choices: list[Any] = listed if isinstance(listed, list) else []
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


_SHIPPED: list[Schemas] = []


def shipped() -> Schemas:
    """The :class:`Schemas` of the shipped copy (one per process)."""
    if not _SHIPPED:
        _SHIPPED.append(Schemas(SHIPPED))
    return _SHIPPED[0]


_INDEX = re.compile(r"^event (\d+) \(")


def parsed(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """``(line number, event, "")`` for each JSONL line that is a JSON object,
    ``(line number, None, problem)`` for one that is not (or a
    :class:`LongLine`); blank lines are skipped. The one reading of a log's
    lines that ``validate`` and ``timeline`` share."""
    for n, line in enumerate(lines, 1):
        if isinstance(line, LongLine):
            yield n, None, line.problem
            continue
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError as e:
            yield n, None, f"not JSON: {e}"
            continue
        if not isinstance(ev, dict):
            yield n, None, f"not a JSON object: {type(ev).__name__}"
            continue
        yield n, ev, ""


def check_lines(lines: Iterable[str], schemas: Schemas) -> tuple[int, list[tuple[int, str]]]:
    """``(events, problems)`` for JSONL ``lines``: each problem as ``(line
    number, text)``, a line that is no JSON object (or a :class:`LongLine`)
    a problem of its own (blank lines are skipped). Problems come in line
    order."""
    numbers: list[int] = []  # each event's line number (an int per event, not the event)
    problems: list[tuple[int, str]] = []

    def events() -> Iterator[dict[str, Any]]:
        for n, ev, problem in parsed(lines):
            if ev is None:
                problems.append((n, problem))
                continue
            numbers.append(n)
            yield ev

    for text in schemas.stream_problems(events()):
        m = _INDEX.match(text)
        n = numbers[int(m.group(1))] if m else 0
        problems.append((n, text[text.index("("):] if m else text))
    problems.sort(key=lambda p: p[0])
    return len(numbers), problems


MAX_LINE = 32 << 20
"""The longest JSONL line read (bytes, its newline included): twice the
relay's largest event (``AEP_MAX_BODY``, 16 MiB by default), so every event a
daemon logged fits; a longer line is a :class:`LongLine`."""
_CHUNK = 1 << 20


class LongLine(str):
    """Stands in for a line over :data:`MAX_LINE` bytes, skipped while read
    (never held whole): an empty string whose ``size`` is the line's length
    in bytes (characters on a text stream) and ``problem`` says so."""

    size: int = 0

    @property
    def problem(self) -> str:
        return (f"line of {self.size} bytes, over the {MAX_LINE}-byte limit "
                "(no event is that large); skipped")


def _long(size: int) -> LongLine:
    line = LongLine("")
    line.size = size
    return line


def _lines(f: Any) -> Iterator[str]:
    """The lines of the binary (or text) stream ``f``, each read with at
    most :data:`MAX_LINE` bytes at once: a longer one is read on in chunks
    to its end, counted and yielded as a :class:`LongLine`."""
    limit = MAX_LINE
    while raw := f.readline(limit):
        if len(raw) >= limit and not raw.endswith(b"\n" if isinstance(raw, bytes) else "\n"):
            size = len(raw)
            while chunk := f.readline(_CHUNK):
                size += len(chunk)
                if chunk[-1:] in (b"\n", "\n"):
                    break
            yield _long(size)
            continue
        yield raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw


def read_lines(name: str) -> Iterator[str]:
    """The lines of ``name`` (``-``: stdin; ``.gz``: a rotated segment), as
    :func:`_lines` reads them. Raises ``OSError`` when it cannot be read (a
    truncated ``.gz`` included)."""
    if name == "-":
        yield from _lines(getattr(sys.stdin, "buffer", sys.stdin))
        return
    try:
        if name.endswith(".gz"):
            with gzip.open(name, "rb") as z:
                yield from _lines(z)
            return
        with open(name, "rb") as f:
            yield from _lines(f)
    except EOFError as e:  # a .gz cut short (a segment still being written, a bad copy)
        raise OSError(f"truncated gzip: {e}") from e


def run(names: list[str], *, out: TextIO | None = None, err: TextIO | None = None,
        schemas: Schemas | None = None) -> int:
    """Validate each file of ``names``; print ``FILE:LINE: problem`` lines
    and a summary per file. Exit status: 0 valid, 1 problems, 2 a file
    unreadable."""
    out, err = out or sys.stdout, err or sys.stderr
    schemas = schemas or shipped()
    status = 0
    for name in names:
        shown = "<stdin>" if name == "-" else name
        try:
            count, problems = check_lines(read_lines(name), schemas)
        except OSError as e:
            print(_safe(f"aep-bridges validate: {shown}: {e.strerror or e}"), file=err)
            status = 2
            continue
        for n, text in problems:  # an event's id, keys, values: escaped (issue 25)
            print(_safe(f"{shown}:{n}: {text}"), file=out)
        bad = len({n for n, _ in problems})
        print(_safe(f"{shown}: {count} event(s), ") + (f"{len(problems)} problem(s) on {bad} line(s)"
                                                     if problems else "all valid"), file=out)
        if problems and status == 0:
            status = 1
    return status
