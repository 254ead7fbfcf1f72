// N sequential `session/get` round trips: the TypeScript client vs the Python client.
//
//   npm run build && node bench/roundtrip.mjs [N] [ROUNDS]     (defaults: 3000, 3; or BENCH_N, BENCH_ROUNDS)
//
// Each round, each client spawns its own daemon on its own temp database, creates
// one session, warms up, then times N awaited requests one after another
// (latency-bound: one request in flight). The rounds alternate TS and Python so
// machine noise hits both; the median round of each is reported, with the ratio.

import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const { DagctxClient, resolveCommand } = require(join(HERE, "..", "dist", "index.js"));

const N = Number(process.argv[2] ?? process.env.BENCH_N ?? 3000);
const ROUNDS = Number(process.argv[3] ?? process.env.BENCH_ROUNDS ?? 3);
const WARMUP = 500;

async function benchTs(db) {
  const client = await DagctxClient.spawn({ database: db });
  try {
    const { sessionId } = await client.sessionCreate({ title: "bench-ts" });
    for (let i = 0; i < WARMUP; i++) await client.sessionGet(sessionId);
    const start = process.hrtime.bigint();
    for (let i = 0; i < N; i++) await client.sessionGet(sessionId);
    const seconds = Number(process.hrtime.bigint() - start) / 1e9;
    return { client: "typescript", n: N, seconds, rps: N / seconds };
  } finally {
    await client.close();
  }
}

function benchPy(db) {
  // The interpreter that runs the daemon for the TS client runs the Python client too.
  const command = resolveCommand({});
  const python = command[1] === "-m" ? command[0] : "python3";
  const out = execFileSync(
    python,
    [join(HERE, "py_roundtrip.py"), "--db", db, "--n", String(N), "--warmup", String(WARMUP)],
    { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] },
  );
  return JSON.parse(out.trim().split("\n").pop());
}

function median(results) {
  const sorted = [...results].sort((a, b) => a.rps - b.rps);
  return sorted[Math.floor(sorted.length / 2)];
}

const fmt = (r) =>
  `${r.client.padEnd(10)} ${r.rps.toFixed(0).padStart(7)} req/s  (${r.n} x session/get in ${r.seconds.toFixed(3)} s, ` +
  `${((r.seconds / r.n) * 1e6).toFixed(0)} µs each)`;

const dir = mkdtempSync(join(tmpdir(), "dagctx-bench-"));
try {
  const ts = [];
  const py = [];
  for (let round = 0; round < ROUNDS; round++) {
    ts.push(await benchTs(join(dir, `ts-${round}.db`)));
    py.push(benchPy(join(dir, `py-${round}.db`)));
    console.log(`round ${round + 1}: typescript ${ts[round].rps.toFixed(0)} req/s, python ${py[round].rps.toFixed(0)} req/s`);
  }
  const t = median(ts);
  const p = median(py);
  console.log(`median of ${ROUNDS} rounds:`);
  console.log(fmt(t));
  console.log(fmt(p));
  console.log(`ratio TS/Python: ${(t.rps / p.rps).toFixed(2)}x`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
