"""Reading settings from the environment the way every part of the daemon
does (DESIGN.md: "Bad configuration is refused at start with one clear line
per problem, before anything binds").

An :class:`EnvReader` never raises for a bad value: it records one problem
line naming the variable, the value and what was expected, and returns the
default so the caller can carry on collecting every other problem.

The one config shape (issue 7; ``ARCHITECTURE.md`` "Configuration"): each
bridge owns ``bridges/<name>/config.py`` with a frozen dataclass (its
``__post_init__`` calls :func:`check_fields`), ``from_env(env) -> (config,
problems)`` built on :class:`EnvReader`, and ``SETTINGS``, its
:class:`Setting` metadata, from which the supervisor's known-settings list
and the README's knob tables are generated (``python -m supervisor.knobs``)."""
from __future__ import annotations

import dataclasses
import re
import socket
import types
import typing
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")
#: what a bad boolean's problem line says was expected: every word
#: :meth:`EnvReader.flag` accepts (an empty value is "unset")
FLAG_EXPECTED = f"expected {'/'.join(TRUE)} or {'/'.join(w for w in FALSE if w)}"

Address = tuple[str, int]


def parse_hostport(value: str) -> Address:
    """``host:port`` / ``[v6]:port`` -> ``(host, port)``. Raises
    ``ValueError("'x' is not host:port")``."""
    v = value.strip()
    if v.startswith("["):
        host, sep, port = v[1:].partition("]:")
    else:
        host, sep, port = v.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not host:port")
    return host, int(port)


def bindable(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound right now (TCP, SO_REUSEADDR,
    as the servers bind). Port 0 always is; an unresolvable host is not."""
    if port == 0:
        return True
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError:
            return False
    return True


def url_problem(name: str, url: str, *, hint: str = "") -> str | None:
    """``None`` for a usable ``http(s)://host[:port]`` base URL, else the
    problem line (query and fragment refused: credentials have their own
    variables). The line never shows the URL's userinfo (``***@``)."""
    try:
        p = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return f"{name}: not a URL{hint}"
    shown = url
    if "@" in p.netloc:  # user:password: never printed (issue 25 row 10)
        shown = urllib.parse.urlunsplit(p._replace(netloc="***@" + p.netloc.rpartition("@")[2]))
    if p.scheme not in ("http", "https") or not p.hostname:
        return f"{name}={shown!r}: expected http(s)://host:port{hint}"
    try:
        _ = p.port  # raises ValueError for a port that is not a number
    except ValueError:
        return f"{name}={shown!r}: the port is not a number (bad port)"
    if p.query or p.fragment:
        return f"{name}={shown!r}: no query or fragment (credentials have their own settings)"
    return None


_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*\Z")


def token_problem(name: str, value: str | None) -> str | None:
    """``None`` when ``value`` (a bearer token) is unset or made of RFC 6750
    §2.1 ``b64token`` characters (``A-Z a-z 0-9 - . _ ~ + /``, then ``=``
    padding only), else the problem line. Any other character can never
    match what a client sends in ``Authorization: Bearer`` (headers are
    read as latin-1; spaces and commas split the header), so such a token
    would lock every client out while ``check`` said ok. The value is never
    quoted in the line (it is a credential)."""
    if value is None or _B64TOKEN.match(value):
        return None
    return (f"{name}: the token has characters outside RFC 6750 token characters "
            "(A-Z a-z 0-9 - . _ ~ + / and trailing =); no client could present it "
            "(value not shown)")


class EnvReader:
    """Typed reads of ``environ`` with problems collected in ``problems``."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.env = environ
        self.problems: list[str] = []

    def raw(self, name: str) -> str | None:
        v = self.env.get(name)
        return None if v is None or v.strip() == "" else v

    def text(self, name: str, default: str | None = None) -> str | None:
        return self.raw(name) or default

    def flag(self, name: str, default: bool = False) -> bool:
        """``1/true/yes/on`` or ``0/false/no/off`` (case-insensitive)."""
        v = self.raw(name)
        if v is None:
            return default
        if v.strip().lower() in TRUE:
            return True
        if v.strip().lower() in FALSE:
            return False
        self.problems.append(f"{name}={v!r}: {FLAG_EXPECTED}")
        return default

    def integer(self, name: str, default: int, *, minimum: int | None = None,
                maximum: int | None = None, unit: str = "a whole number",
                shown_default: str | None = None) -> int:
        """A whole number in ``[minimum, maximum]`` (either bound optional).
        ``shown_default``: how a problem line names the default when it is
        not a constant (e.g. derived from the open-files limit)."""
        v = self.raw(name)
        if v is None:
            return default
        try:
            n = int(v)
        except ValueError:
            self.problems.append(f"{name}={v!r}: expected {unit}")
            return default
        if (minimum is not None and n < minimum) or (maximum is not None and n > maximum):
            lo = "" if minimum is None else f"{minimum}"
            hi = "" if maximum is None else f"{maximum}"
            shown = str(default) if shown_default is None else shown_default
            self.problems.append(f"{name}={n}: expected {unit} in [{lo}..{hi}] (default {shown})")
            return default
        return n

    def seconds(self, name: str, default: float, *, maximum: float = 86400.0) -> float:
        """A positive number of seconds, at most ``maximum``."""
        v = self.raw(name)
        if v is None:
            return default
        try:
            n = float(v)
            if not 0 < n <= maximum:
                raise ValueError
        except ValueError:
            self.problems.append(f"{name}={v!r}: expected seconds > 0 (default {default:g})")
            return default
        return n

    def url(self, name: str, default: str, *, hint: str = "") -> str:
        """A base URL without trailing slash (see :func:`url_problem`)."""
        v = (self.raw(name) or default).strip().rstrip("/")
        problem = url_problem(name, v, hint=hint)
        if problem:
            self.problems.append(problem)
        return v

    def hostport(self, name: str, default: str) -> Address | None:
        """``host:port``; ``None`` (with a problem line) when unparsable."""
        v = self.raw(name) or default
        try:
            return parse_hostport(v)
        except ValueError:
            self.problems.append(f"{name}={v!r}: expected host:port (e.g. {default})")
            return None


# ------------------------------------------------------------------ settings metadata

@dataclass(frozen=True)
class Setting:
    """One operator knob, as documented: the README's knob tables and the
    supervisor's known-settings list are generated from these (issue 7:
    "one config shape"), so code, docs and the misspelling check cannot drift.

    ``name``: the environment variable (``AEP_OPENHANDS_URL``); ``default``:
    the default as an operator reads it (markdown, e.g. ``"`8000`"`` or
    ``"unset"``); ``meaning``: one markdown table cell; ``secret``: the value
    is a credential (never logged, never echoed in a problem line, kept out
    of the config's ``repr``)."""

    name: str
    default: str
    meaning: str
    secret: bool = False


Row = Setting | Sequence[Setting]
"""One knob-table row: a setting, or the same setting of several profiles
(``AEP_OPENCODE_URL`` / ``AEP_KILOCODE_URL``) shown as one line."""


def render_table(rows: Sequence[Row]) -> str:
    """The markdown knob table (``| Variable | Default | Meaning |``), one
    line per row in order, ending with a newline. A row that is a sequence
    of settings names each (`` `A` / `B` ``) and lists their defaults once
    each (``"`opencode` / `kilo`"``); its meanings must agree (raises
    ``ValueError`` otherwise: write the meaning profile-neutral)."""
    lines = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for row in rows:
        group = (row,) if isinstance(row, Setting) else tuple(row)
        meanings = {s.meaning for s in group}
        if len(meanings) != 1:
            raise ValueError(f"one row, different meanings: {[s.name for s in group]}")
        names = " / ".join(f"`{s.name}`" for s in group)
        default = " / ".join(dict.fromkeys(s.default for s in group))
        lines.append(f"| {names} | {default} | {meanings.pop()} |")
    return "\n".join(lines) + "\n"


def names(settings: Iterable[Setting]) -> frozenset[str]:
    """The variable names of ``settings``."""
    return frozenset(s.name for s in settings)


def check_fields(obj: Any) -> None:
    """Raise ``TypeError`` when a field of the dataclass ``obj`` does not
    hold its declared type: a config dataclass's ``__post_init__`` calls
    this so a bad string can never sit in an ``int`` field (issue 7). Checks
    ``bool``/``int``/``float``/``str``/``Path``/``tuple``, ``X | None``; other
    annotations are trusted (``bool`` is not accepted as ``int``)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not _holds(value, hints.get(f.name, Any)):
            raise TypeError(f"{type(obj).__name__}.{f.name} = {type(value).__name__} value, "
                            f"expected {hints.get(f.name)}")


def _holds(value: Any, hint: Any) -> bool:
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_holds(value, h) for h in typing.get_args(hint))
    plain = origin or hint
    if plain is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if plain is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if plain in (bool, str, tuple, Path):
        return isinstance(value, plain)
    return True
