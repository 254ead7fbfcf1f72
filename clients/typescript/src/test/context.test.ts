// context/render, context/compact answered by onSampling, and cancellation.
//
// render and compact may not be implemented by the daemon yet: then they are
// missing from initialize's `methods` (and answer -32601), and their tests are
// skipped with a message. They run by themselves once the daemon lists them.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { CancellationTokenSource, ResponseError } from "vscode-jsonrpc/node";

import { DagctxClient, errorKind } from "../client";
import { METHOD_NAMES, type CreateMessageParams, type CreateMessageResult } from "../protocol";
import { rejection, skipMessage, spawnClient, tempDir, waitFor, Wire, type TempDir } from "../test-support/helpers";

const SUMMARY_MARKER = "SUMMARY-7f3a: migrate users table to Postgres; keep id INTEGER PRIMARY KEY";

/** A conversation long enough to be worth compacting. */
async function conversation(client: DagctxClient, turns = 12): Promise<{ sessionId: string; head: string; ids: string[] }> {
  const s = await client.sessionCreate({ title: "long conversation" });
  let head = s.head;
  const ids: string[] = [];
  const filler = "The migration must keep every existing row, add the email column, backfill it, and stay reversible. ";
  for (let i = 0; i < turns; i++) {
    const u = await client.append(s.sessionId, {
      role: "user",
      predecessor: head,
      input: `Step ${i}: ${filler.repeat(6)} What about table_${i}?`,
    });
    const l = await client.append(s.sessionId, {
      role: "llm",
      predecessor: u.node.id,
      output: `For table_${i}: ${filler.repeat(6)} Done with step ${i}.`,
    });
    head = l.head;
    ids.push(u.node.id, l.node.id);
  }
  return { sessionId: s.sessionId, head, ids };
}

describe("context", { timeout: 60_000 }, () => {
  let dir: TempDir;
  let client: DagctxClient;
  const sampled: CreateMessageParams[] = [];
  // A stand-in summarizer: the marker plus the identifiers it was shown, as a real
  // summary keeps them (the daemon rejects summaries that drop them: lowFidelity).
  let sampling: (p: CreateMessageParams) => Promise<CreateMessageResult> = async (p) => {
    const shown = p.messages.map((m) => m.content.text ?? "").join("\n");
    const idents = [...new Set(shown.match(/[A-Za-z]+_[A-Za-z0-9_]+|[\w./-]+\.\w{1,4}\b/g) ?? [])];
    return {
      role: "assistant",
      content: { type: "text", text: `${SUMMARY_MARKER}\nIdentifiers: ${idents.join(", ")}` },
      model: "test-model",
      stopReason: "endTurn",
    };
  };
  const wire = new Wire();

  before(async () => {
    dir = tempDir();
    client = await spawnClient(dir, {
      onWire: wire.tap,
      onSampling: (params) => {
        sampled.push(params);
        return sampling(params);
      },
    });
  });

  after(async () => {
    await client.close();
    dir.remove();
  });

  test("onSampling declares the sampling capability at initialize", () => {
    const init = wire.sent.find((m: any) => m.method === "initialize") as any;
    assert.deepEqual(init.params.capabilities.sampling, {});
  });

  test("every protocol method the daemon does not list answers -32601 MethodNotFound", async () => {
    // the premise of the skips below: unlisted methods are refused, never half-served
    const unlisted = METHOD_NAMES.filter((m) => !client.supports(m));
    for (const m of unlisted) {
      const err = await rejection(() => client.connection.sendRequest(m, { sessionId: "x" }));
      assert.equal(err.code, -32601, `${m} answers -32601`);
      assert.equal(errorKind(err), "MethodNotFound");
    }
  });

  test("context/render returns messages, reads, token counts and a manifest", async (t) => {
    if (!client.supports("context/render")) {
      t.skip(skipMessage("context/render"));
      return;
    }
    const s = await client.sessionCreate({ title: "render" });
    const u = await client.append(s.sessionId, { role: "user", predecessor: s.head, input: "Rename the column user_name." });
    const l = await client.append(s.sessionId, {
      role: "llm",
      predecessor: u.node.id,
      name: "gpt-4o",
      output: "Reading the schema.",
    });
    await client.append(s.sessionId, {
      role: "code",
      name: "read_file",
      caller: l.node.id,
      input: { path: "schema.sql" },
      output: "CREATE TABLE t (user_name TEXT);",
      metadata: { toolCallId: "call_r1" },
    });
    for (const format of ["neutral", "openai", "anthropic"] as const) {
      const r = await client.render(s.sessionId, { format });
      assert.ok(Array.isArray(r.messages) && r.messages.length > 0, `${format}: messages`);
      assert.ok(Array.isArray(r.reads), `${format}: reads`);
      assert.equal(typeof r.tokens.total, "number");
      assert.ok(r.tokens.total > 0, `${format}: token total`);
      assert.ok(Array.isArray(r.tokens.perMessage));
      assert.equal(typeof r.manifest, "object");
      const text = JSON.stringify(r.messages);
      assert.ok(text.includes("Rename the column user_name."), `${format}: the user turn is rendered`);
      assert.ok(text.includes("call_r1"), `${format}: the tool call id is rendered`);
    }
    const explicit = await client.render(s.sessionId, { head: u.node.id });
    assert.ok(!JSON.stringify(explicit.messages).includes("Reading the schema."), "render stops at the given head");
  });

  test("a turn: context/prepare → the model's answer appended with renderId → context/replay is exact", async (t) => {
    for (const m of ["context/prepare", "context/replay"]) {
      if (!client.supports(m)) {
        t.skip(skipMessage(m));
        return;
      }
    }
    const s = await client.sessionCreate({ title: "turn" });
    const u = await client.append(s.sessionId, { role: "user", predecessor: s.head, input: "List the migrations." });
    const prep = await client.prepare(s.sessionId, { format: "openai" });
    assert.equal(typeof prep.system, "string");
    assert.ok(prep.system.length > 0, "a system prompt is assembled");
    assert.equal(typeof prep.renderId, "string");
    assert.ok(prep.reads.includes(u.node.id));
    assert.ok(prep.budget.contextWindow > 0);
    assert.ok(prep.budget.inputUsed > 0 && prep.budget.inputUsed <= prep.budget.inputBudget);
    assert.ok(Array.isArray(prep.decisionPath) && prep.decisionPath.length > 0);
    assert.equal(prep.recommendCompaction, false);
    assert.ok(JSON.stringify(prep.messages).includes("List the migrations."));

    const l = await client.append(
      s.sessionId,
      { role: "llm", predecessor: u.node.id, output: "001_init.sql, 002_email.sql" },
      { renderId: prep.renderId },
    );
    const replay = await client.replay(s.sessionId, l.node.id);
    assert.equal(replay.nodeId, l.node.id);
    assert.equal(replay.exact, true, "the llm node recorded what it was sent");
    assert.deepEqual(replay.messages, prep.messages);
  });

  test("usage/report calibrates, and past 70 % of the window sends context/compactionRecommended", async (t) => {
    if (!client.supports("usage/report")) {
      t.skip(skipMessage("usage/report"));
      return;
    }
    const recommended: { sessionId: string; percentUsed: number }[] = [];
    const sub = client.onNotification("context/compactionRecommended", (p) => recommended.push(p));
    try {
      const s = await client.sessionCreate({ title: "usage" });
      const u = await client.append(s.sessionId, { role: "user", predecessor: s.head, input: "hello there" });
      const prep = await client.prepare(s.sessionId, {});
      const l = await client.append(s.sessionId, { role: "llm", predecessor: u.node.id, output: "hi" }, { renderId: prep.renderId });
      const low = await client.usageReport(s.sessionId, l.node.id, { input: 40, output: 5 });
      assert.equal(low.nodeId, l.node.id);
      assert.equal(low.measuredPrompt, 40);
      assert.equal(low.recommendCompaction, false);

      const window = prep.budget.contextWindow;
      const high = await client.usageReport(s.sessionId, l.node.id, { input: Math.ceil(window * 0.9), output: 5 });
      assert.equal(high.recommendCompaction, true);
      await waitFor(() => recommended.length > 0, 5_000, "context/compactionRecommended");
      assert.equal(recommended[0]!.sessionId, s.sessionId);
      assert.ok(recommended[0]!.percentUsed >= 70, `percentUsed ${recommended[0]!.percentUsed}`);
    } finally {
      sub.dispose();
    }
  });

  test("context/compact asks onSampling for the summary and records it", async (t) => {
    if (!client.supports("context/compact")) {
      t.skip(skipMessage("context/compact"));
      return;
    }
    const before = sampled.length;
    const conv = await conversation(client);
    const progress: unknown[] = [];
    const sub = client.onProgress("compact-1", (v) => progress.push(v));
    const r = await client.compact(conv.sessionId, {
      keepRecentTokens: 200,
      instructions: "Keep table names.",
      workDoneToken: "compact-1",
    });
    sub.dispose();
    assert.equal(typeof r.tokensBefore, "number");
    assert.equal(typeof r.tokensAfter, "number");
    assert.equal(r.ok, true, `compaction succeeded (reason: ${r.reason}, error: ${r.error})`);
    assert.ok(sampled.length > before, "the daemon sent sampling/createMessage to this client");
    const req = sampled[sampled.length - 1]!;
    assert.ok(Array.isArray(req.messages) && req.messages.length > 0);
    assert.equal(typeof req.maxTokens, "number");
    assert.equal(req.messages[0]!.content.type, "text");

    assert.equal(typeof r.summaryId, "string");
    assert.ok((r.coversIds ?? []).length > 0, "the summary covers earlier turns");
    for (const id of r.coversIds ?? []) assert.ok(conv.ids.includes(id), `covers ${id}, a turn of the branch`);
    assert.ok(r.tokensAfter < r.tokensBefore, `tokens fell: ${r.tokensBefore} → ${r.tokensAfter}`);
    const got = await client.getNodes(conv.sessionId, [r.summaryId!]);
    assert.ok(JSON.stringify(got.nodes[0]).includes("SUMMARY-7f3a"), "the summary node holds the sampled text");
  });

  test("a failing onSampling makes context/compact fail cleanly, not hang", async (t) => {
    if (!client.supports("context/compact")) {
      t.skip(skipMessage("context/compact"));
      return;
    }
    const conv = await conversation(client, 8);
    const saved = sampling;
    sampling = async () => {
      throw new ResponseError(-32603, "the model is unavailable");
    };
    try {
      let outcome: { ok?: boolean; error?: string | null; kind?: string } = {};
      try {
        const r = await client.compact(conv.sessionId, { keepRecentTokens: 200 });
        outcome = { ok: r.ok, error: r.error };
      } catch (err) {
        outcome = { kind: errorKind(err) };
      }
      assert.ok(outcome.ok === false || outcome.kind === "SamplingFailed", `compact reported the failure: ${JSON.stringify(outcome)}`);
      const hist = await client.history(conv.sessionId);
      assert.equal(hist.head, conv.head, "a failed compaction leaves the branch as it was");
    } finally {
      sampling = saved;
    }
  });
});

describe("cancellation", { timeout: 60_000 }, () => {
  let dir: TempDir;
  let client: DagctxClient;
  const wire = new Wire();
  let gate: { started: boolean; release?: (r: CreateMessageResult) => void; token?: { isCancellationRequested: boolean } } = {
    started: false,
  };

  before(async () => {
    dir = tempDir();
    client = await spawnClient(dir, {
      onWire: wire.tap,
      onSampling: (_params, token) =>
        new Promise<CreateMessageResult>((resolve) => {
          gate.started = true;
          gate.token = token;
          gate.release = resolve;
        }),
    });
  });

  after(async () => {
    gate.release?.({ role: "assistant", content: { type: "text", text: "late" }, model: "m" });
    await client.close();
    dir.remove();
  });

  test("a CancellationToken sends $/cancelRequest for the request's id and the connection goes on", async () => {
    const s = await client.sessionCreate({ title: "cancel" });
    const source = new CancellationTokenSource();
    const mark = wire.sent.length;
    const pending = client.history(s.sessionId, null, source.token);
    source.cancel();
    // the daemon may have answered before the cancel arrived (then the result
    // stands), or it answers -32800 RequestCancelled: both are correct.
    let outcome: "result" | "cancelled";
    try {
      const r = await pending;
      assert.deepEqual(r.nodes, []);
      outcome = "result";
    } catch (err) {
      assert.ok(err instanceof ResponseError);
      assert.equal(err.code, -32800);
      outcome = "cancelled";
    }
    assert.ok(outcome === "result" || outcome === "cancelled");
    await waitFor(() => wire.sent.slice(mark).some((m: any) => m.method === "$/cancelRequest"), 2_000, "$/cancelRequest");
    const sent = wire.sent.slice(mark) as any[];
    const req = sent.find((m) => m.method === "session/history");
    const cancel = sent.find((m) => m.method === "$/cancelRequest");
    assert.ok(req && cancel);
    assert.equal(cancel.params.id, req.id, "$/cancelRequest names the request's id");
    assert.equal(cancel.id, undefined, "$/cancelRequest is a notification");

    // a cancel for a finished request is harmless; the connection still serves
    const after = await client.sessionGet(s.sessionId);
    assert.equal(after.sessionId, s.sessionId);
    assert.ok(client.alive);
  });

  test("cancelling context/compact while the daemon waits on sampling answers -32800 and writes nothing", async (t) => {
    if (!client.supports("context/compact")) {
      t.skip(skipMessage("context/compact"));
      return;
    }
    const conv = await conversation(client, 8);
    const before = await client.sessionGet(conv.sessionId);
    const source = new CancellationTokenSource();
    const pending = client.compact(conv.sessionId, { keepRecentTokens: 200 }, source.token);
    await waitFor(() => gate.started, 20_000, "the daemon to ask for a summary");
    source.cancel();
    const err = await rejection(() => pending);
    assert.ok(err instanceof ResponseError);
    assert.equal(err.code, -32800);
    assert.equal(errorKind(err), "RequestCancelled");
    const afterInfo = await client.sessionGet(conv.sessionId);
    assert.equal(afterInfo.nodeCount, before.nodeCount, "a cancelled compaction wrote nothing");
    assert.equal(afterInfo.head, conv.head);
  });
});
