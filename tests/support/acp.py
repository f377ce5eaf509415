"""ACP test support: the Python SDK's golden wire messages, read at test time.

The sdist of ``agent-client-protocol==0.12.1`` ships ``tests/golden/*.json``:
the params/results of real schema-v1.19 wire messages, one per file. They are
not committed here (the vendor's files stay the vendor's):
:func:`golden_dir` downloads the sdist once with pip (the ordinary client,
into the shared vendor cache) and unpacks it; :func:`golden_frames` wraps each
file into the JSON-RPC frame it is the payload of, with its direction.

When pip cannot reach the registry the calling test is skipped LOUDLY
(:func:`tests.support.vendors.skip_loudly`)."""
from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from .vendors import cache_root, skip_loudly

ACP_PY = "agent-client-protocol"
ACP_PY_VERSION = "0.12.1"
ACP_TS = "@agentclientprotocol/sdk"
ACP_TS_VERSION = "2.4.0"

# golden file -> (direction, frame kind, method), in wire order; "response"
# frames answer the request of that method sent just before, the other way.
GOLDEN: dict[str, tuple[str, str, str]] = {
    "initialize_request": ("client", "request", "initialize"),
    "initialize_response": ("agent", "response", "initialize"),
    "new_session_request": ("client", "request", "session/new"),
    "new_session_response": ("agent", "response", "session/new"),
    "prompt_request": ("client", "request", "session/prompt"),
    "cancel_notification": ("client", "notification", "session/cancel"),
    "fs_read_text_file_request": ("agent", "request", "fs/read_text_file"),
    "fs_read_text_file_response": ("client", "response", "fs/read_text_file"),
    "fs_write_text_file_request": ("agent", "request", "fs/write_text_file"),
    "request_permission_request": ("agent", "request", "session/request_permission"),
    "request_permission_response_selected": ("client", "response", "session/request_permission"),
    "set_session_config_option_request": ("client", "request", "session/set_config_option"),
    "set_session_config_option_response": ("agent", "response", "session/set_config_option"),
}
UPDATE_PREFIX = "session_update_"


def golden_path() -> Path:
    """Where :func:`golden_dir` puts the goldens (may not exist yet)."""
    dest = cache_root() / f"{ACP_PY}@{ACP_PY_VERSION}-sdist"
    return dest / f"agent_client_protocol-{ACP_PY_VERSION}" / "tests" / "golden"


def golden_dir() -> Path:
    """``<vendor cache>/agent-client-protocol@0.12.1-sdist/.../tests/golden``,
    downloaded (pip) and unpacked on first use."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / f"{ACP_PY}@{ACP_PY_VERSION}-sdist"
    golden = golden_path()
    if golden.is_dir():
        return golden
    with open(root / f"{ACP_PY}@{ACP_PY_VERSION}-sdist.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if golden.is_dir():
            return golden
        dest.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--disable-pip-version-check", "-q", "-d", str(dest),
             f"{ACP_PY}=={ACP_PY_VERSION}"], capture_output=True, text=True, timeout=300)
        sdists = list(dest.glob("*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            skip_loudly(f"pip download {ACP_PY}=={ACP_PY_VERSION} failed: "
                        f"{(proc.stderr or proc.stdout).strip()[-400:]}")
        with tarfile.open(sdists[0]) as tar:
            members = [m for m in tar.getmembers() if "/tests/golden/" in m.name]
            tar.extractall(dest, members=members, filter="data")
    return golden


def golden(name: str) -> Any:
    return json.loads((golden_dir() / f"{name}.json").read_text())


def golden_frames() -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(name, direction, kind, frame)`` for every wire message golden
    file: requests and notifications as sent, responses with the id of a
    request sent just before them (returned in wire order: each request
    before its response)."""
    out: list[tuple[str, str, str, dict[str, Any]]] = []
    ids = {"client": 0, "agent": 0}
    last: dict[str, int] = {}
    for name in GOLDEN:  # in wire order: each request before its response
        direction, kind, method = GOLDEN[name]
        body = golden(name)
        if kind == "request":
            rid = ids[direction]
            ids[direction] += 1
            last[method] = rid
            frame = {"jsonrpc": "2.0", "id": rid, "method": method, "params": body}
        elif kind == "notification":
            frame = {"jsonrpc": "2.0", "method": method, "params": body}
        else:
            frame = {"jsonrpc": "2.0", "id": last.get(method, 99), "result": body}
        out.append((name, direction, kind, frame))
    for path in sorted(golden_dir().glob(f"{UPDATE_PREFIX}*.json")):
        frame = {"jsonrpc": "2.0", "method": "session/update",
                 "params": {"sessionId": "sess_abc123def456",
                            "update": json.loads(path.read_text())}}
        out.append((path.stem, "agent", "notification", frame))
    return out


# --------------------------------------------------------------------------- peers and the daemon

PEERS = Path(__file__).resolve().parents[1] / "integration" / "acp" / "peers"
DAEMON_ENV = {"AEP_BRIDGE_ACP": "1", "AEP_BRIDGE_OTLP_IN": "0"}
"""The daemon with the ACP bridge alone (``tests.support.daemon.run_daemon``)."""


def tee(daemon_url: str, *extra: str) -> list[str]:
    """The tee in front of an agent command: ``tee(url) + agent``."""
    from .daemon import console_script
    return console_script() + ["acp", "--daemon", daemon_url, *extra, "--"]


def py_agent() -> list[str]:
    """The Python SDK agent (``peers/py_agent.py``)."""
    return [sys.executable, str(PEERS / "py_agent.py")]


def ts_sdk() -> Path:
    """``@agentclientprotocol/sdk@2.4.0`` from npm (the vendor cache)."""
    from .vendors import npm_package
    return npm_package(ACP_TS, ACP_TS_VERSION)


def node() -> str:
    import shutil
    exe = shutil.which("node")
    if exe is None:
        skip_loudly("node is not on PATH: the TypeScript ACP SDK cannot run")
    return exe


def ts_agent() -> list[str]:
    """The TypeScript SDK agent (``peers/ts_agent.mjs``); needs ``ACP_SDK``
    in its environment (:func:`ts_env`)."""
    return [node(), str(PEERS / "ts_agent.mjs")]


def ts_env() -> dict[str, str]:
    return {"ACP_SDK": str(ts_sdk())}
