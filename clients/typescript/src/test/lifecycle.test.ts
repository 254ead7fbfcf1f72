// The connection: handshake, requests without params, errors, close, spawn failures.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { ResponseError } from "vscode-jsonrpc/node";

import { DagctxClient, errorKind, isDagctxError, resolveCommand, DEFAULT_COMMAND } from "../client";
import { CLIENT_NOTIFICATION_NAMES, METHOD_NAMES, NOTIFICATION_NAMES, PROTOCOL_VERSION } from "../protocol";
import { rejection, spawnClient, tempDir, Wire, type TempDir } from "../test-support/helpers";

describe("lifecycle", { timeout: 60_000 }, () => {
  let dir: TempDir;
  let client: DagctxClient;
  const wire = new Wire();

  before(async () => {
    dir = tempDir();
    client = await spawnClient(dir, { onWire: wire.tap });
  });

  after(async () => {
    if (client.alive) await client.close();
    dir.remove();
  });

  test("initialize answers with server info, protocol version, methods and notifications", () => {
    const r = client.initializeResult;
    assert.ok(r, "initializeResult is set after spawn");
    assert.equal(r.serverInfo.name, "dagctx");
    assert.equal(typeof r.serverInfo.version, "string");
    assert.equal(r.protocolVersion, PROTOCOL_VERSION);
    assert.equal(r.database, dir.db());
    for (const m of ["initialize", "shutdown", "session/create", "session/list", "session/get", "node/append", "search/query"]) {
      assert.ok(r.methods.includes(m), `methods lists ${m}`);
      assert.ok(client.supports(m));
    }
    // everything the daemon lists is a method of the generated table
    for (const m of r.methods) assert.ok((METHOD_NAMES as readonly string[]).includes(m), `${m} is in METHOD_NAMES`);
    assert.deepEqual([...r.notifications].sort(), [...NOTIFICATION_NAMES].sort());
    assert.equal(client.supports("no/such"), false);
  });

  test("the handshake on the wire: initialize request then the initialized notification", () => {
    const first = wire.sent[0] as any;
    assert.equal(first.method, "initialize");
    assert.equal(first.params.clientInfo.name, "dagctx-typescript");
    assert.equal(first.params.processId, process.pid);
    const second = wire.sent[1] as any;
    assert.equal(second.method, "initialized");
    assert.equal(second.id, undefined);
    assert.ok((CLIENT_NOTIFICATION_NAMES as readonly string[]).includes(second.method));
  });

  test("a request without params is answered (vscode-jsonrpc omits them)", async () => {
    await client.sessionCreate({ title: "one" });
    const before = wire.sent.length;
    const raw = (await client.connection.sendRequest("session/list")) as any;
    const sent = wire.sent[before] as any;
    assert.equal(sent.method, "session/list");
    assert.ok(!("params" in sent) || sent.params === undefined, "no params member on the wire");
    assert.ok(Array.isArray(raw.sessions));
    assert.ok(raw.total >= 1);

    // the typed request() lets params be left out when the method needs none
    const typed = await client.request("session/list");
    assert.equal(typed.total, raw.total);
    const nulled = await client.request("session/list", null);
    assert.equal(nulled.total, raw.total);
  });

  test("an application error carries data.kind, and the connection survives it", async () => {
    const s = await client.sessionCreate({ title: "errors" });
    const err = await rejection(() => client.append(s.sessionId, { role: "user", input: "no predecessor" }));
    assert.ok(err instanceof ResponseError, "a vscode-jsonrpc ResponseError");
    assert.equal(err.code, -32001);
    assert.equal(err.data.kind, "PredecessorMissing");
    assert.equal(err.data.path, "node.predecessor");
    assert.equal(err.data.sessionId, s.sessionId);
    assert.equal(errorKind(err), "PredecessorMissing");
    assert.match(err.message, /predecessor/);
    assert.equal(isDagctxError(err, "PredecessorMissing"), true);
    assert.equal(isDagctxError(err, "SessionNotFound"), false);

    const missing = await rejection(() => client.sessionGet("no-such-session"));
    assert.equal(errorKind(missing), "SessionNotFound");

    // the failed append wrote nothing
    const info = await client.sessionGet(s.sessionId);
    assert.equal(info.head, s.head);
    const hist = await client.history(s.sessionId);
    assert.deepEqual(hist.nodes, []);
  });

  test("protocol errors: invalid params (-32602 naming the field) and unknown methods (-32601)", async () => {
    const bad = await rejection(() => client.connection.sendRequest("session/get", { sessionId: 42 }));
    assert.equal(bad.code, -32602);
    assert.equal(errorKind(bad), "InvalidParams");
    assert.match(String(bad.data.path), /sessionId/);

    const missing = await rejection(() => client.connection.sendRequest("session/get"));
    assert.equal(missing.code, -32602);

    const unknown = await rejection(() => client.connection.sendRequest("no/such/method", {}));
    assert.equal(unknown.code, -32601);
    assert.equal(errorKind(unknown), "MethodNotFound");

    // still serving
    const list = await client.sessionList({ limit: 1 });
    assert.equal(list.sessions.length, 1);
  });

  test("close() sends shutdown + exit and resolves with exit code 0", async () => {
    const other = await spawnClient(dir, { database: dir.db("close.db") });
    assert.ok(other.alive);
    const code = await other.close();
    assert.equal(code, 0);
    assert.equal(other.alive, false);
    assert.equal(await other.close(), 0, "close() is idempotent");
    const err = await rejection(() => other.sessionList());
    assert.ok(err instanceof Error);
  });

  test("initialize: false — requests before initialize get -32002, after shutdown -32600; exit code 0", async () => {
    const other = await spawnClient(dir, { database: dir.db("manual.db"), initialize: false });
    try {
      assert.equal(other.initializeResult, undefined);
      const early = await rejection(() => other.sessionList());
      assert.equal(early.code, -32002);
      assert.equal(errorKind(early), "ServerNotInitialized");

      const init = await other.initialize({ initializationOptions: {} });
      assert.equal(init.database, dir.db("manual.db"));
      assert.equal(other.initializeResult, init);
      assert.equal((await other.sessionList()).total, 0);

      assert.equal(await other.connection.sendRequest("shutdown"), null);
      const late = await rejection(() => other.sessionList());
      assert.equal(late.code, -32600);
      assert.equal(errorKind(late), "ShutdownInProgress");
      await other.connection.sendNotification("exit");
      assert.equal(await other.exited, 0);
    } finally {
      await other.close();
    }
  });

  test("exit without shutdown ends the daemon with code 1", async () => {
    const other = await spawnClient(dir, { database: dir.db("exit1.db") });
    await other.connection.sendNotification("exit");
    assert.equal(await other.exited, 1);
    assert.equal(await other.close(), 1);
  });

  test("a dead daemon rejects pending and later requests instead of hanging", async () => {
    const other = await spawnClient(dir, { database: dir.db("dead.db") });
    other.process!.kill("SIGKILL");
    const code = await other.exited;
    assert.equal(code, null, "killed by a signal: no exit code");
    assert.equal(other.alive, false);
    await rejection(() => other.sessionList());
  });
});

describe("spawning", { timeout: 60_000 }, () => {
  test("the command comes from opts.command, then DAGCTX_COMMAND, then the default", () => {
    assert.deepEqual(resolveCommand({ command: ["x", "serve"] }), ["x", "serve"]);
    assert.deepEqual(resolveCommand({ env: { DAGCTX_COMMAND: '["dagctx","serve"]' } }), ["dagctx", "serve"]);
    const saved = process.env.DAGCTX_COMMAND;
    delete process.env.DAGCTX_COMMAND;
    try {
      assert.deepEqual(resolveCommand({}), [...DEFAULT_COMMAND]);
      assert.deepEqual(DEFAULT_COMMAND, ["python3", "-P", "-m", "dagctx.cli", "serve"]);
    } finally {
      if (saved !== undefined) process.env.DAGCTX_COMMAND = saved;
    }
    assert.throws(() => resolveCommand({ env: { DAGCTX_COMMAND: "dagctx serve" } }), /JSON array/);
    assert.throws(() => resolveCommand({ env: { DAGCTX_COMMAND: "[]" } }), /non-empty/);
  });

  test("a missing executable rejects spawn() with a clear error", async () => {
    const err = await rejection(() => DagctxClient.spawn({ command: ["/nonexistent/dagctx-daemon"] }));
    assert.match(err.message, /cannot start the dagctx daemon/);
    assert.match(err.message, /ENOENT/);
  });

  test("a daemon that dies before the handshake rejects spawn() quoting its stderr", async () => {
    const err = await rejection(() =>
      DagctxClient.spawn({ command: ["python3", "-c", "import sys; sys.stderr.write('boom: no database\\n'); sys.exit(3)"] }),
    );
    assert.match(err.message, /exited with code 3/);
    assert.match(err.message, /boom: no database/);
  });

  test("DAGCTX_COMMAND given in opts.env starts the daemon", async () => {
    const dir = tempDir();
    try {
      const command = JSON.stringify(resolveCommand({}));
      const c = await DagctxClient.spawn({ database: dir.db(), env: { DAGCTX_COMMAND: command } });
      assert.equal(c.initializeResult?.serverInfo.name, "dagctx");
      assert.equal(await c.close(), 0);
    } finally {
      dir.remove();
    }
  });
});
