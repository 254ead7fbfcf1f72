// dagctx ui: the page. No build step, no dependency, nothing from the network but this server.
"use strict";

const ROW = 26, LANE = 14, PAD = 10;
const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}
const svgEl = (tag, attrs = {}) => {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
};
// replace a container's children; arrays flatten, null/false are skipped (like el)
const fill = (box, ...kids) => box.replaceChildren(...el("div", {}, ...kids).childNodes);
const fmt = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
const short = (id) => (!id ? "" : id.length > 14 ? id.slice(0, 12) + "…" : id);

async function api(path, params = {}, method = "GET") {
  const q = new URLSearchParams(params).toString();
  const opts = { method, credentials: "same-origin", headers: {} };
  let url = "/api/" + path + (method === "GET" && q ? "?" + q : "");
  if (method === "POST") { opts.body = JSON.stringify(params); opts.headers["Content-Type"] = "application/json"; }
  const res = await fetch(url, opts);
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

// ------------------------------------------------------------------ state

const state = {
  info: null, sessionId: null, graph: null, rows: new Map(), order: [], lastSeq: -1,
  expanded: new Set(), selected: null, layout: null, live: null, refetch: null, partial: false,
};

// ------------------------------------------------------------------ sessions

async function loadSessions(query) {
  const list = $("#sessions");
  const res = await api("sessions", query ? { q: query } : {});
  list.replaceChildren();
  $("#session-count").textContent = query
    ? `${fmt(res.total)} session${res.total === 1 ? "" : "s"} match “${query}”`
    : `${fmt(res.total)} session${res.total === 1 ? "" : "s"}`;
  for (const s of res.sessions) {
    const li = el("li", { "data-session": s.sessionId, "data-testid": "session-row", onclick: () => openSession(s.sessionId) },
      el("div", { class: "title", text: s.title || s.sessionId }),
      el("div", { class: "meta" }, el("span", { class: "badge source", text: s.source }),
        ` ${fmt(s.nodes)} nodes · ${new Date(s.updatedAt * 1000).toLocaleString()}`,
        s.hits ? ` · ${s.hits} hit${s.hits === 1 ? "" : "s"}` : ""),
      s.snippet ? el("div", { class: "snippet", text: s.snippet }) : null);
    if (s.sessionId === state.sessionId) li.classList.add("active");
    list.append(li);
  }
}

// ------------------------------------------------------------------ graph data

// the first page holds a few screens of rows (the window draws ~60): it is drawn as soon
// as it arrives, the rest follows in larger pages and is drawn once
const FIRST_PAGE = 500, NEXT_PAGES = 5000;

async function fetchGraph(sessionId) {
  state.partial = false;
  let after = -1;
  const rows = [];
  let first = null;
  for (;;) {
    const res = await api("graph", { session: sessionId, after, limit: first ? NEXT_PAGES : FIRST_PAGE });
    const page = Object.assign(res.graph, { session: res.session });
    if (state.sessionId !== sessionId) return null;
    const last = page.nextAfterSeq === null || page.nextAfterSeq === undefined;
    if (!first) {
      first = page;
      if (last) { first.last = page; return first; } // one page: the caller draws it
      // the active summaries' rows come with the first page (their own pages come later):
      // covered turns are folded into the capsule from the first drawing
      const onPage = new Set(page.nodes.map((r) => r.id));
      const early = (res.summaries || []).filter((r) => !onPage.has(r.id));
      state.partial = true;
      renderGraphFrom(page, rows.concat(page.nodes, early));
    }
    for (const r of page.nodes) rows.push(r);
    if (last) { first.nodes = rows; first.last = page; break; }
    after = page.nextAfterSeq;
  }
  state.partial = false;
  return first;
}

function renderGraphFrom(page, rows) {
  state.graph = page;
  state.rows = new Map(rows.map((r) => [r.id, r]));
  state.order = rows;
  state.lastSeq = rows.length ? rows[rows.length - 1].seq : -1;
  drawSessionHead();
  layoutAndDraw();
}

async function openSession(sessionId) {
  state.sessionId = sessionId;
  state.expanded = new Set();
  state.selected = null;
  for (const li of document.querySelectorAll("#sessions li")) li.classList.toggle("active", li.dataset.session === sessionId);
  $("#detail").replaceChildren();
  const g = await fetchGraph(sessionId);
  if (!g) return;
  renderGraphFrom(g.last ? Object.assign({}, g.last, { nodes: g.nodes }) : g, g.nodes);
  startLive(sessionId);
}

function drawSessionHead() {
  const g = state.graph, s = g.session;
  const tips = g.branches.map((b) => el("span", { class: "badge tip", title: b.head, text: (b.name || short(b.head)) + (b.current ? " (HEAD)" : "") + (b.spawn ? " spawn" : "") }));
  $("#session-head").replaceChildren(
    el("h1", { text: s.title || s.sessionId }),
    el("div", { class: "muted" }, `${s.source} · ${fmt(g.total)} nodes · HEAD `, el("code", { "data-testid": "head", text: g.head }),
      el("span", { class: "live", id: "live-state", text: "" })),
    el("div", {}, "branches: ", tips));
}

// ------------------------------------------------------------------ layout (lanes like git log --graph)

function buildVisible() {
  const rows = state.order.filter((r) => r.id !== state.graph.rootId && !r.systemPrompt);
  const active = rows.filter((r) => r.summary && r.coversIds);
  const hiddenBy = new Map();   // covered conversation id -> capsule id (while folded)
  const coveredBy = new Map();  // covered id -> summary id (folded or not)
  const capsulesAt = new Map(); // first covered conversation id -> [summary rows]
  const firstOf = new Map();    // summary id -> its first covered conversation id
  for (const s of active) {
    const chainIds = s.coversIds.filter((id) => state.rows.has(id) && state.rows.get(id).conversation);
    if (!chainIds.length) continue;
    firstOf.set(s.id, chainIds[0]);
    if (!capsulesAt.has(chainIds[0])) capsulesAt.set(chainIds[0], []);
    capsulesAt.get(chainIds[0]).push(s);
    for (const id of s.coversIds) coveredBy.set(id, s.id);
    if (!state.expanded.has(s.id)) for (const id of chainIds) hiddenBy.set(id, "capsule:" + s.id);
  }
  const vis = [];
  for (const r of rows) {
    if (r.summary && r.coversIds) continue; // drawn as its capsule
    for (const cap of capsulesAt.get(r.id) || [])
      vis.push({ id: "capsule:" + cap.id, capsule: cap, seq: r.seq, expanded: state.expanded.has(cap.id), parent: r.predecessor });
    if (hiddenBy.has(r.id)) continue;
    vis.push({ id: r.id, row: r, seq: r.seq, parent: r.predecessor || r.spawnedFrom || null, spawn: !!r.spawnRoot,
              covered: coveredBy.get(r.id) });
  }
  // parents through the fold: a hidden node is its capsule
  const map = (id) => (id && hiddenBy.has(id) ? hiddenBy.get(id) : id);
  for (const v of vis) v.parent = map(v.parent);
  // an expanded capsule is a header right before its first covered node, which hangs off it
  const byId = new Map(vis.map((v) => [v.id, v]));
  for (const v of vis) if (v.capsule && v.expanded) {
    const first = byId.get(firstOf.get(v.capsule.id));
    if (first) first.parent = v.id;
  }
  return vis;
}

function layout() {
  const vis = buildVisible();
  const index = new Map(vis.map((v, i) => [v.id, i]));
  const kids = new Map();
  for (const v of vis) if (v.parent && index.has(v.parent)) {
    if (!kids.has(v.parent)) kids.set(v.parent, []);
    kids.get(v.parent).push(v.id);
  }
  const lanes = [];          // slot -> expected id (or null)
  const expect = new Map();  // expected id -> slot
  const edges = [];          // [fromRow, fromLane, toRow, toLane]
  let width = 1;
  const free = () => { let i = lanes.indexOf(null); if (i < 0) { i = lanes.length; lanes.push(null); } return i; };
  vis.forEach((v, i) => {
    let lane = expect.get(v.id);
    if (lane === undefined) lane = free();
    else expect.delete(v.id);
    v.lane = lane; v.index = i;
    // chat children first (the first continues this lane); spawned branches always open a lane
    const ks = (kids.get(v.id) || []).slice().sort((x, y) => (vis[index.get(x)].spawn ? 1 : 0) - (vis[index.get(y)].spawn ? 1 : 0));
    lanes[lane] = null;
    ks.forEach((k, j) => {
      const spawn = vis[index.get(k)].spawn;
      const slot = j === 0 && !spawn ? lane : free();
      lanes[slot] = k; expect.set(k, slot);
      edges.push([i, lane, index.get(k), slot, spawn]);
    });
    width = Math.max(width, lanes.length);
  });
  return { vis, edges, width, index };
}

function layoutAndDraw() {
  state.layout = layout();
  const canvas = $("#graph-canvas");
  canvas.style.height = state.layout.vis.length * ROW + "px";
  drawWindow(true);
}

function drawWindow(force) {
  const L = state.layout;
  if (!L) return;
  const scroller = $("#graph-scroll"), canvas = $("#graph-canvas");
  const top = scroller.scrollTop, h = scroller.clientHeight || 600;
  const a = Math.max(0, Math.floor(top / ROW) - 30), b = Math.min(L.vis.length, Math.ceil((top + h) / ROW) + 30);
  if (!force && state.window && state.window[0] === a && state.window[1] === b) return;
  state.window = [a, b];
  const gutter = PAD * 2 + L.width * LANE;
  const frag = document.createDocumentFragment();
  const svg = svgEl("svg", { class: "lanes", width: gutter, height: (b - a) * ROW });
  svg.style.top = a * ROW + "px";
  const x = (lane) => PAD + lane * LANE + LANE / 2, y = (row) => (row - a) * ROW + ROW / 2;
  for (const [fr, fl, tr, tl, spawn] of L.edges) {
    if (tr < a || fr > b) continue;
    const d = fl === tl ? `M${x(fl)} ${y(fr)} L${x(tl)} ${y(tr)}`
      : `M${x(fl)} ${y(fr)} C${x(fl)} ${y(fr) + ROW * 0.7} ${x(tl)} ${y(fr) + ROW * 0.3} ${x(tl)} ${y(fr) + ROW} L${x(tl)} ${y(tr)}`;
    svg.append(svgEl("path", spawn ? { d, class: "spawn" } : { d }));
  }
  const headId = state.graph.head;
  const tips = new Map(state.graph.branches.map((br) => [br.head, br]));
  for (let i = a; i < b; i++) {
    const v = L.vis[i];
    if (v.capsule) {
      svg.append(svgEl("rect", { class: "capsule", x: x(v.lane) - 5, y: y(i) - 5, width: 10, height: 10, rx: 5 }));
    } else {
      const c = svgEl("circle", { class: v.row.role + (v.id === headId ? " head" : ""), cx: x(v.lane), cy: y(i), r: 4 });
      svg.append(c);
    }
    frag.append(rowEl(v, i, gutter, tips, headId));
  }
  frag.prepend(svg);
  canvas.replaceChildren(frag);
}

function rowEl(v, i, gutter, tips, headId) {
  let div;
  if (v.capsule) {
    const s = v.capsule;
    const n = s.coversIds.filter((id) => state.rows.has(id) && state.rows.get(id).conversation).length;
    const all = s.coversIds.length;
    div = el("div", { class: "grow capsule", "data-testid": "capsule", "data-summary": s.id,
                      onclick: () => toggleCapsule(s.id) },
      el("span", { class: "role", text: "sum" }),
      el("span", { class: "txt" }, `Summary ${short(s.id)} — folds ${n}${state.partial ? "+ (loading)" : ""} conversation node${n === 1 ? "" : "s"} (${all} with their calls) `,
        el("span", { class: "count", text: v.expanded ? "(expanded: click to fold)" : "(folded: click to expand)" })),
      el("button", { "data-testid": "capsule-open", onclick: (e) => { e.stopPropagation(); showCompaction(s.id); }, text: "compaction" }));
  } else {
    const r = v.row;
    const badges = [];
    if (r.id === headId) badges.push(el("span", { class: "badge head", "data-testid": "head-badge", text: "HEAD" }));
    const tip = tips.get(r.id);
    if (tip) badges.push(el("span", { class: "badge tip", text: tip.name || (tip.main ? "main" : "tip") }));
    if (r.spawnRoot) badges.push(el("span", { class: "badge spawn", text: "spawned" }));
    if (r.summary) badges.push(el("span", { class: "badge " + (r.supersededSummary ? "superseded" : "summary"),
                                             text: r.supersededSummary ? "superseded summary" : "summary" }));
    if (r.agedBy) badges.push(el("span", { class: "badge aged", text: "aged" }));
    if (r.spilledChars) badges.push(el("span", { class: "badge spill", text: `spilled ${fmt(r.spilledChars)} chars` }));
    if (r.agedCalls) badges.push(el("span", { class: "badge aged", "data-testid": "aged-calls", text: `${r.agedCalls} aged` }));
    if (r.spilledCalls) badges.push(el("span", { class: "badge spill", "data-testid": "spilled-calls", text: `${r.spilledCalls} spilled` }));
    if (r.status === "error" || r.status === "cancelled") badges.push(el("span", { class: "badge error", text: r.status }));
    div = el("div", { class: `grow ${r.role}${v.covered ? " covered" : ""}${r.supersededSummary ? " superseded-row" : ""}`,
                      "data-node": r.id, "data-testid": "node-row", onclick: () => selectNode(r.id) },
      el("span", { class: "role", text: r.summary ? "sum" : r.role }),
      el("span", { class: "txt", title: r.preview }, r.name && r.role !== "user" ? el("b", { text: r.name + " " }) : null, r.preview),
      r.callees ? el("span", { class: "count", text: `${r.callees} call${r.callees === 1 ? "" : "s"}` }) : null,
      badges);
    if (state.selected === r.id) div.classList.add("selected");
  }
  div.style.top = i * ROW + "px";
  div.style.paddingLeft = gutter + "px";
  return div;
}

function toggleCapsule(id) {
  if (state.expanded.has(id)) state.expanded.delete(id); else state.expanded.add(id);
  layoutAndDraw();
}

// ------------------------------------------------------------------ details

function pre(value) {
  if (value === null || value === undefined) return el("pre", { class: "muted", text: "(none)" });
  return el("pre", { text: typeof value === "string" ? value : JSON.stringify(value, null, 2) });
}

async function selectNode(id) {
  state.selected = id;
  drawWindow(true);
  const sid = state.sessionId;
  const res = await api("nodes", { session: sid, ids: id, callees: "1" });
  if (state.selected !== id) return;
  const n = res.nodes[0], row = state.rows.get(id) || {};
  const pane = $("#detail");
  const actions = [];
  if (n.role === "llm" && n.name !== "context/summary")
    actions.push(el("button", { "data-testid": "open-request", onclick: () => showRequest(id), text: "What the model saw" }));
  if (n.name === "context/summary") actions.push(el("button", { onclick: () => showCompaction(id), text: "Compaction" }));
  if (state.info && state.info.allowWrites && row.conversation) {
    actions.push(el("button", { onclick: () => write("checkout", { session: sid, node: id }), text: "Check out" }));
    actions.push(el("button", { onclick: () => { const t = prompt("Fork here with a user message:"); if (t) write("fork", { session: sid, node: id, text: t }); }, text: "Fork here" }));
  }
  fill(pane,
    el("h2", { text: `${n.role} ${n.name || ""}` }),
    el("dl", { class: "kv" },
      el("dt", { text: "id" }), el("dd", {}, el("code", { text: n.id })),
      el("dt", { text: "seq" }), el("dd", { text: n.seq }),
      el("dt", { text: "status" }), el("dd", { text: n.status }),
      el("dt", { text: "predecessor" }), el("dd", { text: n.predecessor || "—" }),
      el("dt", { text: "caller" }), el("dd", { text: n.caller || "—" }),
      row.agedBy ? [el("dt", { text: "aged" }), el("dd", { text: `shown aged in the request of ${row.agedBy}` })] : null,
      row.spilledChars ? [el("dt", { text: "spilled" }), el("dd", { text: `${fmt(row.spilledChars)} characters stored whole` })] : null),
    el("div", {}, actions),
    n.input !== null && n.input !== undefined ? [el("h3", { text: "input" }), pre(n.input)] : null,
    el("h3", { text: "output" }), pre(n.output),
    res.callees.length ? el("h3", { text: `calls (${res.callees.length})` }) : null,
    res.callees.map((c) => el("div", { class: "msg", "data-testid": "callee" },
      el("div", { class: "mhead" }, el("b", { text: `${c.role} ${c.name}` }), c.metadata && c.metadata.toolCallId ? el("code", { text: c.metadata.toolCallId }) : null,
        el("span", { text: c.status })),
      c.input !== null ? pre(c.input) : null, pre(c.output))));
}

async function write(what, params) {
  try { await api(what, params, "POST"); } catch (e) { alert(e.message); }
}

const KIND_LABEL = { system: "system prompt", tools: "tools", summary: "summary", verbatim: "verbatim tail",
                     aged: "aged placeholders", reduced: "reduced results", reserve: "output reserve" };

function tokenBar(cat) {
  const window = cat.window || cat.total + (cat.outputReserve || 0) || 1;
  const bar = el("div", { class: "bar", "data-testid": "token-bar" });
  const legend = el("div", { class: "legend" });
  const add = (cls, label, n, title) => {
    if (!n) return;
    const s = el("span", { class: cls, title: `${title || label}: ${fmt(n)} tokens` });
    s.style.width = Math.max(0.3, (100 * n) / window) + "%";
    bar.append(s);
    legend.append(el("span", {}, el("i", { class: cls }), `${label} ${fmt(n)}`));
  };
  cat.systemLayers.forEach((l, i) => add(`seg-system l${i % 3}`, `system: ${l.name}`, l.tokens));
  add("seg-tools", "tools", cat.tools);
  add("seg-summary", "summary", cat.summary);
  add("seg-verbatim", "verbatim tail", cat.verbatim);
  add("seg-aged", "aged placeholders", cat.aged);
  add("seg-reduced", "reduced results", cat.reduced);
  add("seg-reserve", "output reserve", cat.outputReserve);
  const used = cat.total + (cat.outputReserve || 0);
  return [bar, legend, el("div", { class: "notice" },
    `${fmt(cat.total)} input tokens + ${fmt(cat.outputReserve)} reserve of a ${fmt(cat.window)}-token window (${(100 * used / window).toFixed(1)} %); `,
    `${cat.exact ? "exact" : "estimated"} counts (${cat.tokenizer}); system layers split by their characters`)];
}

function blockText(b) {
  if (typeof b === "string") return b;
  if (!b || typeof b !== "object") return JSON.stringify(b);
  if (b.type === "text" && typeof b.text === "string") return b.text;
  if (b.type === "tool_use" || b.type === "tool_call") return `→ ${b.name}(${JSON.stringify(b.input !== undefined ? b.input : b.arguments)})${b.id ? " [" + b.id + "]" : ""}`;
  if (b.type === "tool_result") return `← [${b.tool_use_id || b.id || ""}] ${Array.isArray(b.content) ? b.content.map(blockText).join("\n") : blockText(b.content)}`;
  return JSON.stringify(b, null, 2);
}

function messageText(m) {
  if (typeof m.content === "string") return m.content;
  if (Array.isArray(m.content)) return m.content.map(blockText).join("\n");
  return JSON.stringify(m.content !== undefined ? m.content : m, null, 2);
}

function messageEl(m, i, kind, cls, tokens) {
  const extra = [];
  if (m.tool_calls) extra.push(pre(m.tool_calls));
  if (m.tool_call_id) extra.push(el("code", { text: "tool_call_id " + m.tool_call_id }));
  return el("div", { class: `msg ${cls || ""} kind-${kind}`, "data-testid": "request-message", "data-index": i, "data-diff": cls || "" },
    el("div", { class: "mhead" }, el("b", { text: `#${i} ${m.role || ""}` }), el("span", { class: "badge", text: KIND_LABEL[kind] || kind }),
      tokens !== undefined ? el("span", { text: `${fmt(tokens)} tokens` }) : null,
      cls ? el("span", { class: "badge", text: cls === "stable" ? "stable prefix" : cls }) : null),
    pre(messageText(m)), extra);
}

function toolName(t) {
  const f = t && (t.function || t);
  return (f && f.name) || "(unnamed)";
}

function toolsEl(tools, tokens) {
  if (tools === null || tools === undefined)
    return el("div", { class: "muted", "data-testid": "tools", text: tokens ? `${fmt(tokens)} tokens of tools; this call did not record their schema` : "none recorded" });
  if (!tools.length) return el("div", { class: "muted", "data-testid": "tools", text: "none" });
  return el("div", { "data-testid": "tools" },
    el("div", { class: "muted", text: `${fmt(tokens)} tokens of tool schemas, as sent` }),
    tools.map((t) => el("details", { class: "tool", "data-tool": toolName(t) },
      el("summary", {}, el("code", { text: toolName(t) }), " ", ((t.function || t).description || "").slice(0, 120)),
      pre(JSON.stringify(t, null, 2)))));
}

async function showRequest(id) {
  const pane = $("#detail");
  pane.replaceChildren(el("p", { class: "muted", text: "Replaying…" }));
  const r = await api("request", { session: state.sessionId, node: id });
  const rep = r.replay, cat = r.categories, diff = r.previous && r.previous.diff;
  const per = rep.tokens ? rep.tokens.perMessage : [];
  const msgs = [];
  rep.messages.forEach((m, i) => {
    let cls = "";
    if (diff) cls = i < diff.stablePrefixMessages ? "stable" : diff.added.includes(i) ? "added" : "kept";
    if (diff && i === diff.stablePrefixMessages)
      msgs.push(el("div", { class: "prefix-end", "data-testid": "prefix-end",
        text: `the byte-stable prefix ends here: ${diff.stablePrefixMessages} messages, ${fmt(diff.stablePrefixTokens)} tokens identical to the previous request` }));
    msgs.push(messageEl(m, i, cat.messageKinds[i], cls, per[i]));
  });
  if (diff && diff.stablePrefixMessages >= rep.messages.length)
    msgs.push(el("div", { class: "prefix-end", "data-testid": "prefix-end", text: "the whole request is a byte-stable prefix of the previous one" }));
  const replaced = diff ? diff.replaced.map((i) => messageEl(diff.previousMessages[i], i, "verbatim", "replaced")) : [];
  const u = r.usage;
  fill(pane,
    el("h2", {}, "What the model saw ", el("code", { text: short(id) })),
    el("div", { class: "notice" }, `context/replay in ${r.format} format · `, rep.exact ? "exact (recorded render)" : "reconstruction (no recorded render)"),
    el("h3", { text: "Tokens" }), tokenBar(cat),
    el("h3", { text: "Decision path" }), el("ol", { class: "path", "data-testid": "decision-path" }, r.decisionPath.map((s) => el("li", { text: s }))),
    el("h3", { text: "Difference from the previous request" }),
    diff ? el("div", { "data-testid": "diff-summary" },
      `previous request ${short(r.previous.nodeId)}: ${diff.stablePrefixMessages} of ${rep.messages.length} messages byte-stable (${fmt(diff.stablePrefixTokens)} tokens${diff.sameSystem ? ", same system prompt" : ", system prompt changed"}); `,
      `${diff.added.length} added, ${diff.replaced.length} of the previous request's messages replaced.`)
      : el("div", { class: "muted", text: "No earlier request on this branch." }),
    u ? el("div", { "data-testid": "usage" }, `provider usage: input ${fmt(u.input)}, cache read ${fmt(u.cacheRead)}, cache write ${fmt(u.cacheWrite)}, output ${fmt(u.output)}; `,
      `cost ≈ ${fmt(u.inputEquivalent)} base-input tokens (cache write ×${u.factors.cacheWrite}, read ×${u.factors.cacheRead})`)
      : el("div", { class: "notice", text: "No provider usage was reported for this call." }),
    el("h3", { text: "System prompt" }), rep.system ? el("details", {}, el("summary", { text: `${fmt(cat.system)} tokens` }), pre(rep.system)) : el("div", { class: "muted", text: "none" }),
    el("h3", { text: `Tools (${r.tools ? r.tools.length : 0})` }), toolsEl(r.tools, cat.tools),
    el("h3", { text: `Messages (${rep.messages.length})` }), el("div", { "data-testid": "request-messages" }, msgs),
    replaced.length ? [el("h3", { text: "Replaced messages of the previous request" }), replaced] : null,
    el("details", {}, el("summary", { text: "the replay as JSON" }), el("pre", { "data-testid": "replay-json", text: JSON.stringify(rep.messages) })));
}

async function showCompaction(id) {
  const pane = $("#detail");
  const r = await api("compaction", { session: state.sessionId, summary: id });
  const chip = (t, cls) => el("span", { class: "chip " + cls, title: "search the originals", onclick: () => searchOriginals(t), text: t });
  fill(pane,
    el("h2", {}, "Compaction ", el("code", { text: short(id) })),
    el("dl", { class: "kv" },
      el("dt", { text: "tokens" }), el("dd", { "data-testid": "compaction-tokens", text: `${fmt(r.tokensBefore)} → ${fmt(r.tokensAfter)}` }),
      el("dt", { text: "covers" }), el("dd", { text: `${r.coversIds.length} conversation nodes, ${r.covered.length} nodes with their calls` }),
      el("dt", { text: "identifiers" }), el("dd", { text: `${r.kept.length} kept, ${r.dropped.length} dropped — ${r.identifiersFrom}` })),
    el("h3", { text: "Summary" }), pre(r.summary.output),
    el("h3", { text: "Dropped identifiers (click to search the originals)" }), el("div", { class: "chips", "data-testid": "dropped" }, r.dropped.map((t) => chip(t, "dropped"))),
    el("h3", { text: "Kept identifiers" }), el("div", { class: "chips", "data-testid": "kept" }, r.kept.map((t) => chip(t, "kept"))),
    el("div", { id: "orig-hits" }),
    el("h3", { text: "Covered nodes" }),
    el("div", { "data-testid": "covered" }, r.covered.map((n) => el("div", { class: "hit", "data-node": n.id, onclick: () => selectNode(n.id) },
      el("b", { text: `${n.role} ${n.name || ""} ` }), JSON.stringify(n.output === null ? n.input : n.output).slice(0, 200)))));
}

async function searchOriginals(text) {
  const box = $("#orig-hits") || $("#detail");
  const q = /^[\w]+$/.test(text) ? text : `"${text.replace(/"/g, " ")}"`;
  const res = await api("search", { q, session: state.sessionId });
  fill(box, el("h3", { text: `Originals containing ${text} (${res.hits.length})` }),
    el("div", { "data-testid": "original-hits" }, res.hits.map((h) => el("div", { class: "hit", onclick: () => selectNode(h.nodeId) },
      el("b", { text: `${h.role} ${h.name || ""} ` }), h.snippet))));
}

// ------------------------------------------------------------------ live

function startLive(sessionId) {
  if (state.live) state.live.close();
  const es = new EventSource("/api/live?" + new URLSearchParams({ session: sessionId }));
  state.live = es;
  es.addEventListener("ready", () => { const s = $("#live-state"); if (s) s.textContent = "● live"; });
  es.addEventListener("change", (ev) => {
    const e = JSON.parse(ev.data);
    if (e.sessionId !== state.sessionId) return;
    clearTimeout(state.refetch);
    state.refetch = setTimeout(() => refresh(e), 120);
  });
  es.onerror = () => { const s = $("#live-state"); if (s) s.textContent = "○ reconnecting"; };
}

async function refresh() {
  const sid = state.sessionId;
  const g = await fetchGraph(sid);
  if (!g || state.sessionId !== sid) return;
  const top = $("#graph-scroll").scrollTop;
  renderGraphFrom(Object.assign({}, g.last || g, { nodes: g.nodes, session: g.session }), g.nodes);
  $("#graph-scroll").scrollTop = top;
  const live = $("#live-state"); if (live) live.textContent = "● live";
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
}

// ------------------------------------------------------------------ start

async function main() {
  state.info = await api("info");
  $("#db").textContent = state.info.database || "";
  $("#db").title = state.info.database || "";
  $("#graph-scroll").addEventListener("scroll", () => drawWindow(false), { passive: true });
  window.addEventListener("resize", () => drawWindow(true));
  let t = null;
  $("#search").addEventListener("input", () => { clearTimeout(t); t = setTimeout(() => loadSessions($("#search").value.trim()), 200); });
  $("#search-form").addEventListener("submit", (e) => { e.preventDefault(); loadSessions($("#search").value.trim()); });
  await loadSessions("");
  const first = new URLSearchParams(location.hash.slice(1)).get("session");
  if (first) await openSession(first);
  document.body.dataset.ready = "1";
}

main().catch((e) => { document.body.append(el("pre", { text: "dagctx ui failed: " + e.message })); });
