// The plugin as OpenClaw loads and drives it, against a real daemon.
//
// openclaw (pinned devDependency) needs Node ≥ 24.16 to run, so its plugin loader cannot
// run here; this harness follows its documented lifecycle exactly instead
// (docs/plugins/architecture-internals/context-engines.md, docs/concepts/context-engine.md):
// read openclaw.plugin.json, load the package's `openclaw.extensions` entry, call the
// definition's register(api) → api.registerContextEngine(id, factory), call the factory
// with {workspaceDir}, then bootstrap → per message ingest → assemble before each model
// run → ingestBatch of the finished turn → afterTurn → compact (with runtimeContext.llm)
// → dispose. Types come from the real package, so a drifted interface fails the build.

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";

import type { AgentMessage, HarnessContextEngine as ContextEngine } from "openclaw/plugin-sdk/agent-harness-runtime" with { "resolution-mode": "import" };
import type { OpenClawPluginApi, OpenClawPluginDefinition } from "openclaw/plugin-sdk/plugin-entry" with { "resolution-mode": "import" };

import { DagctxClient } from "dagctx-client";

const ROOT = join(__dirname, "..", "..");
const dir = mkdtempSync(join(tmpdir(), "dagctx-openclaw-"));
const db = join(dir, "openclaw.db");
after(() => rmSync(dir, { recursive: true, force: true }));

type LlmParams = { messages: { role: string; content: string }[]; systemPrompt?: string; purpose?: string };

/** A host LLM that writes an extractive summary: every identifier of the transcript. */
function hostLlm(calls: LlmParams[]) {
  return {
    complete: async (p: LlmParams) => {
      calls.push(p);
      const text = p.messages.map((m) => m.content).join("\n");
      const words = [...new Set(text.match(/[A-Za-z_][\w./-]{3,}/g) ?? [])].slice(0, 300);
      return {
        text: "## 1. User intent\nthe work below\n## 3. Work completed\n" + words.join(" "),
        provider: "test",
        model: "host-model",
        agentId: "main",
        usage: {},
        execution: { mode: "direct-provider" as const, owner: { kind: "provider" as const, id: "test" } },
        audit: { caller: { kind: "context-engine" as const, id: "dagctx" } },
      };
    },
  };
}

function loadPlugin(config: Record<string, unknown>): { id: string; factory: Parameters<OpenClawPluginApi["registerContextEngine"]>[1] } {
  const manifest = JSON.parse(readFileSync(join(ROOT, "openclaw.plugin.json"), "utf8"));
  assert.equal(manifest.id, "dagctx");
  assert.equal(manifest.kind, "context-engine");
  assert.equal(manifest.configSchema.type, "object");
  const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
  const entry = join(ROOT, pkg.openclaw.extensions[0]);
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const mod = require(entry) as { default: OpenClawPluginDefinition };
  const def = mod.default;
  assert.equal(def.id, manifest.id);
  const registered: { id: string; factory: Parameters<OpenClawPluginApi["registerContextEngine"]>[1] }[] = [];
  const api: Pick<OpenClawPluginApi, "id" | "name" | "pluginConfig" | "registerContextEngine"> = {
    id: manifest.id,
    name: manifest.name,
    pluginConfig: config,
    registerContextEngine: (id, factory) => registered.push({ id, factory }),
  };
  def.register!(api as OpenClawPluginApi);
  assert.equal(registered.length, 1);
  return registered[0]!;
}

let clock = 1_000_000;
const user = (text: string): AgentMessage => ({ role: "user", content: text, timestamp: ++clock });
const assistant = (text: string, calls: { id: string; name: string; args: Record<string, unknown> }[] = []): AgentMessage => ({
  role: "assistant",
  content: [{ type: "text", text }, ...calls.map((c) => ({ type: "toolCall" as const, id: c.id, name: c.name, arguments: c.args }))],
  api: "openai-completions",
  provider: "test",
  model: "gpt-4o",
  usage: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } },
  stopReason: calls.length ? "toolUse" : "stop",
  timestamp: ++clock,
});
const toolResult = (id: string, name: string, text: string): AgentMessage => ({
  role: "toolResult", toolCallId: id, toolName: name, content: [{ type: "text", text }], isError: false, timestamp: ++clock,
});

function text(m: AgentMessage): string {
  const c = (m as { content: unknown }).content;
  if (typeof c === "string") return c;
  return (c as { type: string; text?: string }[]).filter((p) => p.type === "text").map((p) => p.text).join("\n");
}

test("the plugin registers a context engine that ingests, assembles and compacts through dagctx", async () => {
  const { id, factory } = loadPlugin({ database: db, model: "gpt-4o", keepRecentTokens: 1500 });
  assert.equal(id, "dagctx");
  const engine: ContextEngine = await factory({ workspaceDir: dir });
  assert.equal(engine.info.id, "dagctx");
  assert.equal(engine.info.ownsCompaction, true);

  const sessionId = "oc-session-1";
  const boot = await engine.bootstrap!({ sessionId, sessionFile: join(dir, "none.jsonl") });
  assert.equal(boot.bootstrapped, true);

  const transcript: AgentMessage[] = [];
  for (let turn = 0; turn < 8; turn++) {
    const pre = transcript.length;
    const u = user(`Turn ${turn}: update src/lib/part_${turn}.ts ` + "keep the exported names stable ".repeat(40));
    transcript.push(u);
    assert.deepEqual(await engine.ingest({ sessionId, message: u }), { ingested: true });
    const assembled = await engine.assemble({ sessionId, messages: transcript, tokenBudget: 100_000, model: "gpt-4o", prompt: text(u) });
    assert.ok(assembled.estimatedTokens > 0);
    assert.equal(text(assembled.messages.at(-1)!), text(u), "the newest user message is last, verbatim");
    const call = { id: `call_${turn}`, name: "read_file", args: { path: `src/lib/part_${turn}.ts` } };
    const turnMsgs = [
      assistant(`Reading part_${turn}.`, [call]),
      toolResult(call.id, call.name, `export const part${turn} = ${turn};\n`.repeat(40)),
      assistant(`Updated src/lib/part_${turn}.ts.`),
    ];
    transcript.push(...turnMsgs);
    assert.deepEqual(await engine.ingest({ sessionId, message: turnMsgs[0]! }), { ingested: true });
    // the finished turn as one batch: what was ingested already is not recorded twice
    assert.deepEqual(await engine.ingestBatch!({ sessionId, messages: [u, ...turnMsgs] }), { ingestedCount: 2 });
    await engine.afterTurn!({ sessionId, sessionFile: "", messages: transcript, prePromptMessageCount: pre });
  }

  const before = await engine.assemble({ sessionId, messages: transcript, model: "gpt-4o" });
  assert.equal(before.messages.length, transcript.length, "every message, once");
  for (const [i, m] of before.messages.entries()) {
    assert.equal(m.role, transcript[i]!.role);
    assert.equal(text(m), text(transcript[i]!));
  }

  // below the threshold and not forced: nothing to do
  assert.deepEqual(await engine.compact({ sessionId, sessionKey: "k" }), { ok: true, compacted: false, reason: "belowThreshold" });

  const calls: LlmParams[] = [];
  const res = await engine.compact({ sessionId, sessionKey: "k", force: true, runtimeContext: { llm: hostLlm(calls) as never } });
  assert.equal(res.ok, true, JSON.stringify(res));
  assert.equal(res.compacted, true);
  assert.ok(calls.length >= 1 && calls[0]!.purpose === "dagctx compaction summary", "the summary came from the host's llm");
  assert.ok(res.result && res.result.tokensAfter! < res.result.tokensBefore);
  assert.match(res.result!.summary!, /part_0/);

  const afterCompact = await engine.assemble({ sessionId, messages: transcript, model: "gpt-4o" });
  assert.ok(afterCompact.estimatedTokens < before.estimatedTokens);
  assert.ok(afterCompact.messages.length < before.messages.length);
  assert.match(text(afterCompact.messages[0]!), /\[Previous conversation summary\]/);
  assert.equal(text(afterCompact.messages.at(-1)!), text(transcript.at(-1)!), "the tail is verbatim");
  // pair-valid: every tool result follows the assistant message that called it
  const called = new Set<string>();
  for (const m of afterCompact.messages) {
    if (m.role === "assistant") for (const b of m.content) if (b.type === "toolCall") called.add(b.id);
    if (m.role === "toolResult") assert.ok(called.has(m.toolCallId), `orphan tool result ${m.toolCallId}`);
  }

  // the host's budget is the authority: a render that does not fit is compacted first
  const tight = await engine.assemble({ sessionId, messages: transcript, model: "gpt-4o", tokenBudget: 1200,
    runtimeContext: { llm: hostLlm(calls) as never } });
  assert.ok(tight.estimatedTokens <= afterCompact.estimatedTokens);

  await engine.dispose!();

  // the record outlives the engine: a new engine resumes the same dagctx session
  const again = (await factory({})) as ContextEngine & { dagctxSessionId(id: string): Promise<string> };
  // the host delivers its whole transcript again (a restart): nothing is recorded twice
  assert.deepEqual(await again.ingestBatch!({ sessionId, messages: transcript }), { ingestedCount: 0 });
  const resumed = await again.assemble({ sessionId, messages: transcript, model: "gpt-4o" });
  assert.equal(text(resumed.messages.at(-1)!), text(transcript.at(-1)!));
  assert.match(text(resumed.messages[0]!), /\[Previous conversation summary\]/);
  // a new turn after the restart is recorded
  const next = user("Turn 8: done?");
  assert.deepEqual(await again.ingest({ sessionId, message: next }), { ingested: true });
  const sid = await again.dagctxSessionId(sessionId);
  await again.dispose!();

  const c = await DagctxClient.spawn({ database: db });
  try {
    const users = (await c.history(sid)).nodes.filter((n) => n.role === "user").map((n) => String(n.output));
    assert.equal(users.length, 9, "eight turns and one after the restart, each once");
    assert.equal(users.at(-1), "Turn 8: done?");
    const info = await c.sessionGet(sid);
    assert.equal(info.metadata?.["openclawSessionId"], sessionId);
    const hits = await c.search("part_0", { sessionId: sid, roles: ["code"] });
    const nodes = (await c.getNodes(sid, hits.hits.map((h) => h.nodeId))).nodes;
    assert.ok(nodes.length >= 1);
    for (const n of nodes) {
      assert.equal(n.status, "completed");
      assert.match(String(n.metadata?.["toolCallId"]), /^call_/);
    }
  } finally {
    await c.close();
  }
});
