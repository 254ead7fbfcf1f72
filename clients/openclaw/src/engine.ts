// DagctxContextEngine: OpenClaw's ContextEngine (src/context-engine/types.ts) over the
// dagctx daemon, through the TypeScript client.
//
// OpenClaw keeps its transcript; dagctx keeps the record and decides what the model
// sees. ingest / ingestBatch / afterTurn (and assemble, for what the host never
// ingested) append nodes — each message once, however often it is delivered, also
// across restarts (its key rides in the node's metadata); assemble returns dagctx's render of HEAD as AgentMessages with
// estimatedTokens from the daemon's budget (SPEC §7), compacting first when the render
// does not fit the host's tokenBudget; compact runs dagctx compaction (SPEC §8), the
// summary written by the host's runtimeContext.llm.complete when it offers one (the
// daemon asks through sampling/createMessage, SPEC §9).

import { DagctxClient, ResponseError, type CreateMessageParams, type CreateMessageResult } from "dagctx-client";
import type { HarnessContextEngine as ContextEngine } from "openclaw/plugin-sdk/agent-harness-runtime" with { "resolution-mode": "import" };

import { contentText, fromOpenAI, messageKey, toolCalls, type AssistantMsg } from "./messages";

export type IngestParams = Parameters<ContextEngine["ingest"]>[0];
export type IngestBatchParams = Parameters<NonNullable<ContextEngine["ingestBatch"]>>[0];
export type AssembleParams = Parameters<ContextEngine["assemble"]>[0];
export type AssembleResult = Awaited<ReturnType<ContextEngine["assemble"]>>;
export type CompactParams = Parameters<ContextEngine["compact"]>[0];
export type CompactResult = Awaited<ReturnType<ContextEngine["compact"]>>;
export type BootstrapParams = Parameters<NonNullable<ContextEngine["bootstrap"]>>[0];
export type BootstrapResult = Awaited<ReturnType<NonNullable<ContextEngine["bootstrap"]>>>;
export type AfterTurnParams = Parameters<NonNullable<ContextEngine["afterTurn"]>>[0];
export type RuntimeContext = NonNullable<CompactParams["runtimeContext"]>;
type Llm = NonNullable<RuntimeContext["llm"]>;

export const ENGINE_ID = "dagctx";
export const ENGINE_VERSION = "0.1.0";

export interface DagctxEngineOptions {
  /** SQLite database of the daemon (`--db`). */
  database?: string;
  /** argv of the daemon (default: the TypeScript client's: DAGCTX_COMMAND, else python3 -P -m dagctx.cli serve). */
  command?: string[];
  /** Model to budget for when the host names none. */
  model?: string;
  /** Size of the verbatim tail compaction keeps (default: dagctx's policy). */
  keepRecentTokens?: number;
  /** A deterministic non-LLM summary when the host offers no LLM (SPEC §8 `fallback: "structural"`; opt-in). */
  structuralFallback?: boolean;
  /** Environment of the daemon. */
  env?: Record<string, string | undefined>;
}

interface SessionState {
  sessionId: string;
  head: string;
  seen: Set<string>;
  openCalls: Map<string, string>; // toolCallId → running code node
}

/** One host session's record in one dagctx session. */
export class DagctxContextEngine implements ContextEngine {
  readonly info = {
    id: ENGINE_ID,
    name: "dagctx",
    version: ENGINE_VERSION,
    ownsCompaction: true,
  };

  private client: Promise<DagctxClient> | null = null;
  private readonly sessions = new Map<string, Promise<SessionState>>();
  /** The host's LLM while a compaction runs (answers the daemon's sampling requests). */
  private llm: Llm | null = null;

  constructor(private readonly opts: DagctxEngineOptions = {}) {}

  // ------------------------------------------------------------ the daemon

  connection(): Promise<DagctxClient> {
    if (this.client === null) {
      this.client = DagctxClient.spawn({
        database: this.opts.database,
        command: this.opts.command,
        env: this.opts.env,
        onSampling: (params) => this.sample(params),
      });
      this.client.catch(() => {
        this.client = null;
      });
    }
    return this.client;
  }

  private async sample(params: CreateMessageParams): Promise<CreateMessageResult> {
    const llm = this.llm;
    if (llm === null) {
      throw new ResponseError(-32603, "the OpenClaw host offered no runtimeContext.llm for this compaction");
    }
    const res = await llm.complete({
      messages: params.messages.map((m) => ({ role: m.role, content: m.content.text ?? "" })),
      systemPrompt: params.systemPrompt ?? undefined,
      maxTokens: params.maxTokens,
      purpose: "dagctx compaction summary",
    });
    return { role: "assistant", content: { type: "text", text: res.text }, model: res.model, stopReason: "endTurn" };
  }

  /** The dagctx session of a host session: found by its metadata, else created. */
  session(hostSessionId: string): Promise<SessionState> {
    let s = this.sessions.get(hostSessionId);
    if (s === undefined) {
      s = this.openSession(hostSessionId);
      this.sessions.set(hostSessionId, s);
      s.catch(() => this.sessions.delete(hostSessionId));
    }
    return s;
  }

  private async openSession(hostSessionId: string): Promise<SessionState> {
    const c = await this.connection();
    for (let offset = 0; ; ) {
      const page = await c.sessionList({ limit: 200, offset });
      const found = page.sessions.find((x) => x.metadata?.["openclawSessionId"] === hostSessionId);
      if (found) return this.resume(c, found.sessionId, found.head);
      offset += page.sessions.length;
      if (page.sessions.length === 0 || offset >= page.total) break;
    }
    const created = await c.sessionCreate({ title: `openclaw ${hostSessionId}`, metadata: { openclawSessionId: hostSessionId } });
    return { sessionId: created.sessionId, head: created.head, seen: new Set(), openCalls: new Map() };
  }

  /**
   * A session recorded before (another process, a restart): every message already recorded
   * carries its key in `metadata.openclawKey` (tool results on their code node), so a host
   * that delivers its transcript again records nothing twice; tool calls still running stay open.
   */
  private async resume(c: DagctxClient, sessionId: string, head: string): Promise<SessionState> {
    const state: SessionState = { sessionId, head, seen: new Set(), openCalls: new Map() };
    const chain = (await c.history(sessionId)).nodes;
    if (chain.length === 0) return state;
    const got = await c.request("node/get", { sessionId, ids: chain.map((n) => n.id), includeCallees: true });
    for (const n of [...got.nodes, ...(got.callees ?? [])]) {
      const key = n.metadata?.["openclawKey"];
      if (typeof key === "string") state.seen.add(key);
      const callId = n.metadata?.["toolCallId"];
      if (n.role === "code" && n.status === "running" && typeof callId === "string") state.openCalls.set(callId, n.id);
    }
    return state;
  }

  /** The dagctx session id recording a host session (after its first lifecycle call). */
  async dagctxSessionId(hostSessionId: string): Promise<string> {
    return (await this.session(hostSessionId)).sessionId;
  }

  // ------------------------------------------------------------ lifecycle

  async bootstrap(params: BootstrapParams): Promise<BootstrapResult> {
    await this.session(params.sessionId);
    return { bootstrapped: true, importedMessages: 0 };
  }

  async ingest(params: IngestParams): Promise<{ ingested: boolean }> {
    const s = await this.session(params.sessionId);
    return { ingested: await this.record(s, params.message) };
  }

  async ingestBatch(params: IngestBatchParams): Promise<{ ingestedCount: number }> {
    const s = await this.session(params.sessionId);
    let n = 0;
    for (const m of params.messages) if (await this.record(s, m)) n += 1;
    return { ingestedCount: n };
  }

  /** Append one message; false when it was recorded before or is not a chat message. */
  private async record(s: SessionState, msg: IngestParams["message"]): Promise<boolean> {
    const key = messageKey(msg);
    if (s.seen.has(key)) return false;
    const c = await this.connection();
    const role = (msg as { role?: unknown }).role;
    if (role === "user") {
      const r = await c.append(s.sessionId, {
        role: "user", output: contentText((msg as { content: unknown }).content), predecessor: s.head, metadata: { openclawKey: key },
      });
      s.head = r.node.id;
    } else if (role === "assistant") {
      const a = msg as AssistantMsg;
      const r = await c.append(s.sessionId, {
        role: "llm", name: a.model || "assistant", output: contentText(a.content), predecessor: s.head, metadata: { openclawKey: key },
      });
      s.head = r.node.id;
      for (const call of toolCalls(a)) {
        const code = await c.append(s.sessionId, {
          role: "code",
          name: call.name,
          input: call.arguments,
          status: "running",
          caller: r.node.id,
          metadata: { toolCallId: call.id },
        });
        s.openCalls.set(call.id, code.node.id);
      }
      const u = a.usage;
      if (u && u.input + u.cacheRead + u.cacheWrite > 0) {
        await c.usageReport(s.sessionId, r.node.id, { input: u.input, output: u.output, cacheRead: u.cacheRead, cacheWrite: u.cacheWrite }, a.model || null);
      }
    } else if (role === "toolResult") {
      const t = msg as { toolCallId: string; content: unknown; isError?: boolean };
      const nodeId = s.openCalls.get(t.toolCallId);
      if (nodeId === undefined) return false;
      s.openCalls.delete(t.toolCallId);
      await c.update(s.sessionId, nodeId, {
        status: t.isError ? "error" : "completed", output: contentText(t.content), metadata: { openclawKey: key },
      });
    } else {
      return false;
    }
    s.seen.add(key);
    return true;
  }

  async assemble(params: AssembleParams): Promise<AssembleResult> {
    const s = await this.session(params.sessionId);
    const c = await this.connection();
    // A host that skipped ingest (an engine enabled mid-session) still gets its history.
    for (const m of params.messages) await this.record(s, m);
    const model = params.model ?? this.opts.model ?? null;
    let prep = await c.prepare(s.sessionId, { model, format: "openai", promptMode: "none" });
    if (params.tokenBudget !== undefined && prep.budget.inputUsed > params.tokenBudget) {
      // The host's budget is the authority for this call: fold old turns, then render again.
      await this.compactSession(s, model, {
        llm: params.runtimeContext?.llm ?? null,
        keepRecentTokens: Math.max(1, Math.floor(params.tokenBudget / 4)),
      });
      prep = await c.prepare(s.sessionId, { model, format: "openai", promptMode: "none" });
    }
    const { messages, system } = fromOpenAI(prep.messages, model ?? "dagctx");
    const result: AssembleResult = { messages, estimatedTokens: prep.budget.inputUsed };
    if (system.length > 0) result.systemPromptAddition = system.join("\n\n");
    return result;
  }

  async afterTurn(params: AfterTurnParams): Promise<void> {
    const s = await this.session(params.sessionId);
    for (const m of params.messages.slice(params.prePromptMessageCount)) await this.record(s, m);
  }

  async compact(params: CompactParams): Promise<CompactResult> {
    const s = await this.session(params.sessionId);
    const c = await this.connection();
    const model = this.opts.model ?? null;
    const before = await c.prepare(s.sessionId, { model, format: "openai", promptMode: "none" });
    if (!params.force && !before.recommendCompaction && (params.tokenBudget === undefined || before.budget.inputUsed <= params.tokenBudget)) {
      return { ok: true, compacted: false, reason: "belowThreshold" };
    }
    const res = await this.compactSession(s, model, {
      llm: params.runtimeContext?.llm ?? null,
      instructions: params.customInstructions,
      signal: params.abortSignal,
    });
    if (!res.ok || !res.summaryId) {
      return { ok: false, compacted: false, reason: res.reason ?? "failed" };
    }
    const summary = (await c.getNodes(s.sessionId, [res.summaryId])).nodes[0];
    return {
      ok: true,
      compacted: true,
      reason: res.reason ?? undefined,
      result: {
        summary: typeof summary?.output === "string" ? summary.output : undefined,
        tokensBefore: res.tokensBefore,
        tokensAfter: res.tokensAfter,
        details: { summaryId: res.summaryId, coversIds: res.coversIds, dagctxSessionId: s.sessionId },
      },
    };
  }

  private async compactSession(
    s: SessionState,
    model: string | null,
    o: { llm?: Llm | null; instructions?: string; keepRecentTokens?: number; signal?: AbortSignal },
  ) {
    const c = await this.connection();
    const previous = this.llm;
    this.llm = o.llm ?? previous;
    try {
      if (o.signal?.aborted) throw new Error("compaction aborted by the host");
      return await c.compact(s.sessionId, {
        model,
        instructions: o.instructions ?? null,
        keepRecentTokens: o.keepRecentTokens ?? this.opts.keepRecentTokens ?? null,
        fallback: this.opts.structuralFallback ? "structural" : "none",
      });
    } finally {
      this.llm = previous;
    }
  }

  async dispose(): Promise<void> {
    const pending = this.client;
    this.client = null;
    this.sessions.clear();
    if (pending !== null) {
      const c = await pending.catch(() => null);
      await c?.close();
    }
  }
}
