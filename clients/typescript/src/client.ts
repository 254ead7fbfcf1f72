/**
 * A TypeScript client for the dagctx daemon, over vscode-jsonrpc.
 *
 * `DagctxClient.spawn()` starts `python3 -P -m dagctx.cli serve` as a child process —
 * a thin forwarder to the user's shared daemon (SPEC §1), or a private daemon with
 * `standalone: true` — connects a vscode-jsonrpc `MessageConnection` to its stdio
 * (LSP base-protocol framing), answers the daemon's `sampling/createMessage` requests through the
 * `onSampling` callback, fans notifications out to `onNotification` listeners and
 * performs the `initialize` / `initialized` handshake. Every request is typed by
 * the generated `Methods` map (src/protocol.ts, from protocol/dagctx/protocol/schema.json).
 *
 * Errors are vscode-jsonrpc `ResponseError`s; the daemon's stable error kind is
 * `err.data.kind` (see `errorKind()`). Cancellation uses vscode-jsonrpc's
 * `CancellationToken`, which sends `$/cancelRequest`.
 */

import { spawn as spawnProcess, type ChildProcess } from "node:child_process";
import type { Readable, Writable } from "node:stream";

import {
  CancellationToken,
  createMessageConnection,
  Disposable,
  ErrorCodes,
  NullLogger,
  ResponseError,
  StreamMessageReader,
  StreamMessageWriter,
  type DataCallback,
  type Logger,
  type Message,
  type MessageConnection,
  type MessageReader,
  type MessageWriter,
} from "vscode-jsonrpc/node";

import {
  NOTIFICATION_NAMES,
  type CompactParams,
  type CompactResult,
  type CreateMessageParams,
  type CreateMessageResult,
  type DaemonStatus,
  type NodeNotification,
  type SessionChange,
  type ErrorData,
  type ErrorKind,
  type ExportParams,
  type ExportResult,
  type HeadResult,
  type ImportParams,
  type ImportResult,
  type InitializationOptions,
  type InitializeParams,
  type InitializeResult,
  type MethodName,
  type Methods,
  type NodeAppendParams,
  type NodeGetResult,
  type NodeInput,
  type NodeResult,
  type NodeUpdateParams,
  type Notifications,
  type OutputRange,
  type PrepareParams,
  type PrepareResult,
  type ProgressParams,
  type RenderParams,
  type RenderResult,
  type ReplayParams,
  type ReplayResult,
  type SearchParams,
  type SearchResult,
  type ServerRequests,
  type SessionBranchesResult,
  type SessionCreateParams,
  type SessionCreateResult,
  type SessionDeleteResult,
  type SessionHistoryResult,
  type SessionInfo,
  type SessionListParams,
  type SessionListResult,
  type SessionSpawnParams,
  type SessionSpawnResult,
  type Usage,
  type UsageReportResult,
} from "./protocol";

export const CLIENT_NAME = "dagctx-typescript";
export const CLIENT_VERSION = "0.1.0";

/** The command used when neither `opts.command` nor `DAGCTX_COMMAND` is given. */
export const DEFAULT_COMMAND: readonly string[] = ["python3", "-P", "-m", "dagctx.cli", "serve"];

// ---------------------------------------------------------------- types

/** Params of a client → server method. */
export type ParamsOf<M extends MethodName> = Methods[M]["params"];
/** Result of a client → server method. */
export type ResultOf<M extends MethodName> = Methods[M]["result"];

/**
 * The arguments after the method name: params are optional (and may be `null`)
 * when the method's params type has no required field, as the protocol allows.
 */
export type RequestArgs<M extends MethodName> = {} extends ParamsOf<M>
  ? [params?: ParamsOf<M> | null, token?: CancellationToken]
  : [params: ParamsOf<M>, token?: CancellationToken];

/** Answers the daemon's `sampling/createMessage` (a summary to write, MCP-shaped). */
export type SamplingHandler = (
  params: CreateMessageParams,
  token: CancellationToken,
) => Promise<CreateMessageResult> | CreateMessageResult;

/** Sees every JSON-RPC message on the wire (for logging, tests, tracing). */
export type WireTap = (direction: "send" | "receive", message: Message) => void;

/** An `err.data` of the daemon's error answers. */
export type DagctxResponseError = ResponseError<ErrorData>;

export interface ConnectOptions {
  /** `initialize.params.initializationOptions` (e.g. `{observeNodes: true}`). */
  initializationOptions?: InitializationOptions;
  /** `initialize.params.capabilities`; `sampling: {}` is added when `onSampling` is given. */
  capabilities?: Record<string, unknown>;
  /** Answers `sampling/createMessage`; without it the daemon cannot ask this client for summaries. */
  onSampling?: SamplingHandler;
  /** `initialize.params.clientInfo`. */
  clientInfo?: { name?: string; version?: string | null };
  /** `initialize.params.rootUri`. */
  rootUri?: string | null;
  /** Send `initialize` + `initialized` (default true). */
  initialize?: boolean;
  /** vscode-jsonrpc's logger for connection-level problems (default: silent). */
  logger?: Logger;
  /** Called for every message sent or received. */
  onWire?: WireTap;
}

export interface SpawnOptions extends ConnectOptions {
  /** SQLite database file, passed as `--db PATH`. */
  database?: string;
  /**
   * argv of the daemon. Default: `DAGCTX_COMMAND` (a JSON array, read from
   * `opts.env` first, then the process environment), else `python3 -P -m dagctx.cli serve`.
   */
  command?: string[];
  /** Extra arguments appended after `--db` (e.g. `["--log-level", "INFO"]`). */
  args?: string[];
  /**
   * Run a private daemon in the child (`serve --standalone`) instead of forwarding to
   * the user's shared daemon. Default: false (also `DAGCTX_STANDALONE=1` in `env`).
   */
  standalone?: boolean;
  /** Environment of the daemon, merged over this process's environment. */
  env?: Record<string, string | undefined>;
  /** Working directory of the daemon. */
  cwd?: string;
  /**
   * The daemon's stderr: `"pipe"` (default; the last 16 KiB are kept in
   * `client.stderr` and quoted when the daemon fails to start), `"inherit"`, or `"ignore"`.
   */
  stderr?: "pipe" | "inherit" | "ignore";
}

type Listener = (params: unknown) => void;

const STDERR_KEEP = 16 * 1024;

// ---------------------------------------------------------------- helpers

/** The daemon's stable error kind (`error.data.kind`), if `err` is one of its answers. */
export function errorKind(err: unknown): string | undefined {
  if (!(err instanceof ResponseError)) return undefined;
  const data = err.data as Partial<ErrorData> | null | undefined;
  return typeof data?.kind === "string" ? data.kind : undefined;
}

/** Whether `err` is an error answer of the daemon (optionally of one `kind`). */
export function isDagctxError(err: unknown, kind?: ErrorKind | string): err is DagctxResponseError {
  const k = errorKind(err);
  return k !== undefined && (kind === undefined || k === kind);
}

/** Resolve the daemon's argv from options and `DAGCTX_COMMAND`. */
export function resolveCommand(opts: Pick<SpawnOptions, "command" | "env"> = {}): string[] {
  if (opts.command !== undefined) {
    if (!Array.isArray(opts.command) || opts.command.length === 0 || !opts.command.every((a) => typeof a === "string")) {
      throw new TypeError("opts.command must be a non-empty array of strings");
    }
    return [...opts.command];
  }
  const raw = opts.env?.DAGCTX_COMMAND ?? process.env.DAGCTX_COMMAND;
  if (raw !== undefined && raw.trim() !== "") {
    let parsed: unknown;
    try {
      parsed = JSON.parse(raw);
    } catch (e) {
      throw new TypeError(`DAGCTX_COMMAND must be a JSON array of strings, e.g. ["dagctx","serve"]: ${(e as Error).message}`);
    }
    if (!Array.isArray(parsed) || parsed.length === 0 || !parsed.every((a) => typeof a === "string")) {
      throw new TypeError(`DAGCTX_COMMAND must be a non-empty JSON array of strings, got ${raw}`);
    }
    return parsed as string[];
  }
  return [...DEFAULT_COMMAND];
}

class TapReader implements MessageReader {
  constructor(
    private readonly inner: MessageReader,
    private readonly tap: WireTap,
  ) {}
  get onError() {
    return this.inner.onError;
  }
  get onClose() {
    return this.inner.onClose;
  }
  get onPartialMessage() {
    return this.inner.onPartialMessage;
  }
  listen(callback: DataCallback): Disposable {
    return this.inner.listen((message) => {
      safeTap(this.tap, "receive", message);
      callback(message);
    });
  }
  dispose(): void {
    this.inner.dispose();
  }
}

/**
 * The writer the connection uses. It taps messages (when asked) and turns a failed
 * write into `onFailure` instead of a rejection: vscode-jsonrpc rethrows write
 * errors of requests inside a promise executor, where nobody can catch them. The
 * client disposes the connection on failure, which rejects every pending request.
 */
class GuardedWriter implements MessageWriter {
  constructor(
    private readonly inner: MessageWriter,
    private readonly tap: WireTap | undefined,
    private readonly onFailure: (error: unknown) => void,
  ) {}
  get onError() {
    return this.inner.onError;
  }
  get onClose() {
    return this.inner.onClose;
  }
  write(message: Message): Promise<void> {
    if (this.tap) safeTap(this.tap, "send", message);
    return this.inner.write(message).catch((error: unknown) => this.onFailure(error));
  }
  end(): void {
    this.inner.end();
  }
  dispose(): void {
    this.inner.dispose();
  }
}

function safeTap(tap: WireTap, direction: "send" | "receive", message: Message): void {
  try {
    tap(direction, message);
  } catch {
    // a tap never breaks the connection
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

// ---------------------------------------------------------------- the client

/** One connection to one dagctx daemon. */
export class DagctxClient {
  /** The vscode-jsonrpc connection (for anything this class does not wrap). */
  readonly connection: MessageConnection;
  /** The daemon process, when this client spawned it. */
  readonly process: ChildProcess | undefined;
  /** The `initialize` result, once the handshake is done. */
  initializeResult: InitializeResult | undefined;

  private readonly listeners = new Map<string, Set<Listener>>();
  private readonly registered = new Set<string>();
  private samplingHandler: SamplingHandler | undefined;
  private stderrTail = "";
  private readonly exitPromise: Promise<number | null>;
  private closing: Promise<number | null> | undefined;
  private disposed = false;

  private constructor(reader: Readable, writer: Writable, opts: ConnectOptions, child?: ChildProcess) {
    this.process = child;
    this.samplingHandler = opts.onSampling;
    let messageReader: MessageReader = new StreamMessageReader(reader);
    if (opts.onWire) messageReader = new TapReader(messageReader, opts.onWire);
    const messageWriter = new GuardedWriter(new StreamMessageWriter(writer), opts.onWire, () => this.dispose());
    this.connection = createMessageConnection(messageReader, messageWriter, opts.logger ?? NullLogger);

    // Handlers go in before listen(), so nothing the daemon sends early is lost.
    this.connection.onRequest("sampling/createMessage", (params: CreateMessageParams, token: CancellationToken) => {
      const handler = this.samplingHandler;
      if (handler === undefined) {
        throw new ResponseError(-32601, "this client has no sampling handler (pass onSampling to DagctxClient.spawn)");
      }
      return handler(params, token);
    });
    for (const method of NOTIFICATION_NAMES) this.register(method);
    this.connection.onUnhandledNotification((message) => this.emit(message.method, message.params));
    this.connection.onClose(() => this.dispose());

    if (child !== undefined) {
      this.exitPromise = new Promise<number | null>((resolve) => {
        // A signal-killed daemon has no exit code: null.
        const done = (code: number | null) => {
          resolve(code);
          this.dispose();
        };
        child.once("close", (code) => done(code));
        child.once("error", () => done(child.exitCode));
      });
      child.stderr?.setEncoding("utf8");
      child.stderr?.on("data", (chunk: string) => {
        this.stderrTail = (this.stderrTail + chunk).slice(-STDERR_KEEP);
      });
      // EPIPE after the daemon died is reported through the connection; never crash.
      child.stdin?.on("error", () => undefined);
    } else {
      this.exitPromise = new Promise<number | null>((resolve) => this.connection.onClose(() => resolve(null)));
    }
    this.connection.listen();
  }

  // ------------------------------------------------------------ construction

  /** Start the daemon as a child process, connect, and (by default) initialize it. */
  static async spawn(opts: SpawnOptions = {}): Promise<DagctxClient> {
    const argv = resolveCommand(opts);
    if (opts.database !== undefined) argv.push("--db", opts.database);
    if (opts.standalone) argv.push("--standalone");
    if (opts.args) argv.push(...opts.args);
    const stderrMode = opts.stderr ?? "pipe";
    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const [k, v] of Object.entries(opts.env ?? {})) {
      if (v === undefined) delete env[k];
      else env[k] = v;
    }
    const child = spawnProcess(argv[0]!, argv.slice(1), {
      stdio: ["pipe", "pipe", stderrMode],
      env,
      cwd: opts.cwd,
      windowsHide: true,
    });
    // Spawn failures (ENOENT) and early deaths become a clear rejection of spawn().
    let client: DagctxClient | undefined;
    const failed = new Promise<never>((_, reject) => {
      child.once("error", (err) => reject(new Error(`cannot start the dagctx daemon (${argv.join(" ")}): ${err.message}`)));
      child.once("close", (code, signal) => {
        const tail = client?.stderr.trim() ?? "";
        reject(
          new Error(
            `the dagctx daemon (${argv.join(" ")}) exited with ${signal ?? `code ${code}`} before the handshake finished` +
              (tail ? `; its stderr ends with:\n${tail.split("\n").slice(-20).join("\n")}` : ""),
          ),
        );
      });
    });
    failed.catch(() => undefined);
    if (child.pid === undefined) {
      // spawn failed (no such executable, ...): Node reports it as an 'error' event
      await failed;
    }
    client = new DagctxClient(child.stdout!, child.stdin!, opts, child);
    if (opts.initialize === false) return client;
    try {
      await Promise.race([client.initialize(opts), failed]);
    } catch (err) {
      // The connection closes before the process is reaped; if the daemon died,
      // its exit status and stderr explain more than "connection got disposed".
      const connectionLost = !(err instanceof ResponseError) || err.code === ErrorCodes.PendingResponseRejected;
      const reason = connectionLost ? await Promise.race([failed.catch((e: unknown) => e), delay(2_000).then(() => err)]) : err;
      if (child.exitCode === null && child.signalCode === null) child.kill();
      client.dispose();
      throw reason;
    }
    return client;
  }

  /** Connect to a daemon over existing streams (a socket pair, a test harness). */
  static async connect(reader: Readable, writer: Writable, opts: ConnectOptions = {}): Promise<DagctxClient> {
    const client = new DagctxClient(reader, writer, opts);
    if (opts.initialize !== false) await client.initialize(opts);
    return client;
  }

  /** `initialize` + `initialized`. Called by `spawn`/`connect` unless `initialize: false`. */
  async initialize(opts: ConnectOptions = {}): Promise<InitializeResult> {
    if (opts.onSampling) this.samplingHandler = opts.onSampling;
    const capabilities: Record<string, unknown> = { ...(opts.capabilities ?? {}) };
    if (this.samplingHandler !== undefined && capabilities.sampling === undefined) capabilities.sampling = {};
    const params: InitializeParams = {
      processId: process.pid,
      clientInfo: { name: opts.clientInfo?.name ?? CLIENT_NAME, version: opts.clientInfo?.version ?? CLIENT_VERSION },
      rootUri: opts.rootUri ?? null,
      capabilities,
      initializationOptions: opts.initializationOptions ?? {},
    };
    const result = await this.request("initialize", params);
    await this.connection.sendNotification("initialized", {});
    this.initializeResult = result;
    return result;
  }

  // ------------------------------------------------------------ state

  /** The last 16 KiB the daemon wrote to stderr (when spawned with `stderr: "pipe"`). */
  get stderr(): string {
    return this.stderrTail;
  }

  /** Whether the daemon process is still running (always true for stream connections until close). */
  get alive(): boolean {
    if (this.disposed) return false;
    if (this.process === undefined) return true;
    return this.process.exitCode === null && this.process.signalCode === null;
  }

  /** Whether the daemon's `initialize` result lists `method` (it answers -32601 otherwise). */
  supports(method: string): boolean {
    return this.initializeResult?.methods.includes(method) ?? false;
  }

  /** Resolves with the daemon's exit code once its process is gone (null for stream connections). */
  get exited(): Promise<number | null> {
    return this.exitPromise;
  }

  // ------------------------------------------------------------ requests and notifications

  /** Send a typed request. Params may be omitted when the method has no required field. */
  async request<M extends MethodName>(method: M, ...args: RequestArgs<M>): Promise<ResultOf<M>> {
    const [params, token] = args as [ParamsOf<M> | null | undefined, CancellationToken | undefined];
    const rest: unknown[] = [];
    // vscode-jsonrpc omits `params` when none are given; the daemon reads that as {}.
    if (params !== undefined && params !== null) rest.push(params);
    if (token !== undefined) rest.push(token);
    // (async: a disposed connection throws synchronously; callers get a rejection)
    return (await this.connection.sendRequest(method, ...rest)) as ResultOf<M>;
  }

  /** Listen to a server → client notification; returns a Disposable that unsubscribes. */
  onNotification<N extends keyof Notifications>(method: N, listener: (params: Notifications[N]["params"]) => void): Disposable;
  onNotification(method: string, listener: (params: unknown) => void): Disposable;
  onNotification(method: string, listener: Listener): Disposable {
    this.register(method);
    let set = this.listeners.get(method);
    if (set === undefined) {
      set = new Set();
      this.listeners.set(method, set);
    }
    set.add(listener);
    return Disposable.create(() => {
      set!.delete(listener);
    });
  }

  /** Listen to `$/progress` of one work-done token (e.g. `context/compact`'s `workDoneToken`). */
  onProgress(token: number | string, listener: (value: Record<string, unknown>) => void): Disposable {
    return this.onNotification("$/progress", (p: ProgressParams) => {
      if (p.token === token) listener(p.value);
    });
  }

  /** Answer a server → client request (`sampling/createMessage` has its own `onSampling`). */
  onRequest<R extends keyof ServerRequests>(
    method: R,
    handler: (params: ServerRequests[R]["params"], token: CancellationToken) => Promise<ServerRequests[R]["result"]> | ServerRequests[R]["result"],
  ): Disposable;
  onRequest(method: string, handler: (params: unknown, token: CancellationToken) => unknown): Disposable;
  onRequest(method: string, handler: (params: any, token: CancellationToken) => unknown): Disposable {
    if (method === "sampling/createMessage") {
      this.samplingHandler = handler as SamplingHandler;
      return Disposable.create(() => {
        if (this.samplingHandler === handler) this.samplingHandler = undefined;
      });
    }
    return this.connection.onRequest(method, handler);
  }

  /** Replace the `sampling/createMessage` handler (the capability is declared at initialize). */
  setSamplingHandler(handler: SamplingHandler | undefined): void {
    this.samplingHandler = handler;
  }

  private register(method: string): void {
    if (this.registered.has(method)) return;
    this.registered.add(method);
    if (method === "$/progress") {
      // vscode-jsonrpc routes $/progress itself; progress without a registered token lands here.
      this.connection.onUnhandledProgress((p) => this.emit("$/progress", p));
    } else {
      this.connection.onNotification(method, (params: unknown) => this.emit(method, params));
    }
  }

  private emit(method: string, params: unknown): void {
    const set = this.listeners.get(method);
    if (set === undefined) return;
    for (const listener of [...set]) {
      try {
        listener(params);
      } catch {
        // one listener's bug never stops the others or the connection
      }
    }
  }

  // ------------------------------------------------------------ lifecycle

  /**
   * `shutdown` + `exit`, then wait for the daemon to end (killing it after
   * `timeoutMs`). Resolves with its exit code: 0 after a clean shutdown.
   */
  close(timeoutMs = 10_000): Promise<number | null> {
    if (this.closing === undefined) this.closing = this.doClose(timeoutMs);
    return this.closing;
  }

  private async doClose(timeoutMs: number): Promise<number | null> {
    if (this.alive) {
      try {
        await Promise.race([this.connection.sendRequest("shutdown"), delay(timeoutMs)]);
        await this.connection.sendNotification("exit");
      } catch {
        // the daemon is already gone or refused; waiting (or killing) below settles it
      }
    }
    if (this.process === undefined) {
      this.connection.end();
      this.dispose();
      return null;
    }
    const child = this.process;
    const timedOut = Symbol("timeout");
    const first = await Promise.race([this.exitPromise, delay(timeoutMs).then(() => timedOut)]);
    if (first !== timedOut) return first as number | null;
    child.kill("SIGTERM");
    const second = await Promise.race([this.exitPromise, delay(2_000).then(() => timedOut)]);
    if (second !== timedOut) return second as number | null;
    child.kill("SIGKILL");
    return this.exitPromise;
  }

  /** Drop the connection without the shutdown handshake (pending requests reject). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.connection.dispose();
  }

  // ------------------------------------------------------------ sessions

  sessionCreate(params: SessionCreateParams = {}, token?: CancellationToken): Promise<SessionCreateResult> {
    return this.request("session/create", params, token);
  }

  sessionList(params: SessionListParams = {}, token?: CancellationToken): Promise<SessionListResult> {
    return this.request("session/list", params, token);
  }

  sessionGet(sessionId: string, token?: CancellationToken): Promise<SessionInfo> {
    return this.request("session/get", { sessionId }, token);
  }

  sessionRename(sessionId: string, title: string, token?: CancellationToken): Promise<SessionInfo> {
    return this.request("session/rename", { sessionId, title }, token);
  }

  sessionDelete(sessionId: string, token?: CancellationToken): Promise<SessionDeleteResult> {
    return this.request("session/delete", { sessionId }, token);
  }

  /** The linear branch ending at `head` (default: HEAD), oldest first. */
  history(sessionId: string, head?: string | null, token?: CancellationToken): Promise<SessionHistoryResult> {
    return this.request("session/history", { sessionId, head: head ?? null }, token);
  }

  branches(sessionId: string, token?: CancellationToken): Promise<SessionBranchesResult> {
    return this.request("session/branches", { sessionId }, token);
  }

  checkout(sessionId: string, nodeId: string, token?: CancellationToken): Promise<HeadResult> {
    return this.request("session/checkout", { sessionId, nodeId }, token);
  }

  /** Move HEAD back along its branch: to `to.nodeId`, or by `to.steps` nodes. */
  rewind(sessionId: string, to: { nodeId?: string; steps?: number }, token?: CancellationToken): Promise<HeadResult> {
    return this.request("session/rewind", { sessionId, nodeId: to.nodeId ?? null, steps: to.steps ?? null }, token);
  }

  /** Open a spawn branch whose root hangs off `callerId` (HEAD stays). */
  spawnBranch(
    sessionId: string,
    callerId: string,
    opts: Omit<SessionSpawnParams, "sessionId" | "callerId"> = {},
    token?: CancellationToken,
  ): Promise<SessionSpawnResult> {
    return this.request("session/spawn", { ...opts, sessionId, callerId }, token);
  }

  /** Name (or, with `null`, unname) a branch tip. */
  nameBranch(sessionId: string, head: string, name: string | null, token?: CancellationToken): Promise<SessionBranchesResult> {
    return this.request("session/nameBranch", { sessionId, head, name }, token);
  }

  importPath(path: string, opts: Omit<ImportParams, "path"> = {}, token?: CancellationToken): Promise<ImportResult> {
    return this.request("session/import", { ...opts, path }, token);
  }

  export(sessionId: string, opts: Omit<ExportParams, "sessionId"> = {}, token?: CancellationToken): Promise<ExportResult> {
    return this.request("session/export", { ...opts, sessionId }, token);
  }

  // ------------------------------------------------------------ nodes

  /** Append one node. HEAD moves when the node extends HEAD (or `moveHead: true`). */
  append(
    sessionId: string,
    node: NodeInput,
    opts: Omit<NodeAppendParams, "sessionId" | "node"> = {},
    token?: CancellationToken,
  ): Promise<NodeResult> {
    return this.request("node/append", { ...opts, sessionId, node }, token);
  }

  /** Finish a `running` node: the ledger's only mutation. */
  update(
    sessionId: string,
    nodeId: string,
    fields: Omit<NodeUpdateParams, "sessionId" | "nodeId">,
    token?: CancellationToken,
  ): Promise<NodeResult> {
    return this.request("node/update", { ...fields, sessionId, nodeId }, token);
  }

  getNodes(sessionId: string, ids: string[], range?: OutputRange | null, token?: CancellationToken): Promise<NodeGetResult> {
    return this.request("node/get", { sessionId, ids, range: range ?? null }, token);
  }

  // ------------------------------------------------------------ context

  render(sessionId: string, opts: Omit<RenderParams, "sessionId"> = {}, token?: CancellationToken): Promise<RenderResult> {
    return this.request("context/render", { ...opts, sessionId }, token);
  }

  prepare(sessionId: string, opts: Omit<PrepareParams, "sessionId"> = {}, token?: CancellationToken): Promise<PrepareResult> {
    return this.request("context/prepare", { ...opts, sessionId }, token);
  }

  /** Compact a branch into a rolling summary; the daemon asks `onSampling` to write it. */
  compact(sessionId: string, opts: Omit<CompactParams, "sessionId"> = {}, token?: CancellationToken): Promise<CompactResult> {
    return this.request("context/compact", { ...opts, sessionId }, token);
  }

  replay(
    sessionId: string,
    nodeId: string,
    opts: Omit<ReplayParams, "sessionId" | "nodeId"> = {},
    token?: CancellationToken,
  ): Promise<ReplayResult> {
    return this.request("context/replay", { ...opts, sessionId, nodeId }, token);
  }

  usageReport(
    sessionId: string,
    nodeId: string,
    usage: Usage,
    model?: string | null,
    token?: CancellationToken,
  ): Promise<UsageReportResult> {
    return this.request("usage/report", { sessionId, nodeId, usage, model: model ?? null }, token);
  }

  search(query: string, opts: Omit<SearchParams, "query"> = {}, token?: CancellationToken): Promise<SearchResult> {
    return this.request("search/query", { ...opts, query }, token);
  }

  // ------------------------------------------------------------ live sessions

  /** This connection's id in the daemon: the `origin` of notifications it caused. */
  get connectionId(): string | null {
    return this.initializeResult?.connectionId ?? null;
  }

  /**
   * Watch a session live: subscribe, and call `listener` for every `node/didAppend`,
   * `node/didUpdate` and `session/didChange` of it — whichever client or process wrote.
   * Set `includeOwn: false` to skip changes this connection caused. Dispose the
   * result to stop (it unsubscribes).
   */
  async watch(
    sessionId: string,
    listener: (change: SessionEvent) => void,
    opts: { includeOwn?: boolean } = {},
  ): Promise<Disposable> {
    const own = opts.includeOwn === false ? this.connectionId : undefined;
    const relay = (method: SessionEvent["method"]) => (params: unknown) => {
      const p = params as NodeNotification | SessionChange;
      if (p.sessionId !== sessionId || (own !== undefined && own !== null && p.origin === own)) return;
      listener({ method, params: p } as SessionEvent);
    };
    const subs = [
      this.onNotification("node/didAppend", relay("node/didAppend")),
      this.onNotification("node/didUpdate", relay("node/didUpdate")),
      this.onNotification("session/didChange", relay("session/didChange")),
    ];
    await this.request("session/subscribe", { sessionId });
    return Disposable.create(() => {
      for (const d of subs) d.dispose();
      if (this.alive) this.request("session/unsubscribe", { sessionId }).catch(() => undefined);
    });
  }

  daemonStatus(token?: CancellationToken): Promise<DaemonStatus> {
    return this.request("daemon/status", null, token);
  }
}

/** One change of a watched session (see `DagctxClient.watch`). */
export type SessionEvent =
  | { method: "node/didAppend" | "node/didUpdate"; params: NodeNotification }
  | { method: "session/didChange"; params: SessionChange };
