// A real ACP agent on the TypeScript SDK (@agentclientprotocol/sdk 2.4.0, its
// 2.x `agent()` API, stable v1 entrypoint), plain ESM on Node, over stdio.
// Scripted like py_agent.py: per prompt turn a plan, a thought, message
// chunks, a tool call, session/request_permission, the tool completed when
// allowed (failed otherwise), end_turn (cancelled when the ask was cancelled).
// Run: ACP_SDK=/path/to/node_modules/@agentclientprotocol/sdk node ts_agent.mjs
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";
import path from "node:path";

const sdk = await import(pathToFileURL(path.join(process.env.ACP_SDK, "dist/v1/stable/acp.js")).href);
const { agent, methods, ndJsonStream, PROTOCOL_VERSION } = sdk;

let sessions = 0;
let turns = 0;

const app = agent({ name: "aep-test-ts-agent" })
  .onRequest(methods.agent.initialize, async () => ({
    protocolVersion: PROTOCOL_VERSION,
    agentCapabilities: { loadSession: false },
    agentInfo: { name: "aep-test-ts-agent", version: "1.0" },
  }))
  .onRequest(methods.agent.session.new, async () => ({ sessionId: `ts-sess-${++sessions}` }))
  .onRequest(methods.agent.session.prompt, async ({ params, client }) => {
    const n = ++turns;
    const sessionId = params.sessionId;
    const say = (update) => client.notify(methods.client.session.update, { sessionId, update });
    await say({ sessionUpdate: "plan", entries: [
      { content: "read the failing test", priority: "high", status: "in_progress" },
      { content: "fix it", priority: "medium", status: "pending" }] });
    await say({ sessionUpdate: "agent_thought_chunk", content: { type: "text", text: `turn ${n}` } });
    await say({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: "On it \u2029 now." } });
    const call = `ts-call-${n}`;
    await say({ sessionUpdate: "tool_call", toolCallId: call, title: "edit file", kind: "edit",
                status: "pending", rawInput: { path: "src/x.ts", turn: n } });
    const answer = await client.request(methods.client.session.requestPermission, {
      sessionId,
      toolCall: { toolCallId: call, title: "edit file", kind: "edit" },
      options: [{ optionId: "allow_once", name: "Allow once", kind: "allow_once" },
                { optionId: "reject_once", name: "Reject", kind: "reject_once" }],
    });
    const allowed = answer.outcome.outcome === "selected" && answer.outcome.optionId === "allow_once";
    if (allowed) {
      await say({ sessionUpdate: "tool_call_update", toolCallId: call, status: "completed",
                  rawOutput: { edited: true } });
    } else {
      await say({ sessionUpdate: "tool_call_update", toolCallId: call, status: "failed" });
    }
    return { stopReason: answer.outcome.outcome === "cancelled" ? "cancelled" : "end_turn" };
  })
  .onNotification(methods.agent.session.cancel, async () => {});

const stream = ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
const conn = app.connect(stream);
await conn.closed;
