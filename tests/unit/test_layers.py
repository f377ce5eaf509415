"""The shape of the tree, in the style of trio's ``_tests/test_exports.py``:

- the layers point one way (``bridges.core`` -> the bridges ->
  ``supervisor``), checked on the AST of every module, imports inside
  functions included;
- each curated package and module exposes exactly the public surface listed
  here: a new public name (or module) fails this test until it is added on
  purpose, and everything listed exists.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, anywhere in
    it (module level, functions, ``TYPE_CHECKING`` blocks), as absolute
    names; ``from x import y`` counts ``x`` and ``x.y``."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def _imports_of(path: Path) -> set[str]:
    return imported_modules(path.read_text(), _module_name(path),
                            is_package=path.name == "__init__.py")


def _offenders(package: str, forbidden) -> list[str]:
    return [f"{_module_name(p)} imports {name}" for p in _modules(package)
            for name in sorted(_imports_of(p)) if forbidden(_module_name(p), name)]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# -- the walker itself (so the layer tests can fail) ----------------------------------

def test_the_walker_sees_function_level_and_relative_imports():
    src = ("import os\n"
           "from . import sibling\n"
           "from ..core import aep\n"
           "def f():\n"
           "    from supervisor.relay.core import Relay\n"
           "    import supervisor.http\n"
           "if False:\n"
           "    from .deep import thing\n")
    found = imported_modules(src, "bridges.otlp_in.bridge")
    assert {"os", "bridges.otlp_in.sibling", "bridges.core.aep", "supervisor.relay.core",
            "supervisor.relay.core.Relay", "supervisor.http",
            "bridges.otlp_in.deep.thing"} <= found
    assert "bridges.x.y" in imported_modules("from .y import z\n", "bridges.x", is_package=True)


# -- the layers ---------------------------------------------------------------------

def test_no_bridge_module_imports_the_supervisor():
    assert _offenders("bridges", lambda mod, name: _under(name, "supervisor")) == []


def test_bridges_core_imports_no_bridge():
    """The shared layer is below every bridge: it knows none of them."""
    def bad(mod: str, name: str) -> bool:
        return _under(mod, "bridges.core") and _under(name, "bridges") \
            and not _under(name, "bridges.core") and name != "bridges"
    assert _offenders("bridges/core", bad) == []


def test_the_relay_imports_nothing_else_of_the_supervisor():
    """The embedded relay is transport + state over bridges.core: it does not
    know the fleet, the config or the daemon."""
    def bad(mod: str, name: str) -> bool:
        return _under(name, "supervisor") and not _under(name, "supervisor.relay")
    assert _offenders("supervisor/relay", bad) == []


def test_test_doubles_serve_through_bridges_core():
    """The vendor doubles in tests/support use the shared ASGI helpers, not a
    supervisor module, so they stand beside any bridge."""
    def bad(mod: str, name: str) -> bool:
        return _under(name, "supervisor.asgi") or _under(name, "supervisor.relay.serve") \
            and not mod.endswith("relay_harness")
    assert _offenders("tests/support", bad) == []


def test_importing_the_http_machinery_changes_nothing_in_hypercorn():
    """The HTTP/1.1-only policy is applied by the connection handler serve_app
    builds, never by patching hypercorn for the whole process at import."""
    import hypercorn.protocol
    import hypercorn.trio.tcp_server as tcp
    for name in ("bridges.core.http", "supervisor.relay.serve", "supervisor.http",
                 "supervisor.daemon", "bridges.otlp_in.bridge"):
        importlib.import_module(name)
    assert tcp.ProtocolWrapper is hypercorn.protocol.ProtocolWrapper


# -- the public surface ---------------------------------------------------------------

PUBLIC: dict[str, set[str]] = {
    "bridges.core": {
        "aep", "asgi", "backoff", "bridge", "captable", "capture", "control", "envelope",
        "errors", "http", "ledger", "naming", "paths", "posture", "readers", "redaction", "settings",
        "statefile",
    },
    "bridges.core.posture": {"MODES", "Posture"},
    "bridges.core.readers": {"arr", "obj", "text", "whole"},
    "bridges.core.aep": {
        "AEP_VERSION", "SUPPORTED_VERSIONS", "SEVERITIES", "SEVERITY_RANK", "DEFAULT_SEVERITY",
        "NOTICE_RANK", "CAPTURE_LEVELS", "CAPTURE_RANK", "DEFAULT_CAPTURE", "capture_rank",
        "CORE_COMMANDS", "ACK_TYPES", "is_command_type", "is_command", "is_foreign",
        "NACK_REASONS", "ACK_WINDOW_MS", "dumps", "loads", "scrub_surrogates",
    },
    "bridges.core.asgi": {
        "Scope", "Message", "Receive", "Send", "App", "ABORT_KEY", "LISTEN_KEY", "lifespan",
        "read_body", "headers", "header", "send_bytes", "send_json", "respond", "send_metrics", "presented_tokens", "token_matches", "bearer_ok",
        "host_allowed", "listen_host", "host_guard", "refuse_upgrade",
    },
    "bridges.core.http": {
        "HyperConfig", "hyper_config", "bind_socket", "serve_app", "Http2Refused", "FaultLog",
        "fault_kind", "FAULT_LOG_INTERVAL_S",
    },
    "bridges.core.errors": {"leaves", "root_cause"},
    "bridges.core.paths": {"state_dir", "write_atomic"},
    "bridges.core.statefile": {"COMPACT_CHUNK", "COMPACT_MIN", "StateFile", "state_path"},
    "supervisor.relay": {"Relay", "LocalEmitter", "CommandRefused", "RelayClosed", "InvalidEvent"},
    "supervisor.relay.core": {"Relay", "RelayClosed", "CommandRefused", "LocalEmitter",
                              "normalize_origin", "RELAY_AGENT", "RunFault"},
    "supervisor.relay.app": {"RelayApp", "make_app"},
    "supervisor.relay.serve": {"serve_relay"},
    "supervisor.relay.streams": {"serve_sse", "pump_sse", "serve_socket", "refuse_upgrade"},
    "supervisor.relay.connections": {"RelayClosed", "TooLarge", "Unavailable", "CommandRefused", "Connection",
                                     "LocalEmitter", "SocketConnection", "Claims", "ROLES"},
    "supervisor.relay.outlet": {"Outlet", "OutletHub", "Subscriber", "Item", "EventItem", "RunItem",
                                "FrameItem", "ReplayItem", "EndItem", "OPEN", "FINISHING",
                                "TERMINATED", "CLOSED", "frame_text", "exhausted_marker"},
    "supervisor.relay.fanout": {"Fanout", "View", "downlevel_raw", "sse_safe", "sse_message"},
    "supervisor.relay.replay": {"ReplayJob", "Plan", "exhausted_marker", "plan_replay",
                                "unheld_positions"},
    "supervisor.jetstream.plan": {"Found", "Lookup", "MAX_SUBJECTS", "Position", "Resolved",
                                  "resolve_after", "session_subject", "subject_plan"},
    "supervisor.jetstream.relay": {
        "CONSUMER_INACTIVE_S", "CONSUMER_PREFIX", "FETCH_BATCH", "FETCH_TIMEOUT_S", "IDLE_CHECKS",
        "JetStreamRelay", "JsSocketConnection", "PUBLISH_DEADLINE_S", "PUBLISH_WINDOW",
        "REQUEST_TIMEOUT_S", "ROUTE_DEADLINE_S", "accepts_of", "reply_refusal", "roster_entries"},
    "supervisor.relay.params": {"parse_capture", "parse_from", "parse_last_event_id",
                                "normalize_origin", "parse_filter_json", "parse_from_json"},
    "supervisor.relay.envelope": {"InvalidEvent", "MAX_DATA_DEPTH", "validate", "well_formed", "encode",
                                  "to_entry", "envelope_error", "has_duplicate_keys",
                                  "trusted_entry", "formed_entry", "AEP_VERSION", "is_command_type", "is_foreign"},
    "supervisor.relay.attrmatch": {"Filter", "InvalidFilter", "validate_filter", "attr_match",
                                   "MATCH_ALL", "CORE_ATTRS", "FILTERABLE", "DEFAULTS",
                                   "FilterTooLarge", "DEFAULT_MAX_TERMS", "filter_terms"},
    "supervisor.relay.buffer": {"SessionBuffers", "Entry", "Held", "Position", "BufKey",
                                "ENTRY_OVERHEAD", "MiB", "same_event", "same_json", "AppendFault"},
    "supervisor.relay.capcheck": {"exceeds", "content_level"},
    "supervisor.http": {"serve_asgi", "health_app"},
    "supervisor.console": {"BEARER_PREFIX", "CSP", "SUBPROTOCOL", "console_app", "static_files"},
    "supervisor.console.app": {"BEARER_PREFIX", "CSP", "SUBPROTOCOL", "console_app", "static_files"},
    "supervisor.uplink": {"Uplink", "UplinkError", "socket_url", "redact_url", "encode",
                          "is_command"},
    "supervisor.metrics": {"ACK_BUCKETS", "FleetCollector", "Metrics", "PREFIX"},
    "supervisor.retention": {"RetainingSessionLog", "RetentionPolicy", "REMOVALS_PER_STEP", "SETTINGS", "parse_age", "parse_size", "segment_name"},
    "supervisor.spares": {"SpareFiles", "SPARE_DIR", "DEFAULT_TARGET", "QUIET", "CHUNK", "RETIRE_AFTER", "INODE_RESERVE", "give_back"},
    "supervisor.statelock": {"LOCK_FILE", "StateDirBusy", "StateLock", "hold"},
    "supervisor.tail": {"AGENT_W", "DEFAULT_LISTEN", "FAMILY_STYLE", "OUTCOME_STYLE", "SESSION_W", "TIME_W", "TYPE_W", "Timeline", "default_url", "gist", "parse_filter", "run"},
    "supervisor.jetstream.publish": {"AckInbox", "LEADER_WAIT_S", "Message", "PUBLISH_TIMEOUT_S", "Publisher",
                                     "RETRY_INITIAL_S", "RETRY_MAX_S", "ROUND_MAX", "TooLarge",
                                     "await_leader", "ensure_stream", "message_for",
                                     "stream_drift", "too_large", "wanted_stream"},
    "supervisor.jetstream.presence": {"Claims", "ID_FILE", "Presence", "accepts_of", "daemon_id",
                                      "route"},
    "supervisor.jetstream.sink": {"JetStreamSink"},
    "supervisor.jetstream.recover": {"MARK_FILE", "MAX_FILE_BYTES", "candidate_files",
                                     "marker", "missing_lines", "read_mark", "recover",
                                     "write_mark"},
    "supervisor.install": {"ENV_TEMPLATE", "PLIST_LABEL", "Planned", "SYSTEMD_ENV_FILE", "SYSTEMD_UNIT_DIR", "UNIT_NAME", "console_script", "default_manager", "install", "plan", "read_env_file", "render_plist", "render_unit", "unreachable"},
}


def _path_of(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _defined_public_names(module: str) -> set[str]:
    """Names a module defines at top level (def, class, assignment) that do
    not start with ``_``: what it offers whether or not it lists them."""
    names: set[str] = set()
    for node in ast.parse(_path_of(module).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_") and n != "log"}  # a logger is not API


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_surface_is_curated(module):
    mod = importlib.import_module(module)
    exported = getattr(mod, "__all__", None)
    assert exported is not None, f"{module} declares no __all__"
    assert len(exported) == len(set(exported)), f"{module}.__all__ repeats a name"
    assert set(exported) == PUBLIC[module], (
        f"{module}.__all__ changed: added {sorted(set(exported) - PUBLIC[module])}, "
        f"removed {sorted(PUBLIC[module] - set(exported))} (update PUBLIC on purpose)")
    for name in exported:
        if _path_of(module).name == "__init__.py" and name not in vars(mod):
            importlib.import_module(f"{module}.{name}")  # a submodule
        else:
            assert hasattr(mod, name), f"{module}.__all__ lists {name}, which does not exist"
    unlisted = _defined_public_names(module) - set(exported)
    assert not unlisted, f"{module} defines public {sorted(unlisted)} outside __all__"


def test_each_package_lists_every_module():
    """A new module in a curated package is listed on purpose."""
    core = {p.stem for p in (ROOT / "bridges" / "core").glob("*.py") if p.stem != "__init__"}
    assert core == PUBLIC["bridges.core"]
    relay = {f"supervisor.relay.{p.stem}" for p in (ROOT / "supervisor" / "relay").glob("*.py")
             if p.stem != "__init__"}
    assert relay == {m for m in PUBLIC if m.startswith("supervisor.relay.")}
