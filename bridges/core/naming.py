"""Vendor fallback type naming: ``x.{vendor}.{family}.{leaf}`` (AEP-0001 §6).

A vendor moment with no core equivalent degrades to a vendor extension type,
named mechanically, never guessed, never dropped. The envelope grammar
(``shared/aep/schemas/aep-event.schema.json``) is::

    x\\.[a-z0-9_-]+\\.[a-z0-9_]+(\\.[a-z0-9_]+)+

so the vendor token allows ``-`` and at least TWO ``[a-z0-9_]+`` segments
follow it. Every function here returns a string matching that grammar for
any input (property-tested in ``tests/unit/core/test_naming.py``).

The design records name vendor moments in four mechanical ways, each a
function below, each checked against the mapping pins:

- :func:`kind_type`: a CamelCase (OpenHands ``kind``) or UPPER_SNAKE (AG-UI
  ``type``) name: snake-case it, drop a trailing ``_event`` (OpenHands
  only), split family from leaf at the LAST underscore, single-segment names
  gain ``.event`` (``SandboxCheckpointEvent`` ->
  ``x.openhands.sandbox.checkpoint``; ``MessageEvent`` ->
  ``x.openhands.message.event``; ``TEXT_MESSAGE_CONTENT`` ->
  ``x.agui.text_message.content``). Records:
  ``docs/bridge-openhands-design.md``, ``docs/bridge-agui-design.md``.
- :func:`path_type`: a JSON-RPC method or ``sessionUpdate`` tag (ACP): every
  ``/`` and ``_`` separates a segment (``fs/read_text_file`` ->
  ``x.acp.fs.read.text.file``; ``initialize`` -> ``x.acp.initialize.event``).
  Record: ``docs/bridge-acp-design.md``.
- :func:`dotted_type`: an already dotted bus/wire type (OpenCode and Kilo
  Code SSE ``some.future.event``; Kimi web ``turn.started`` under the
  ``web`` channel prefix). Records: ``docs/adapter-opencode-design.md``,
  ``docs/adapter-kilocode-design.md``, ``docs/adapter-kimi-code-design.md``.
- :func:`fallback_type` with a fixed family: the OTLP channel
  (``x.codex.otel.{snake_of_event_name}``,
  ``docs/bridge-otlp-inbound-design.md``) and hook vocabularies
  (``x.kimi-code.session.{snake_case}``).

Pure functions: no I/O, no globals beyond compiled patterns.
"""
from __future__ import annotations

import functools
import re
import unicodedata

TYPE_GRAMMAR = re.compile(r"^x\.[a-z0-9_-]+\.[a-z0-9_]+(\.[a-z0-9_]+)+$")
"""The vendor-extension branch of the envelope ``type`` pattern."""

MAX_SEGMENT = 64
"""Longest segment emitted; longer ones are cut (a type is a routing key,
not a payload)."""

RESERVED_FAMILY_RENAME = "vendor_control"
"""``x.{vendor}.control.*`` is the vendor COMMAND namespace (AEP-0004 §2.2;
the envelope schema's foreign-emitter branch forbids ``seq`` there), so a
fallback for an emitted vendor fact never lands in it: a ``control``
family is renamed to this."""

MAX_SEGMENTS = 12
"""Most segments after the vendor token; deeper names keep their first ones."""

MAX_NAME = 1024
"""Longest vendor name read: a name is cut to this many characters before
it is sanitized (a type holds at most :data:`MAX_SEGMENTS` segments of
:data:`MAX_SEGMENT`, 780 characters; a vendor's real names are far shorter,
so only a hostile one loses its tail; outside review of issue 25: a 4 MB ``hook_event_name`` of dots took 17 s to turn into
``x.claude-code.session.event``, the event loop held all along)."""

# an uppercase letter before the last capital of a run that starts a word
# ("ACPTool" -> "ACP_Tool"): a lookahead, linear in the name; the former
# "([A-Z]+)([A-Z][a-z])" backtracked quadratically on a long run of capitals
# (outside review of issue 25: a 1 MB hook_event_name stalled the event loop
# for minutes)
_ACRONYM = re.compile(r"([A-Z])(?=[A-Z][a-z])")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_NOT_TOKEN = re.compile(r"[^a-z0-9]+")
_NOT_VENDOR = re.compile(r"[^a-z0-9_-]+")


def _ascii(name: str) -> str:
    # "Réponse" -> "Reponse": keep what is legible, drop what is not.
    return unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")


def snake(name: str) -> str:
    """``CamelCase`` / ``UPPER_SNAKE`` / ``kebab-case`` / dotted -> ``snake_case``
    tokens of ``[a-z0-9_]``: acronyms stay together (``ACPToolCallEvent`` ->
    ``acp_tool_call_event``), every run of other characters becomes one
    ``_``, leading/trailing ``_`` are stripped. May return ``""`` (nothing
    legible); :func:`token` never does."""
    s = _ascii(str(name))
    s = _ACRONYM.sub(r"\1_", s)
    s = _CAMEL.sub(r"\1_\2", s)
    s = _NOT_TOKEN.sub("_", s.lower())
    return s.strip("_")


def token(name: str, default: str = "unknown") -> str:
    """One type segment ``[a-z0-9_]+``: :func:`snake` of ``name``, cut to
    :data:`MAX_SEGMENT`, ``default`` when nothing legible remains."""
    s = snake(str(name)[:MAX_NAME])[:MAX_SEGMENT].strip("_")
    return s or default


def vendor_token(vendor: str) -> str:
    """The vendor segment ``[a-z0-9_-]+``: lowercased, any other run of
    characters becomes ``-`` (``Kimi Code`` -> ``kimi-code``, ``kilo.ai`` ->
    ``kilo-ai``); ``vendor`` when nothing legible remains."""
    s = _NOT_VENDOR.sub("-", _ascii(str(vendor)[:MAX_NAME]).lower()).strip("-_")
    return s[:MAX_SEGMENT].strip("-_") or "vendor"


def _segments(part: str) -> list[str]:
    return [t for t in (token(p, "") for p in str(part)[:MAX_NAME].split(".")) if t]


def fallback_type(vendor: str, family: str, leaf: str) -> str:
    """``x.{vendor}.{family}.{leaf}``. ``family`` and ``leaf`` may each be
    dotted (every segment sanitized by :func:`token`, empty segments
    dropped). When fewer than two segments remain after the vendor, the
    missing ones are ``unknown`` (family) / ``event`` (leaf), and at most
    :data:`MAX_SEGMENTS` are kept, so the result always satisfies the grammar
    and is never a vendor command type (:data:`RESERVED_FAMILY_RENAME`) (``fallback_type("acp", "initialize", "")``
    -> ``x.acp.initialize.event``)."""
    if type(vendor) is str and type(family) is str and type(leaf) is str:
        return _fallback_cached(vendor, family, leaf)
    return _fallback(vendor, family, leaf)


def _fallback(vendor: str, family: str, leaf: str) -> str:
    segs = (_segments(family) + _segments(leaf))[:MAX_SEGMENTS]
    if not segs:
        segs = ["unknown", "event"]
    elif len(segs) == 1:
        segs.append("event")
    if segs[0] == "control":
        segs[0] = RESERVED_FAMILY_RENAME
    return ".".join(["x", vendor_token(vendor), *segs])


# A vendor publishes a handful of type names, each seen on every frame: the
# sanitizing (NFKD, three regexes per segment) was ~5% of the SSE bridges'
# path. Bounded: a hostile stream of fresh names only cycles the cache.
_fallback_cached = functools.lru_cache(maxsize=4096)(_fallback)


def kind_type(vendor: str, kind: str, *, drop_event_suffix: bool = True) -> str:
    """OpenHands ``kind`` / AG-UI ``type`` naming (see the module
    docstring): ``snake``, drop a trailing ``_event`` when
    ``drop_event_suffix`` (OpenHands; AG-UI passes ``False``), split at the
    last underscore, ``.event`` for single-segment names."""
    s = token(kind)
    if drop_event_suffix and s.endswith("_event") and len(s) > len("_event"):
        s = s[: -len("_event")]
    family, _, leaf = s.rpartition("_")
    if not family:
        return fallback_type(vendor, leaf, "event")
    return fallback_type(vendor, family, leaf)


def path_type(vendor: str, name: str) -> str:
    """ACP method / update-tag naming: every ``/``, ``.`` and ``_``
    (after snake-casing each piece) separates a segment; single-segment
    names gain ``.event``."""
    segs = [t for p in re.split(r"[/.]", str(name)) for t in snake(p).split("_") if t]
    return fallback_type(vendor, ".".join(segs), "")


def dotted_type(vendor: str, name: str, *, prefix: str | None = None) -> str:
    """A dotted vendor type kept as its own segments (each sanitized by
    :func:`token`), optionally under a channel ``prefix`` (Kimi web:
    ``prefix="web"``, ``turn.started`` -> ``x.kimi-code.web.turn.started``).
    A single segment gains ``.event``."""
    return fallback_type(vendor, prefix or "", str(name))
