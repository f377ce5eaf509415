"""The OTLP inbound bridge (``bridges/otlp_in``): Codex and the VS Code
agent export OpenTelemetry LogRecords; this bridge receives them over
OTLP/gRPC and OTLP/HTTP (protobuf or JSON, gzip) and emits AEP events.
Design record: ``shared/aep/docs/bridge-otlp-inbound-design.md``.

The package, from the wire inwards:

=====================  ===================================================  =====
module                 what                                                 pure
=====================  ===================================================  =====
:mod:`.config`         settings metadata, :class:`~.config.OtlpConfig`,     yes
                       ``from_env(env) -> (configs, problems)``
:mod:`.http`           OTLP/HTTP ``POST /v1/logs`` (hypercorn ASGI app)     no
:mod:`.grpc`           OTLP/gRPC ``LogsService/Export`` (grpcio threads,    no
                       handed back to trio)
:mod:`.status`         the one error -> status map of both transports       yes
:mod:`.decode`         bodies -> flattened records (gzip capped)            yes
:mod:`.flatten`        OTLP protobuf / JSON -> the pins' record shape       yes
:mod:`.export`         planning (records -> emissions) and admission        plan
                       (stamping onto the relay channel, backpressure)
:mod:`.profiles`       the vendor seams; :mod:`.codex`, :mod:`.vscode`      yes
                       map, :mod:`.common` helps
:mod:`.bridge`         :class:`OtlpInBridge` (config only) and its          no
                       per-run :class:`~.bridge.OtlpRun`
=====================  ===================================================  =====

Configuration: :data:`bridges.otlp_in.config.SETTINGS` (the README's knob
rows are generated from it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from bridges.core.capture import CapturePolicy

from . import config
from .config import SETTINGS, OtlpConfig

if TYPE_CHECKING:
    from .bridge import OtlpInBridge
_LAZY = ("OtlpInBridge",)


__all__ = ["OtlpConfig", "OtlpInBridge", "SETTINGS", "from_env"]


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy | None = None
             ) -> list[OtlpInBridge]:
    """One :class:`OtlpInBridge` per vendor named in ``AEP_OTLP_VENDOR``
    (:func:`bridges.otlp_in.config.from_env`). Never raises: the
    configuration's problem lines surface through the first bridge's
    :meth:`~OtlpInBridge.preflight` (once each), each bridge adds its own
    ports-in-use lines."""
    from .bridge import OtlpInBridge
    configs, problems = config.from_env(environ)
    return [OtlpInBridge(cfg, policy=policy, problems=problems if i == 0 else ())
            for i, cfg in enumerate(configs)]


def __getattr__(name: str) -> Any:
    # the bridge itself (and what it imports) only when asked for: the daemon
    # and the CLI import every bridge's config for its settings' names
    # (supervisor.config.known_settings), enabled or not, at each start
    if name in _LAZY:
        from . import bridge
        return getattr(bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
