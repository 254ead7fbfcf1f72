#!/usr/bin/env node
// Watch one dagctx session live: print every node/didAppend, node/didUpdate and
// session/didChange as a JSON line, whichever client or process wrote it.
//
//   node scripts/watch-session.mjs SESSION_ID [--db PATH] [--standalone]
//
// The daemon is the user's shared one (through `dagctx serve`), so changes made by an
// editor, an agent or the CLI all show up here. The first line is {"ready": ...}.

import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { DagctxClient } = require("../dist/index.js");

const argv = process.argv.slice(2);
const sessionId = argv.find((a, i) => !a.startsWith("--") && argv[i - 1] !== "--db");
if (!sessionId) {
  process.stderr.write("usage: watch-session.mjs SESSION_ID [--db PATH] [--standalone]\n");
  process.exit(2);
}
const dbAt = argv.indexOf("--db");
const client = await DagctxClient.spawn({
  database: dbAt >= 0 ? argv[dbAt + 1] : undefined,
  standalone: argv.includes("--standalone"),
  clientInfo: { name: "watch-session.mjs" },
});
await client.watch(sessionId, (event) => {
  process.stdout.write(JSON.stringify({ ...event, t: Date.now() }) + "\n");
});
process.stdout.write(JSON.stringify({ ready: true, connectionId: client.connectionId, t: Date.now() }) + "\n");
const stop = async () => {
  await client.close().catch(() => undefined);
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
process.stdin.on("end", stop);
process.stdin.resume();
