// A minimal coding agent on dagctx (TypeScript): the whole loop, nothing hidden.
//
// Each step: context/prepare (system prompt + history under the model's budget, OpenAI
// format; when it recommends compaction, context/compact first — the daemon gets the
// summary from the same endpoint: samplingEndpoint — and prepare again) → an
// OpenAI-compatible chat completion with tools → the reply appended as an llm node (with
// the prepare's renderId, so context/replay rebuilds what the model saw) and each tool
// call as a code node, running while it runs, completed/error after → usage/report with
// the provider's numbers (they calibrate the next prepare's count). A compaction that
// found nothing to fold is not tried again in the same turn: within a turn dagctx
// reduces what the model sees by itself.
//
//   node dist/agent.js --base-url https://api.openai.com/v1 --model gpt-4o \
//       --workspace ./scratch "Add a README to this project"
//
// The tools only touch files inside --workspace. The key is read from the environment
// variable named by --api-key-env (default OPENAI_API_KEY), by this process and the daemon.

import { mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";
import { parseArgs } from "node:util";

import { DagctxClient } from "dagctx-client";

const TOOLS = [
  { type: "function", function: { name: "read_file", description: "Read a text file of the workspace.",
    parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } } },
  { type: "function", function: { name: "write_file", description: "Create or overwrite a text file of the workspace.",
    parameters: { type: "object", properties: { path: { type: "string" }, content: { type: "string" } }, required: ["path", "content"] } } },
  { type: "function", function: { name: "list_files", description: "List the files of the workspace (or of one folder in it).",
    parameters: { type: "object", properties: { path: { type: "string" } } } } },
];
const IDENTITY = "You are a careful coding agent. Use the tools to read and change files in the workspace.";

interface ToolCall { id: string; function: { name: string; arguments?: string } }
interface ChatMessage { role: string; content?: string | null; tool_calls?: ToolCall[] }
interface ChatReply {
  choices: { message: ChatMessage }[];
  usage?: { prompt_tokens?: number; completion_tokens?: number; prompt_tokens_details?: { cached_tokens?: number } };
}

class ToolFailed extends Error {}

function inside(workspace: string, rel: string): string {
  const path = resolve(workspace, rel);
  if (path !== workspace && !path.startsWith(workspace + sep)) throw new ToolFailed(`${JSON.stringify(rel)} is outside the workspace`);
  return path;
}

function listFiles(root: string, workspace: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(root)) {
    const p = join(root, name);
    if (statSync(p).isDirectory()) out.push(...listFiles(p, workspace));
    else out.push(relative(workspace, p));
  }
  return out.sort();
}

function runTool(workspace: string, name: string, args: Record<string, unknown>): string {
  const rel = typeof args.path === "string" ? args.path : "";
  if (name === "read_file") {
    const p = inside(workspace, rel);
    try {
      return readFileSync(p, "utf8");
    } catch {
      throw new ToolFailed(`no file ${JSON.stringify(rel)} in the workspace`);
    }
  }
  if (name === "write_file") {
    const p = inside(workspace, rel);
    const content = typeof args.content === "string" ? args.content : "";
    mkdirSync(dirname(p), { recursive: true });
    writeFileSync(p, content, "utf8");
    return `wrote ${Buffer.byteLength(content)} bytes to ${rel}`;
  }
  if (name === "list_files") return listFiles(inside(workspace, rel || "."), workspace).join("\n") || "(empty)";
  throw new ToolFailed(`unknown tool ${JSON.stringify(name)}`);
}

async function chat(baseUrl: string, apiKey: string | undefined, body: unknown): Promise<ChatReply> {
  const res = await fetch(baseUrl.replace(/\/$/, "") + "/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json", ...(apiKey ? { Authorization: `Bearer ${apiKey}` } : {}) },
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`the chat endpoint answered HTTP ${res.status}: ${(await res.text()).slice(0, 500)}`);
  return (await res.json()) as ChatReply;
}

async function main(): Promise<number> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      "base-url": { type: "string", default: process.env.OPENAI_BASE_URL ?? "https://api.openai.com/v1" },
      model: { type: "string", default: "gpt-4o" },
      "api-key-env": { type: "string", default: "OPENAI_API_KEY" },
      workspace: { type: "string", default: "." },
      db: { type: "string" },
      session: { type: "string" },
      "max-steps": { type: "string", default: "12" },
      "keep-recent-tokens": { type: "string" },
      "context-window": { type: "string" },
    },
  });
  const task = positionals.join(" ");
  if (!task) {
    console.error("usage: agent [--base-url URL] [--model M] [--workspace DIR] [--db FILE] [--session ID] TASK");
    return 2;
  }
  const baseUrl = values["base-url"]!;
  const model = values.model!;
  const workspace = resolve(values.workspace!);
  mkdirSync(workspace, { recursive: true });
  const apiKeyEnv = values["api-key-env"]!;
  const apiKey = process.env[apiKeyEnv];
  const client = await DagctxClient.spawn({
    database: values.db,
    initializationOptions: {
      samplingEndpoint: { baseUrl, model, apiKeyEnv },
      // the model's window, for a model dagctx's table does not know
      ...(values["context-window"] ? { models: { [model]: { contextWindow: Number(values["context-window"]) } } } : {}),
    },
  });
  try {
    let sid: string;
    let head: string;
    if (values.session) {
      sid = values.session;
      head = (await client.sessionGet(sid)).head;
    } else {
      const s = await client.sessionCreate({ title: `agent: ${task.slice(0, 60)}` });
      sid = s.sessionId;
      head = s.head;
    }
    console.log(`session ${sid}`);
    head = (await client.append(sid, { role: "user", output: task, predecessor: head })).head;

    const prepare = () => client.prepare(sid, { model, format: "openai", tools: TOOLS, promptMode: "minimal", identity: IDENTITY });
    let nothingToFold = false; // a compaction of this turn found nothing: not again this turn
    for (let step = 0; step < Number(values["max-steps"]); step++) {
      let prep = await prepare();
      if (prep.recommendCompaction && !nothingToFold) {
        const keep = values["keep-recent-tokens"];
        const res = await client.compact(sid, { model, keepRecentTokens: keep ? Number(keep) : null });
        console.log(`  compaction: ${res.ok && res.summaryId ? `summary ${res.summaryId}` : res.reason} (${res.tokensBefore} → ${res.tokensAfter} tokens)`);
        if (res.ok && res.summaryId) prep = await prepare();
        else nothingToFold = true;
      }
      const reply = await chat(baseUrl, apiKey, { model, messages: prep.messages, tools: TOOLS });
      const msg = reply.choices[0]!.message;
      const calls = msg.tool_calls ?? [];
      const llm = await client.append(sid, { role: "llm", name: model, output: msg.content ?? "", predecessor: head }, { renderId: prep.renderId });
      head = llm.head;
      const u = reply.usage;
      if (u?.prompt_tokens) {
        const cached = u.prompt_tokens_details?.cached_tokens ?? 0;
        await client.usageReport(sid, llm.node.id,
          { input: u.prompt_tokens - cached, output: u.completion_tokens ?? 0, cacheRead: cached }, model);
      }
      for (const call of calls) {
        let args: Record<string, unknown>;
        try {
          args = JSON.parse(call.function.arguments || "{}") as Record<string, unknown>;
        } catch {
          args = { raw: call.function.arguments };
        }
        const code = await client.append(sid, {
          role: "code", name: call.function.name, input: args, status: "running", caller: llm.node.id, metadata: { toolCallId: call.id },
        });
        let out: string;
        let status: "completed" | "error";
        try {
          out = runTool(workspace, call.function.name, args);
          status = "completed";
        } catch (e) {
          if (!(e instanceof ToolFailed)) throw e;
          out = `error: ${e.message}`;
          status = "error";
        }
        await client.update(sid, code.node.id, { status, output: out });
        console.log(`  tool ${call.function.name} ${JSON.stringify(args).slice(0, 80)} → ${status}`);
      }
      if (calls.length === 0) {
        console.log(msg.content ?? "");
        return 0;
      }
    }
    console.error(`stopped after ${values["max-steps"]} steps`);
    return 1;
  } finally {
    await client.close();
  }
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  },
);
