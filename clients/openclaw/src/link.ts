// One daemon connection per gateway process.
//
// OpenClaw builds a context engine for every logical turn and disposes it when the turn
// ends; a connection per engine would start (or attach to) the daemon on every turn. The
// link is module-level state instead: every engine with the same options shares one
// DagctxClient for the life of the process. A connection that dies is dropped and the
// next call reconnects, but at most once per `retryMs` (a stopped dagctx makes each turn
// fail fast instead of waiting for a spawn every call).
//
// Summaries: the daemon asks this client for them through `sampling/createMessage`
// (SPEC §9). The link answers with the host completion function (OpenClaw's
// `runtimeContext.llm.complete`) that the compaction in progress lent it; compactions
// on one link run one at a time, so each sampling request is answered by the host
// function of the compaction that caused it.

import { AsyncResource } from "node:async_hooks";

import { DagctxClient, ResponseError, type CreateMessageParams, type CreateMessageResult } from "dagctx-client";

export interface HostLlm {
  complete: (params: {
    messages: { role: "system" | "user" | "assistant"; content: string }[];
    systemPrompt?: string;
    maxTokens?: number;
    purpose?: string;
    signal?: AbortSignal;
  }) => Promise<{ text: string; model?: string; provider?: string }>;
}

/** The link refused to try the daemon again yet (it failed moments ago). */
export class LinkWaiting extends Error {
  override name = "LinkWaiting";
}

export interface LinkOptions {
  database?: string;
  command?: string[];
  env?: Record<string, string | undefined>;
  /** Minimum wait before reconnecting after a failed connection (default 5 s). */
  retryMs?: number;
}

export class DaemonLink {
  private client: Promise<DagctxClient> | null = null;
  private failedAt = 0;
  private lastError: Error | null = null;
  private lent: { llm: HostLlm; scope: AsyncResource } | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  /** A connection is open and initialized (it answered `initialize`). */
  private live: DagctxClient | null = null;
  /** How many connections this link opened (one per process unless the daemon went away). */
  connections = 0;
  /** Host completion calls made for the daemon's sampling requests. */
  samplingCalls = 0;

  constructor(readonly opts: LinkOptions) {}

  connection(): Promise<DagctxClient> {
    if (this.client !== null) return this.client;
    const retry = this.opts.retryMs ?? 5_000;
    if (this.lastError !== null && Date.now() - this.failedAt < retry) {
      return Promise.reject(new LinkWaiting(`dagctx is unavailable (${this.lastError.message}); retrying in ${Math.ceil((retry - (Date.now() - this.failedAt)) / 1000)} s`));
    }
    this.connections += 1;
    // Opened in the plugin's load-time async context, not the turn's that happens to ask first:
    // the connection outlives every turn.
    const pending = ROOT.runInAsyncScope(() =>
      DagctxClient.spawn({
        database: this.opts.database,
        command: this.opts.command,
        env: this.opts.env,
        clientInfo: { name: "dagctx-openclaw", version: "0.2.0" },
        onSampling: (params) => this.sample(params),
      }),
    );
    this.client = pending;
    pending.then(
      (c) => {
        this.lastError = null;
        this.live = c;
        // A connection that closes (daemon stopped, killed) is dropped; the next call reconnects.
        void c.exited.then(() => {
          if (this.live === c) this.live = null;
          if (this.client === pending) this.client = null;
        });
      },
      (err: unknown) => {
        if (this.client === pending) this.client = null;
        this.failedAt = Date.now();
        this.lastError = err instanceof Error ? err : new Error(String(err));
      },
    );
    return pending;
  }

  /** Whether a connection to dagctx is open now. */
  get connected(): boolean {
    return this.live !== null;
  }

  /** Mark the connection broken after a call failed because the daemon went away. */
  broken(err: unknown): void {
    // The link's own "retrying in N s" answer does not push the next attempt further out.
    if (err instanceof LinkWaiting) return;
    this.failedAt = Date.now();
    this.lastError = err instanceof Error ? err : new Error(String(err));
    const pending = this.client;
    this.client = null;
    this.live = null;
    void pending?.then((c) => c.dispose(), () => undefined);
  }

  /** Run `fn` with `llm` answering the daemon's sampling requests (one at a time per link). */
  withLlm<T>(llm: HostLlm | null, fn: () => Promise<T>): Promise<T> {
    // The daemon's sampling request arrives on the connection's stream, whose async context
    // is that of whichever turn opened the connection (OpenClaw closes a turn's async work
    // scope when the turn ends). The host function is called in the compaction caller's
    // context instead, captured here.
    const scope = new AsyncResource("dagctx-openclaw.sampling");
    const run = this.queue.then(async () => {
      this.lent = llm === null ? null : { llm, scope };
      try {
        return await fn();
      } finally {
        this.lent = null;
        scope.emitDestroy();
      }
    });
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async sample(params: CreateMessageParams): Promise<CreateMessageResult> {
    const lent = this.lent;
    if (lent === null) {
      throw new ResponseError(-32603, "the OpenClaw host lent no runtimeContext.llm for this compaction (dagctx-openclaw answers sampling only with the host's completion function)");
    }
    this.samplingCalls += 1;
    const res = await lent.scope.runInAsyncScope(() =>
      lent.llm.complete({
        messages: params.messages.map((m) => ({ role: m.role, content: m.content.text ?? "" })),
        systemPrompt: params.systemPrompt ?? undefined,
        maxTokens: params.maxTokens,
        purpose: "dagctx compaction summary",
      }),
    );
    return { role: "assistant", content: { type: "text", text: res.text }, model: res.model ?? "openclaw", stopReason: "endTurn" };
  }

  async close(): Promise<void> {
    const pending = this.client;
    this.client = null;
    this.live = null;
    const c = await pending?.catch(() => null);
    await c?.close();
  }
}

const links = new Map<string, DaemonLink>();
const ROOT = new AsyncResource("dagctx-openclaw.link");

/** The process-wide link for these options. */
export function sharedLink(opts: LinkOptions): DaemonLink {
  const key = JSON.stringify([opts.database ?? null, opts.command ?? null, opts.env ?? null]);
  let link = links.get(key);
  if (link === undefined) {
    link = new DaemonLink(opts);
    links.set(key, link);
  }
  return link;
}

/** Close every link (tests; the daemon's stdio closes with the process anyway). */
export async function closeAllLinks(): Promise<void> {
  const all = [...links.values()];
  links.clear();
  await Promise.all(all.map((l) => l.close()));
}
