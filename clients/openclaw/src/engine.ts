// DagctxContextEngine: OpenClaw's ContextEngine (src/context-engine/types.ts) over the
// dagctx daemon, through the TypeScript client.
//
// OpenClaw keeps its transcript; dagctx keeps the record and decides what the model sees.
//
// Recording. An admitted turn (every normal turn since OpenClaw 2026.8.1) reaches dagctx
// once, through `commitTurn`: the host hands over the durable range from the admitted
// user entry to the accepted terminal entry, under an advancement key it may retry. Each
// recorded node carries that key (`metadata.openclawTurn`) and the message's own key
// (`metadata.openclawKey`), so a retried commit — in this process or after a restart —
// adds nothing and answers `duplicate`, and a commit interrupted half-way is completed,
// not copied. Runs without an admission (older hosts, runs the host finalizes itself)
// record through afterTurn / ingestBatch / ingest with the same message keys.
// `assemble` never records: the host passes an assemble's output back into the next
// assemble of the same turn, and those messages are dagctx's own render. The one
// exception is a dagctx session that holds nothing yet while the host already has a
// history (the engine enabled mid-session): that history is imported once.
//
// Assembling. `context/prepare` renders HEAD (SPEC §7) as AgentMessages. The window the
// messages may use is the host's: `tokenBudget` (OpenClaw passes the window less its
// output reserve, less its own estimate of the system prompt and the prompt) and, once
// a turn has been answered, the provider's own count of what the rest of the request
// (system prompt, tool schemas, hooks) costs — measured as the reported prompt tokens
// less this engine's estimate of the messages it sent. When the render does not fit,
// the engine compacts (SPEC §8) with the host's completion function and renders again;
// if it still does not fit, the oldest messages are left out (they stay recorded and
// searchable) and the plugin says so on the host's log.
//
// Compacting. `compact` honours the host's budget: the verbatim tail is sized to fit the
// budget's messages share; "nothing to compact" answers ok. Summaries are written by the
// host's `runtimeContext.llm.complete` (or the plugin runtime's `llm.complete`), which
// answers the daemon's `sampling/createMessage` (SPEC §9).

import type { DagctxClient } from "dagctx-client";
import type { HarnessContextEngine as ContextEngine } from "openclaw/plugin-sdk/agent-harness-runtime" with { "resolution-mode": "import" };

import { DaemonLink, sharedLink, type HostLlm } from "./link";
import { contentText, estimateTokens, fromOpenAI, messageKey, toolCalls, type AssistantMsg } from "./messages";

export type IngestParams = Parameters<ContextEngine["ingest"]>[0];
export type IngestBatchParams = Parameters<NonNullable<ContextEngine["ingestBatch"]>>[0];
export type AssembleParams = Parameters<ContextEngine["assemble"]>[0];
export type AssembleResult = Awaited<ReturnType<ContextEngine["assemble"]>>;
export type CompactParams = Parameters<ContextEngine["compact"]>[0];
export type CompactResult = Awaited<ReturnType<ContextEngine["compact"]>>;
export type BootstrapParams = Parameters<NonNullable<ContextEngine["bootstrap"]>>[0];
export type BootstrapResult = Awaited<ReturnType<NonNullable<ContextEngine["bootstrap"]>>>;
export type AfterTurnParams = Parameters<NonNullable<ContextEngine["afterTurn"]>>[0];
export type CommitTurnParams = Parameters<NonNullable<ContextEngine["commitTurn"]>>[0];
export type SubagentSpawnParams = Parameters<NonNullable<ContextEngine["prepareSubagentSpawn"]>>[0];
type Message = IngestParams["message"];

export const ENGINE_ID = "dagctx";
export const ENGINE_VERSION = "0.2.0";

/** Session keys of OpenClaw's internal-effects runs (memory flush and the like): `agent:<id>:internal-session-effects:…`. */
const INTERNAL_RUN = /^agent:[^:]+:internal-session-effects:/;

/** Turns per host session kept for replay while dagctx is unreachable. */
const MAX_BACKLOG = 200;

export interface DagctxEngineOptions {
  /** SQLite database of the daemon (`--db`). */
  database?: string;
  /** argv of the daemon (default: the TypeScript client's: DAGCTX_COMMAND, else python3 -P -m dagctx.cli serve). */
  command?: string[];
  /** Model to budget for when the host names none. */
  model?: string;
  /** Size of the verbatim tail compaction keeps when the host gives no budget (default: dagctx's policy). */
  keepRecentTokens?: number;
  /** A deterministic non-LLM summary when the host offers no LLM (SPEC §8 `fallback: "structural"`; opt-in). */
  structuralFallback?: boolean;
  /** Append one JSON line per assemble/commit/compact to this file (what the model was given, and why). */
  trace?: string;
  /** Environment of the daemon. */
  env?: Record<string, string | undefined>;
  /** The plugin runtime's completion function (api.runtime.llm), used when a call brings no runtimeContext.llm. */
  runtimeLlm?: HostLlm | null;
  /** Where the plugin says what went wrong (the host's plugin logger). */
  logger?: { info?: (m: string) => void; warn: (m: string) => void; error?: (m: string) => void };
}

interface SessionState {
  sessionId: string;
  head: string;
  /** Nodes recorded in this dagctx session (0: nothing yet). */
  recorded: number;
  seen: Set<string>;
  advanced: Set<string>;
  openCalls: Map<string, string>; // toolCallId → running code node
  /** What the provider said the rest of the request costs (system prompt, tools, hooks), in tokens. */
  overhead: number | null;
  /** The host's window and output reserve, as last seen. */
  window: number | null;
  reserve: number;
  /** Tokens of the messages the last assemble handed out (this engine's estimate). */
  lastAssembled: number;
  lastSummaryId: string | null;
}

/** Per-link state shared by every engine instance of the process (OpenClaw builds one per turn). */
interface Shared {
  sessions: Map<string, Promise<SessionState>>;
  /** Subagent session key → the parent session key whose context it forks. */
  parents: Map<string, string>;
  /** Session key → host session id, as last seen. */
  keys: Map<string, string>;
  /** Steps that did not go through dagctx (each said so on the host's log). */
  degraded: number;
  /** When the current outage began (null: dagctx answers). */
  outageSince: number | null;
  /** Host session id → what its steps could not record during an outage, oldest first. */
  backlog: Map<string, { messages: Message[]; turn?: string }[]>;
  /** Host session id → its state once opened (read synchronously while dagctx is away). */
  states: Map<string, SessionState>;
  /** Backlog entries recorded since the outage ended. */
  replayed: number;
  /** Host session id → its replay in progress. */
  replaying: Map<string, Promise<void>>;
}
const shared = new WeakMap<DaemonLink, Shared>();
function stateOf(link: DaemonLink): Shared {
  let s = shared.get(link);
  if (s === undefined) {
    s = { sessions: new Map(), parents: new Map(), keys: new Map(), degraded: 0, outageSince: null, backlog: new Map(), states: new Map(), replayed: 0, replaying: new Map() };
    shared.set(link, s);
  }
  return s;
}

/** One host session's record in one dagctx session. */
export class DagctxContextEngine implements ContextEngine {
  readonly info = {
    id: ENGINE_ID,
    name: "dagctx",
    version: ENGINE_VERSION,
    ownsCompaction: true,
    // OpenClaw ≥ 2026.8.1 runs a turn with a transcript recorder on this engine only when
    // it declares both, and implements commitTurn (see the header).
    transcriptSemantics: {
      currentTurnFence: "before-current-turn-entry-v1" as const,
      turnAdvancementIdempotency: "atomic-idempotent-v1" as const,
    },
    // Without assembly before the prompt, dagctx would record a session the model never
    // sees: refuse such a host for agent runs (OpenClaw then says why and runs legacy).
    hostRequirements: {
      "agent-run": {
        requiredCapabilities: ["assemble-before-prompt" as const],
        unsupportedMessage: "dagctx decides what the model sees; this host cannot ask it before the prompt.",
      },
    },
  };

  constructor(private readonly opts: DagctxEngineOptions = {}) {}

  /** The process's link for these options (looked up on each use: closeAllLinks starts afresh). */
  get link(): DaemonLink {
    return sharedLink({ database: this.opts.database, command: this.opts.command, env: this.opts.env });
  }

  private get shared(): Shared {
    return stateOf(this.link);
  }

  // ------------------------------------------------------------ plumbing

  connection(): Promise<DagctxClient> {
    return this.link.connection();
  }

  private warn(message: string): void {
    const text = `[dagctx] ${message}`;
    if (this.opts.logger) this.opts.logger.warn(text);
    else console.warn(text);
  }

  /**
   * Run one step on dagctx. When dagctx fails (stopped, unreachable, erring) the step does
   * not throw: OpenClaw quarantines a context engine for the whole process on the first
   * error a lifecycle method throws (and would never come back to dagctx). The step says
   * loudly that it degraded and answers `degraded()` instead — what the host's own engine
   * would do for it. Only the host's own abort is rethrown (as its abort reason, which the
   * host does not count as an engine failure). The link retries the daemon at most every
   * few seconds, and the first step that goes through again says so (RECOVERED).
   */
  private async guard<T>(what: string, fn: () => Promise<T>, degraded: (err: unknown) => T, signal?: AbortSignal): Promise<T> {
    try {
      const out = await fn();
      this.recovered();
      return out;
    } catch (err) {
      if (signal?.aborted) throw signal.reason instanceof Error ? signal.reason : abortError(String(signal.reason ?? "aborted by the host"));
      const msg = err instanceof Error ? err.message : String(err);
      if (/disposed|closed|EPIPE|ECONNRESET|not running|exited|unavailable|cannot start|stopped|ENOENT/i.test(msg)) this.link.broken(err);
      const sh = this.shared;
      sh.degraded += 1;
      if (sh.outageSince === null) sh.outageSince = Date.now();
      this.warn(`DEGRADED: ${what} did not go through dagctx (${msg}); OpenClaw goes on without dagctx for this step (${sh.degraded} degraded step(s) so far).`);
      return degraded(err);
    }
  }

  /** The first step that went through dagctx after an outage says so. */
  private recovered(): void {
    const sh = this.shared;
    // A step that needed nothing from dagctx (a session already open) proves nothing.
    if (sh.outageSince === null || !this.link.connected) return;
    const seconds = Math.round((Date.now() - sh.outageSince) / 100) / 10;
    sh.outageSince = null;
    const kept = [...sh.backlog.values()].reduce((n, b) => n + b.length, 0);
    this.warn(`RECOVERED: dagctx answers again after ${seconds} s; ${sh.replayed} step(s) the outage kept from dagctx were recorded now${kept > 0 ? `, ${kept} more when their sessions next run` : ""}.`);
    sh.replayed = 0;
  }

  /**
   * The dagctx session of a host session with the turns it missed replayed first: a
   * commit (or afterTurn) that could not reach dagctx is kept (per session, bounded) and
   * recorded, in order, by the next step that reaches dagctx. Message keys make the
   * replay idempotent.
   */
  private async ready(hostSessionId: string, sessionKey?: string): Promise<SessionState> {
    const s = await this.session(hostSessionId, sessionKey);
    const sh = this.shared;
    // One replay per session at a time: steps arriving meanwhile wait for it (two replays
    // appending the same turn concurrently would fork the branch).
    for (;;) {
      const running = sh.replaying.get(hostSessionId);
      if (running !== undefined) {
        await running;
        continue;
      }
      const backlog = sh.backlog.get(hostSessionId);
      if (backlog === undefined || backlog.length === 0) {
        sh.backlog.delete(hostSessionId);
        return s;
      }
      const run = this.replay(s, hostSessionId, backlog).finally(() => sh.replaying.delete(hostSessionId));
      sh.replaying.set(hostSessionId, run);
      await run;
    }
  }

  private async replay(s: SessionState, hostSessionId: string, backlog: { messages: Message[]; turn?: string }[]): Promise<void> {
    while (backlog.length > 0) {
      const entry = backlog[0]!;
      if (entry.turn === undefined || !s.advanced.has(entry.turn)) {
        for (const m of entry.messages) await this.record(s, m, entry.turn);
        if (entry.turn !== undefined) s.advanced.add(entry.turn);
      }
      backlog.shift();
      this.shared.replayed += 1;
      this.trace("replay", { sessionId: hostSessionId, advancementKey: entry.turn ?? null, messages: entry.messages.length });
    }
  }

  /** Keep what a step could not record, for the next step that reaches dagctx. */
  private keep(hostSessionId: string, messages: Message[], turn?: string): void {
    let backlog = this.shared.backlog.get(hostSessionId);
    if (backlog === undefined) {
      backlog = [];
      this.shared.backlog.set(hostSessionId, backlog);
    }
    backlog.push({ messages: [...messages], turn });
    if (backlog.length > MAX_BACKLOG) {
      backlog.shift();
      this.warn(`DEGRADED: more than ${MAX_BACKLOG} turns of ${hostSessionId} missed dagctx; the oldest is no longer kept for replay (OpenClaw's transcript still has it).`);
    }
  }

  private trace(event: string, data: Record<string, unknown>): void {
    if (!this.opts.trace) return;
    try {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const fs = require("node:fs") as typeof import("node:fs");
      fs.appendFileSync(this.opts.trace, JSON.stringify({ event, at: Date.now(), ...data }) + "\n");
    } catch {
      // tracing never breaks a turn
    }
  }

  /** The host session whose dagctx session a run reads (a forked subagent reads its parent's). */
  private parentKey(sessionKey: string | undefined): string | undefined {
    return sessionKey === undefined ? undefined : this.shared.parents.get(sessionKey);
  }

  /** The dagctx session of a host session: found by its metadata, else created. */
  session(hostSessionId: string, sessionKey?: string): Promise<SessionState> {
    if (sessionKey !== undefined) this.shared.keys.set(sessionKey, hostSessionId);
    let s = this.shared.sessions.get(hostSessionId);
    if (s === undefined) {
      s = this.openSession(hostSessionId, sessionKey);
      this.shared.sessions.set(hostSessionId, s);
      s.then((st) => void this.shared.states.set(hostSessionId, st), () => this.shared.sessions.delete(hostSessionId));
    }
    return s;
  }

  private async openSession(hostSessionId: string, sessionKey?: string): Promise<SessionState> {
    const c = await this.connection();
    for (let offset = 0; ; ) {
      const page = await c.sessionList({ limit: 200, offset });
      const found = page.sessions.find((x) => x.metadata?.["openclawSessionId"] === hostSessionId);
      if (found) return this.resume(c, found.sessionId, found.head);
      offset += page.sessions.length;
      if (page.sessions.length === 0 || offset >= page.total) break;
    }
    const metadata: Record<string, unknown> = { openclawSessionId: hostSessionId };
    if (sessionKey !== undefined) metadata["openclawSessionKey"] = sessionKey;
    const created = await c.sessionCreate({ title: `openclaw ${sessionKey ?? hostSessionId}`, metadata });
    return fresh(created.sessionId, created.head);
  }

  /**
   * A session recorded before (another process, a restart): every recorded message carries
   * its key (tool results on their code node) and its turn's advancement key, so nothing
   * the host delivers again is recorded twice; tool calls still running stay open.
   */
  private async resume(c: DagctxClient, sessionId: string, head: string): Promise<SessionState> {
    const state = fresh(sessionId, head);
    const chain = (await c.history(sessionId)).nodes;
    if (chain.length === 0) return state;
    const got = await c.request("node/get", { sessionId, ids: chain.map((n) => n.id), includeCallees: true });
    for (const n of [...got.nodes, ...(got.callees ?? [])]) {
      state.recorded += 1;
      const key = n.metadata?.["openclawKey"];
      if (typeof key === "string") state.seen.add(key);
      const turn = n.metadata?.["openclawTurn"];
      if (typeof turn === "string") state.advanced.add(turn);
      const callId = n.metadata?.["toolCallId"];
      if (n.role === "code" && n.status === "running" && typeof callId === "string") state.openCalls.set(callId, n.id);
    }
    return state;
  }

  /** The dagctx session id recording a host session (after its first lifecycle call). */
  async dagctxSessionId(hostSessionId: string): Promise<string> {
    return (await this.session(hostSessionId)).sessionId;
  }

  /** The dagctx session a tool call of this host session reads (its parent's for a forked subagent). */
  async sessionForTools(hostSessionId: string | undefined, sessionKey: string | undefined): Promise<string | null> {
    const parent = this.parentKey(sessionKey);
    const id = parent !== undefined ? this.shared.keys.get(parent) : hostSessionId ?? (sessionKey ? this.shared.keys.get(sessionKey) : undefined);
    if (id === undefined) return null;
    return (await this.session(id)).sessionId;
  }

  // ------------------------------------------------------------ recording

  /** Append one message; false when it was recorded before or is not a chat message. */
  private async record(s: SessionState, msg: Message, turn?: string): Promise<boolean> {
    const key = messageKey(msg);
    if (s.seen.has(key)) return false;
    const c = await this.connection();
    const role = (msg as { role?: unknown }).role;
    const meta: Record<string, unknown> = { openclawKey: key };
    if (turn !== undefined) meta["openclawTurn"] = turn;
    if (role === "user") {
      const r = await c.append(s.sessionId, {
        role: "user", output: contentText((msg as { content: unknown }).content), predecessor: s.head, metadata: meta,
      });
      s.head = r.node.id;
    } else if (role === "assistant") {
      const a = msg as AssistantMsg;
      const r = await c.append(s.sessionId, {
        role: "llm", name: a.model || "assistant", output: contentText(a.content), predecessor: s.head, metadata: meta,
      });
      s.head = r.node.id;
      for (const call of toolCalls(a)) {
        const code = await c.append(s.sessionId, {
          role: "code", name: call.name, input: call.arguments, status: "running", caller: r.node.id,
          metadata: { toolCallId: call.id },
        });
        s.openCalls.set(call.id, code.node.id);
        s.recorded += 1;
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
        status: t.isError ? "error" : "completed", output: contentText(t.content), metadata: meta,
      });
    } else {
      return false;
    }
    s.seen.add(key);
    s.recorded += 1;
    return true;
  }

  /** What the provider reported for the turn's calls teaches what the rest of the request costs. */
  private learn(s: SessionState, messages: Message[], window: number | undefined): void {
    if (window !== undefined && window > 0) s.window = window;
    // The first call of the turn saw: the assembled history + the turn's user message(s).
    let sent = s.lastAssembled;
    for (const m of messages) {
      const role = (m as { role?: unknown }).role;
      if (role === "assistant") {
        const u = (m as AssistantMsg).usage;
        const prompt = u ? u.input + u.cacheRead + u.cacheWrite : 0;
        if (prompt > 0) {
          const overhead = Math.max(0, prompt - sent);
          s.overhead = s.overhead === null ? overhead : Math.max(s.overhead, overhead);
        }
        break;
      }
      sent += estimateTokens(m);
    }
  }

  async bootstrap(params: BootstrapParams): Promise<BootstrapResult> {
    if (isInternal(params.sessionKey)) return { bootstrapped: false, reason: "internal run: reads the host's view of its parent" };
    return this.guard("bootstrap", async (): Promise<BootstrapResult> => {
      await this.ready(params.sessionId, params.sessionKey);
      return { bootstrapped: true, importedMessages: 0 };
    }, (): BootstrapResult => ({ bootstrapped: false, reason: "dagctx is unavailable" }));
  }

  async ingest(params: IngestParams): Promise<{ ingested: boolean }> {
    if (isInternal(params.sessionKey)) return { ingested: false };
    return this.guard("ingest", async () => {
      const s = await this.ready(params.sessionId, params.sessionKey);
      return { ingested: await this.record(s, params.message) };
    }, () => {
      this.keep(params.sessionId, [params.message]);
      return { ingested: false };
    });
  }

  async ingestBatch(params: IngestBatchParams): Promise<{ ingestedCount: number }> {
    if (isInternal(params.sessionKey)) return { ingestedCount: 0 };
    return this.guard("ingestBatch", async () => {
      const s = await this.ready(params.sessionId, params.sessionKey);
      let n = 0;
      for (const m of params.messages) if (await this.record(s, m)) n += 1;
      return { ingestedCount: n };
    }, () => {
      this.keep(params.sessionId, params.messages);
      return { ingestedCount: 0 };
    });
  }

  async afterTurn(params: AfterTurnParams): Promise<void> {
    if (isInternal(params.sessionKey)) return;
    const added = params.messages.slice(params.prePromptMessageCount);
    await this.guard("afterTurn", async () => {
      const s = await this.ready(params.sessionId, params.sessionKey);
      for (const m of added) await this.record(s, m);
      this.learn(s, added, params.tokenBudget);
    }, () => this.keep(params.sessionId, added));
  }

  /**
   * Atomically and idempotently record one accepted turn. A key recorded before answers
   * `duplicate` (nothing is appended); a commit cut short earlier is completed.
   */
  async commitTurn(params: CommitTurnParams): Promise<{ status: "committed" | "duplicate" }> {
    if (isInternal(params.sessionKey)) return { status: "committed" };
    return this.guard("commitTurn", async () => {
      const s = await this.ready(params.sessionId, params.sessionKey);
      if (s.advanced.has(params.advancementKey)) {
        this.trace("commitTurn", { sessionId: params.sessionId, advancementKey: params.advancementKey, status: "duplicate" });
        return { status: "duplicate" as const };
      }
      let n = 0;
      for (const m of params.messages) if (await this.record(s, m, params.advancementKey)) n += 1;
      s.advanced.add(params.advancementKey);
      const rc = (params.runtimeContext ?? {}) as { modelContextWindow?: unknown; tokenBudget?: unknown };
      const window = typeof rc.modelContextWindow === "number" ? rc.modelContextWindow : typeof rc.tokenBudget === "number" ? rc.tokenBudget : undefined;
      this.learn(s, params.messages, window);
      const status = n === 0 && params.messages.length > 0 ? ("duplicate" as const) : ("committed" as const);
      this.trace("commitTurn", { sessionId: params.sessionId, advancementKey: params.advancementKey, status, recorded: n, overhead: s.overhead });
      return { status };
    }, () => {
      // The host's transcript holds the turn; this process records it in dagctx as soon as
      // dagctx answers again (the same advancement key, so at most once).
      this.keep(params.sessionId, params.messages, params.advancementKey);
      this.trace("commitTurn", { sessionId: params.sessionId, advancementKey: params.advancementKey, status: "kept for replay" });
      return { status: "committed" as const };
    });
  }

  // ------------------------------------------------------------ assembling

  private async render(s: SessionState, model: string | null): Promise<{ messages: Message[]; system: string[]; summaryId: string | null }> {
    const c = await this.connection();
    const prep = await c.prepare(s.sessionId, { model, format: "openai", promptMode: "none" });
    const { messages, system } = fromOpenAI(prep.messages, model ?? "dagctx");
    return { messages, system, summaryId: prep.summaryId ?? null };
  }

  /**
   * The tokens the messages may use. Once a turn was answered, the provider's own count
   * says what the rest of the request costs (system prompt, tool schemas, hooks): the
   * window less the host's output reserve, that, and what is still to come after the
   * messages (the prompt before the run; inside the tool loop, the turn's pending
   * messages, which the host already took off `tokenBudget`). Before that, the host's
   * `tokenBudget` (its estimate, which leaves the tool schemas out).
   */
  private limitFor(s: SessionState, params: AssembleParams): number | null {
    const rs = params.runtimeSettings;
    const reserve = rs?.limits.maxOutputTokens;
    if (typeof reserve === "number" && reserve > 0) s.reserve = reserve;
    let limit: number | null = params.tokenBudget ?? rs?.limits.promptTokenBudget ?? null;
    if (s.overhead !== null && s.window !== null) {
      let after: number;
      if (params.prompt !== undefined) after = estimateTokens({ role: "user", content: params.prompt } as Message);
      else if (params.tokenBudget !== undefined && params.tokenBudget <= s.window) after = s.window - params.tokenBudget;
      else after = 0;
      limit = s.window - outputReserve(s) - s.overhead - after;
    }
    if (limit === null) return null;
    // The estimate is chars/4: keep 5 % for its error.
    return Math.max(1, Math.floor(limit * 0.95));
  }

  async assemble(params: AssembleParams): Promise<AssembleResult> {
    if (isInternal(params.sessionKey)) {
      // A memory flush (and the like) runs on a detached view of its parent's transcript: that
      // view is the parent's context; it is handed back as given and nothing is recorded.
      return { messages: params.messages, estimatedTokens: sum(params.messages), contextProjection: { mode: "per_turn" } };
    }
    return this.guard("assemble", async () => {
      const s = await this.ready(params.sessionId, params.sessionKey);
      const model = params.model ?? this.opts.model ?? null;
      if (s.recorded === 0 && params.messages.length > 0) {
        // Enabled mid-session: the host's history is recorded once, before anything is rendered.
        for (const m of params.messages) await this.record(s, m);
      }
      let view = await this.render(s, model);
      const parent = this.parentKey(params.sessionKey);
      if (parent !== undefined) {
        const pid = this.shared.keys.get(parent);
        if (pid !== undefined) {
          const ps = await this.session(pid);
          const pv = await this.render(ps, model);
          view = { messages: [...pv.messages, ...view.messages], system: [...pv.system, ...view.system], summaryId: view.summaryId };
        }
      }
      const limit = this.limitFor(s, params);
      let compacted: string | null = null;
      let dropped = 0;
      if (limit !== null && sum(view.messages) > limit) {
        const llm = this.hostLlm(params.runtimeContext);
        if (llm !== null || this.opts.structuralFallback) {
          const res = await this.compactSession(s, model, { llm, keepRecentTokens: Math.max(1, Math.floor(limit / 2)) });
          if (res.ok && res.summaryId) {
            compacted = res.summaryId;
            view = await this.render(s, model);
          }
        }
        while (view.messages.length > 1 && sum(view.messages) > limit) {
          view.messages = dropOldest(view.messages);
          dropped += 1;
        }
        if (dropped > 0) {
          this.warn(`the render of ${params.sessionId} did not fit the host's budget (${limit} tokens) after compaction; left out its ${dropped} oldest message group(s) for this call (they stay recorded: search them with dagctx_search).`);
        }
      }
      const estimated = sum(view.messages);
      s.lastAssembled = estimated;
      if (view.summaryId !== null) s.lastSummaryId = view.summaryId;
      const result: AssembleResult = {
        messages: view.messages,
        estimatedTokens: estimated,
        contextProjection: this.projection(s, params),
      };
      if (view.system.length > 0) result.systemPromptAddition = view.system.join("\n\n");
      this.trace("assemble", {
        sessionId: params.sessionId, sessionKey: params.sessionKey, tokenBudget: params.tokenBudget ?? null, limit,
        overhead: s.overhead, window: s.window, estimatedTokens: estimated, compacted, dropped,
        given: params.messages.length, prompt: params.prompt?.length ?? null, reserve: s.reserve,
        limits: params.runtimeSettings?.limits ?? null, tools: params.availableTools?.size ?? null, messages: view.messages, systemPromptAddition: result.systemPromptAddition ?? null,
      });
      return result;
    }, () => this.passThrough(params));
  }

  /**
   * What the model sees while dagctx is unreachable: the host's own messages, as its
   * default engine would hand them on, less the oldest groups when they do not fit the
   * budget (what dagctx last learned of it, else the host's tokenBudget).
   */
  private passThrough(params: AssembleParams): AssembleResult {
    const known = this.shared.states.get(params.sessionId);
    const limit = known !== undefined ? this.limitFor(known, params) : params.tokenBudget ?? null;
    let messages = params.messages;
    let dropped = 0;
    while (limit !== null && messages.length > 1 && sum(messages) > limit) {
      messages = dropOldest(messages);
      dropped += 1;
    }
    if (dropped > 0) this.warn(`DEGRADED: without dagctx, left out the ${dropped} oldest message group(s) of ${params.sessionId} to fit the host's budget (${limit} tokens).`);
    this.trace("assemble", { sessionId: params.sessionId, sessionKey: params.sessionKey, degraded: true, limit, dropped, given: params.messages.length, messages });
    return { messages, estimatedTokens: sum(messages), contextProjection: { mode: "per_turn" } };
  }

  /**
   * Hosts with a persistent backend thread (OpenClaw's Codex app-server harness) inject the
   * context once per epoch: the epoch is the summary the render starts from, so a compaction
   * rotates the thread. Every other host projects per turn.
   */
  private projection(s: SessionState, params: AssembleParams): AssembleResult["contextProjection"] {
    const host = params.runtimeSettings?.executionHost.id ?? null;
    if (host === "codex-app-server") {
      return { mode: "thread_bootstrap", epoch: `${s.sessionId}:${s.lastSummaryId ?? "start"}`, fingerprint: s.head };
    }
    return { mode: "per_turn" };
  }

  private hostLlm(rc: unknown): HostLlm | null {
    const llm = (rc as { llm?: HostLlm } | undefined)?.llm;
    if (llm && typeof llm.complete === "function") return llm;
    return this.opts.runtimeLlm ?? null;
  }

  // ------------------------------------------------------------ compacting

  async compact(params: CompactParams): Promise<CompactResult> {
    if (isInternal(params.sessionKey)) return { ok: true, compacted: false, reason: "nothing to compact: internal run" };
    const signal = params.abortSignal;
    return this.guard("compact", async () => {
      const s = await this.ready(params.sessionId, params.sessionKey);
      const model = this.opts.model ?? params.runtimeSettings?.model.resolved ?? null;
      const c = await this.connection();
      const before = await c.prepare(s.sessionId, { model, format: "openai", promptMode: "none" });
      const messagesTokens = sum(fromOpenAI(before.messages, model ?? "dagctx").messages);
      // The host's budget: the window (tokenBudget, or the runtime's), less what the rest of the request costs.
      const window = params.tokenBudget ?? (params.runtimeContext as { tokenBudget?: number } | undefined)?.tokenBudget ?? params.runtimeSettings?.limits.promptTokenBudget ?? null;
      const reserve = Math.min(params.runtimeSettings?.limits.maxOutputTokens ?? s.reserve, Math.floor(0.1 * (window ?? 0)));
      const room = window === null ? null : Math.max(1, window - reserve - (s.overhead ?? 0));
      const over = room !== null && messagesTokens > room;
      if (!params.force && !over && !before.recommendCompaction) {
        return { ok: true, compacted: false, reason: "below threshold: the conversation fits the host's budget" };
      }
      const keep = room !== null ? Math.max(1, Math.floor(room / 2)) : this.opts.keepRecentTokens;
      const res = await this.compactSession(s, model, {
        llm: this.hostLlm(params.runtimeContext),
        instructions: params.customInstructions,
        keepRecentTokens: keep,
        signal: params.abortSignal,
      });
      this.trace("compact", { sessionId: params.sessionId, force: params.force ?? false, room, keep, ok: res.ok, reason: res.reason ?? null, summaryId: res.summaryId ?? null });
      if ((res.ok && !res.summaryId) || res.reason === "notSmaller") {
        // Nothing older than the tail to fold: a success, not a failure.
        // (or a summary of what lies outside it would not be smaller than that part itself)
        return { ok: true, compacted: false, reason: "nothing to compact: every message is in the verbatim tail" };
      }
      if (!res.ok || !res.summaryId) {
        // The turn must not die of it: assemble keeps every request inside the budget (it
        // leaves out the oldest messages when it cannot compact), so the host may go on.
        this.shared.degraded += 1;
        this.warn(`DEGRADED: compaction of ${params.sessionId} failed (${res.error ?? res.reason ?? "unknown"}); requests stay inside the budget by leaving out the oldest messages until a compaction succeeds.`);
        return { ok: true, compacted: false, reason: `already under target: dagctx fits each request itself (compaction failed: ${res.error ?? res.reason ?? "unknown"})` };
      }
      s.lastSummaryId = res.summaryId;
      const summary = (await c.getNodes(s.sessionId, [res.summaryId])).nodes[0];
      return {
        ok: true,
        compacted: true,
        result: {
          summary: typeof summary?.output === "string" ? summary.output : undefined,
          tokensBefore: res.tokensBefore,
          tokensAfter: res.tokensAfter,
          details: { summaryId: res.summaryId, coversIds: res.coversIds, dagctxSessionId: s.sessionId },
        },
      };
    }, () => ({
      // Not a failure the host should act on: each request still fits (assemble leaves out
      // the oldest messages while dagctx is away) and dagctx compacts when it is back.
      ok: true, compacted: false, reason: "already under target: dagctx is unavailable, so each request is fitted to the budget by the plugin",
    }), signal);
  }

  private async compactSession(
    s: SessionState,
    model: string | null,
    o: { llm?: HostLlm | null; instructions?: string; keepRecentTokens?: number; signal?: AbortSignal },
  ) {
    const c = await this.connection();
    // A background compaction the host aborts (a foreground turn arrived) stops here with
    // the host's own abort reason, also after waiting its turn behind another compaction.
    return this.link.withLlm(o.llm ?? null, () => {
      if (o.signal?.aborted) throw o.signal.reason instanceof Error ? o.signal.reason : abortError("compaction aborted by the host");
      return c.compact(s.sessionId, {
        model,
        instructions: o.instructions ?? null,
        keepRecentTokens: o.keepRecentTokens ?? this.opts.keepRecentTokens ?? null,
        fallback: this.opts.structuralFallback ? "structural" : "none",
        trigger: "auto",
      });
    });
  }

  // ------------------------------------------------------------ subagents

  async prepareSubagentSpawn(params: SubagentSpawnParams): Promise<{ rollback: () => void } | undefined> {
    if (params.contextMode !== "fork") return undefined;
    this.shared.parents.set(params.childSessionKey, params.parentSessionKey);
    if (params.parentSessionId !== undefined) this.shared.keys.set(params.parentSessionKey, params.parentSessionId);
    return { rollback: () => void this.shared.parents.delete(params.childSessionKey) };
  }

  async onSubagentEnded(params: { childSessionKey: string }): Promise<void> {
    this.shared.parents.delete(params.childSessionKey);
  }

  /** The link outlives the engine: OpenClaw disposes an engine after every turn. */
  async dispose(): Promise<void> {}
}

/**
 * The output room kept free in the window: the host's reserve, at most a tenth of the window.
 * (OpenClaw's default compaction reserve, 4,000 tokens, is more than a 16k window has left
 * after its system prompt and tools; the host itself sends requests into it.)
 */
function outputReserve(s: SessionState): number {
  return s.window === null ? s.reserve : Math.min(s.reserve, Math.floor(0.1 * s.window));
}

function abortError(message: string): Error {
  const err = new Error(message);
  err.name = "AbortError";
  return err;
}

function fresh(sessionId: string, head: string): SessionState {
  return {
    sessionId, head, recorded: 0, seen: new Set(), advanced: new Set(), openCalls: new Map(),
    overhead: null, window: null, reserve: 0, lastAssembled: 0, lastSummaryId: null,
  };
}

function isInternal(sessionKey: string | undefined): boolean {
  return sessionKey !== undefined && INTERNAL_RUN.test(sessionKey);
}

function sum(messages: Message[]): number {
  let n = 0;
  for (const m of messages) n += estimateTokens(m);
  return n;
}

/** Leave out the oldest message group: a user message, or an assistant message with its tool results. */
function dropOldest(messages: Message[]): Message[] {
  const keep = isSummary(messages[0]) && messages.length > 2 ? 1 : 0;
  let i = keep + 1;
  while (i < messages.length && (messages[i] as { role?: unknown }).role === "toolResult") i += 1;
  return [...messages.slice(0, keep), ...messages.slice(i)];
}

function isSummary(m: Message | undefined): boolean {
  return m !== undefined && (m as { role?: unknown }).role === "user" && contentText((m as { content?: unknown }).content).startsWith("[Previous conversation summary]");
}
