// dagctx's recall tools as OpenClaw agent tools: what compaction folded away stays
// recoverable by the model itself — search the session's history, read one node whole
// (paged by characters), expand a compaction summary into the turns it replaced. The same
// three operations as the MCP face (`dagctx mcp`: search_history, read_node,
// expand_summary), answered over the engine's shared daemon connection. Answers are plain
// text a model reads easily (a header line per item), bounded in size with an explicit
// way to get the next page; `details` carries the same data structured.

import type { DagctxClient } from "dagctx-client";

import type { DagctxContextEngine } from "./engine";

/** Characters of one tool answer (about 2k tokens): the rest is paged. */
export const ANSWER_CHARS = 8_000;

export interface ToolContext {
  sessionId?: string;
  sessionKey?: string;
}

interface ToolResult {
  content: { type: "text"; text: string }[];
  details: unknown;
}

export interface RecallTool {
  name: string;
  label: string;
  description: string;
  parameters: Record<string, unknown>;
  catalogMode: "direct-only";
  execute: (toolCallId: string, params: unknown, signal?: AbortSignal) => Promise<ToolResult>;
}

export const TOOL_NAMES = ["dagctx_search", "dagctx_read", "dagctx_expand"] as const;

function text(body: string, details: unknown): ToolResult {
  return { content: [{ type: "text", text: body }], details };
}

function nodeText(v: unknown): string {
  if (v === null || v === undefined) return "";
  return typeof v === "string" ? v : JSON.stringify(v, null, 1);
}

function str(p: Record<string, unknown>, key: string): string {
  const v = p[key];
  if (typeof v !== "string" || v.trim() === "") throw new Error(`${key} is required: a non-empty string`);
  return v.trim();
}

function int(p: Record<string, unknown>, key: string, dflt: number, min: number, max: number): number {
  const v = p[key];
  if (v === undefined || v === null) return dflt;
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) throw new Error(`${key} must be an integer from ${min} to ${max}`);
  return v;
}

/** The three tools, bound to the calling run's session. */
export function recallTools(engine: DagctxContextEngine, ctx: ToolContext): RecallTool[] {
  const session = async (): Promise<{ c: DagctxClient; sid: string }> => {
    const sid = await engine.sessionForTools(ctx.sessionId, ctx.sessionKey);
    if (sid === null) throw new Error("this run has no dagctx session yet (dagctx records a session from its first turn)");
    return { c: await engine.connection(), sid };
  };

  const search: RecallTool = {
    name: "dagctx_search",
    label: "Search history (dagctx)",
    description:
      "Search everything this conversation recorded, including what was summarized away: user messages, " +
      "your replies, tool calls and their full outputs. Words, code identifiers, \"phrases\", prefix*, AND/OR/NOT. " +
      "Each hit gives a nodeId for dagctx_read.",
    parameters: {
      type: "object",
      additionalProperties: false,
      properties: {
        query: { type: "string", minLength: 1, description: "the search expression" },
        limit: { type: "integer", minimum: 1, maximum: 50, description: "at most this many hits (default 10)" },
      },
      required: ["query"],
    },
    catalogMode: "direct-only",
    async execute(_id, raw) {
      const p = (raw ?? {}) as Record<string, unknown>;
      const query = str(p, "query");
      const limit = int(p, "limit", 10, 1, 50);
      const { c, sid } = await session();
      const res = await c.search(query, { sessionId: sid, limit });
      if (res.hits.length === 0) return text(`No hits for ${JSON.stringify(query)} in this conversation's history.`, { query, hits: [] });
      const lines = [`${res.hits.length} hit(s) for ${JSON.stringify(query)} (read one whole with dagctx_read nodeId=…):`];
      let used = lines[0]!.length;
      let shown = 0;
      for (const h of res.hits) {
        const who = h.role === "llm" ? "assistant" : h.role === "code" ? `tool ${h.name}` : h.role;
        const line = `\n## nodeId ${h.nodeId} — ${who}, #${h.seq}\n${h.snippet}`;
        if (used + line.length > ANSWER_CHARS) break;
        lines.push(line);
        used += line.length;
        shown += 1;
      }
      if (shown < res.hits.length) lines.push(`\n(${res.hits.length - shown} more hit(s) left out to keep this answer short: narrow the query)`);
      return text(lines.join("\n"), { query, sessionId: sid, hits: res.hits });
    },
  };

  const read: RecallTool = {
    name: "dagctx_read",
    label: "Read a history node (dagctx)",
    description:
      "The full content of one recorded node (a message, or a tool call with its input and output), by the nodeId " +
      "from dagctx_search. Long outputs come in pages: pass offset to continue.",
    parameters: {
      type: "object",
      additionalProperties: false,
      properties: {
        nodeId: { type: "string", minLength: 1, description: "the node's id (from dagctx_search)" },
        offset: { type: "integer", minimum: 0, description: "first character of the output to return (default 0)" },
      },
      required: ["nodeId"],
    },
    catalogMode: "direct-only",
    async execute(_id, raw) {
      const p = (raw ?? {}) as Record<string, unknown>;
      const nodeId = str(p, "nodeId");
      const offset = int(p, "offset", 0, 0, Number.MAX_SAFE_INTEGER);
      const { c, sid } = await session();
      const node = (await c.getNodes(sid, [nodeId])).nodes[0];
      if (node === undefined) throw new Error(`no node ${nodeId} in this conversation's history`);
      const spill = node.metadata?.["spill"] as { chars?: number } | undefined;
      let body: string;
      let total: number;
      if (spill && typeof spill.chars === "number" && typeof node.output === "string") {
        total = spill.chars;
        const part = await c.getNodes(sid, [nodeId], { offset, length: ANSWER_CHARS });
        body = nodeText(part.nodes[0]?.output);
      } else {
        const all = nodeText(node.output);
        total = all.length;
        body = all.slice(offset, offset + ANSWER_CHARS);
      }
      const end = offset + body.length;
      const who = node.role === "llm" ? "assistant" : node.role === "code" ? `tool call ${node.name ?? ""}` : node.role;
      const head = [`# nodeId ${node.id} — ${who}, #${node.seq}, ${node.status ?? "completed"}`];
      if (node.role === "code" && offset === 0) head.push(`## input\n${nodeText(node.input).slice(0, 2_000)}`);
      if (node.name === "context/summary") head.push(`(a compaction summary: dagctx_expand nodeId=${node.id} gives the turns it replaced)`);
      head.push(`## ${node.role === "code" ? "output" : "text"} (characters ${offset}–${end} of ${total})\n${body}`);
      if (end < total) head.push(`\n(more: dagctx_read nodeId=${node.id} offset=${end})`);
      return text(head.join("\n"), { sessionId: sid, nodeId: node.id, role: node.role, name: node.name, offset, totalChars: total, nextOffset: end < total ? end : null });
    },
  };

  const expand: RecallTool = {
    name: "dagctx_expand",
    label: "Expand a summary (dagctx)",
    description:
      "The turns a compaction summary replaced, verbatim and in order, with their tool calls, in pages. " +
      "Give the summary's nodeId (a node named context/summary); pass cursor to continue.",
    parameters: {
      type: "object",
      additionalProperties: false,
      properties: {
        nodeId: { type: "string", minLength: 1, description: "the summary node's id" },
        cursor: { type: "integer", minimum: 0, description: "index of the first turn to show (from the previous page; default 0)" },
      },
      required: ["nodeId"],
    },
    catalogMode: "direct-only",
    async execute(_id, raw) {
      const p = (raw ?? {}) as Record<string, unknown>;
      const nodeId = str(p, "nodeId");
      const cursor = int(p, "cursor", 0, 0, Number.MAX_SAFE_INTEGER);
      const { c, sid } = await session();
      const node = (await c.getNodes(sid, [nodeId])).nodes[0];
      const covers = node?.metadata?.["covers_ids"];
      if (node === undefined || node.name !== "context/summary" || !Array.isArray(covers)) {
        throw new Error(`node ${nodeId} is not a compaction summary (a summary is named context/summary); find one with dagctx_search`);
      }
      const ids = (covers as string[]).slice(cursor, cursor + 50);
      const got = ids.length ? await c.request("node/get", { sessionId: sid, ids, includeCallees: true }) : { nodes: [], callees: [] };
      const callsOf = new Map<string, typeof got.nodes>();
      for (const k of got.callees ?? []) {
        const list = callsOf.get(k.caller ?? "") ?? [];
        list.push(k);
        callsOf.set(k.caller ?? "", list);
      }
      const out = [`# summary ${nodeId}: turns ${cursor + 1}–… of ${covers.length} it replaced`];
      let used = out[0]!.length;
      let next = cursor;
      for (const n of got.nodes) {
        const who = n.role === "llm" ? "assistant" : n.role === "code" ? `tool ${n.name ?? ""}` : n.role;
        let block = `\n## nodeId ${n.id} — ${who}, #${n.seq}\n${nodeText(n.output).slice(0, 2_000)}`;
        for (const k of callsOf.get(n.id) ?? []) block += `\n- tool ${k.name ?? ""} (nodeId ${k.id}): ${nodeText(k.output).slice(0, 400)}`;
        if (used + block.length > ANSWER_CHARS && next > cursor) break;
        out.push(block);
        used += block.length;
        next += 1;
      }
      if (next < covers.length) out.push(`\n(more: dagctx_expand nodeId=${nodeId} cursor=${next})`);
      return text(out.join("\n"), { sessionId: sid, summaryId: nodeId, totalTurns: covers.length, nextCursor: next < covers.length ? next : null });
    },
  };

  return [search, read, expand];
}

/** Where the memory tools look: the workspace OpenClaw runs the agent in (its tool context). */
export interface MemoryToolContext {
  workspaceDir?: string;
}

export const MEMORY_TOOL_NAMES = ["memory_search", "memory_get"] as const;

/** The error a model can act on: dagctx's message and kind, as a tool result (not a throw). */
function memoryError(err: unknown): ToolResult | null {
  const e = err as { message?: string; data?: { kind?: string } } | undefined;
  const kind = e?.data?.kind;
  if (kind === "InvalidParams" || kind === "WorkspaceEscape" || kind === "ChunkNotFound") {
    return text(`memory: ${e?.message ?? String(err)} (${kind})`, { error: { kind, message: e?.message } });
  }
  return null;
}

/**
 * `memory_search` / `memory_get` as OpenClaw's memory tools, over dagctx's memory index of
 * the run's workspace (SPEC §5.1): MEMORY.md and memory/*.md, chunked with line ranges,
 * brought up to date before each search; searched by the keywords of a plain question, with
 * MMR. A path out of the workspace is refused by the daemon (WorkspaceEscape).
 */
export function memoryTools(engine: DagctxContextEngine, ctx: MemoryToolContext): RecallTool[] {
  const workspace = (): string => {
    const ws = ctx.workspaceDir;
    if (typeof ws !== "string" || ws === "") throw new Error("memory tools: this run has no workspace folder");
    return ws;
  };

  const search: RecallTool = {
    name: "memory_search",
    label: "Search memory (dagctx)",
    description:
      "Search the workspace's memory files (MEMORY.md, memory/*.md) for what was noted or decided before; with " +
      "sources [\"memory\",\"sessions\"] recorded conversations too. Ask in plain words. Each hit names its file, " +
      "lines and a chunkId for memory_get.",
    parameters: {
      type: "object",
      additionalProperties: false,
      properties: {
        query: { type: "string", minLength: 1, description: "what to look for, in plain words" },
        maxResults: { type: "integer", minimum: 1, maximum: 50, description: "at most this many hits (default 6)" },
        sources: { type: "array", items: { enum: ["memory", "sessions"] }, description: "where to look (default memory)" },
      },
      required: ["query"],
    },
    catalogMode: "direct-only",
    async execute(_id, raw) {
      const p = (raw ?? {}) as Record<string, unknown>;
      const query = str(p, "query");
      const maxResults = int(p, "maxResults", 6, 1, 50);
      const sources = Array.isArray(p["sources"]) && p["sources"].length ? (p["sources"] as ("memory" | "sessions")[]) : ["memory" as const];
      const ws = workspace();
      const c = await engine.connection();
      try {
        const idx = sources.includes("memory") ? await c.request("memory/index", { workspace: ws }) : null;
        const res = await c.request("memory/search", { query, workspace: ws, maxResults, sources, mmr: { lambda: 0.7 } });
        const notIndexed = (idx?.skipped ?? []).map((s) => s.note);
        const lines = [`# memory_search ${JSON.stringify(query)}: ${res.hits.length ? `${res.hits.length} hit(s)` : "no hits"}` +
          (res.keywords.length ? ` (keywords: ${res.keywords.join(" ")})` : "")];
        let used = lines[0]!.length;
        let shown = 0;
        for (const h of res.hits) {
          const where = h.source === "memory" ? `${h.path} lines ${h.startLine}–${h.endLine} · chunkId ${h.chunkId}` : `session ${h.sessionId} · node ${h.nodeId}`;
          const block = `\n## ${where} · score ${h.score.toFixed(3)}\n${h.text.slice(0, 2_000)}`;
          if (used + block.length > ANSWER_CHARS && shown > 0) break;
          lines.push(block);
          used += block.length;
          shown += 1;
        }
        if (notIndexed.length) lines.push(`\nNot indexed (${notIndexed.length}):\n` + notIndexed.slice(0, 5).map((n) => `- ${n}`).join("\n"));
        return text(lines.join("\n"), { query, keywords: res.keywords, hits: res.hits.slice(0, shown), notIndexed });
      } catch (err) {
        const out = memoryError(err);
        if (out) return out;
        throw err;
      }
    },
  };

  const get: RecallTool = {
    name: "memory_get",
    label: "Read memory (dagctx)",
    description:
      "Read a memory file by lines: a chunkId from memory_search, or path (MEMORY.md or memory/…, relative to the " +
      "workspace) from fromLine for lines lines.",
    parameters: {
      type: "object",
      additionalProperties: false,
      properties: {
        chunkId: { type: "string", minLength: 1, description: "a chunkId from memory_search" },
        path: { type: "string", minLength: 1, description: "a memory file, relative to the workspace" },
        fromLine: { type: "integer", minimum: 1, description: "first line, 1-based (default 1)" },
        lines: { type: "integer", minimum: 1, maximum: 2000, description: "how many lines (default: the rest, up to 2000)" },
      },
    },
    catalogMode: "direct-only",
    async execute(_id, raw) {
      const p = (raw ?? {}) as Record<string, unknown>;
      const chunkId = typeof p["chunkId"] === "string" ? p["chunkId"] : undefined;
      const path = typeof p["path"] === "string" ? p["path"] : undefined;
      if ((chunkId === undefined) === (path === undefined)) throw new Error("give exactly one of chunkId (from memory_search) and path (a memory file)");
      const fromLine = int(p, "fromLine", 1, 1, Number.MAX_SAFE_INTEGER);
      const lines = int(p, "lines", 2000, 1, 2000);
      const c = await engine.connection();
      try {
        const res = await c.request("memory/get", { workspace: workspace(), ...(chunkId ? { chunkId } : { path }), fromLine, lines });
        let body = res.text;
        let end = res.endLine;
        if (body.length > ANSWER_CHARS) {
          const kept = body.slice(0, ANSWER_CHARS).split("\n");
          if (kept.length > 1) kept.pop();
          body = kept.join("\n");
          end = res.startLine + kept.length - 1;
        }
        const more = end < res.totalLines && !res.chunkId ? `\n\n(more: memory_get path=${res.path} fromLine=${end + 1})` : "";
        return text(`# ${res.path} lines ${res.startLine}–${end} of ${res.totalLines}\n${body}${more}`,
          { path: res.path, startLine: res.startLine, endLine: end, totalLines: res.totalLines, chunkId: res.chunkId ?? null, text: body });
      } catch (err) {
        const out = memoryError(err);
        if (out) return out;
        throw err;
      }
    },
  };

  return [search, get];
}
