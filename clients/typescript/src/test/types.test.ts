// The generated types: src/protocol.ts is current with protocol/dagctx/protocol/schema.json, and
// the generator maps each JSON Schema construct the way the README promises.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, test } from "node:test";
import { pathToFileURL } from "node:url";

import { ERROR_KINDS, METHOD_NAMES, NOTIFICATION_NAMES, SERVER_REQUEST_NAMES } from "../protocol";

// dist/test/types.test.js → the package directory
const PKG = resolve(__dirname, "..", "..");
const SCHEMA = resolve(PKG, "..", "..", "protocol", "dagctx", "protocol", "schema.json");
const GEN = join(PKG, "scripts", "gen-types.mjs");

type Generate = (schema: unknown, label?: string) => string;

async function loadGenerator(): Promise<Generate> {
  // a real dynamic import (tsc would turn `import()` into require() under CommonJS)
  const dynamicImport = new Function("u", "return import(u)") as (u: string) => Promise<{ generate: Generate }>;
  return (await dynamicImport(pathToFileURL(GEN).href)).generate;
}

describe("generated protocol types", () => {
  test("check-types: src/protocol.ts matches a fresh generation from schema.json", () => {
    const out = execFileSync(process.execPath, [GEN, "--check"], { cwd: PKG, encoding: "utf8" });
    assert.match(out, /up to date/);
  });

  test("the runtime name lists follow the schema's method table", () => {
    const schema = JSON.parse(readFileSync(SCHEMA, "utf8"));
    const methods = Object.entries(schema.methods) as [string, { direction: string; kind: string }][];
    const pick = (dir: string, kind: string) => methods.filter(([, m]) => m.direction === dir && m.kind === kind).map(([n]) => n);
    assert.deepEqual([...METHOD_NAMES], pick("client-to-server", "request"));
    assert.deepEqual([...SERVER_REQUEST_NAMES], pick("server-to-client", "request"));
    assert.deepEqual([...NOTIFICATION_NAMES], pick("server-to-client", "notification"));
    assert.deepEqual(ERROR_KINDS, schema.errorKinds);
    assert.ok(METHOD_NAMES.includes("context/compact"));
    assert.ok(SERVER_REQUEST_NAMES.includes("sampling/createMessage"));
  });

  test("the generator maps objects, defaults, enums, unions, arrays, dicts and untyped schemas", async () => {
    const generate = await loadGenerator();
    const text = generate({
      version: "9.9",
      methods: {
        "a/do": { direction: "client-to-server", kind: "request", description: "Do it.", params: { $ref: "#/$defs/P" }, result: { type: "null" } },
        "a/ask": { direction: "server-to-client", kind: "request", description: "", params: { $ref: "#/$defs/Empty" }, result: { $ref: "#/$defs/P" } },
        "a/note": { direction: "server-to-client", kind: "notification", description: "", params: { $ref: "#/$defs/P" }, result: { type: "null" } },
        "a/tell": { direction: "client-to-server", kind: "notification", description: "", params: { $ref: "#/$defs/Empty" }, result: { type: "null" } },
      },
      errorKinds: { Boom: -32001 },
      $defs: {
        P: {
          type: "object",
          description: "A thing.\n\nWith */ in it.",
          properties: {
            req: { type: "string" },
            withDefault: { type: "integer", default: 3 },
            notRequired: { type: "boolean" },
            mode: { enum: ["a", "b"] },
            maybe: { anyOf: [{ type: "string" }, { type: "null" }], default: null },
            list: { type: "array", items: { anyOf: [{ type: "integer" }, { type: "string" }] } },
            anyList: { type: "array" },
            dict: { type: "object", additionalProperties: { $ref: "#/$defs/Empty" } },
            bag: { type: "object" },
            anything: {},
            "odd-name": { type: "number" },
            fixed: { const: "x" },
          },
          required: ["req", "withDefault", "mode", "list", "anyList", "dict", "bag", "anything", "odd-name", "fixed"],
        },
        Empty: { type: "object", properties: {}, required: [] },
      },
    });
    assert.match(text, /export const PROTOCOL_VERSION = "9\.9";/);
    assert.match(text, /export interface P \{/);
    assert.match(text, /With \*\\\/ in it\./, "a comment terminator in a description is escaped");
    assert.match(text, /\n  req: string;/);
    assert.match(text, /\n  withDefault\?: number;/, "a property with a default is optional");
    assert.match(text, /@default 3/);
    assert.match(text, /\n  notRequired\?: boolean;/, "a property not required is optional");
    assert.match(text, /\n  mode: "a" \| "b";/);
    assert.match(text, /\n  maybe\?: string \| null;/);
    assert.match(text, /\n  list: \(number \| string\)\[\];/);
    assert.match(text, /\n  anyList: unknown\[\];/);
    assert.match(text, /\n  dict: Record<string, Empty>;/);
    assert.match(text, /\n  bag: Record<string, unknown>;/);
    assert.match(text, /\n  anything: unknown;/);
    assert.match(text, /\n  "odd-name": number;/);
    assert.match(text, /\n  fixed: "x";/);
    assert.match(text, /export type Empty = Record<string, never>;/);
    assert.match(text, /export interface Methods \{\n {2}\/\*\* Do it\. \*\/\n {2}"a\/do": \{ params: P; result: null \};\n\}/);
    assert.match(text, /export interface ServerRequests \{\n {2}"a\/ask": \{ params: Empty; result: P \};\n\}/);
    assert.match(text, /export interface Notifications \{\n {2}"a\/note": \{ params: P \};\n\}/);
    assert.match(text, /export interface ClientNotifications \{\n {2}"a\/tell": \{ params: Empty \};\n\}/);
    assert.match(text, /export const METHOD_NAMES = \[\n {2}"a\/do",\n\] as const;/);
    assert.match(text, /export type ErrorKind =\n {2}\| "Boom";/);
    assert.match(text, /Boom: -32001,/);
    assert.equal(generate(JSON.parse(readFileSync(SCHEMA, "utf8"))), readFileSync(join(PKG, "src", "protocol.ts"), "utf8"));
  });
});
