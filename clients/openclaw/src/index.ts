// The OpenClaw plugin entry: registers the dagctx context engine and its recall tools.
//
// openclaw.plugin.json declares the kinds "context-engine" and "memory"; select the engine
// with `plugins.slots.contextEngine: "dagctx"` and, for dagctx's memory_search/memory_get as
// the agent's memory tools, `plugins.slots.memory: "dagctx"`. The plugin config (`plugins.entries.dagctx.config`)
// is validated by the manifest's configSchema and passed to each engine instance.

import type { OpenClawPluginApi, OpenClawPluginDefinition } from "openclaw/plugin-sdk/plugin-entry" with { "resolution-mode": "import" };

import { DagctxContextEngine, ENGINE_ID, ENGINE_VERSION, type DagctxEngineOptions } from "./engine";
import type { HostLlm } from "./link";
import { MEMORY_TOOL_NAMES, memoryTools, recallTools, TOOL_NAMES } from "./tools";

export { DagctxContextEngine, ENGINE_ID, type DagctxEngineOptions } from "./engine";
export { fromOpenAI, contentText, messageKey, estimateTokens } from "./messages";
export { memoryTools, MEMORY_TOOL_NAMES, recallTools, TOOL_NAMES } from "./tools";

/** Whether the host config gives dagctx the memory slot (`plugins.slots.memory: "dagctx"`). */
export function ownsMemorySlot(config: unknown): boolean {
  const slots = (config as { plugins?: { slots?: { memory?: unknown } } } | undefined)?.plugins?.slots;
  return slots?.memory === ENGINE_ID;
}
export { sharedLink, closeAllLinks } from "./link";

/** The plugin config as the manifest's configSchema allows it. */
export function engineOptions(config: Record<string, unknown> | undefined): DagctxEngineOptions {
  const c = config ?? {};
  const opts: DagctxEngineOptions = {};
  if (typeof c.database === "string") opts.database = c.database;
  if (Array.isArray(c.command) && c.command.every((a) => typeof a === "string")) opts.command = c.command as string[];
  if (typeof c.model === "string") opts.model = c.model;
  if (typeof c.keepRecentTokens === "number") opts.keepRecentTokens = c.keepRecentTokens;
  if (typeof c.structuralFallback === "boolean") opts.structuralFallback = c.structuralFallback;
  if (typeof c.trace === "string") opts.trace = c.trace;
  if (c.env !== null && typeof c.env === "object" && !Array.isArray(c.env)) {
    // OpenClaw keeps variables such as XDG_RUNTIME_DIR out of its own environment (host env
    // security), so a daemon it starts would not find the user's shared daemon: name them here.
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(c.env as Record<string, unknown>)) if (typeof v === "string") env[k] = v;
    opts.env = env;
  }
  return opts;
}

const plugin: OpenClawPluginDefinition = {
  id: ENGINE_ID,
  name: "dagctx",
  description: "Context engine backed by the dagctx daemon",
  version: ENGINE_VERSION,
  register(api: OpenClawPluginApi) {
    const opts = engineOptions(api.pluginConfig);
    opts.logger = api.logger;
    // The host's own completion function, for compactions a call brings no runtimeContext.llm to.
    const llm = (api.runtime as { llm?: HostLlm } | undefined)?.llm;
    if (llm && typeof llm.complete === "function") opts.runtimeLlm = llm;
    // Every engine OpenClaw builds (one per turn) shares one daemon connection (link.ts).
    api.registerContextEngine(ENGINE_ID, () => new DagctxContextEngine(opts));
    const engine = new DagctxContextEngine(opts);
    api.registerTool((ctx) => recallTools(engine, { sessionId: ctx.sessionId, sessionKey: ctx.sessionKey }) as never, {
      names: [...TOOL_NAMES],
    });
    // OpenClaw's memory tools, when the memory slot is dagctx's (the manifest declares both
    // kinds); otherwise the memory plugin in that slot (memory-core by default) owns the names.
    if (ownsMemorySlot(api.config)) {
      api.registerTool((ctx) => memoryTools(engine, { workspaceDir: ctx.workspaceDir }) as never, {
        names: [...MEMORY_TOOL_NAMES],
      });
    }
  },
};

export default plugin;
