"""The AEP-0003 §9.4 redaction pipeline, hardened past the normative floor.

The floor, applied in order: (a) secrets and credentials ->
``[REDACTED:secret]``; (b) values the operator configured as secret; (c) the
user's home directory prefix -> ``~``; (d) PII (emails, phone numbers) ->
``[REDACTED:pii]``, on by default and operator-disableable. The pipeline is
a floor, not a ceiling: this module redacts more, matching the reference
implementation's hardened set (``shared/aep/docs/capture-and-redaction.md``:
quoted credential assignments, lowercase ``bearer``, well-known bare token
shapes, other users' home paths, credential-named object keys) and the
adversarial corpus ``conformance/fixtures/redaction/cases.json``.

Beyond the corpus: AWS temporary/role key ids, Stripe/npm/Hugging Face/
Anthropic token shapes, ``Authorization:`` header values of any scheme,
``--password VALUE`` style flags, ``scheme://user:password@host`` URL
credentials, truncated PEM blocks (BEGIN without END redacts to the end),
Windows ``C:\\Users\\name`` homes.

Out of scope (documented in the corpus): base64/hex-encoded secrets,
homoglyph key names, secrets in object KEY names (keys are structural),
prose-obfuscated PII.

Ordering note: rule (b) also runs once before (a). A configured secret that
happens to contain an (a)-shaped substring would otherwise be cut by (a)
first and then no longer match literally in (b), leaking its remainder.
Running (b) first only ever redacts more.

Everything here is pure: no I/O, no globals beyond compiled patterns.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

SECRET = "[REDACTED:secret]"
PII = "[REDACTED:pii]"

MAX_PASSES = 4
"""The pipeline is re-run until the text stops changing (so a second pass
never changes the output: idempotence), at most this many times."""

# ---------------------------------------------------------------- (a) secrets

# PEM: any armored block; a BEGIN without its END (truncated output) redacts
# to the end of the text, since the key body follows the header.
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]{0,64}-----.*?(?:-----END [A-Z0-9 ]{0,64}-----|\Z)", re.S)

# Credential keywords: the key must END with one of these (so
# ``max_tokens: 3`` is not a credential but ``GITHUB_TOKEN=...`` is).
_KEYWORDS = (
    r"password|passwd|passphrase|secret|api[_-]?key|apikey|token|access[_-]?key"
    r"|secret[_-]?key|private[_-]?key|auth[_-]?key|client[_-]?secret|credentials?"
    r"|session[_-]?key"
)
_ASSIGN = re.compile(
    r"(?i)(?<![A-Za-z0-9_.-])"        # run starts only: linear time on long runs
    r"(?P<key>[A-Za-z0-9_.-]*?(?:" + _KEYWORDS + r"))"
    r"(?P<q>(?:\\{0,3}[\"'])?)"        # quoted key, also JSON-in-a-string: \"token\": ...
    r"(?P<sep>\s*[=:]\s*)"            # \s includes newlines: value on the next line
    r"(?P<val>\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|\S+)"
)
# ``--password hunter2`` / ``--api-key abc`` command-line flags.
_FLAG = re.compile(
    r"(?i)(?<![\w-])(?P<key>--?(?:[a-z0-9]+-)*(?:password|passwd|passphrase|secret|api-?key|token"
    r"|access-?key|private-?key|client-?secret))(?P<sep>[ \t]+)(?P<val>(?!-)\S+)")
# ``Authorization: <scheme> <credentials>`` of any scheme.
_AUTHZ = re.compile(
    r"(?i)(?P<key>\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)"
    r"(?P<scheme>(?:basic|bearer|digest|token|negotiate|ntlm|aws4-hmac-sha256)[ \t]+)?"
    r"(?P<val>[^\s\"']+)")
# ``Bearer <token>`` anywhere (RFC 6750 schemes are case-insensitive). Prose
# guard: the token must look like one (a digit or token punctuation, or long).
_BEARER = re.compile(r"(?i)\b(?P<key>bearer[ \t]+)(?P<val>[A-Za-z0-9\-._~+/]+=*)")

# Bare shapes, redacted wherever they appear.
_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[0-9A-Z]{16}"   # AWS key ids
    r"|eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"            # JWT
    r"|gh[pousr]_[A-Za-z0-9]{20,}"                                         # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{20,}"                                       # GitHub fine-grained
    r"|glpat-[A-Za-z0-9_-]{20,}"                                           # GitLab PAT
    r"|xox[abposre]-[A-Za-z0-9-]{10,}"                                     # Slack
    r"|sk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}"                               # OpenAI / Anthropic
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{10,}"                               # Stripe
    r"|AIza[0-9A-Za-z_-]{30,}"                                             # Google API key
    r"|npm_[A-Za-z0-9]{30,}"                                               # npm
    r"|hf_[A-Za-z0-9]{30,}"                                                # Hugging Face
    r")(?![A-Za-z0-9])")
# ``scheme://user:password@host``: keep the user, drop the password.
_URL_CRED = re.compile(
    r"(?<![a-zA-Z0-9+.-])(?P<pre>[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]+:)(?P<val>[^\s@/]+)(?=@)")

# ---------------------------------------------------------------- (c) home paths

_HOME_ANY = re.compile(
    r"(?:(?<![\w.~/-])|(?<=://))"
    r"(?:/home/|/Users/)(?!\.{1,2}(?:/|$))[^/\s\"'`:;,)\]}]+"
    r"|(?<![\w])[A-Za-z]:\\Users\\[^\\\s\"']+")

# ---------------------------------------------------------------- (d) PII

_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
    r"(?![A-Za-z0-9-])")
_PHONE_INTL = re.compile(
    r"(?<![\w+])\+\d{1,3}(?>(?:[ .-]?(?:\(\d{1,4}\)|\d{1,4})){2,6})(?![\w])")
_PHONE_NANP = re.compile(
    r"(?<![\w.+-])(?:\(\d{3}\)[ .-]?|\d{3}[ .-])\d{3}[ .-]\d{4}(?![\w]|[.-]\d)")

# ---------------------------------------------------------------- object keys

_CRED_KEY = re.compile(
    r"(?i)^[A-Za-z0-9_.-]*?(?:" + _KEYWORDS + r"|authorization|auth|cookie|set-cookie"
    r"|x-api-key)$")


def _looks_like_token(tok: str) -> bool:
    return len(tok) >= 16 or any(c.isdigit() or c in "-._~+/=" for c in tok)


def _sub_assign(m: re.Match[str]) -> str:
    val = m.group("val")
    if val[:1] in "\"'" and len(val) >= 2 and val[-1] == val[0]:
        red = val[0] + SECRET + val[0]
    else:
        red = SECRET
    return m.group("key") + m.group("q") + m.group("sep") + red


def _sub_bearer(m: re.Match[str]) -> str:
    # The floor's literal ``Bearer `` prefix always redacts; other casings
    # (``bearer``) only when the word after it looks like a token, so
    # "the bearer of good news" stays prose.
    if not m.group("key").startswith("Bearer") and not _looks_like_token(m.group("val")):
        return m.group(0)
    return m.group("key") + SECRET


def _sub_authz(m: re.Match[str]) -> str:
    return m.group("key") + (m.group("scheme") or "") + SECRET


# Cheap substring prefilters: most text carries no credential vocabulary at
# all, and a regex that cannot match still costs a scan per position.
_ASSIGN_HINT = re.compile(
    r"(?i)(?:passw(?:or)?d|passphrase|secret|key|token|credentials?)(?:\\{0,3}[\"'])?\s*[=:]")


def _secrets(text: str) -> str:
    if "-----BEGIN" in text:
        text = _PEM.sub(SECRET, text)
    if "://" in text:
        text = _URL_CRED.sub(lambda m: m.group("pre") + SECRET, text)
    text = _SHAPES.sub(SECRET, text)
    low = text.lower()
    if "authorization" in low:
        text = _AUTHZ.sub(_sub_authz, text)
    if "bearer" in low:
        text = _BEARER.sub(_sub_bearer, text)
    if "-" in text:
        text = _FLAG.sub(lambda m: m.group("key") + m.group("sep") + SECRET, text)
    if _ASSIGN_HINT.search(text):
        text = _ASSIGN.sub(_sub_assign, text)
    return text


def _configured(text: str, values: tuple[str, ...]) -> str:
    for v in values:  # longest first (see normalize_secret_values)
        if v in text:
            text = text.replace(v, SECRET)
    return text


def _home(text: str, home: str | None) -> str:
    if home and home in text:
        text = re.sub(r"(?<![\w.-])" + re.escape(home) + r"(?=$|[/\\]|[^\w.-])", "~", text)
    if "/home/" in text or "/Users/" in text or ":\\Users\\" in text:
        text = _HOME_ANY.sub("~", text)
    return text


def _pii(text: str) -> str:
    if "@" in text:
        text = _EMAIL.sub(PII, text)

    def intl(m: re.Match[str]) -> str:
        digits = sum(c.isdigit() for c in m.group(0))
        return PII if digits >= 8 else m.group(0)

    if "+" in text:
        text = _PHONE_INTL.sub(intl, text)
    return _PHONE_NANP.sub(PII, text)


def normalize_secret_values(values: Iterable[str], min_len: int = 4) -> tuple[str, ...]:
    """Configured secret values, deduplicated, longest first, without the
    ones too short to redact meaningfully (``min_len`` characters; a
    1-character "secret" would rewrite every occurrence of that letter)."""
    vals = {v for v in values if isinstance(v, str) and len(v) >= min_len}
    return tuple(sorted(vals, key=lambda v: (-len(v), v)))


def usable_home(home: str | None) -> str | None:
    """The home prefix rule (c) replaces, or ``None`` when it is unusable
    (empty, relative, or the filesystem root, which would rewrite every
    absolute path). A trailing separator is dropped."""
    if not home or not isinstance(home, str):
        return None
    h = home.rstrip("/\\")
    if not h or not (h.startswith("/") or re.match(r"^[A-Za-z]:\\", h)):
        return None
    return h


def redact_text(text: str, *, secret_values: tuple[str, ...] = (), home: str | None = None,
                pii: bool = True) -> str:
    """Run one string through the pipeline: secrets, configured values, home
    paths, PII (when ``pii``). ``secret_values`` should come from
    :func:`normalize_secret_values`; ``home`` from :func:`usable_home`.
    Idempotent: the pipeline repeats until the text is stable. Never raises
    for any ``str``; a non-``str`` input is returned unchanged."""
    if not isinstance(text, str) or not text:
        return text
    for _ in range(MAX_PASSES):
        out = _configured(text, secret_values)
        out = _secrets(out)
        out = _configured(out, secret_values)
        out = _home(out, home)
        if pii:
            out = _pii(out)
        if out == text:
            break
        text = out
    return text


def is_credential_key(key: object) -> bool:
    """True for an object key naming a credential (``token``, ``API_KEY``,
    ``Password``, ``authorization``, ``client_secret``...): its value is
    dropped whatever its shape (hardening beyond the floor)."""
    return isinstance(key, str) and bool(_CRED_KEY.match(key))


def redact_value(value: Any, *, secret_values: tuple[str, ...] = (), home: str | None = None,
                 pii: bool = True) -> Any:
    """The pipeline over a JSON value: strings through :func:`redact_text`,
    objects and arrays recursively (keys kept: they are structural), the
    value under a credential-named key replaced by ``[REDACTED:secret]``
    when it is a string or number (an object or array there is replaced
    whole). Booleans and ``null`` pass. Returns a new value."""
    if isinstance(value, str):
        return redact_text(value, secret_values=secret_values, home=home, pii=pii)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if is_credential_key(k) and v is not None and not isinstance(v, bool):
                out[k] = SECRET
            else:
                out[k] = redact_value(v, secret_values=secret_values, home=home, pii=pii)
        return out
    if isinstance(value, (list, tuple)):
        return [redact_value(v, secret_values=secret_values, home=home, pii=pii)
                for v in value]
    return value
