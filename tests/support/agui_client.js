// The real @ag-ui/client HttpAgent (1.0.0) running one run against a URL.
// Usage: node agui_client.js URL THREAD_ID RUN_ID PROMPT
// It POSTs the RunAgentInput with `Accept: text/event-stream`, parses the SSE
// stream, runs verifyEvents over it and applies the events to its messages.
// Prints one JSON line: {ok, events, messages, state, newMessages, error}.
const { HttpAgent } = require("@ag-ui/client");

async function main() {
  const [url, threadId, runId, prompt] = process.argv.slice(2);
  const agent = new HttpAgent({
    url, threadId,
    initialMessages: [{ id: "u-" + runId, role: "user", content: prompt }],
  });
  const events = [];
  let failed = null;
  try {
    const result = await agent.runAgent({ runId }, {
      onEvent: ({ event }) => { events.push(event); },
      onRunFailed: ({ error }) => { failed = String(error && error.message || error); },
    });
    process.stdout.write(JSON.stringify({ ok: failed === null, events, messages: agent.messages, state: agent.state,
                                          newMessages: result.newMessages, error: failed }) + "\n");
  } catch (e) {
    process.stdout.write(JSON.stringify({ ok: false, events, messages: agent.messages,
                                          error: String(e && e.message || e) }) + "\n");
  }
}
main();
