"""The configuration file: ``aep-bridges run|relay|check|doctor --config FILE``
(or ``AEP_CONFIG=FILE``), TOML with the environment's own names; the
client commands (``tail``, ``respond``, ``cancel``, ``pause``, ``resume``)
read the same file for their default URL (``AEP_LISTEN``) and token
(``AEP_TOKEN``).

::

    # /etc/aep-bridges/config.toml
    AEP_LISTEN = "127.0.0.1:8787"
    AEP_BRIDGE_OPENCODE_SSE = true
    AEP_OPENCODE_URL = "http://127.0.0.1:4096"
    AEP_LOG_MAX_TOTAL_BYTES = "512M"
    AEP_CORS_ORIGINS = ["http://localhost:3000"]

Every key is a setting of the README's tables, at the top level (no
tables); a value is a string, a number, a boolean (``true`` -> ``1``) or an
array of them (joined with commas, as ``AEP_CORS_ORIGINS`` takes them).
The file only supplies values: they go through the same validation as the
environment's (:func:`supervisor.config.load`), and **the environment wins
over the file** (as systemd's ``Environment=`` wins over its
``EnvironmentFile=``), so one run can override one setting.

Unknown names get the environment's did-you-mean warning (naming the file)
and are dropped, except ``AEP_BRIDGE_*``, which :func:`~supervisor.config.load`
refuses as for the environment. A secret (``AEP_TOKEN``, a password) in a
file other users can read is warned about: secrets belong in the 0600
environment file.

:func:`read` is pure over the file's text; :class:`Sources` records where
each setting came from (``aep-bridges check`` prints it)."""
from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, MutableMapping, Sequence

__all__: Sequence[str] = ("Sources", "parse", "read")


def _scalar(value: Any) -> str | None:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float, str)):
        return str(value)
    return None


def _value(name: str, value: Any) -> tuple[str | None, str | None]:
    """``(environment string, None)`` or ``(None, problem)``."""
    if isinstance(value, list):
        parts = [_scalar(v) for v in value]
        if all(p is not None for p in parts):
            return ",".join(p for p in parts if p is not None), None
        return None, f"{name}: an array of strings, numbers or booleans expected"
    text = _scalar(value)
    if text is None:
        return None, (f"{name}: {type(value).__name__} is not a setting value "
                      "(a string, number or boolean)")
    return text, None


def parse(text: str, *, source: str, known: frozenset[str],
          secrets: frozenset[str] = frozenset(),
          readable_by_others: bool = False) -> tuple[dict[str, str], list[str], list[str]]:
    """``(values, problems, warnings)`` of a config file's ``text``;
    ``source`` names it in the lines. ``known``: the setting names
    (:func:`supervisor.config.known_settings`). Never raises."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return {}, [f"{source}: not TOML: {e}"], []
    values: dict[str, str] = {}
    problems: list[str] = []
    warnings: list[str] = []
    for name, raw in doc.items():
        if isinstance(raw, dict):
            problems.append(f"{source}: [{name}]: tables are not read; settings are top-level "
                            "names (AEP_BUFFER = 5000)")
            continue
        if name not in known and not name.startswith("AEP_BRIDGE_"):
            close = difflib.get_close_matches(name, known, n=1)
            warnings.append(f"{name} (in {source}) is not a setting (ignored)"
                            + (f"; did you mean {close[0]}?" if close else ""))
            continue
        text_value, problem = _value(name, raw)
        if problem is not None:
            problems.append(f"{source}: {problem}")
            continue
        assert text_value is not None
        values[name] = text_value
        if name in secrets and readable_by_others:
            warnings.append(f"{name} is in {source}, which other users can read: keep secrets "
                            "in the environment file (mode 0600), or chmod 600 the file")
    return values, problems, warnings


def read(path: Path, *, known: frozenset[str],
         secrets: frozenset[str] = frozenset()) -> tuple[dict[str, str], list[str], list[str]]:
    """:func:`parse` of the file at ``path``; an unreadable file is one
    problem line."""
    try:
        data = Path(path).read_bytes()
        mode = os.stat(path).st_mode
    except OSError as e:
        return {}, [f"--config {path}: {e.strerror or e}"], []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return {}, [f"{path}: not UTF-8 ({e.reason} at byte {e.start})"], []
    return parse(text, source=str(path), known=known, secrets=secrets,
                 readable_by_others=bool(mode & 0o004))


@dataclass
class Sources:
    """Where each setting came from: the names present in the process
    environment at start are ``environment``; :meth:`fill` adds the names a
    lower source supplies (an environment file, the config file) without
    overriding any already set."""

    origin: dict[str, str] = field(default_factory=dict)
    #: each source :meth:`fill` read (``config file PATH``, ``--env-file PATH``), in order
    read: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> "Sources":
        return cls({k: "environment" for k in environ if k.startswith("AEP_")})

    def fill(self, environ: MutableMapping[str, str], values: Mapping[str, str], source: str) -> None:
        """Set each of ``values`` in ``environ`` unless already set there."""
        self.read.append(source)
        for k, v in values.items():
            if k not in environ:
                environ[k] = v
                self.origin[k] = source

    def of_name(self, name: str) -> str:
        return self.origin.get(name, "environment")
