-- dagctx.nvim: a Neovim client of the dagctx context-engine daemon.
--
--   require("dagctx").setup({
--     cmd = { "python3", "-P", "-m", "dagctx.cli", "serve" },  -- default ($DAGCTX_PYTHON replaces python3)
--     database = "~/notes/agent.db",                 -- initializationOptions.database
--     initialization_options = { observeNodes = true },
--     on_sampling = function(params, respond) ... end,
--   })
--
-- The daemon is spawned on first use (or by start()) and speaks JSON-RPC 2.0 with
-- LSP framing on stdio; see dagctx.rpc for the connection and dagctx.ui for the
-- scratch buffers of :DagctxSessions, :DagctxRender and :DagctxSearch.

local rpc = require("dagctx.rpc")
local ui = require("dagctx.ui")

local M = {}

M.version = "0.1.0"

local function default_cmd(standalone)
  local python = vim.env.DAGCTX_PYTHON
  if python == nil or python == "" then
    python = "python3"
  end
  local cmd = { python, "-P", "-m", "dagctx.cli", "serve" }
  if standalone then
    table.insert(cmd, "--standalone")
  end
  return cmd
end

M.defaults = {
  cmd = nil, -- nil: default_cmd(): `dagctx serve`, which forwards to your shared daemon
  standalone = false, -- true: a private daemon for this editor (`serve --standalone`)
  cmd_env = nil, -- extra environment variables of the daemon
  cwd = nil,
  database = nil, -- path of the SQLite database (initializationOptions.database)
  initialization_options = {}, -- camelCase keys, as on the wire
  capabilities = {}, -- camelCase keys; `sampling` is added when on_sampling is set
  observe_nodes = true, -- ask for node/didAppend and node/didUpdate
  timeout_ms = 10000, -- request_sync default and the commands' timeout
  list_limit = 100, -- :DagctxSessions
  search_limit = 50, -- :DagctxSearch
  window = "split", -- how scratch buffers open: split | vsplit | tab | current
  -- sampling/createMessage: fun(params, respond) -> result | string | nil, err.
  -- Return the result (or just its text), or `nil, {code?, message}`; or return
  -- nothing and call respond(err, result) later (the editor waits for it up to
  -- sampling_timeout_ms: vim.lsp.rpc answers server requests synchronously).
  on_sampling = nil,
  sampling_timeout_ms = 120000,
  on_notification = nil, -- fun(method, params), after the built-in handling
  log_size = 200, -- notifications kept for :DagctxLog
  notify_compaction = true, -- vim.notify on context/compactionRecommended
}

M.config = vim.deepcopy(M.defaults)
M.client = nil
M.log = {}
M.last_notification = nil
M.last_server_request = nil

local levels = vim.log.levels

local function notify(msg, level)
  vim.notify("dagctx: " .. msg, level or levels.INFO)
end

---Report a failed request: "dagctx: <what>: [Kind] message (code)".
function M.notify_error(what, err)
  notify(what .. ": " .. rpc.format_error(err), levels.ERROR)
end

-- ------------------------------------------------------------------ wire helpers

---Empty tables become {} (not []) on the wire, recursively: for option tables
---that hold only objects (initializationOptions, capabilities).
local function objects(v)
  if type(v) ~= "table" or v == vim.NIL then
    return v
  end
  if next(v) == nil then
    return vim.empty_dict()
  end
  local out = {}
  for k, x in pairs(v) do
    out[k] = objects(x)
  end
  return out
end

local function push_log(method, params, summary)
  local entry = { time = os.time(), method = method, params = params, summary = summary }
  table.insert(M.log, entry)
  local limit = M.config.log_size or 200
  while #M.log > limit do
    table.remove(M.log, 1)
  end
  return entry
end

local has_autocmd_data = vim.fn.has("nvim-0.8") == 1

---Fire `User <pattern>` if anyone listens; the payload is also in
---require("dagctx").last_notification (and in the autocmd's `data` on 0.8+).
local function fire(pattern, payload)
  if vim.fn.exists("#User#" .. pattern) ~= 1 then
    return
  end
  local opts = { pattern = pattern, modeline = false }
  if has_autocmd_data then
    opts.data = payload
  end
  local ok, e = pcall(vim.api.nvim_exec_autocmds, "User", opts)
  if not ok then
    notify("User " .. pattern .. " autocmd failed: " .. tostring(e), levels.WARN)
  end
end

local node_events = {
  ["node/didAppend"] = "DagctxNodeAppended",
  ["node/didUpdate"] = "DagctxNodeUpdated",
  ["session/didChange"] = "DagctxSessionChanged",
  ["context/compactionRecommended"] = "DagctxCompactionRecommended",
  ["$/progress"] = "DagctxProgress",
}

local function summarize(method, p)
  if type(p) ~= "table" then
    return nil
  end
  if method == "node/didAppend" or method == "node/didUpdate" then
    local n = p.node or {}
    local out = n.output
    if type(out) ~= "string" then
      out = (out ~= nil and out ~= vim.NIL) and ui.to_json(out) or ""
    end
    out = ui.first_line(out, 80)
    return string.format("%s %s #%s %s%s [%s] %s", tostring(p.sessionId), tostring(n.id), tostring(n.seq), tostring(n.role),
      (n.name and n.name ~= "") and (" " .. n.name) or "", tostring(n.status), out)
  elseif method == "session/didChange" then
    return string.format("%s %s%s%s", tostring(p.sessionId), tostring(p.change),
      p.head and (" head " .. tostring(p.head)) or "", p.title and (" title " .. tostring(p.title)) or "")
  elseif method == "window/logMessage" then
    return tostring(p.message)
  end
  return nil
end

-- ------------------------------------------------------------------ live sessions

---session id -> the watch buffer's name, for :DagctxWatch
M.watching = {}

local function watch_line(method, p)
  local who = (p.origin == nil or p.origin == vim.NIL) and "another process" or tostring(p.origin)
  if M.client and M.client.initialize_result and p.origin == M.client.initialize_result.connectionId then
    who = "this editor"
  end
  -- one buffer line whatever the payload holds (nvim_buf_set_lines refuses newlines)
  return ui.one_line(string.format("%s  %-18s %s  (from %s)", os.date("%H:%M:%S"), method,
    summarize(method, p) or "", who))
end

local function on_watched(method, params)
  if type(params) ~= "table" or not M.watching[params.sessionId] then
    return
  end
  local buf = ui.find_buf(M.watching[params.sessionId])
  if not buf then
    return
  end
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, -1, -1, false, { watch_line(method, params) })
  vim.bo[buf].modifiable = false
  vim.bo[buf].modified = false
  for _, win in ipairs(vim.fn.win_findbuf(buf)) do
    vim.api.nvim_win_set_cursor(win, { vim.api.nvim_buf_line_count(buf), 0 })
  end
end

local function on_notification(method, params)
  local payload = { method = method, params = params }
  M.last_notification = payload
  push_log(method, params, summarize(method, params))
  if method == "context/compactionRecommended" and M.config.notify_compaction then
    local p = type(params) == "table" and params or {}
    notify(string.format("compaction recommended for session %s (%s%% of the window)", tostring(p.sessionId),
      tostring(p.percentUsed or p.percent or "?")), levels.WARN)
  end
  local pattern = node_events[method]
  if pattern then
    fire(pattern, payload)
  end
  if method == "node/didAppend" or method == "node/didUpdate" or method == "session/didChange" then
    on_watched(method, params)
  end
  fire("DagctxNotification", payload)
  if M.config.on_notification then
    local ok, e = pcall(M.config.on_notification, method, params)
    if not ok then
      notify("on_notification failed: " .. tostring(e), levels.WARN)
    end
  end
end

---The default sampling handler: no model is configured, answer an error.
function M.default_sampling(_params)
  return nil, {
    code = rpc.codes.MethodNotFound,
    message = "dagctx.nvim has no sampling handler: pass on_sampling to require('dagctx').setup()",
  }
end

local function sampling_result(res)
  if type(res) == "string" then
    return { role = "assistant", content = { type = "text", text = res }, model = "dagctx.nvim", stopReason = "endTurn" }
  end
  return res
end

---Answer sampling/createMessage with config.on_sampling (synchronously; an
---asynchronous handler calls respond() and the editor waits for it).
function M.handle_sampling(params)
  local handler = M.config.on_sampling or M.default_sampling
  local responded, r_err, r_res = false, nil, nil
  local function respond(err, result)
    if not responded then
      responded, r_err, r_res = true, err, result
    end
  end
  local res, err = handler(params, respond)
  if res == nil and err == nil then
    if not responded then
      vim.wait(M.config.sampling_timeout_ms or 120000, function()
        return responded
      end, 10)
    end
    if not responded then
      return nil, { code = rpc.codes.InternalError, message = "the sampling handler did not respond in time" }
    end
    res, err = r_res, r_err
  end
  if err ~= nil then
    if type(err) ~= "table" then
      err = { code = rpc.codes.Application, message = tostring(err) }
    end
    return nil, err
  end
  if res == nil then
    return nil, { code = rpc.codes.InternalError, message = "the sampling handler returned no result" }
  end
  return sampling_result(res)
end

local function on_server_request(method, params)
  M.last_server_request = { method = method, params = params }
  push_log(method, params, "server request")
  if method == "sampling/createMessage" then
    return M.handle_sampling(params)
  end
  return nil, { code = rpc.codes.MethodNotFound, message = "dagctx.nvim does not handle " .. tostring(method) }
end

-- ------------------------------------------------------------------ lifecycle

local function build_client()
  local cfg = M.config
  local init = vim.deepcopy(cfg.initialization_options or {})
  if cfg.database and init.database == nil then
    init.database = vim.fn.expand(cfg.database)
  end
  if cfg.observe_nodes and init.observeNodes == nil then
    init.observeNodes = true
  end
  local caps = vim.deepcopy(cfg.capabilities or {})
  if cfg.on_sampling and caps.sampling == nil then
    caps.sampling = {}
  end
  return rpc.new({
    cmd = cfg.cmd or default_cmd(cfg.standalone),
    cmd_env = cfg.cmd_env,
    cwd = cfg.cwd,
    initialization_options = objects(init),
    capabilities = objects(caps),
    client_info = { name = "dagctx.nvim", version = M.version },
    on_notification = on_notification,
    on_server_request = on_server_request,
    on_error = function(kind, detail)
      push_log("client/error", detail, tostring(kind) .. ": " .. (type(detail) == "string" and detail or vim.inspect(detail)))
    end,
    on_exit = function(code, signal, was)
      push_log("client/exit", { code = code, signal = signal }, string.format("daemon exited: code %s, signal %s", tostring(code), tostring(signal)))
      if was == "running" then
        local tail = M.client and M.client:stderr_tail(8) or {}
        local last = #tail > 0 and ("; its last stderr lines:\n    " .. table.concat(tail, "\n    ")) or ""
        notify(string.format("the daemon exited unexpectedly (code %s); it restarts on the next command%s",
          tostring(code), last), levels.WARN)
      end
    end,
  })
end

local augroup = nil

---Configure the plugin. Does not spawn the daemon (first use does, or start()).
function M.setup(opts)
  opts = opts or {}
  local cfg = vim.tbl_extend("force", vim.deepcopy(M.defaults), opts)
  -- option tables are replaced, never merged index by index
  M.config = cfg
  if M.client and M.client:is_alive() then
    notify("setup() changed the configuration: the running daemon keeps the old one until :DagctxStop", levels.INFO)
  end
  if augroup == nil then
    augroup = vim.api.nvim_create_augroup("dagctx", { clear = true })
    vim.api.nvim_create_autocmd("VimLeavePre", {
      group = augroup,
      callback = function()
        M.stop(true, 1000)
      end,
    })
  end
  return M
end

---Spawn the daemon (if it is not running) and send initialize. Returns the
---client, or nil and an error.
function M.start()
  if M.client and M.client:is_alive() then
    return M.client
  end
  local client = build_client()
  local ok, err = client:start()
  if not ok then
    return nil, err
  end
  M.client = client
  return client
end

---shutdown + exit. With sync, wait for the process; returns its exit code.
function M.stop(sync, timeout_ms)
  local client = M.client
  if not client then
    return nil
  end
  local code = client:stop(sync, timeout_ms)
  return code
end

---The initialize result of the running daemon (waits for it), or nil, err.
function M.server_info(timeout_ms)
  local client, err = M.start()
  if not client then
    return nil, err
  end
  local ok, e = client:wait_ready(timeout_ms or M.config.timeout_ms)
  if not ok then
    return nil, e
  end
  return client.initialize_result
end

---Asynchronous request: callback(err, result) runs on the main loop.
function M.request(method, params, callback)
  local client, err = M.start()
  if not client then
    vim.schedule(function()
      if callback then
        callback(err)
      end
    end)
    return nil
  end
  return client:request(method, params, callback)
end

---Synchronous request (vim.wait): returns result, err. err is
---{code, message, data, kind} with kind = the daemon's data.kind.
function M.request_sync(method, params, timeout_ms)
  local client, err = M.start()
  if not client then
    return nil, err
  end
  return client:request_sync(method, params, timeout_ms or M.config.timeout_ms)
end

function M.notify(method, params)
  local client = M.start()
  return client and client:notify(method, params) or false
end

-- ------------------------------------------------------------------ commands

local function database_name()
  local info = M.client and M.client.initialize_result
  return info and info.database or nil
end

---:DagctxSessions
function M.sessions()
  local res, err = M.request_sync("session/list", { limit = M.config.list_limit, offset = 0 })
  if err then
    M.notify_error("session/list failed", err)
    return nil, err
  end
  local lines, items = ui.format_sessions(res, database_name())
  return ui.open_scratch("dagctx://sessions", lines, {
    window = M.config.window,
    items = items,
    on_enter = function(item)
      M.render(item.sessionId)
    end,
  })
end

local function newest_session()
  local res, err = M.request_sync("session/list", { limit = 1, offset = 0 })
  if err then
    return nil, err
  end
  local s = res.sessions and res.sessions[1]
  if not s then
    return nil, rpc.make_error(rpc.codes.InvalidParams, "there are no sessions in this database yet", { kind = "SessionNotFound" })
  end
  return s.sessionId
end

---Every session id of the database (session/list, page by page).
local function all_session_ids(timeout_ms)
  local ids, offset = {}, 0
  while true do
    local res, err = M.request_sync("session/list", { limit = 500, offset = offset }, timeout_ms)
    if err then
      return nil, err
    end
    local page = res.sessions or {}
    for _, s in ipairs(page) do
      ids[#ids + 1] = s.sessionId
    end
    offset = offset + #page
    if #page == 0 or offset >= (res.total or 0) then
      return ids
    end
  end
end

---The session id `ref` names: itself, or the only id that starts with it (as the CLI).
function M.resolve_session(ref)
  local _, err = M.request_sync("session/get", { sessionId = ref })
  if not err or err.code == rpc.codes.MethodNotFound then
    return ref -- found, or an older daemon without session/get: the id as given
  end
  if err.kind ~= "SessionNotFound" then
    return nil, err
  end
  local ids, lerr = all_session_ids()
  if not ids then
    return nil, lerr
  end
  local matches = {}
  for _, id in ipairs(ids) do
    if vim.startswith(id, ref) then
      matches[#matches + 1] = id
    end
  end
  if #matches == 1 then
    return matches[1]
  end
  local why = #matches == 0 and "no session id starts with it"
    or string.format("%d sessions match; give more characters", #matches)
  return nil, rpc.make_error(rpc.codes.Application, string.format("session %q: %s", ref, why), { kind = "SessionNotFound" })
end

---:DagctxRender [session id or prefix]: the neutral messages of the session's HEAD.
---Falls back to session/history when the daemon lacks context/render.
function M.render(session_id, opts)
  opts = opts or {}
  if session_id == nil or session_id == "" then
    local id, err = newest_session()
    if not id then
      M.notify_error("render", err)
      return nil, err
    end
    session_id = id
  else
    local id, err = M.resolve_session(session_id)
    if not id then
      M.notify_error("render", err)
      return nil, err
    end
    session_id = id
  end
  local name = "dagctx://render/" .. session_id
  local params = { sessionId = session_id, format = "neutral" }
  if opts.head then
    params.head = opts.head
  end
  local res, err = M.request_sync("context/render", params)
  if err and err.code == rpc.codes.MethodNotFound then
    local hist_params = { sessionId = session_id }
    if opts.head then
      hist_params.head = opts.head
    end
    local hist, herr = M.request_sync("session/history", hist_params)
    if herr then
      M.notify_error("session/history failed", herr)
      return nil, herr
    end
    local note = "-- context/render is not available in this daemon ("
      .. rpc.format_error(err)
      .. "); showing session/history instead"
    return ui.open_scratch(name, ui.format_history(hist, session_id, note), { window = M.config.window })
  elseif err then
    M.notify_error("context/render failed", err)
    return nil, err
  end
  return ui.open_scratch(name, ui.format_render(res, session_id), { window = M.config.window })
end

---:DagctxWatch [session]: subscribe and show every change of the session live, whoever
---writes it (an agent, the CLI, a CI run on the same database).
function M.watch(session_id)
  if session_id == nil or session_id == "" then
    local id, err = newest_session()
    if not id then
      M.notify_error("watch", err)
      return nil, err
    end
    session_id = id
  end
  local res, err = M.request_sync("session/subscribe", { sessionId = session_id })
  if err then
    M.notify_error("session/subscribe failed", err)
    return nil, err
  end
  local name = "dagctx://watch/" .. session_id
  M.watching[session_id] = name
  local buf = ui.open_scratch(name, {
    "-- watching session " .. session_id .. " (HEAD " .. tostring(res.head) .. "); :DagctxUnwatch stops",
  }, { window = M.config.window })
  vim.bo[buf].bufhidden = "hide"
  return buf
end

---:DagctxUnwatch [session]: stop watching (every session without an argument).
function M.unwatch(session_id)
  local ids = {}
  if session_id and session_id ~= "" then
    ids = { session_id }
  else
    ids = vim.tbl_keys(M.watching)
  end
  for _, id in ipairs(ids) do
    M.watching[id] = nil
    if M.client and M.client:is_alive() then
      M.request("session/unsubscribe", { sessionId = id }, function() end)
    end
  end
  return #ids
end

---:DagctxSearch {query}
function M.search(query, opts)
  opts = opts or {}
  if query == nil or vim.trim(query) == "" then
    local err = rpc.make_error(rpc.codes.InvalidParams, "usage: :DagctxSearch {query}")
    M.notify_error("search", err)
    return nil, err
  end
  local params = { query = query, limit = opts.limit or M.config.search_limit }
  if opts.sessionId then
    params.sessionId = opts.sessionId
  end
  local res, err = M.request_sync("search/query", params)
  if err then
    M.notify_error("search/query failed", err)
    return nil, err
  end
  local lines, items = ui.format_search(res, query)
  return ui.open_scratch("dagctx://search", lines, {
    window = M.config.window,
    items = items,
    on_enter = function(item)
      M.render(item.sessionId)
    end,
  })
end

---:DagctxLog: notifications and server requests received.
function M.show_log()
  return ui.open_scratch("dagctx://log", ui.format_log(M.log), { window = M.config.window })
end

---Completion of session ids (for :DagctxRender). Starts the daemon when no command
---has yet (completion is the first thing a user may do), waiting at most 3 s.
function M.complete_sessions(arglead)
  local client = M.start()
  if not client or not client:wait_ready(3000) then
    return {}
  end
  local ids = all_session_ids(2000) or {}
  local out = {}
  for _, id in ipairs(ids) do
    if vim.startswith(id, arglead or "") then
      out[#out + 1] = id
    end
  end
  return out
end

return M
