// A real ACP client on the TypeScript SDK (@agentclientprotocol/sdk 2.4.0,
// `client()` + `connectWith`), shaped like the SDK's example client: it spawns
// the agent command with piped stdio, runs one prompt turn answering the
// permission ask, then SIGTERMs the agent command WITHOUT closing its stdin.
// Prints one JSON line: {view: [...every message received...], exit: {code, signal}}.
// Run: ACP_SDK=... node ts_client.mjs ANSWER -- CMD ARGS...
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";
import path from "node:path";

const sdk = await import(pathToFileURL(path.join(process.env.ACP_SDK, "dist/v1/stable/acp.js")).href);
const { client, methods, ndJsonStream, PROTOCOL_VERSION } = sdk;

const argv = process.argv.slice(2);
const answer = argv[0];
const cmd = argv.slice(argv.indexOf("--") + 1);
const proc = spawn(cmd[0], cmd.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
const view = [];

const app = client({ name: "aep-test-ts-client" })
  .onRequest(methods.client.session.requestPermission, async ({ params }) => {
    view.push(["request_permission", params]);
    return answer === "cancel" ? { outcome: { outcome: "cancelled" } }
                               : { outcome: { outcome: "selected", optionId: answer } };
  })
  .onNotification(methods.client.session.update, async ({ params }) => {
    view.push(["session_update", params]);
  });

const stream = ndJsonStream(Writable.toWeb(proc.stdin), Readable.toWeb(proc.stdout));
const conn = app.connect(stream);
conn.closed.catch(() => {});  // the agent command's exit closes the connection
const ctx = conn.agent;
const init = await ctx.request(methods.agent.initialize, {
  protocolVersion: PROTOCOL_VERSION, clientCapabilities: {},
  clientInfo: { name: "aep-test-ts-client", version: "1" } });
view.push(["initialize", init]);
const session = await ctx.request(methods.agent.session.new, { cwd: "/", mcpServers: [] });
view.push(["session/new", session]);
const result = await ctx.request(methods.agent.session.prompt, {
  sessionId: session.sessionId, prompt: [{ type: "text", text: "fix the build" }] });
view.push(["session/prompt", result]);
proc.kill("SIGTERM");  // like the SDK's example client: stdin is never closed
view.push(["exit", await exited]);
// exit once the line is written (a write to a pipe is asynchronous in Node)
process.stdout.write(JSON.stringify(view) + "\n", () => process.exit(0));
