-- dagctx.rpc: one connection to one dagctx daemon, on top of vim.lsp.rpc.
--
-- vim.lsp.rpc does the framing (Content-Length headers) and the JSON. This
-- module adds what a dagctx client needs around it:
--
--   * the lifecycle: initialize -> initialized -> requests ... shutdown -> exit;
--     requests made while initialize is in flight are queued and sent after it;
--   * callbacks that always run on the main loop, exactly once, even when the
--     daemon dies or the reply is a (muted) RequestCancelled;
--   * errors as tables {code, message, data, kind}, `kind` being the daemon's
--     stable `data.kind`;
--   * a synchronous request (vim.wait) for commands and tests;
--   * server -> client requests answered synchronously, as vim.lsp.rpc wants.
--
-- Notes on vim.lsp.rpc in Neovim 0.7.2 (runtime/lua/vim/lsp/rpc.lua), which
-- shaped this module:
--   * start(cmd, cmd_args, dispatchers, extra_spawn_params): cmd is a string and
--     cmd_args a list; from 0.10 on it is start(cmd_list, dispatchers, extra).
--   * the `notification` and `on_error` dispatchers are schedule_wrap()ed by
--     start(); `on_exit` is not (it runs in a luv callback: a fast event);
--     `server_request` is called inside a vim.schedule() and must *return*
--     `result` or `nil, err` at once: the reply is sent when it returns. Returning
--     neither raises an error in the scheduled function and no reply is sent, so
--     a null result has to be vim.NIL. err.code must be one of
--     vim.lsp.protocol.ErrorCodes (asserted).
--   * bodies are decoded with luanil.object = true: a JSON null inside an
--     object becomes nil, inside an array vim.NIL; `{}` decodes to
--     vim.empty_dict(). vim.json.encode({}) gives "[]", so empty objects we send
--     must be vim.empty_dict().
--   * a reply with code -32800 (RequestCancelled) never reaches the request's
--     callback; only notify_reply_callback sees it. We use that to complete the
--     request with a cancellation error instead of leaving it pending forever.
--   * request ids we send are numbers (tonumber() is applied to reply ids); the
--     daemon's own request ids are strings and are echoed back unchanged.

local M = {}

M.codes = {
  ParseError = -32700,
  InvalidRequest = -32600,
  MethodNotFound = -32601,
  InvalidParams = -32602,
  InternalError = -32603,
  ServerNotInitialized = -32002,
  Application = -32001, -- LSP's "UnknownErrorCode"; dagctx's application errors
  RequestCancelled = -32800,
}

local has_new_start = vim.fn.has("nvim-0.10") == 1

-- ------------------------------------------------------------------ stderr tail
--
-- vim.lsp.rpc reads the daemon's stderr and hands each chunk to
-- vim.lsp.log.error("rpc", cmd, "stderr", chunk); it offers no callback of its own.
-- To say why a daemon died, the tap below sees those calls (and passes every call
-- on unchanged) and keeps each client's last STDERR_LINES lines.

local STDERR_LINES = 40
local taps = {} -- cmd key -> client

local function cmd_key(cmd)
  if type(cmd) == "table" then
    return cmd[1] and tostring(cmd[1]) or ""
  end
  return tostring(cmd)
end

local function install_tap()
  local ok, log = pcall(require, "vim.lsp.log")
  if not ok or type(log) ~= "table" or log.__dagctx_tap then
    return
  end
  local original = log.error
  log.__dagctx_tap = true
  log.error = function(...)
    local n = select("#", ...)
    if n >= 4 then
      local tag, cmd, what, chunk = ...
      if tag == "rpc" and what == "stderr" and type(chunk) == "string" then
        local client = taps[cmd_key(cmd)]
        if client then
          client:_stderr(chunk)
        end
      end
    end
    return original(...)
  end
end

---Append a chunk of the daemon's stderr to the ring buffer (a fast event: no API calls).
function M._stderr_lines(buffer, partial, chunk)
  local text = (partial or "") .. chunk
  local rest = text
  for line, nl in text:gmatch("([^\n]*)(\n)") do
    local _ = nl
    if line:match("%S") then
      buffer[#buffer + 1] = #line > 500 and (line:sub(1, 499) .. "…") or line
      if #buffer > STDERR_LINES then
        table.remove(buffer, 1)
      end
    end
  end
  rest = text:match("[^\n]*$") or ""
  return rest
end

---Normalize an error reply into {code, message, data, kind}.
local function make_error(code, message, data)
  local kind = type(data) == "table" and data.kind or nil
  return { code = code, message = message, data = data, kind = kind }
end
M.make_error = make_error

---"[Kind] message (code)" for a person.
function M.format_error(err)
  if err == nil then
    return "no error"
  end
  if type(err) ~= "table" then
    return tostring(err)
  end
  local kind = err.kind or (type(err.data) == "table" and err.data.kind) or nil
  local parts = {}
  if kind then
    table.insert(parts, "[" .. tostring(kind) .. "]")
  end
  table.insert(parts, tostring(err.message or "error"))
  if err.code then
    table.insert(parts, "(" .. tostring(err.code) .. ")")
  end
  return table.concat(parts, " ")
end

local function in_fast()
  return vim.in_fast_event and vim.in_fast_event()
end

---Run fn on the main loop (now if we already are there).
local function on_main(fn)
  if in_fast() then
    vim.schedule(fn)
  else
    fn()
  end
end

local Client = {}
Client.__index = Client

---Create a client (the daemon is not spawned until :start()).
---opts:
---  cmd                    list of strings, e.g. {"python3", "-P", "-m", "dagctx.cli", "serve"}
---  cmd_env                table of extra environment variables, or nil
---  cwd                    working directory of the daemon, or nil
---  initialization_options table (camelCase keys, as on the wire)
---  capabilities           table (camelCase keys)
---  client_info            {name, version}
---  on_notification        fun(method, params)             (main loop)
---  on_server_request      fun(method, params) -> result | nil, err  (main loop)
---  on_error               fun(kind_name, detail)          (main loop)
---  on_exit                fun(code, signal, previous_state) (main loop)
function M.new(opts)
  local self = setmetatable({}, Client)
  self.opts = opts or {}
  self.state = "stopped" -- stopped | starting | running | stopping | failed
  self.queue = {} -- requests waiting for initialize
  self.pending = {} -- id -> request record
  self.rpc = nil
  self.initialize_result = nil
  self.init_error = nil
  self.exit_code = nil
  self.stderr = {} -- the daemon's last stderr lines
  self.stderr_partial = ""
  return self
end

function Client:_stderr(chunk)
  self.stderr_partial = M._stderr_lines(self.stderr, self.stderr_partial, chunk)
end

---The daemon's last `n` stderr lines (a list; a partial last line included).
function Client:stderr_tail(n)
  n = n or 12
  local lines = {}
  for i = math.max(1, #self.stderr - n + 1), #self.stderr do
    lines[#lines + 1] = self.stderr[i]
  end
  if self.stderr_partial:match("%S") then
    lines[#lines + 1] = self.stderr_partial
  end
  return lines
end

function Client:is_running()
  return self.state == "running"
end

function Client:is_alive()
  return self.state == "starting" or self.state == "running" or self.state == "stopping"
end

-- ------------------------------------------------------------------ dispatchers

function Client:_dispatchers()
  local this = self
  return {
    notification = function(method, params)
      on_main(function()
        local cb = this.opts.on_notification
        if cb then
          local ok, e = pcall(cb, method, params)
          if not ok then
            this:_report("notification handler for " .. tostring(method) .. " failed: " .. tostring(e))
          end
        end
      end)
    end,
    server_request = function(method, params)
      return this:_answer(method, params)
    end,
    on_error = function(code, detail)
      on_main(function()
        local name = vim.lsp.rpc.client_errors and vim.lsp.rpc.client_errors[code] or tostring(code)
        if this.opts.on_error then
          pcall(this.opts.on_error, name, detail)
        end
      end)
    end,
    on_exit = function(code, signal)
      -- a luv callback (fast event): nothing of the editor may be touched here
      vim.schedule(function()
        this:_on_exit(code, signal)
      end)
    end,
  }
end

---Answer a server -> client request. Must return synchronously (see the header).
function Client:_answer(method, params)
  local handler = self.opts.on_server_request
  local result, err
  if handler then
    local ok, r, e = pcall(handler, method, params)
    if ok then
      result, err = r, e
    else
      err = { code = M.codes.InternalError, message = "the editor's handler failed: " .. tostring(r) }
    end
  else
    err = { code = M.codes.MethodNotFound, message = "this client does not handle " .. tostring(method) }
  end
  if err ~= nil then
    if type(err) ~= "table" then
      err = { code = M.codes.Application, message = tostring(err) }
    end
    local code = err.code
    if type(code) ~= "number" or not vim.lsp.protocol.ErrorCodes[code] then
      -- vim.lsp.rpc asserts that the code is one it knows
      code = M.codes.InternalError
    end
    return nil, vim.lsp.rpc.rpc_response_error(code, tostring(err.message or "error"), err.data)
  end
  if result == nil then
    result = vim.NIL -- a JSON null result; plain nil would send no reply at all
  end
  return result
end

-- ------------------------------------------------------------------ process

local function spawn(cmd, dispatchers, extra)
  if has_new_start then
    return vim.lsp.rpc.start(cmd, dispatchers, extra)
  end
  local args = {}
  for i = 2, #cmd do
    args[#args + 1] = cmd[i]
  end
  return vim.lsp.rpc.start(cmd[1], args, dispatchers, extra)
end

---Spawn the daemon and send initialize. Returns true, or false and an error.
---Requests made before initialize is answered are queued.
function Client:start()
  if self:is_alive() then
    return true
  end
  local cmd = self.opts.cmd
  if type(cmd) ~= "table" or #cmd == 0 then
    return false, make_error(M.codes.InvalidParams, "dagctx: cmd must be a non-empty list of strings")
  end
  if vim.fn.executable(cmd[1]) ~= 1 then
    return false,
      make_error(
        M.codes.InternalError,
        string.format("dagctx: %q is not executable (set cmd in setup() or $DAGCTX_PYTHON)", cmd[1])
      )
  end
  local extra = {}
  if self.opts.cwd then
    extra.cwd = self.opts.cwd
  end
  if self.opts.cmd_env then
    extra.env = self.opts.cmd_env
  end
  install_tap()
  self.stderr, self.stderr_partial = {}, ""
  taps[cmd_key(cmd)] = self
  local ok, rpc = pcall(spawn, cmd, self:_dispatchers(), extra)
  if not ok or rpc == nil then
    return false, make_error(M.codes.InternalError, "dagctx: could not start " .. table.concat(cmd, " ") .. ": " .. tostring(rpc))
  end
  self.rpc = rpc
  self.state = "starting"
  self.init_error = nil
  self.exit_code = nil
  self.queue = {}
  self.pending = {}

  local info = self.opts.client_info or { name = "dagctx.nvim", version = "0.1.0" }
  local params = {
    processId = vim.fn.getpid(),
    clientInfo = info,
    rootUri = vim.uri_from_fname(vim.fn.getcwd()),
    capabilities = self.opts.capabilities or vim.empty_dict(),
    initializationOptions = self.opts.initialization_options or vim.empty_dict(),
  }
  self:_send({
    method = "initialize",
    params = params,
    callback = function(err, result)
      if err then
        self.init_error = err
        self.state = "failed"
        self:_fail_queue(make_error(err.code, "initialize failed: " .. tostring(err.message), err.data))
        self:_kill()
        return
      end
      self.initialize_result = result
      self.rpc.notify("initialized", vim.empty_dict())
      self.state = "running"
      local queue = self.queue
      self.queue = {}
      for _, req in ipairs(queue) do
        if not req.done then
          self:_send(req)
        end
      end
    end,
  })
  return true
end

function Client:_kill()
  local rpc = self.rpc
  if not rpc then
    return
  end
  if rpc.terminate then
    pcall(rpc.terminate)
  elseif rpc.handle and not rpc.handle:is_closing() then
    pcall(rpc.handle.kill, rpc.handle, 15)
  end
end

function Client:_on_exit(code, signal)
  self.exit_code = code
  local was = self.state
  self.state = was == "failed" and "failed" or "stopped"
  local message = string.format("the dagctx daemon exited (code %s, signal %s)", tostring(code), tostring(signal))
  local tail = self:stderr_tail(12)
  if #tail > 0 then
    message = message .. "; its last stderr lines:\n    " .. table.concat(tail, "\n    ")
  end
  local err = make_error(M.codes.InternalError, message, { kind = "DaemonExited", stderr = tail })
  self:_fail_queue(err)
  local pending = self.pending
  self.pending = {}
  for _, req in pairs(pending) do
    self:_finish(req, err)
  end
  self.rpc = nil
  if self.opts.on_exit then
    pcall(self.opts.on_exit, code, signal, was)
  end
end

function Client:_fail_queue(err)
  local queue = self.queue
  self.queue = {}
  for _, req in ipairs(queue) do
    self:_finish(req, err)
  end
end

function Client:_report(msg)
  if self.opts.on_error then
    pcall(self.opts.on_error, "HANDLER_ERROR", msg)
  end
end

-- ------------------------------------------------------------------ requests

function Client:_finish(req, err, result)
  if req.done then
    return
  end
  req.done = true
  if req.id ~= nil and self.pending[req.id] == req then
    self.pending[req.id] = nil
  end
  if err ~= nil and type(err) == "table" and err.kind == nil then
    err = make_error(err.code, err.message, err.data)
  end
  if req.callback then
    local ok, e = pcall(req.callback, err, result)
    if not ok then
      self:_report("callback of " .. req.method .. " failed: " .. tostring(e))
    end
  end
end

function Client:_send(req)
  local rpc = self.rpc
  if not rpc then
    on_main(function()
      self:_finish(req, make_error(M.codes.InternalError, "the dagctx daemon is not running", { kind = "NotRunning" }))
    end)
    return
  end
  local ok, id = rpc.request(req.method, req.params, function(err, result)
    -- scheduled by vim.lsp.rpc: main loop
    self:_finish(req, err, result)
  end, function()
    -- the reply arrived. The result callback (queued right after this one) finishes
    -- the request; if it never comes, the reply was a muted RequestCancelled.
    vim.schedule(function()
      self:_finish(
        req,
        make_error(M.codes.RequestCancelled, req.method .. " was cancelled", { kind = "RequestCancelled" })
      )
    end)
  end)
  if not ok then
    on_main(function()
      self:_finish(req, make_error(M.codes.InternalError, "could not send " .. req.method .. ": the daemon's stdin is closed"))
    end)
    return
  end
  req.id = id
  self.pending[id] = req
end

---Send a request. callback(err, result) runs once, on the main loop.
---Returns a handle for :cancel().
function Client:request(method, params, callback)
  if type(params) == "table" and next(params) == nil and getmetatable(params) == nil then
    -- dagctx params are always by name: {} means an empty object, not "[]"
    params = vim.empty_dict()
  end
  local req = { method = method, params = params, callback = callback, done = false }
  if self.state == "running" or self.state == "stopping" then
    self:_send(req)
  elseif self.state == "starting" then
    table.insert(self.queue, req)
  else
    local err
    if self.state == "failed" and self.init_error then
      err = make_error(self.init_error.code, "initialize failed: " .. tostring(self.init_error.message), self.init_error.data)
    else
      err = make_error(M.codes.InternalError, "the dagctx daemon is not running (" .. self.state .. ")", { kind = "NotRunning" })
    end
    vim.schedule(function()
      self:_finish(req, err)
    end)
  end
  return req
end

---Cancel a request made with :request(); its callback gets a RequestCancelled error.
function Client:cancel(req, reason)
  if req.done then
    return
  end
  if req.id ~= nil and self.rpc then
    self.rpc.notify("$/cancelRequest", { id = req.id })
  end
  self:_finish(req, make_error(M.codes.RequestCancelled, reason or (req.method .. " was cancelled by the client"), { kind = "RequestCancelled" }))
end

function Client:notify(method, params)
  if not self.rpc then
    return false
  end
  return self.rpc.notify(method, params)
end

---Send a request and wait for its answer. Returns result, err.
---Not usable inside a fast event (luv callback).
function Client:request_sync(method, params, timeout_ms)
  timeout_ms = timeout_ms or 10000
  if in_fast() then
    return nil, make_error(M.codes.InternalError, "request_sync called in a fast event; use request() with a callback")
  end
  local done, r_err, r_res = false, nil, nil
  local req = self:request(method, params, function(err, result)
    done, r_err, r_res = true, err, result
  end)
  local ok = vim.wait(timeout_ms, function()
    return done
  end, 5)
  if not ok and not done then
    self:cancel(req, string.format("%s got no answer within %d ms", method, timeout_ms))
    return nil, make_error(M.codes.RequestCancelled, string.format("%s got no answer within %d ms", method, timeout_ms), { kind = "Timeout" })
  end
  return r_res, r_err
end

---Wait until initialize is answered. Returns true or false, err.
function Client:wait_ready(timeout_ms)
  if self.state == "running" then
    return true
  end
  if in_fast() then
    return false, make_error(M.codes.InternalError, "wait_ready called in a fast event")
  end
  vim.wait(timeout_ms or 10000, function()
    return self.state ~= "starting"
  end, 5)
  if self.state == "running" then
    return true
  end
  if self.state == "starting" then
    return false, make_error(M.codes.InternalError, "the dagctx daemon did not answer initialize in time", { kind = "Timeout" })
  end
  return false, self.init_error or make_error(M.codes.InternalError, "the dagctx daemon is not running", { kind = "NotRunning" })
end

---shutdown + exit. With sync = true, wait (up to timeout_ms) for the process to
---end, killing it if it does not; returns its exit code (or nil).
function Client:stop(sync, timeout_ms)
  timeout_ms = timeout_ms or 3000
  if not self.rpc then
    self.state = self.state == "failed" and "failed" or "stopped"
    return self.exit_code
  end
  if self.state == "running" then
    self.state = "stopping"
    local function send_exit()
      if self.rpc then
        self.rpc.notify("exit", nil)
      end
    end
    if sync and not in_fast() then
      self:request_sync("shutdown", nil, timeout_ms)
      send_exit()
    else
      self:request("shutdown", nil, function()
        send_exit()
      end)
    end
  elseif self.state == "starting" or self.state == "failed" then
    self:_kill()
  end
  if sync and not in_fast() then
    local ended = vim.wait(timeout_ms, function()
      return self.rpc == nil
    end, 5)
    if not ended then
      self:_kill()
      vim.wait(1000, function()
        return self.rpc == nil
      end, 5)
    end
  end
  return self.exit_code
end

M.Client = Client

return M
