// Build the installable plugin archive: `npm run pack` → build/dagctx-openclaw-<version>.tgz.
//
// `openclaw plugins install` refuses a plugin whose node_modules holds a symlink that leads
// outside the install root, which is what `file:../typescript` makes. So the archive carries
// its runtime dependencies as real files (npm `bundleDependencies`): the built TypeScript
// client (clients/typescript/dist) and its one dependency, vscode-jsonrpc. Nothing else is
// fetched at install time. Run `npm run build` here and in clients/typescript first.
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const client = resolve(here, "..", "typescript");
const stage = join(here, "build", "stage");
const out = join(here, "build");

function need(path, hint) {
  if (!existsSync(path)) {
    console.error(`pack: ${path} is missing; ${hint}`);
    process.exit(1);
  }
}
need(join(here, "dist", "index.js"), "run `npm run build` in clients/openclaw");
need(join(client, "dist", "index.js"), "run `npm ci && npm run build` in clients/typescript");
need(join(client, "node_modules", "vscode-jsonrpc", "package.json"), "run `npm ci` in clients/typescript");

rmSync(stage, { recursive: true, force: true });
mkdirSync(join(stage, "dist"), { recursive: true });
for (const f of ["engine", "index", "link", "messages", "tools"]) {
  for (const ext of [".js", ".d.ts"]) {
    const src = join(here, "dist", f + ext);
    if (existsSync(src)) cpSync(src, join(stage, "dist", f + ext));
  }
}
cpSync(join(here, "openclaw.plugin.json"), join(stage, "openclaw.plugin.json"));
cpSync(join(here, "README.md"), join(stage, "README.md"));

const pkg = JSON.parse(readFileSync(join(here, "package.json"), "utf8"));
const clientPkg = JSON.parse(readFileSync(join(client, "package.json"), "utf8"));
const rpcPkg = JSON.parse(readFileSync(join(client, "node_modules", "vscode-jsonrpc", "package.json"), "utf8"));

// The client, as an installed package: its built files and a package.json without scripts.
const clientDir = join(stage, "node_modules", "dagctx-client");
mkdirSync(join(clientDir, "dist"), { recursive: true });
for (const name of ["client", "index", "protocol"]) {
  for (const ext of [".js", ".d.ts"]) cpSync(join(client, "dist", name + ext), join(clientDir, "dist", name + ext));
}
writeFileSync(
  join(clientDir, "package.json"),
  JSON.stringify({ name: clientPkg.name, version: clientPkg.version, license: clientPkg.license, type: "commonjs",
    main: "dist/index.js", types: "dist/index.d.ts", dependencies: clientPkg.dependencies }, null, 2) + "\n",
);
cpSync(join(client, "node_modules", "vscode-jsonrpc"), join(stage, "node_modules", "vscode-jsonrpc"), { recursive: true, dereference: true });

const staged = {
  name: pkg.name,
  version: pkg.version,
  description: pkg.description,
  license: pkg.license,
  type: pkg.type,
  main: pkg.main,
  types: pkg.types,
  engines: pkg.engines,
  openclaw: pkg.openclaw,
  peerDependencies: pkg.peerDependencies,
  peerDependenciesMeta: { openclaw: { optional: true } },
  dependencies: { "dagctx-client": clientPkg.version, "vscode-jsonrpc": rpcPkg.version },
  bundleDependencies: ["dagctx-client", "vscode-jsonrpc"],
  files: ["dist/*.js", "dist/*.d.ts", "openclaw.plugin.json", "README.md"],
};
writeFileSync(join(stage, "package.json"), JSON.stringify(staged, null, 2) + "\n");

const name = execFileSync("npm", ["pack", "--silent", "--pack-destination", out], { cwd: stage, encoding: "utf8" }).trim().split("\n").pop();
rmSync(stage, { recursive: true, force: true });
console.log(join(out, name));
