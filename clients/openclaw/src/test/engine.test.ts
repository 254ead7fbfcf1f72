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
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";

import type { AgentMessage, HarnessContextEngine as ContextEngine } from "openclaw/plugin-sdk/agent-harness-runtime" with { "resolution-mode": "import" };
import type { OpenClawPluginApi, OpenClawPluginDefinition } from "openclaw/plugin-sdk/plugin-entry" with { "resolution-mode": "import" };

import { DagctxClient, resolveCommand } from "dagctx-client";

import { closeAllLinks } from "../link";
import type { RecallTool } from "../tools";

const ROOT = join(__dirname, "..", "..");
const dir = mkdtempSync(join(tmpdir(), "dagctx-openclaw-"));
const db = join(dir, "openclaw.db");
after(async () => {
  await closeAllLinks();
  rmSync(dir, { recursive: true, force: true });
});

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

type ToolFactory = (ctx: { sessionId?: string; sessionKey?: string; workspaceDir?: string }) => RecallTool[];

function loadPlugin(config: Record<string, unknown>, hostConfig: Record<string, unknown> = {}): { id: string; factory: Parameters<OpenClawPluginApi["registerContextEngine"]>[1]; tools: ToolFactory[]; warnings: string[] } {
  const manifest = JSON.parse(readFileSync(join(ROOT, "openclaw.plugin.json"), "utf8"));
  assert.equal(manifest.id, "dagctx");
  assert.deepEqual(manifest.kind, ["context-engine", "memory"]);
  assert.equal(manifest.configSchema.type, "object");
  const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
  const entry = join(ROOT, pkg.openclaw.extensions[0]);
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const mod = require(entry) as { default: OpenClawPluginDefinition };
  const def = mod.default;
  assert.equal(def.id, manifest.id);
  const registered: { id: string; factory: Parameters<OpenClawPluginApi["registerContextEngine"]>[1] }[] = [];
  const tools: ToolFactory[] = [];
  const warnings: string[] = [];
  const api = {
    id: manifest.id,
    name: manifest.name,
    pluginConfig: config,
    config: hostConfig,
    logger: { info: () => undefined, warn: (m: string) => warnings.push(m), error: (m: string) => warnings.push(m) },
    registerContextEngine: (id: string, factory: Parameters<OpenClawPluginApi["registerContextEngine"]>[1]) => registered.push({ id, factory }),
    registerTool: (factory: ToolFactory, opts: { names: string[] }) => {
      for (const n of opts.names) assert.ok(manifest.contracts.tools.includes(n), `${n} is in the manifest's contracts.tools`);
      tools.push(factory);
    },
  };
  def.register!(api as unknown as OpenClawPluginApi);
  assert.equal(registered.length, 1);
  return { ...registered[0]!, tools, warnings };
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

  // below the threshold and not forced: nothing to do, and that is a success
  const idle = await engine.compact({ sessionId, sessionKey: "k" });
  assert.equal(idle.ok, true);
  assert.equal(idle.compacted, false);
  assert.match(idle.reason!, /below threshold/);

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
  const summariesBefore = calls.length;
  const tight = await engine.assemble({ sessionId, messages: transcript, model: "gpt-4o", tokenBudget: 1200,
    runtimeContext: { llm: hostLlm(calls) as never } });
  assert.ok(tight.estimatedTokens <= 1200, `${tight.estimatedTokens} tokens for a budget of 1200`);
  assert.ok(calls.length > summariesBefore, "the tight budget was met by compacting through the host's llm");

  await engine.dispose!();
  // OpenClaw disposes an engine after every turn: the daemon connection is the process's, not the engine's
  const link = (engine as unknown as { link: { connections: number } }).link;
  const other = (await factory({})) as unknown as { link: { connections: number } };
  assert.equal(other.link, link, "engines share one daemon link");
  assert.equal(link.connections, 1, "one daemon connection for every engine of the process");
  await closeAllLinks(); // as a new process would start

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
  await closeAllLinks();

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

function turnMessages(i: number): AgentMessage[] {
  return [user(`turn ${i}: fix ticket T-${i}07 in app/core_${i}.py`), assistant(`Fixed T-${i}07.`)];
}

test("OpenClaw's durable turn contract: declared, idempotent commits, assemble never re-records", async () => {
  const { factory, tools, warnings } = loadPlugin({ database: db, model: "gpt-4o" });
  const engine = (await factory({})) as ContextEngine & { dagctxSessionId(id: string): Promise<string> };
  assert.deepEqual(engine.info.transcriptSemantics, {
    currentTurnFence: "before-current-turn-entry-v1",
    turnAdvancementIdempotency: "atomic-idempotent-v1",
  });
  assert.deepEqual(engine.info.hostRequirements?.["agent-run"]?.requiredCapabilities, ["assemble-before-prompt"]);
  assert.equal(typeof engine.commitTurn, "function");

  const sessionId = "oc-durable";
  const sessionKey = "agent:main:durable";
  const admission = {} as never;
  const terminal = {} as never;
  const t1 = turnMessages(1);
  assert.deepEqual(await engine.commitTurn!({ advancementKey: "turn-1", admission, terminal, messages: t1, sessionId, sessionKey }), { status: "committed" });
  // the host retries the same advancement (a lost acknowledgement): nothing is appended twice
  assert.deepEqual(await engine.commitTurn!({ advancementKey: "turn-1", admission, terminal, messages: t1, sessionId, sessionKey }), { status: "duplicate" });

  // the host feeds an assemble's output back into the next assemble of the same turn
  let view = await engine.assemble({ sessionId, sessionKey, messages: [], model: "gpt-4o", tokenBudget: 50_000 });
  for (let k = 0; k < 3; k++) {
    view = await engine.assemble({ sessionId, sessionKey, messages: view.messages, model: "gpt-4o", tokenBudget: 50_000 });
  }
  assert.equal(view.messages.length, 2);
  assert.deepEqual(view.contextProjection, { mode: "per_turn" });

  // a commit cut short (only its user message got recorded) is completed by the retry, not copied
  const t2 = turnMessages(2);
  await engine.ingest({ sessionId, sessionKey, message: t2[0]! });
  assert.deepEqual(await engine.commitTurn!({ advancementKey: "turn-2", admission, terminal, messages: t2, sessionId, sessionKey }), { status: "committed" });

  // a restarted gateway (a new process: a new link) retrying an old key: duplicate, from the record itself
  await closeAllLinks();
  const restarted = await factory({});
  assert.deepEqual(await restarted.commitTurn!({ advancementKey: "turn-1", admission, terminal, messages: t1, sessionId, sessionKey }), { status: "duplicate" });
  assert.deepEqual(await restarted.commitTurn!({ advancementKey: "turn-2", admission, terminal, messages: t2, sessionId, sessionKey }), { status: "duplicate" });

  // an internal run (OpenClaw's memory flush: its own session key) reads the view the host gives it, records nothing
  const flushKey = "agent:main:internal-session-effects:flush-1";
  const flush = await restarted.assemble({ sessionId: "internal-session-effects-flush-1", sessionKey: flushKey, messages: [...t1, ...t2], tokenBudget: 50_000 });
  assert.equal(flush.messages.length, 4, "the internal run gets its parent's context");
  assert.deepEqual(await restarted.commitTurn!({ advancementKey: "flush", admission, terminal, messages: [user("flush")], sessionId: "internal-session-effects-flush-1", sessionKey: flushKey }), { status: "committed" });

  // nothing to compact is a success
  const none = await restarted.compact({ sessionId, sessionKey, force: true, tokenBudget: 50_000 });
  assert.equal(none.ok, true);
  assert.equal(none.compacted, false);
  assert.match(none.reason!, /nothing to compact/);

  // the recall tools read this session's record
  assert.equal(tools.length, 1);
  const [search, read] = tools[0]!({ sessionId, sessionKey });
  assert.deepEqual(tools[0]!({ sessionId, sessionKey }).map((t) => t.name), ["dagctx_search", "dagctx_read", "dagctx_expand"]);
  const found = await search!.execute("c1", { query: "core_1" });
  const body = found.content[0]!.text;
  assert.match(body, /nodeId \S+/);
  const nodeId = /nodeId (\S+)/.exec(body)![1]!;
  const whole = await read!.execute("c2", { nodeId });
  assert.match(whole.content[0]!.text, /turn 1: fix ticket T-107 in app\/core_1\.py/);
  await assert.rejects(search!.execute("c3", { query: "" }), /query is required/);

  const sid = await (restarted as unknown as { dagctxSessionId(id: string): Promise<string> }).dagctxSessionId(sessionId);
  await closeAllLinks();
  const c = await DagctxClient.spawn({ database: db });
  try {
    const chain = (await c.history(sid)).nodes;
    assert.deepEqual(chain.map((n) => String(n.output)), [...t1, ...t2].map(text), "each message once, in order");
    const sessions = (await c.sessionList({ limit: 200 })).sessions;
    assert.ok(!sessions.some((x) => x.metadata?.["openclawSessionKey"] === flushKey), "the internal run recorded nothing");
  } finally {
    await c.close();
  }
  assert.deepEqual(warnings, []);
});

test("dagctx stopped: every step goes on without dagctx and says so, none throws (OpenClaw would quarantine the engine); back, it records what it missed", async () => {
  const launcher = join(dir, "dagctx-launch");
  const quote = (a: string) => `'${a.replace(/'/g, `'\\''`)}'`;
  const working = `#!/bin/sh\nexec ${resolveCommand({}).map(quote).join(" ")} "$@"\n`;
  writeFileSync(launcher, working, { mode: 0o755 });
  const { factory, warnings } = loadPlugin({ database: db, model: "gpt-4o", command: [launcher] });
  const engine = (await factory({})) as ContextEngine & { connection(): Promise<DagctxClient>; dagctxSessionId(id: string): Promise<string> };
  const sessionId = "oc-outage";
  const sessionKey = "agent:main:outage";
  const admission = {} as never;
  const terminal = {} as never;
  const t1 = turnMessages(31);
  assert.deepEqual(await engine.commitTurn!({ advancementKey: "o-1", admission, terminal, messages: t1, sessionId, sessionKey }), { status: "committed" });

  // the host aborts a background compaction: its own abort reason comes back (not an engine failure)
  const ctl = new AbortController();
  const reason = Object.assign(new Error("Session maintenance yielded to a foreground turn"), { name: "AbortError" });
  ctl.abort(reason);
  await assert.rejects(engine.compact({ sessionId, sessionKey, force: true, tokenBudget: 50_000, abortSignal: ctl.signal } as never), (e) => e === reason);
  assert.equal(warnings.length, 0, warnings.join("\n"));

  // dagctx stops: its daemon dies and its command fails
  writeFileSync(launcher, "#!/bin/sh\necho 'dagctx is stopped (test)' >&2\nexit 1\n", { mode: 0o755 });
  const conn = await engine.connection();
  conn.process?.kill("SIGKILL");
  await conn.exited;

  const t2 = turnMessages(32);
  const given = [...t1, t2[0]!];
  const view = await engine.assemble({ sessionId, sessionKey, messages: given, model: "gpt-4o", tokenBudget: 50_000 });
  assert.deepEqual(view.messages, given, "without dagctx the model sees the host's own messages");
  assert.deepEqual(await engine.commitTurn!({ advancementKey: "o-2", admission, terminal, messages: t2, sessionId, sessionKey }), { status: "committed" });
  const compacted = await engine.compact({ sessionId, sessionKey, tokenBudget: 50_000 });
  assert.equal(compacted.ok, true);
  assert.equal(compacted.compacted, false);
  const small = await engine.assemble({ sessionId, sessionKey, messages: [...t1, ...t2], model: "gpt-4o", tokenBudget: 20 });
  assert.ok(small.messages.length < 4 && small.messages.length > 0, "over the budget, the oldest messages are left out");
  assert.ok(warnings.length >= 4 && warnings.every((w) => w.includes("[dagctx] DEGRADED")), warnings.join("\n"));

  // dagctx is back: the next step after the retry wait reconnects, replays the kept turn, says so
  writeFileSync(launcher, working, { mode: 0o755 });
  await new Promise((r) => setTimeout(r, 5_200));
  const t3 = turnMessages(33);
  assert.deepEqual(await engine.commitTurn!({ advancementKey: "o-3", admission, terminal, messages: t3, sessionId, sessionKey }), { status: "committed" });
  assert.match(warnings.at(-1)!, /\[dagctx\] RECOVERED: .*1 step\(s\)/);
  const back = await engine.assemble({ sessionId, sessionKey, messages: [], model: "gpt-4o", tokenBudget: 50_000 });
  assert.deepEqual(back.messages.map(text), [...t1, ...t2, ...t3].map(text), "each turn once, in order, the outage's included");
  // the host retrying the outage's commit: a duplicate
  assert.deepEqual(await engine.commitTurn!({ advancementKey: "o-2", admission, terminal, messages: t2, sessionId, sessionKey }), { status: "duplicate" });
  await closeAllLinks();
});

test("in the memory slot, memory_search and memory_get search and read the run's workspace through dagctx", async () => {
  const ws = mkdtempSync(join(tmpdir(), "dagctx-openclaw-ws-"));
  mkdirSync(join(ws, "memory"));
  writeFileSync(join(ws, "MEMORY.md"), "# Memory\n\nThe user prefers tabs.\n");
  writeFileSync(join(ws, "memory", "cache.md"), "# Cache\n\nWe decided the cache eviction policy is LRU with a 256 MiB bound.\n");
  writeFileSync(join(dir, "secret.md"), "top secret\n");
  try {
    // not in the memory slot: only the recall tools (memory-core keeps the memory tool names)
    const plain = loadPlugin({ database: db });
    assert.equal(plain.tools.length, 1);
    const { tools } = loadPlugin({ database: db }, { plugins: { slots: { memory: "dagctx", contextEngine: "dagctx" } } });
    assert.equal(tools.length, 2);
    const mem = tools[1]!({ sessionId: "s", workspaceDir: ws });
    assert.deepEqual(mem.map((t) => t.name), ["memory_search", "memory_get"]);
    const [search, get] = mem as [RecallTool, RecallTool];
    const found = await search.execute("t1", { query: "what did we decide about the cache eviction policy?" });
    const hits = (found.details as { hits: { path: string; chunkId: string; text: string }[]; keywords: string[] });
    assert.equal(hits.hits[0]!.path, "memory/cache.md");
    assert.ok(hits.keywords.includes("cache") && !hits.keywords.includes("what"));
    assert.match(found.content[0]!.text, /memory\/cache\.md lines 1–3 · chunkId /);
    // an edit is found at the next search (the index is brought up to date first)
    writeFileSync(join(ws, "memory", "infra.md"), "Everything runs on kubernetes.\n");
    const again = await search.execute("t2", { query: "kubernetes" });
    assert.deepEqual((again.details as { hits: { path: string }[] }).hits.map((h) => h.path), ["memory/infra.md"]);
    const byChunk = await get.execute("t3", { chunkId: hits.hits[0]!.chunkId });
    assert.match(byChunk.content[0]!.text, /LRU with a 256 MiB bound/);
    const byLines = await get.execute("t4", { path: "MEMORY.md", fromLine: 3, lines: 1 });
    assert.equal((byLines.details as { text: string }).text, "The user prefers tabs.");
    // out of the workspace: an answer naming WorkspaceEscape, never the file
    const refused = await get.execute("t5", { path: "../" + dir.split("/").pop() + "/secret.md" });
    assert.equal((refused.details as { error: { kind: string } }).error.kind, "WorkspaceEscape");
    assert.ok(!refused.content[0]!.text.includes("top secret"));
    await assert.rejects(get.execute("t6", {}), /exactly one of chunkId/);
  } finally {
    await closeAllLinks();
    rmSync(ws, { recursive: true, force: true });
  }
});
