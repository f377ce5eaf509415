"""The OTLP inbound bridge (``bridges/otlp_in``): Codex and the VS Code
agent export OpenTelemetry LogRecords; this bridge receives them over
OTLP/gRPC and OTLP/HTTP (protobuf or JSON, gzip) and emits AEP events.
Design record: ``shared/aep/docs/bridge-otlp-inbound-design.md``.

Configuration (:func:`from_env`; names in ``shared/DESIGN.md``):

=================================  =========================================  ==================
setting                            meaning                                    default
=================================  =========================================  ==================
``AEP_OTLP_VENDOR``                profile(s): ``codex``, ``vscode``, or      ``codex``
                                   ``codex,vscode`` (one emitter each)
``AEP_OTLP_GRPC_LISTEN``           gRPC listener of the first profile         ``127.0.0.1:4317``
``AEP_OTLP_HTTP_LISTEN``           HTTP listener of the first profile         ``127.0.0.1:4318``
``AEP_OTLP_<VENDOR>_GRPC_LISTEN``  per-profile override; required for every   (first profile:
``AEP_OTLP_<VENDOR>_HTTP_LISTEN``  profile after the first. ``off`` disables   the two above)
``AEP_OTLP_PRIMARY``               ``1``: core types (primary mode)           companion
``AEP_OTLP_MAX_BODY``              request limit, bytes (compressed and       ``4194304``
                                   inflated)
=================================  =========================================  ==================
"""
from __future__ import annotations

from typing import Mapping

from bridges.core.capture import CapturePolicy
from bridges.core.settings import EnvReader

from .bridge import DEFAULT_GRPC_LISTEN, DEFAULT_HTTP_LISTEN, OtlpInBridge
from .receiver import DEFAULT_MAX_BODY

__all__ = ["OtlpInBridge", "from_env"]



def from_env(environ: Mapping[str, str], *, policy: CapturePolicy | None = None
             ) -> list[OtlpInBridge]:
    """One :class:`OtlpInBridge` per vendor named in ``AEP_OTLP_VENDOR``.
    Never raises: bad values surface as :meth:`OtlpInBridge.preflight`
    lines (one per problem)."""
    vendors = [v.strip().lower() for v in (environ.get("AEP_OTLP_VENDOR") or "codex").split(",")]
    vendors = [v for v in dict.fromkeys(vendors) if v] or ["codex"]
    reader = EnvReader(environ)
    primary = reader.flag("AEP_OTLP_PRIMARY")
    raw_max = (environ.get("AEP_OTLP_MAX_BODY") or "").strip()
    max_body: int = DEFAULT_MAX_BODY
    if raw_max:
        max_body = int(raw_max) if raw_max.isdigit() else raw_max  # type: ignore[assignment]
    bridges: list[OtlpInBridge] = []
    for i, vendor in enumerate(vendors):
        key = vendor.upper().replace("-", "_")
        settings = {"vendor": "AEP_OTLP_VENDOR", "max_body": "AEP_OTLP_MAX_BODY"}
        listen = {}
        for kind, default in (("grpc", DEFAULT_GRPC_LISTEN), ("http", DEFAULT_HTTP_LISTEN)):
            own = f"AEP_OTLP_{key}_{kind.upper()}_LISTEN"
            shared = f"AEP_OTLP_{kind.upper()}_LISTEN"
            if environ.get(own):
                listen[kind], settings[kind] = environ[own], own
            elif i == 0:
                listen[kind], settings[kind] = environ.get(shared) or default, shared
            else:
                # Two profiles cannot share listeners: preflight names the
                # missing per-profile setting ("" = not set).
                listen[kind], settings[kind] = "", own
        bridges.append(OtlpInBridge(vendor, grpc_listen=listen["grpc"],
                                    http_listen=listen["http"], primary=primary,
                                    policy=policy, max_body=max_body, settings=settings,
                                    problems=reader.problems if i == 0 else None))
    for b in bridges:
        b.peers = tuple(bridges)
    return bridges
