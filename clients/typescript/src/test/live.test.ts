// Live sessions: watch() subscribes and hears every change of one session, whoever
// writes it — two clients, each through its own `dagctx serve`.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { DagctxClient, type SessionEvent } from "../client";
import { spawnClient, tempDir, waitFor, type TempDir } from "../test-support/helpers";

// Through the shared daemon both clients are connections of one process (their ids
// differ and name the writer); with DAGCTX_STANDALONE each has its own daemon.
const shared = !["1", "true", "yes", "on"].includes((process.env.DAGCTX_STANDALONE ?? "").toLowerCase());

describe("live sessions", { timeout: 60_000, skip: shared ? false : "needs the shared daemon" }, () => {
  let dir: TempDir;
  let writer: DagctxClient;
  let watcher: DagctxClient;

  before(async () => {
    dir = tempDir();
    writer = await spawnClient(dir);
    watcher = await spawnClient(dir);
  });

  after(async () => {
    await writer.close();
    await watcher.close();
    dir.remove();
  });

  test("watch() hears another client's appends, HEAD moves and renames, each naming its origin", async () => {
    const s = await writer.sessionCreate({ title: "watched" });
    const seen: SessionEvent[] = [];
    const sub = await watcher.watch(s.sessionId, (e) => seen.push(e));
    const u = await writer.append(s.sessionId, { role: "user", predecessor: s.head, output: "hello" });
    await waitFor(() => seen.some((e) => e.method === "node/didAppend"), 5_000, "node/didAppend");
    const appended = seen.find((e) => e.method === "node/didAppend")!;
    assert.equal(appended.method === "node/didAppend" && appended.params.node.id, u.node.id);
    assert.equal(appended.params.origin, writer.connectionId, "names the writer's connection");
    assert.notEqual(writer.connectionId, watcher.connectionId);
    await writer.checkout(s.sessionId, s.rootId);
    await waitFor(() => seen.some((e) => e.method === "session/didChange" && e.params.change === "head"), 5_000, "head");
    await writer.sessionRename(s.sessionId, "renamed");
    await waitFor(() => seen.some((e) => e.method === "session/didChange" && e.params.change === "renamed"), 5_000,
      "renamed");
    sub.dispose();
    const before = seen.length;
    await writer.append(s.sessionId, { role: "user", predecessor: s.rootId, output: "unheard" });
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(seen.length, before, "nothing after dispose (unsubscribed)");
  });
});
