"""Building an :class:`~bridges.otlp_in.OtlpInBridge` the way a test reads
best: listeners as the strings an operator writes (``"127.0.0.1:0"``,
``"off"``), through the bridge's own parser."""
from __future__ import annotations

from typing import Any

from bridges.otlp_in import OtlpConfig, OtlpInBridge
from bridges.otlp_in.config import DEFAULT_MAX_BODY, parse_listen


def otlp_bridge(*, grpc: str = "127.0.0.1:0", http: str = "127.0.0.1:0", vendor: str = "codex",
                primary: bool = False, max_body: int = DEFAULT_MAX_BODY,
                **kw: Any) -> OtlpInBridge:
    """One profile on ``grpc`` / ``http`` (``host:port`` or ``off``);
    ``kw``: :class:`OtlpInBridge` keywords (``emit_grace``, ``policy``...)."""
    cfg = OtlpConfig(vendor, parse_listen(grpc), parse_listen(http), primary, max_body)
    return OtlpInBridge(cfg, **kw)
