// The OpenClaw plugin entry: registers the dagctx context engine.
//
// openclaw.plugin.json declares `kind: "context-engine"`; select the engine with
// `plugins.slots.contextEngine: "dagctx"`. The plugin config (`plugins.entries.dagctx.config`)
// is validated by the manifest's configSchema and passed to each engine instance.

import type { OpenClawPluginApi, OpenClawPluginDefinition } from "openclaw/plugin-sdk/plugin-entry" with { "resolution-mode": "import" };

import { DagctxContextEngine, ENGINE_ID, ENGINE_VERSION, type DagctxEngineOptions } from "./engine";

export { DagctxContextEngine, ENGINE_ID, type DagctxEngineOptions } from "./engine";
export { fromOpenAI, contentText, messageKey } from "./messages";

/** The plugin config as the manifest's configSchema allows it. */
export function engineOptions(config: Record<string, unknown> | undefined): DagctxEngineOptions {
  const c = config ?? {};
  const opts: DagctxEngineOptions = {};
  if (typeof c.database === "string") opts.database = c.database;
  if (Array.isArray(c.command) && c.command.every((a) => typeof a === "string")) opts.command = c.command as string[];
  if (typeof c.model === "string") opts.model = c.model;
  if (typeof c.keepRecentTokens === "number") opts.keepRecentTokens = c.keepRecentTokens;
  if (typeof c.structuralFallback === "boolean") opts.structuralFallback = c.structuralFallback;
  return opts;
}

const plugin: OpenClawPluginDefinition = {
  id: ENGINE_ID,
  name: "dagctx",
  description: "Context engine backed by the dagctx daemon",
  version: ENGINE_VERSION,
  register(api: OpenClawPluginApi) {
    const opts = engineOptions(api.pluginConfig);
    api.registerContextEngine(ENGINE_ID, () => new DagctxContextEngine(opts));
  },
};

export default plugin;
