"""Daemon logging: one JSON object per line on stderr (journald, launchd and
log shippers parse it), or plain text when stderr is a TTY.

Secrets are scrubbed at the handler, whatever the call site wrote: the values
of every secret-bearing environment variable (``AEP_TOKEN``, vendor passwords
and keys), ``access_token``/``token``/``key``/``password`` query values,
the userinfo of any ``scheme://user:password@`` URL and
``Authorization`` header values (AEP-0003 §8.1: the query token MUST NOT be
logged)."""
from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Iterable, Mapping

# Environment names whose values are secrets wherever they appear.
_SECRET_NAME = re.compile(r"(TOKEN|PASSWORD|PASSWD|SECRET|API_KEY|_KEY)$")
_QUERY_SECRET = re.compile(
    r"(?i)((?:access_token|token|api_key|apikey|key|password|secret)=)[^&\s\"']+")
_AUTH_HEADER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{4,}")
# scheme://user:password@host: the whole userinfo (issue 25 row 10)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@\"']+@")
REDACTED = "[REDACTED]"


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values of secret-bearing variables (4+ characters), longest
    first so a value containing another is scrubbed whole."""
    vals = {v for k, v in environ.items() if _SECRET_NAME.search(k) and v and len(v) >= 4}
    return sorted(vals, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """Remove secrets from one log line."""
    for s in secrets:
        if s in text:
            text = text.replace(s, REDACTED)
    text = _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, text)
    text = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    return _AUTH_HEADER.sub(lambda m: m.group(1) + " " + REDACTED, text)


class _Formatter(logging.Formatter):
    def __init__(self, as_json: bool, secrets: list[str]) -> None:
        super().__init__()
        self.as_json = as_json
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.exc_info:
            msg += "\n" + self.formatException(record.exc_info)
        msg = scrub(msg, self.secrets)
        extra = {k: v for k, v in record.__dict__.items() if k.startswith("aep_")}
        if not self.as_json:
            ts = time.strftime("%H:%M:%S", time.localtime(record.created))
            tail = " ".join(f"{k[4:]}={scrub(str(v), self.secrets)}" for k, v in extra.items())
            return f"{ts} {record.levelname:<7} {record.name}: {msg}" + (f" [{tail}]" if tail else "")
        obj = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": msg,
        }
        for k, v in extra.items():
            obj[k[4:]] = scrub(v, self.secrets) if isinstance(v, str) else v
        return json.dumps(obj, ensure_ascii=False, default=str)


def setup(environ: Mapping[str, str], *, stream=None, level: str | None = None,
          secrets: Iterable[str] = ()) -> None:
    """Configure the root logger once for the daemon process.
    ``AEP_LOG_LEVEL`` (default ``info``); ``AEP_LOG_FORMAT`` = ``json`` |
    ``text`` overrides the TTY detection. ``secrets``: more values scrubbed
    from every line (the per-emitter credentials, read from their file)."""
    stream = stream or sys.stderr
    fmt = (environ.get("AEP_LOG_FORMAT") or "").strip().lower()
    as_json = fmt == "json" if fmt in ("json", "text") else not stream.isatty()
    handler = logging.StreamHandler(stream)
    extra = [s for s in secrets if len(s) >= 4]
    handler.setFormatter(_Formatter(as_json, sorted({*secret_values(environ), *extra},
                                                    key=len, reverse=True)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or environ.get("AEP_LOG_LEVEL") or "info").strip().upper())
    # hypercorn's access log would print query strings (access_token): off.
    logging.getLogger("hypercorn.access").disabled = True
    # httpx logs every vendor poll at INFO: noise in a daemon's log.
    for name in ("httpx", "httpcore", "hpack"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
