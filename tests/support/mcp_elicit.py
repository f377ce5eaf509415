"""A tiny stdio MCP server whose one tool asks the client for input through MCP
elicitation (``elicitation/create``), so a real agent fires its Elicitation hooks.

Stdlib only, run as a script by the agent (``python tests/support/mcp_elicit.py``):
newline-delimited JSON-RPC 2.0 on stdin/stdout. It answers ``initialize`` (echoing
the client's protocol version; capabilities ``tools``), ``tools/list`` (the tool
:data:`TOOL`), ``ping``; on ``tools/call`` it sends ``elicitation/create`` with
:data:`MESSAGE` and :data:`SCHEMA` (the shape pinned in
``conformance/fixtures/mappings/claude-code.json`` ``elicitation.input``), waits for
the client's answer, and returns it as the tool's text result
(``elicitation: <json of the answer>``), which is what reaches the model.
"""
import json
import sys

TOOL = "deploy"
MESSAGE = "Configure the deployment target"
SCHEMA = {
    "type": "object",
    "properties": {
        "environment": {"type": "string", "enum": ["staging", "production"],
                        "enumNames": ["Staging", "Production"], "title": "Environment"},
        "replicas": {"type": "integer", "title": "Replica count"},
        "reason": {"type": "string", "title": "Why now"},
        "confirm": {"type": "boolean", "title": "Proceed immediately"},
    },
    "required": ["environment", "confirm"],
}


def _send(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _read() -> dict | None:
    line = sys.stdin.readline()
    while line and not line.strip():
        line = sys.stdin.readline()
    return json.loads(line) if line else None


def main() -> None:
    pending: dict | None = None  # the tools/call waiting for the elicitation answer
    while True:
        msg = _read()
        if msg is None:
            return
        method, mid = msg.get("method"), msg.get("id")
        if method is None and mid == "elicit-1" and pending is not None:
            text = "elicitation: " + json.dumps(msg.get("result", msg.get("error")))
            _send({"jsonrpc": "2.0", "id": pending["id"],
                   "result": {"content": [{"type": "text", "text": text}], "isError": False}})
            pending = None
        elif method == "initialize":
            version = (msg.get("params") or {}).get("protocolVersion", "2025-06-18")
            _send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": version, "capabilities": {"tools": {}},
                "serverInfo": {"name": "aep-elicit", "version": "1.0"}}})
        elif method == "tools/list":
            _send({"jsonrpc": "2.0", "id": mid, "result": {"tools": [{
                "name": TOOL, "description": "Deploy the service (asks where first).",
                "inputSchema": {"type": "object", "properties": {}}}]}})
        elif method == "tools/call":
            pending = msg
            _send({"jsonrpc": "2.0", "id": "elicit-1", "method": "elicitation/create",
                   "params": {"message": MESSAGE, "requestedSchema": SCHEMA}})
        elif method == "ping":
            _send({"jsonrpc": "2.0", "id": mid, "result": {}})
        elif mid is not None and method is not None:
            _send({"jsonrpc": "2.0", "id": mid,
                   "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
