// OpenClaw's AgentMessage ↔ dagctx nodes and renders.
//
// Into dagctx (SPEC §4): a user message is a user node; an assistant message an llm
// node whose tool calls are code nodes (caller = the llm node, metadata.toolCallId),
// appended `running`; a toolResult finishes its code node (`completed`, or `error`
// when `isError`). Out of dagctx: the OpenAI-format render (pair-valid, SPEC §6) is
// turned back into AgentMessages — user, assistant (text + toolCall blocks), toolResult.

import type { AgentMessage } from "openclaw/plugin-sdk/agent-harness-runtime" with { "resolution-mode": "import" };

/** The three message shapes this engine records (custom host messages are skipped). */
export type UserMsg = Extract<AgentMessage, { role: "user" }>;
export type AssistantMsg = Extract<AgentMessage, { role: "assistant" }>;
export type ToolResultMsg = Extract<AgentMessage, { role: "toolResult" }>;

type Part = { type?: unknown; text?: unknown };

/** The text of a message's content (a string, or text parts; images are left out). */
export function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return content == null ? "" : JSON.stringify(content);
  return content
    .filter((p: Part) => p && p.type === "text" && typeof p.text === "string")
    .map((p: Part) => p.text as string)
    .join("\n");
}

export interface ToolCallBlock {
  id: string;
  name: string;
  arguments: Record<string, unknown>;
}

export function toolCalls(msg: AssistantMsg): ToolCallBlock[] {
  const out: ToolCallBlock[] = [];
  for (const block of msg.content) {
    if (block.type === "toolCall") out.push({ id: block.id, name: block.name, arguments: block.arguments });
  }
  return out;
}

/** A stable identity of a message, so a message delivered twice (ingest, batch, afterTurn) is recorded once. */
export function messageKey(msg: AgentMessage): string {
  const m = msg as { role?: unknown; timestamp?: unknown; toolCallId?: unknown; content?: unknown };
  return JSON.stringify([m.role, m.timestamp ?? null, m.toolCallId ?? null, contentText(m.content)]);
}

/**
 * This plugin's token estimate of one message: a quarter of its characters as the provider
 * receives them (text, tool-call names and JSON arguments, tool results), plus a few for
 * the framing. Used against the host's budget, and calibrated by the provider's reported
 * prompt tokens (see the engine).
 */
export function estimateTokens(msg: AgentMessage): number {
  const m = msg as { role?: unknown; content?: unknown };
  let chars = 16;
  if (m.role === "assistant" && Array.isArray(m.content)) {
    for (const block of m.content as { type?: string; text?: string; name?: string; arguments?: unknown; thinking?: string }[]) {
      if (block.type === "text") chars += (block.text ?? "").length;
      else if (block.type === "toolCall") chars += (block.name ?? "").length + JSON.stringify(block.arguments ?? {}).length + 24;
      else if (block.type === "thinking") chars += (block.thinking ?? "").length;
    }
  } else {
    chars += JSON.stringify(contentText(m.content)).length;
  }
  return Math.ceil(chars / 4);
}

interface OpenAIMessage {
  role: string;
  content?: unknown;
  tool_calls?: { id: string; function: { name: string; arguments: string } }[];
  tool_call_id?: string;
}

function parseArgs(raw: string): Record<string, unknown> {
  try {
    const v: unknown = JSON.parse(raw);
    return v && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : { value: v };
  } catch {
    return { raw };
  }
}

/** dagctx's OpenAI-format render → OpenClaw AgentMessages (system messages are returned apart). */
export function fromOpenAI(messages: unknown[], model: string, now: number = Date.now()): {
  messages: AgentMessage[];
  system: string[];
} {
  const out: AgentMessage[] = [];
  const system: string[] = [];
  const toolNames = new Map<string, string>();
  let t = now - messages.length; // strictly increasing timestamps, oldest first
  for (const raw of messages as OpenAIMessage[]) {
    t += 1;
    if (raw.role === "system") {
      system.push(contentText(raw.content));
    } else if (raw.role === "user") {
      const user: UserMsg = { role: "user", content: contentText(raw.content), timestamp: t };
      out.push(user);
    } else if (raw.role === "assistant") {
      const content: AssistantMsg["content"] = [];
      const text = contentText(raw.content);
      if (text) content.push({ type: "text", text });
      for (const call of raw.tool_calls ?? []) {
        toolNames.set(call.id, call.function.name);
        content.push({ type: "toolCall", id: call.id, name: call.function.name, arguments: parseArgs(call.function.arguments) });
      }
      const assistant: AssistantMsg = {
        role: "assistant",
        content,
        api: "openai-completions",
        provider: "dagctx",
        model,
        usage: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } },
        stopReason: raw.tool_calls?.length ? "toolUse" : "stop",
        timestamp: t,
      };
      out.push(assistant);
    } else if (raw.role === "tool") {
      const id = raw.tool_call_id ?? "";
      const result: ToolResultMsg = {
        role: "toolResult",
        toolCallId: id,
        toolName: toolNames.get(id) ?? "",
        content: [{ type: "text", text: contentText(raw.content) }],
        isError: false,
        timestamp: t,
      };
      out.push(result);
    }
  }
  return { messages: out, system };
}
