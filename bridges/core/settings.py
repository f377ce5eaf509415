"""Reading settings from the environment the way every part of the daemon
does (DESIGN.md: "Bad configuration is refused at start with one clear line
per problem, before anything binds").

An :class:`EnvReader` never raises for a bad value: it records one problem
line naming the variable, the value and what was expected, and returns the
default so the caller can carry on collecting every other problem."""
from __future__ import annotations

import socket
import urllib.parse
from dataclasses import dataclass
from typing import Mapping, Sequence

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")

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
    variables)."""
    p = urllib.parse.urlsplit(url)
    if p.scheme not in ("http", "https") or not p.hostname:
        return f"{name}={url!r}: expected http(s)://host:port{hint}"
    try:
        p.port
    except ValueError:
        return f"{name}={url!r}: the port is not a number (bad port)"
    if p.query or p.fragment:
        return f"{name}={url!r}: no query or fragment (credentials have their own settings)"
    return None


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
        self.problems.append(f"{name}={v!r}: expected 1 or 0")
        return default

    def integer(self, name: str, default: int, *, minimum: int | None = None,
                maximum: int | None = None, unit: str = "a whole number") -> int:
        """A whole number in ``[minimum, maximum]`` (either bound optional)."""
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
            self.problems.append(f"{name}={n}: expected {unit} in [{lo}..{hi}] (default {default})")
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
    is a credential (never logged, never echoed in a problem line)."""

    name: str
    default: str
    meaning: str
    secret: bool = False


def render_table(settings: Sequence[Setting]) -> str:
    """The markdown knob table for ``settings`` (``| Variable | Default |
    Meaning |``), one row per setting in order, ending with a newline."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for s in settings:
        rows.append(f"| `{s.name}` | {s.default} | {s.meaning} |")
    return "\n".join(rows) + "\n"
