"""The ``attr-match`` filter dialect (AEP-0003 §6): validation that fails
closed and a compiled matcher for the fan-out hot path.

Pure: no I/O, no clocks, no globals beyond constants. The corpus
``conformance/fixtures/attr-match/cases.json`` pins the behavior
(``tests/unit/relay/test_attrmatch.py``).

Grammar (§6.1)::

    Filter      = { (AttrName : Predicate)* }        conjunction; {} matches all
    Predicate   = Scalar | [Scalar+]                  equality / any-of
                | TypePattern | [TypePattern+]        "type" only ("p.*")
                | {"gte": L} | {"lte": L} | both      "severity" only
    Scalar      = JSON string / integer / boolean     (no float, no null)
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from bridges.core.aep import SEVERITIES, SEVERITY_RANK

__all__ = ["Filter", "InvalidFilter", "FilterTooLarge", "DEFAULT_MAX_TERMS", "filter_terms", "validate_filter", "attr_match", "MATCH_ALL", "CORE_ATTRS",
           "FILTERABLE", "DEFAULTS", "MAX_TYPE_PATTERN"]

#: Every core envelope attribute (AEP-0001 §5.1); none is a legal extension key.
CORE_ATTRS = frozenset({
    "aep", "id", "type", "subject", "time", "source", "agent", "session", "run",
    "step", "seq", "epoch", "cause", "traceparent", "severity", "capture", "data",
})
#: The filterable core subset (§6.2 rule 1); ``time``, ``seq``, ``aep``,
#: ``traceparent`` and ``data`` are carried, never filtered.
FILTERABLE = frozenset({
    "id", "type", "subject", "source", "agent", "session", "run", "step",
    "epoch", "cause", "severity", "capture",
})
#: AEP-0001 defaults applied before matching when the event omits them (§6.2 rule 5).
DEFAULTS: Mapping[str, Any] = {"severity": "info", "capture": "metadata", "epoch": 0}

_EXT_NAME = re.compile(r"[a-z0-9]{1,20}\Z")
# "p.*": one or more dot-separated tokens, then ".*" (never "*" alone).
#: Longest ``prefix.*`` pattern: a subscription's patterns are probed at
#: each ``.`` of an event's type within their length (a 320 KB pattern and
#: one matching event held the event loop 7.8 s: a fourth outside attack on
#: issue 25).
MAX_TYPE_PATTERN = 256
_TYPE_PATTERN = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.\*\Z")
_MISSING = object()


class InvalidFilter(ValueError):
    """The filter is malformed or names an illegal key (§6.5 ``invalid-filter``).
    ``str(exc)`` is a one-line detail safe to send back to the client."""


class FilterTooLarge(InvalidFilter):
    """The filter is valid but holds more alternatives than the relay's
    bound (``AEP_MAX_FILTER_TERMS``): answered ``limit-exceeded``, not
    ``invalid-filter`` (issue 10 #5: every event is matched against every
    filter, so one huge filter taxes every consumer)."""


DEFAULT_MAX_TERMS = 1024
"""Default bound on a filter's alternatives (scalars and type patterns, all keys)."""


def filter_terms(flt: Mapping[str, Any]) -> int:
    """How many alternatives a (validated) filter holds."""
    return sum(len(p) if isinstance(p, list) else 1 for p in flt.values())


def _tag(v: Any) -> str | None:
    """JSON type tag for exact, coercion-free comparison (``true`` != ``1``)."""
    if isinstance(v, bool):
        return "b"
    if isinstance(v, int):
        return "i"
    if isinstance(v, str):
        return "s"
    return None


def _check_scalar(key: str, v: Any) -> None:
    if _tag(v) is None:
        raise InvalidFilter(
            f"predicate values must be JSON strings, integers or booleans ({key})")
    if isinstance(v, str) and "*" in v:
        if key != "type":
            raise InvalidFilter(f'glob patterns are only legal on "type" ({key})')
        if len(v) > MAX_TYPE_PATTERN:  # its probe costs grow with its length squared
            raise InvalidFilter(f"type pattern longer than {MAX_TYPE_PATTERN} characters")
        if not _TYPE_PATTERN.match(v):
            raise InvalidFilter(f"bad type pattern {v!r} (form: prefix.*)")


def _check_key(key: Any) -> None:
    if not isinstance(key, str):
        raise InvalidFilter("filter keys must be strings")
    if key in FILTERABLE:
        return
    if key in CORE_ATTRS:
        raise InvalidFilter(f"attribute not filterable: {key}")
    if not _EXT_NAME.match(key):
        raise InvalidFilter(f"unknown filter key: {key}")


def validate_filter(flt: object) -> None:
    """Raise :class:`InvalidFilter` unless ``flt`` is a valid attr-match filter
    (§6.1, §6.2 rule 1). Never partially accepts: fail closed."""
    if not isinstance(flt, dict):
        raise InvalidFilter("filter must be a JSON object")
    for key, pred in flt.items():
        _check_key(key)
        if isinstance(pred, dict):
            if key != "severity":
                raise InvalidFilter(f"comparison objects are only legal on \"severity\" ({key})")
            if not pred:
                raise InvalidFilter("severity comparison needs gte and/or lte")
            for op, level in pred.items():
                if op not in ("gte", "lte"):
                    raise InvalidFilter(f"severity comparison allows gte/lte only (got {op!r})")
                if not isinstance(level, str) or level not in SEVERITY_RANK:
                    raise InvalidFilter(f"unknown severity level: {level!r}")
            continue
        if isinstance(pred, list):
            if not pred:
                raise InvalidFilter(f"empty inclusion array on {key}")
            for v in pred:
                _check_scalar(key, v)
            continue
        _check_scalar(key, pred)


def _compile_one(key: str, pred: Any) -> Callable[[Any], bool]:
    if isinstance(pred, dict):  # severity comparison (validated)
        lo = SEVERITY_RANK[pred["gte"]] if "gte" in pred else 0
        hi = SEVERITY_RANK[pred["lte"]] if "lte" in pred else len(SEVERITIES) - 1

        def sev_cmp(v: Any) -> bool:
            r = SEVERITY_RANK.get(v) if isinstance(v, str) else None
            return r is not None and lo <= r <= hi
        return sev_cmp

    alts = pred if isinstance(pred, list) else [pred]
    exact = frozenset((_tag(a), a) for a in alts
                      if not (key == "type" and isinstance(a, str) and a.endswith(".*")))
    prefixes = tuple(a[:-1] for a in alts
                     if key == "type" and isinstance(a, str) and a.endswith(".*"))

    if not prefixes:
        def eq(v: Any) -> bool:
            if type(v) is str:  # the common case, without the tag's isinstance chain
                return ("s", v) in exact
            t = _tag(v)
            return t is not None and (t, v) in exact
        return eq

    # compiled once: a set of "p." prefixes, probed at each "." of the type
    # within the longest prefix's length (cost per event: bounded by the
    # patterns, never by the type: a probe at every "." of a 300 KB type of
    # dots sliced quadratically and held the event loop for seconds per
    # subscriber, outside review of issue 25)
    prefix_set = frozenset(prefixes)
    longest = max(len(p) for p in prefixes)

    def eq_or_prefix(v: Any) -> bool:
        t = _tag(v)
        if t is None:
            return False
        if (t, v) in exact:
            return True
        if t != "s":
            return False
        # "p.*" matches types strictly beginning with "p." (never "p" itself)
        end = min(len(v) - 1, longest)
        i = v.find(".", 0, end)
        while 0 <= i < end:
            if v[:i + 1] in prefix_set:
                return True
            i = v.find(".", i + 1, end)
        return False
    return eq_or_prefix


class Filter:
    """A validated, compiled attr-match filter.

    ``Filter(obj, max_terms=None)`` raises :class:`InvalidFilter`, or
    :class:`FilterTooLarge` past ``max_terms`` alternatives; ``f.matches(attrs)``
    tests one event's envelope attributes (a mapping; ``data`` is never
    consulted). ``f.source`` is the filter object as given."""

    __slots__ = ("source", "_preds", "sessions", "keys")

    def __init__(self, flt: Any, max_terms: int | None = None) -> None:
        if max_terms is not None and isinstance(flt, dict) and \
                (n := filter_terms(flt)) > max_terms:  # before validating a million terms
            raise FilterTooLarge(f"filter holds {n} alternatives; this relay takes at most "
                                 f"{max_terms} (AEP_MAX_FILTER_TERMS)")
        validate_filter(flt)
        self.source = flt
        self._preds = tuple((k, DEFAULTS.get(k, _MISSING), _compile_one(k, p))
                            for k, p in flt.items())
        #: ``(attribute, default)`` of each attribute the filter reads: the
        #: verdict is a function of ``attrs.get(attribute, default)`` for
        #: these alone (their types and values)
        self.keys: tuple[tuple[str, Any], ...] = tuple((k, d) for k, d, _ in self._preds)
        s = flt.get("session")
        #: the exact session names this filter pins, if it pins any (replay hint)
        self.sessions: tuple[str, ...] = tuple(
            v for v in (s if isinstance(s, list) else [s]) if isinstance(v, str)) \
            if s is not None else ()

    def matches(self, attrs: Mapping[str, Any]) -> bool:
        for key, default, test in self._preds:
            v = attrs.get(key, default)
            if v is _MISSING or not test(v):
                return False  # absent attributes never match (§6.2 rule 5)
        return True


MATCH_ALL = Filter({})


def attr_match(flt: object, event: Mapping[str, Any]) -> bool:
    """Convenience: validate ``flt`` and test ``event`` (raises :class:`InvalidFilter`)."""
    return Filter(flt).matches(event)
