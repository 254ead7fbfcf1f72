// The ledger through the client: turns, a tool call, forks, checkout, rewind, a
// spawn branch, history and branches; live node notifications; full-text search.

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { DagctxClient, errorKind } from "../client";
import type { NodeNotification } from "../protocol";
import { rejection, skipMessage, spawnClient, tempDir, waitFor, type TempDir } from "../test-support/helpers";

describe("ledger scenario", { timeout: 60_000 }, () => {
  let dir: TempDir;
  let client: DagctxClient;

  before(async () => {
    dir = tempDir();
    client = await spawnClient(dir);
  });

  after(async () => {
    await client.close();
    dir.remove();
  });

  test("create → turns with a tool call → fork → checkout → rewind → spawn branch", async () => {
    const s = await client.sessionCreate({ title: "ledger scenario", metadata: { origin: "ts-test" } });
    const sid = s.sessionId;
    assert.equal(s.head, s.rootId, "a new session's HEAD is its ROOT");

    // --- a user turn, then the model's turn that calls a tool
    const u1 = await client.append(sid, { role: "user", predecessor: s.head, input: "Write the schema migration." });
    assert.equal(u1.head, u1.node.id, "a turn extending HEAD moves HEAD");
    assert.equal(u1.node.predecessor, s.rootId);
    assert.equal(u1.node.role, "user");

    const l1 = await client.append(sid, {
      role: "llm",
      name: "gpt-4o",
      predecessor: u1.node.id,
      output: {
        text: "Let me read the current schema.",
        toolCalls: [{ id: "call_1", name: "read_file", arguments: { path: "db/schema.sql" } }],
      },
    });
    assert.equal(l1.head, l1.node.id);
    assert.ok(l1.node.seq > u1.node.seq, "seq grows");

    // the tool call is a code node: caller = the llm node, metadata.toolCallId = the provider's id
    const tool = await client.append(sid, {
      role: "code",
      name: "read_file",
      caller: l1.node.id,
      input: { path: "db/schema.sql" },
      output: "CREATE TABLE users (id INTEGER PRIMARY KEY);",
      metadata: { toolCallId: "call_1" },
    });
    assert.equal(tool.head, l1.node.id, "a nested call never moves HEAD");
    assert.equal(tool.node.caller, l1.node.id);
    assert.equal(tool.node.predecessor ?? null, null);
    assert.equal((tool.node.metadata as any).toolCallId, "call_1");

    const l2 = await client.append(sid, {
      role: "llm",
      name: "gpt-4o",
      predecessor: l1.node.id,
      output: "Here is the migration: ALTER TABLE users ADD COLUMN email TEXT;",
    });
    assert.equal(l2.head, l2.node.id);

    const got = await client.getNodes(sid, [tool.node.id, l1.node.id]);
    assert.deepEqual(
      got.nodes.map((n) => n.id),
      [tool.node.id, l1.node.id],
    );
    assert.equal(got.nodes[0]!.caller, l1.node.id);
    assert.equal((got.nodes[0]!.metadata as any).toolCallId, "call_1");
    assert.equal(got.nodes[0]!.output, "CREATE TABLE users (id INTEGER PRIMARY KEY);");

    // --- fork from u1 with moveHead: the new branch becomes HEAD
    const fork = await client.append(
      sid,
      { role: "user", predecessor: u1.node.id, input: "Actually, target Postgres instead." },
      { moveHead: true },
    );
    assert.equal(fork.head, fork.node.id);

    // a fork without moveHead leaves HEAD alone
    const side = await client.append(sid, { role: "user", predecessor: u1.node.id, input: "A side question." });
    assert.equal(side.head, fork.node.id);

    let br = await client.branches(sid);
    assert.equal(br.head, fork.node.id);
    const tips = br.branches.map((b) => b.head);
    assert.deepEqual(new Set(tips), new Set([l2.node.id, fork.node.id, side.node.id]));
    const main = br.branches.filter((b) => b.main);
    assert.equal(main.length, 1);
    assert.equal(main[0]!.head, l2.node.id, "the main lane follows the first child");
    assert.equal(main[0]!.length, 3);
    assert.equal(br.branches.find((b) => b.current)!.head, fork.node.id);
    assert.equal(br.branches.find((b) => b.head === fork.node.id)!.length, 2);

    // --- checkout back to the main tip
    const co = await client.checkout(sid, l2.node.id);
    assert.deepEqual(co, { head: l2.node.id, previous: fork.node.id });

    // history: oldest first, ROOT excluded, nested calls excluded
    let hist = await client.history(sid);
    assert.equal(hist.head, l2.node.id);
    assert.deepEqual(
      hist.nodes.map((n) => n.id),
      [u1.node.id, l1.node.id, l2.node.id],
    );
    const forkHist = await client.history(sid, fork.node.id);
    assert.deepEqual(
      forkHist.nodes.map((n) => n.id),
      [u1.node.id, fork.node.id],
    );

    // --- rewind by steps, then to a node, and not off the branch
    const back1 = await client.rewind(sid, { steps: 1 });
    assert.deepEqual(back1, { head: l1.node.id, previous: l2.node.id });
    const backTo = await client.rewind(sid, { nodeId: u1.node.id });
    assert.deepEqual(backTo, { head: u1.node.id, previous: l1.node.id });
    const off = await rejection(() => client.rewind(sid, { nodeId: fork.node.id }));
    assert.equal(errorKind(off), "InvalidEdge");
    hist = await client.history(sid);
    assert.deepEqual(
      hist.nodes.map((n) => n.id),
      [u1.node.id],
    );
    const checkoutNested = await rejection(() => client.checkout(sid, tool.node.id));
    assert.equal(errorKind(checkoutNested), "InvalidEdge", "HEAD is never a nested call");

    // --- a spawn branch off the tool call (a sub-agent): HEAD stays
    const sp = await client.spawnBranch(sid, tool.node.id, { name: "subagent", source: "task" });
    assert.equal(sp.head, u1.node.id, "session/spawn leaves HEAD where it was");
    assert.equal(sp.node.caller, tool.node.id);
    assert.equal(sp.node.predecessor ?? null, null);
    assert.equal((sp.node.metadata as any).spawn_branch_root, true);

    const sub1 = await client.append(sid, { role: "user", predecessor: sp.node.id, input: "Inspect the indexes." });
    assert.equal(sub1.head, u1.node.id, "appending on another branch does not move HEAD");
    const sub2 = await client.append(sid, { role: "llm", predecessor: sub1.node.id, output: "Two indexes found." });

    br = await client.branches(sid);
    const spawnBranch = br.branches.find((b) => b.spawn);
    assert.ok(spawnBranch, "branches lists the spawn branch");
    assert.equal(spawnBranch.head, sub2.node.id);
    assert.equal(spawnBranch.root, sp.node.id);
    assert.equal(spawnBranch.name, "subagent");
    assert.equal(spawnBranch.length, 3);
    assert.equal(spawnBranch.main, false);
    assert.equal(br.branches.filter((b) => !b.spawn).length, 3);

    const subHist = await client.history(sid, sub2.node.id);
    assert.deepEqual(
      subHist.nodes.map((n) => n.id),
      [sp.node.id, sub1.node.id, sub2.node.id],
    );

    // --- the session record
    const info = await client.sessionGet(sid);
    assert.equal(info.sessionId, sid);
    assert.equal(info.title, "ledger scenario");
    assert.equal(info.rootId, s.rootId);
    assert.equal(info.head, u1.node.id);
    assert.ok(info.nodeCount >= 9, `nodeCount ${info.nodeCount} counts every node`);
    assert.equal((info.metadata as any)?.origin, "ts-test");
  });

  test("a running node is finished by node/update; sessions are renamed, listed, deleted", async () => {
    const s = await client.sessionCreate({ title: "update" });
    const u = await client.append(s.sessionId, { role: "user", predecessor: s.head, input: "run the tests" });
    const l = await client.append(s.sessionId, { role: "llm", predecessor: u.node.id, output: "running them" });
    const run = await client.append(s.sessionId, {
      role: "code",
      name: "bash",
      caller: l.node.id,
      input: { cmd: "pytest" },
      status: "running",
      metadata: { toolCallId: "call_9" },
    });
    assert.equal(run.node.status, "running");
    const done = await client.update(s.sessionId, run.node.id, { status: "completed", output: "12 passed" });
    assert.equal(done.node.status ?? "completed", "completed");
    assert.equal(done.node.output, "12 passed");
    const again = await rejection(() => client.update(s.sessionId, run.node.id, { status: "error" }));
    assert.equal(errorKind(again), "NotRunning");

    const renamed = await client.sessionRename(s.sessionId, "renamed");
    assert.equal(renamed.title, "renamed");
    const list = await client.sessionList({ limit: 100 });
    assert.ok(list.sessions.some((x) => x.sessionId === s.sessionId && x.title === "renamed"));
    const del = await client.sessionDelete(s.sessionId);
    assert.equal(del.deleted, true);
    assert.equal(del.nodesRemoved >= 3, true);
    assert.equal(errorKind(await rejection(() => client.sessionGet(s.sessionId))), "SessionNotFound");
  });

  test("session/export → a transcript file → session/import names the same conversation (no copy)", async (t) => {
    for (const m of ["session/export", "session/import"]) {
      if (!client.supports(m)) {
        t.skip(skipMessage(m));
        return;
      }
    }
    const s = await client.sessionCreate({ title: "round trip" });
    const u = await client.append(s.sessionId, { role: "user", predecessor: s.head, input: "Add an index on users.email." });
    const l = await client.append(s.sessionId, { role: "llm", name: "claude", predecessor: u.node.id, output: "Checking the schema." });
    await client.append(s.sessionId, {
      role: "code",
      name: "read_file",
      caller: l.node.id,
      input: { path: "schema.sql" },
      output: "CREATE TABLE users (email TEXT);",
      metadata: { toolCallId: "toolu_01" },
    });
    await client.append(s.sessionId, { role: "llm", name: "claude", predecessor: l.node.id, output: "Index added." });

    const ex = await client.export(s.sessionId, { format: "claude-code" });
    assert.equal(ex.format, "claude-code");
    assert.ok(ex.lines > 0);
    assert.equal(typeof ex.content, "string");
    const file = join(dir.path, "transcript.jsonl");
    writeFileSync(file, ex.content!);

    const im = await client.importPath(file);
    assert.equal(im.sessions.length, 1);
    const imported = im.sessions[0]!;
    // the file names its source session, which is in this database: already present (SPEC §1)
    assert.equal(imported.created, false);
    assert.equal(imported.sessionId, s.sessionId);
    assert.equal(imported.toolPairs, 1);
    const hist = await client.history(imported.sessionId);
    const text = JSON.stringify(hist.nodes);
    for (const needle of ["Add an index on users.email.", "Checking the schema.", "Index added."]) {
      assert.ok(text.includes(needle), `the imported branch holds ${JSON.stringify(needle)}`);
    }
    const again = await client.importPath(file);
    assert.equal(again.sessions[0]!.sessionId, imported.sessionId);
    assert.equal(again.sessions[0]!.created, false, "importing the same transcript twice does not duplicate it");

    const missing = await rejection(() => client.importPath(join(dir.path, "no-such-file.jsonl")));
    assert.ok(errorKind(missing), "a missing file is an error answer with a kind");
  });

  test("search finds English words and a Chinese word inside a sentence", async () => {
    const a = await client.sessionCreate({ title: "search" });
    const zh = await client.append(a.sessionId, {
      role: "user",
      predecessor: a.head,
      input: "我们需要写一个数据库迁移脚本",
    });
    const en = await client.append(a.sessionId, {
      role: "llm",
      predecessor: zh.node.id,
      output: "I will refactor the authentication middleware first.",
    });
    const b = await client.sessionCreate({ title: "other" });
    await client.append(b.sessionId, { role: "user", predecessor: b.head, input: "authentication tokens expire too soon" });

    const cjk = await client.search("迁移", { sessionId: a.sessionId });
    assert.equal(cjk.hits.length, 1);
    assert.equal(cjk.hits[0]!.nodeId, zh.node.id);
    assert.equal(cjk.hits[0]!.sessionId, a.sessionId);
    assert.match(cjk.hits[0]!.snippet, /迁移/);
    assert.equal(typeof cjk.hits[0]!.score, "number");

    const word = await client.search("authentication", { sessionId: a.sessionId });
    assert.deepEqual(
      word.hits.map((h) => h.nodeId),
      [en.node.id],
    );
    assert.equal(word.hits[0]!.role, "llm");

    const everywhere = await client.search("authentication");
    assert.deepEqual(new Set(everywhere.hits.map((h) => h.sessionId)), new Set([a.sessionId, b.sessionId]));

    const onlyUsers = await client.search("authentication", { roles: ["user"] });
    assert.deepEqual(
      onlyUsers.hits.map((h) => h.sessionId),
      [b.sessionId],
    );

    assert.equal((await client.search("kubernetes")).hits.length, 0);
    assert.equal(errorKind(await rejection(() => client.search("   "))), "InvalidQuery");
  });
});

describe("node notifications", { timeout: 60_000 }, () => {
  let dir: TempDir;

  before(() => {
    dir = tempDir();
  });
  after(() => dir.remove());

  test("observeNodes: node/didAppend and node/didUpdate arrive for every write", async () => {
    const client = await spawnClient(dir, { initializationOptions: { observeNodes: true } });
    try {
      const appended: NodeNotification[] = [];
      const updated: NodeNotification[] = [];
      const sub = client.onNotification("node/didAppend", (p) => appended.push(p));
      client.onNotification("node/didUpdate", (p) => updated.push(p));

      const s = await client.sessionCreate({ title: "observed" });
      const u = await client.append(s.sessionId, { role: "user", predecessor: s.head, input: "hello" });
      const l = await client.append(s.sessionId, { role: "llm", predecessor: u.node.id, output: "calling a tool" });
      const t = await client.append(s.sessionId, { role: "code", caller: l.node.id, name: "ls", status: "running" });
      await client.update(s.sessionId, t.node.id, { status: "completed", output: "a.txt" });
      const sp = await client.spawnBranch(s.sessionId, t.node.id);

      await waitFor(() => appended.length === 4 && updated.length === 1, 5_000, "4 didAppend + 1 didUpdate");
      assert.deepEqual(
        appended.map((n) => n.node.id),
        [u.node.id, l.node.id, t.node.id, sp.node.id],
      );
      assert.ok(appended.every((n) => n.sessionId === s.sessionId));
      assert.equal(appended[0]!.head, u.node.id);
      assert.equal(appended[2]!.head, l.node.id, "the head after a nested call is unchanged");
      assert.equal(updated[0]!.node.id, t.node.id);
      assert.equal(updated[0]!.node.output, "a.txt");

      // unsubscribing stops delivery
      sub.dispose();
      await client.append(s.sessionId, { role: "user", predecessor: l.node.id, input: "more" });
      await client.sessionList();
      assert.equal(appended.length, 4);
    } finally {
      await client.close();
    }
  });

  test("logMessages: the daemon's warnings arrive as window/logMessage", async () => {
    const client = await spawnClient(dir, { database: dir.db("log.db"), initializationOptions: { logMessages: true } });
    try {
      const logs: { type: number; message: string }[] = [];
      client.onNotification("window/logMessage", (p) => logs.push(p));
      // the daemon logs (and otherwise ignores) a notification it does not know
      await client.connection.sendNotification("bogus/notification", { x: 1 });
      await waitFor(() => logs.some((l) => l.message.includes("bogus/notification")), 5_000, "a window/logMessage");
      const line = logs.find((l) => l.message.includes("bogus/notification"))!;
      assert.equal(line.type, 2, "a warning (LSP MessageType.Warning)");
      assert.ok(client.alive);
      assert.ok((await client.sessionList()).total >= 0);
    } finally {
      await client.close();
    }
  });

  test("without observeNodes no node notifications are sent", async () => {
    const client = await spawnClient(dir, { database: dir.db("quiet.db") });
    try {
      let count = 0;
      client.onNotification("node/didAppend", () => count++);
      const s = await client.sessionCreate();
      await client.append(s.sessionId, { role: "user", predecessor: s.head, input: "hello" });
      await client.sessionList();
      assert.equal(count, 0);
    } finally {
      await client.close();
    }
  });
});
