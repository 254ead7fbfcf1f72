-- Headless test of dagctx.nvim against a real daemon.
--
--   nvim --headless -u NONE -c "luafile clients/nvim/test/test_dagctx.lua"
--
-- (clients/nvim/test/run.sh does this.) Exits 0 with "N passed, 0 failed" as the
-- last line, or 1 after printing every failure. $DAGCTX_PYTHON picks the python
-- that runs `-P -m dagctx.cli serve` (default python3).

local started = vim.loop.hrtime()

local function out(s)
  io.stdout:write(s .. "\n")
  io.stdout:flush()
end

local function finish(code)
  pcall(function()
    require("dagctx").stop(true, 2000)
  end)
  if code == 0 then
    vim.cmd("qall!")
  else
    vim.cmd("cquit 1")
  end
end

-- a hard limit, in case something waits forever
local watchdog = vim.loop.new_timer()
watchdog:start(25000, 0, vim.schedule_wrap(function()
  out("FAIL - the test did not finish within 25 s")
  finish(1)
end))

local function main()
  -- ------------------------------------------------------------------ setup

  local script = debug.getinfo(1, "S").source:gsub("^@", "")
  local plugin_dir = vim.fn.fnamemodify(script, ":p:h:h")
  vim.opt.runtimepath:prepend(plugin_dir)
  vim.cmd("runtime plugin/dagctx.lua") -- -u NONE loads no plugins by itself

  local python = vim.env.DAGCTX_PYTHON
  if python == nil or python == "" then
    python = "python3"
  end

  local passed, failed, skipped = 0, 0, 0
  local failures = {}

  local function check(cond, msg, ...)
    if not cond then
      error(string.format(msg, ...), 2)
    end
  end

  local function eq(actual, expected, what)
    if actual ~= expected then
      error(string.format("%s: expected %s, got %s", what, vim.inspect(expected), vim.inspect(actual)), 2)
    end
  end

  local function test(name, fn)
    local ok, err = xpcall(fn, debug.traceback)
    if ok and err == "skip" then
      skipped = skipped + 1
      out("skip - " .. name)
    elseif ok then
      passed = passed + 1
      out("ok - " .. name)
    else
      failed = failed + 1
      table.insert(failures, name)
      out("FAIL - " .. name .. ": " .. tostring(err))
    end
    return ok
  end

  local function buf_lines(name)
    local ui = require("dagctx.ui")
    local buf = ui.find_buf(name)
    check(buf ~= nil, "no buffer named %s", name)
    return vim.api.nvim_buf_get_lines(buf, 0, -1, false), buf
  end

  local function contains(lines, needle)
    for _, l in ipairs(lines) do
      if l:find(needle, 1, true) then
        return true
      end
    end
    return false
  end

  local function must_contain(lines, needle, where)
    if not contains(lines, needle) then
      error(string.format("%s does not contain %q:\n  %s", where, needle, table.concat(lines, "\n  ")), 2)
    end
  end

  -- capture vim.notify: errors of commands surface there
  local notes = {}
  local real_notify = vim.notify
  vim.notify = function(msg, level, opts)
    table.insert(notes, { msg = msg, level = level })
    if level and level >= vim.log.levels.ERROR and os.getenv("DAGCTX_TEST_VERBOSE") then
      real_notify(msg, level, opts)
    end
  end

  local db = vim.fn.tempname() .. "-dagctx.db"
  local sampled = {}
  local appended_events = 0
  vim.api.nvim_create_autocmd("User", {
    pattern = "DagctxNodeAppended",
    callback = function()
      appended_events = appended_events + 1
    end,
  })

  local dagctx = require("dagctx")
  dagctx.setup({
    cmd = { python, "-P", "-m", "dagctx.cli", "serve" },
    database = db,
    initialization_options = { observeNodes = true },
    window = "split",
    timeout_ms = 15000,
    on_sampling = function(params)
      table.insert(sampled, params)
      return "A short summary of the conversation."
    end,
  })

  local S = {} -- state shared by the tests, in order

  -- ------------------------------------------------------------------ tests

  test("commands are registered by plugin/dagctx.lua", function()
    for _, name in ipairs({ "DagctxSessions", "DagctxRender", "DagctxSearch", "DagctxLog", "DagctxStop",
                            "DagctxWatch", "DagctxUnwatch" }) do
      eq(vim.fn.exists(":" .. name), 2, ":" .. name)
    end
  end)

  local daemon_up = test("initialize: the daemon starts and opens the temp database", function()
    local info, err = dagctx.server_info(15000)
    check(info, "initialize failed: %s", require("dagctx.rpc").format_error(err))
    eq(info.serverInfo and info.serverInfo.name, "dagctx", "serverInfo.name")
    eq(vim.fn.resolve(info.database), vim.fn.resolve(db), "database")
    check(vim.tbl_contains(info.methods, "session/create"), "methods lacks session/create: %s", vim.inspect(info.methods))
    S.methods = info.methods
  end)

  if not daemon_up then
    out("the daemon did not start: is `" .. python .. " -P -m dagctx.cli serve` runnable? ($DAGCTX_PYTHON picks the python)")
    out(string.format("%d passed, %d failed", passed, failed))
    finish(1)
    return
  end

  test("params may be omitted (nil params are left off the wire)", function()
    local res, err = dagctx.request_sync("session/list", nil)
    check(not err, "session/list without params: %s", require("dagctx.rpc").format_error(err))
    eq(res.total, 0, "total of an empty database")
    check(type(res.sessions) == "table", "sessions is not a list")
  end)

  test("empty params {} are sent as an object, not []", function()
    local res, err = dagctx.request_sync("session/list", {})
    check(not err, "session/list {}: %s", require("dagctx.rpc").format_error(err))
    eq(res.total, 0, "total")
  end)

  test("session/create and node/append (user + llm) via request_sync", function()
    local other, oerr = dagctx.request_sync("session/create", { title = "another session" })
    check(other, "session/create: %s", require("dagctx.rpc").format_error(oerr))
    S.other_id = other.sessionId

    local s, err = dagctx.request_sync("session/create", { title = "迁移 planning" })
    check(s, "session/create: %s", require("dagctx.rpc").format_error(err))
    check(type(s.sessionId) == "string" and s.sessionId ~= "", "no sessionId")
    eq(s.head, s.rootId, "head right after create")
    S.id = s.sessionId

    local u, uerr = dagctx.request_sync("node/append", {
      sessionId = S.id,
      node = { role = "user", output = "我们需要写一个数据库迁移脚本", predecessor = s.head },
    })
    check(u, "append user: %s", require("dagctx.rpc").format_error(uerr))
    eq(u.node.role, "user", "user node role")
    eq(u.head, u.node.id, "head after the user node")
    S.user_id = u.node.id

    local l, lerr = dagctx.request_sync("node/append", {
      sessionId = S.id,
      node = { role = "llm", output = "好的。先列出现有的表，再写 up/down 两个方向。", predecessor = u.head, caller = u.node.id },
    })
    check(l, "append llm: %s", require("dagctx.rpc").format_error(lerr))
    eq(l.node.predecessor, S.user_id, "llm predecessor")
    eq(l.head, l.node.id, "head after the llm node")
    check(l.node.seq > u.node.seq, "seq does not increase: %s then %s", u.node.seq, l.node.seq)
    S.llm_id = l.node.id
  end)

  test("notifications: node/didAppend fires User DagctxNodeAppended and is logged", function()
    vim.wait(2000, function()
      return appended_events >= 2
    end, 10)
    check(appended_events >= 2, "expected at least 2 DagctxNodeAppended autocmds, got %d", appended_events)
    local last = dagctx.last_notification
    check(last, "no last_notification")
    eq(last.method, "node/didAppend", "last notification method")
    eq(last.params.node.id, S.llm_id, "last notification node id")
    eq(last.params.sessionId, S.id, "last notification sessionId")
    local logged = false
    for _, e in ipairs(dagctx.log) do
      if e.method == "node/didAppend" and e.params.node.id == S.user_id then
        logged = true
      end
    end
    check(logged, "the user node's didAppend is not in the log")
  end)

  test("async request: the callback runs on the main loop", function()
    local got, fast, cb_err = nil, nil, nil
    dagctx.request("session/get", { sessionId = S.id }, function(err, result)
      fast = vim.in_fast_event()
      cb_err, got = err, result
      -- the API is usable here (not a fast event)
      vim.api.nvim_buf_get_lines(0, 0, 1, false)
    end)
    vim.wait(5000, function()
      return got ~= nil or cb_err ~= nil
    end, 5)
    check(not cb_err, "session/get: %s", require("dagctx.rpc").format_error(cb_err))
    check(got, "no callback within 5 s")
    eq(fast, false, "vim.in_fast_event() in the callback")
    eq(got.title, "迁移 planning", "title")
    eq(got.head, S.llm_id, "head")
  end)

  test(":DagctxSessions lists the sessions in a scratch buffer", function()
    vim.cmd("DagctxSessions")
    local lines, buf = buf_lines("dagctx://sessions")
    must_contain(lines, "# dagctx sessions: 2 of 2", "dagctx://sessions")
    local row
    for _, l in ipairs(lines) do
      if vim.startswith(l, S.id) then
        row = l
      end
    end
    check(row, "no row for session %s:\n%s", S.id, table.concat(lines, "\n"))
    check(row:find("迁移 planning", 1, true), "row lacks the title: %s", row)
    check(row:match("%s3%s"), "row lacks the node count 3 (root + 2): %s", row)
    check(row:match("%d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d"), "row lacks the updated time: %s", row)
    must_contain(lines, S.other_id, "dagctx://sessions")
    eq(vim.bo[buf].buftype, "nofile", "buftype")
    eq(vim.bo[buf].bufhidden, "wipe", "bufhidden")
    eq(vim.bo[buf].filetype, "dagctx", "filetype")
    eq(vim.bo[buf].modifiable, false, "modifiable")
    eq(vim.api.nvim_get_current_buf(), buf, "the scratch buffer is current")
    -- running it again refills the same buffer
    vim.cmd("DagctxSessions")
    local _, buf2 = buf_lines("dagctx://sessions")
    eq(buf2, buf, "the same buffer is reused")
  end)

  test(":DagctxRender <id> shows the session's messages (## role + text)", function()
    vim.cmd("DagctxRender " .. S.id)
    local lines, buf = buf_lines("dagctx://render/" .. S.id)
    local has_render = vim.tbl_contains(S.methods or {}, "context/render")
    if has_render then
      check(vim.startswith(lines[1], "# context/render"), "first line: %s", lines[1])
    else
      check(
        vim.startswith(lines[1], "-- context/render is not available"),
        "the first line does not say that render fell back to history: %s",
        lines[1]
      )
      check(lines[1]:find("-32601", 1, true), "the first line does not name the error: %s", lines[1])
      out("  note: the daemon has no context/render yet; checked the session/history fallback")
    end
    must_contain(lines, "## user", "render buffer")
    must_contain(lines, "## assistant", "render buffer")
    must_contain(lines, "我们需要写一个数据库迁移脚本", "render buffer")
    must_contain(lines, "好的。先列出现有的表，再写 up/down 两个方向。", "render buffer")
    -- the user block comes before the assistant block
    local iu, ia
    for i, l in ipairs(lines) do
      if l == "## user" and not iu then
        iu = i
      end
      if l == "## assistant" and not ia then
        ia = i
      end
    end
    check(iu and ia and iu < ia, "## user (%s) should precede ## assistant (%s)", tostring(iu), tostring(ia))
    eq(vim.bo[buf].filetype, "dagctx", "filetype")
  end)

  test(":DagctxRender <id prefix> resolves the prefix as the CLI does", function()
    vim.cmd("DagctxRender " .. S.id:sub(1, 8))
    local lines = buf_lines("dagctx://render/" .. S.id)
    must_contain(lines, "我们需要写一个数据库迁移脚本", "render of a prefix")
    notes = {}
    local buf, err = dagctx.render("zz-no-such-prefix")
    eq(buf, nil, "render of an unknown prefix")
    eq(err and err.kind, "SessionNotFound", "err.kind")
    check(err.message:find("no session id starts with it", 1, true), "message: %s", err.message)
  end)

  test("completion of :DagctxRender works before any command started the daemon", function()
    eq(dagctx.stop(true, 3000), 0, "daemon exit code")
    dagctx.client = nil
    local items = vim.fn.getcompletion("DagctxRender " .. S.id:sub(1, 4), "cmdline")
    check(vim.tbl_contains(items, S.id), "completion %s lacks %s", vim.inspect(items), S.id)
    check(dagctx.client and dagctx.client:is_running(), "completion did not start the daemon")
  end)

  test(":DagctxRender without an id renders the newest session", function()
    local a = dagctx.request_sync("node/append", {
      sessionId = S.other_id,
      node = { role = "user", output = "hello from the other session", predecessor = "ROOT" },
    })
    check(a, "append to the other session failed")
    vim.cmd("DagctxRender")
    local lines = buf_lines("dagctx://render/" .. S.other_id)
    must_contain(lines, "hello from the other session", "render of the newest session")
  end)

  test(":DagctxSearch 迁移 lists the hit (session, node, snippet)", function()
    vim.cmd("DagctxSearch 迁移")
    local lines, buf = buf_lines("dagctx://search")
    check(lines[1]:find("迁移", 1, true), "header: %s", lines[1])
    local row
    for _, l in ipairs(lines) do
      if l:find(S.user_id, 1, true) then
        row = l
      end
    end
    check(row, "no hit for the user node %s:\n%s", S.user_id, table.concat(lines, "\n"))
    check(vim.startswith(row, S.id), "the hit does not start with the session id: %s", row)
    check(row:find("迁移", 1, true), "the hit has no snippet with 迁移: %s", row)
    eq(vim.bo[buf].buftype, "nofile", "buftype")
    -- <CR> on the hit renders its session
    local lnum
    for i, l in ipairs(lines) do
      if l == row then
        lnum = i
      end
    end
    vim.api.nvim_win_set_cursor(0, { lnum, 0 })
    vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes("<CR>", true, false, true), "x", false)
    eq(vim.api.nvim_buf_get_name(0), "dagctx://render/" .. S.id, "buffer after <CR> on a hit")
  end)

  test("an error reply surfaces data.kind (PredecessorMissing)", function()
    local res, err = dagctx.request_sync("node/append", {
      sessionId = S.id,
      node = { role = "user", output = "orphan (no predecessor)" },
    })
    eq(res, nil, "result of a bad append")
    check(err, "no error for a missing predecessor")
    eq(err.kind, "PredecessorMissing", "err.kind")
    eq(err.data and err.data.kind, "PredecessorMissing", "err.data.kind")
    eq(err.code, -32001, "err.code")
    check(type(err.message) == "string" and err.message ~= "", "empty message")
    local text = require("dagctx.rpc").format_error(err)
    check(text:find("[PredecessorMissing]", 1, true), "format_error: %s", text)
    check(type(err.data.details) == "table" and err.data.details.head == S.llm_id, "data.details.head: %s", vim.inspect(err.data))
    -- a predecessor that does not exist is NodeNotFound
    local res2, err2 = dagctx.request_sync("node/append", {
      sessionId = S.id,
      node = { role = "user", output = "orphan", predecessor = "no-such-node" },
    })
    eq(res2, nil, "result of an append after a missing node")
    eq(err2 and err2.kind, "NodeNotFound", "kind for an unknown predecessor")
    -- the daemon survived and wrote nothing
    local hist = dagctx.request_sync("session/history", { sessionId = S.id })
    eq(#hist.nodes, 2, "history length after the failed append")
  end)

  test("a failing command reports data.kind through vim.notify", function()
    notes = {}
    local buf = dagctx.render("no-such-session")
    eq(buf, nil, "render of a missing session")
    local msg = notes[#notes] and notes[#notes].msg or ""
    check(msg:find("[SessionNotFound]", 1, true), "vim.notify message: %q", msg)
    eq(notes[#notes].level, vim.log.levels.ERROR, "level")
  end)

  test("server->client request: the sampling dispatcher answers (unit)", function()
    local client = dagctx.client
    local params = {
      messages = { { role = "user", content = { type = "text", text = "summarize" } } },
      systemPrompt = "You summarize.",
      maxTokens = 100,
    }
    local n = #sampled
    local result, err = client:_answer("sampling/createMessage", params)
    check(not err, "error: %s", vim.inspect(err))
    eq(#sampled, n + 1, "on_sampling calls")
    eq(result.role, "assistant", "role")
    eq(result.content.type, "text", "content.type")
    eq(result.content.text, "A short summary of the conversation.", "content.text")
    eq(result.stopReason, "endTurn", "stopReason")
    -- an unknown server request gets MethodNotFound
    local r2, e2 = client:_answer("no/suchMethod", vim.empty_dict())
    eq(r2, nil, "result for an unknown method")
    eq(e2.code, -32601, "code for an unknown method")
    -- the default handler answers an error
    local r3, e3 = dagctx.default_sampling(params)
    eq(r3, nil, "default sampling result")
    eq(e3.code, -32601, "default sampling code")
  end)

  test("server->client request: an asynchronous handler answers via respond()", function()
    local saved = dagctx.config.on_sampling
    dagctx.config.on_sampling = function(_, respond)
      vim.defer_fn(function()
        respond(nil, { role = "assistant", content = { type = "text", text = "later" }, model = "m", stopReason = "endTurn" })
      end, 20)
    end
    local ok, result, err = pcall(dagctx.handle_sampling, { messages = {} })
    dagctx.config.on_sampling = saved
    check(ok, "handle_sampling raised: %s", tostring(result))
    check(not err, "error: %s", vim.inspect(err))
    eq(result.content.text, "later", "text")
    -- and an asynchronous error
    dagctx.config.on_sampling = function(_, respond)
      vim.defer_fn(function()
        respond({ code = -32603, message = "model offline" })
      end, 20)
    end
    local r2, e2 = dagctx.handle_sampling({ messages = {} })
    dagctx.config.on_sampling = saved
    eq(r2, nil, "result of a failed async handler")
    eq(e2.message, "model offline", "message")
  end)

  test("server->client request from the real daemon: sampling/createMessage during context/compact", function()
    if not vim.tbl_contains(S.methods or {}, "context/compact") then
      out("  note: the daemon has no method that triggers sampling yet (no context/compact);"
        .. " the fake daemon below covers the wire")
      return "skip"
    end
    -- a longer conversation, so there is something to compact
    local head = dagctx.request_sync("session/get", { sessionId = S.id }).head
    for i = 1, 6 do
      local u = dagctx.request_sync("node/append", {
        sessionId = S.id,
        node = { role = "user", output = string.format("第 %d 步：迁移表 t%d，加索引，补数据。", i, i) .. string.rep(" 细节", 40), predecessor = head },
      })
      local l = dagctx.request_sync("node/append", {
        sessionId = S.id,
        node = { role = "llm", output = "完成第 " .. i .. " 步。" .. string.rep(" 说明", 40), predecessor = u.head, caller = u.node.id },
      })
      head = l.head
    end
    local n = #sampled
    local res, err = dagctx.request_sync("context/compact", { sessionId = S.id, keepRecentTokens = 50 }, 20000)
    check(not err, "context/compact: %s", require("dagctx.rpc").format_error(err))
    if #sampled == n then
      check(res.ok ~= true or res.summaryId == nil, "compact succeeded without asking the client: %s", vim.inspect(res))
      out("  note: context/compact did not sample: " .. tostring(res.reason or res.error))
      return "skip"
    end
    check(type(sampled[#sampled].messages) == "table", "sampling params have no messages")
    eq(dagctx.last_server_request.method, "sampling/createMessage", "last server request")
    check(res.ok, "compact after sampling failed: %s", vim.inspect(res))
  end)

  test(":DagctxWatch shows a session's changes live, from this editor and from another process", function()
    eq(vim.fn.exists(":DagctxWatch"), 2, ":DagctxWatch")
    local w = dagctx.request_sync("session/create", { title = "watched" })
    check(w, "session/create failed")
    vim.cmd("DagctxWatch " .. w.sessionId)
    local name = "dagctx://watch/" .. w.sessionId
    local lines = buf_lines(name)
    must_contain(lines, "watching session " .. w.sessionId, "the watch buffer")
    local mine, merr = dagctx.request_sync("node/append", {
      sessionId = w.sessionId,
      node = { role = "user", output = "watched from the editor", predecessor = w.head },
    })
    check(mine, "append: %s", require("dagctx.rpc").format_error(merr))
    vim.wait(3000, function()
      return contains(buf_lines(name), "watched from the editor")
    end, 10)
    lines = buf_lines(name)
    must_contain(lines, "watched from the editor", "the watch buffer")
    must_contain(lines, "(from this editor)", "the watch buffer")
    -- another process (a standalone daemon on the same file) appends: it shows up too
    local code = table.concat({
      "import asyncio, sys",
      "from dagctx.client import DagctxClient",
      "async def main():",
      "    c = await DagctxClient.spawn(sys.argv[1], standalone=True)",
      "    await c.append(sys.argv[2], 'user', output='written by another process', predecessor=sys.argv[3])",
      "    await c.close()",
      "asyncio.run(main())",
    }, "\n")
    local outp = vim.fn.system({ python, "-P", "-c", code, db, w.sessionId, mine.node.id })
    eq(vim.v.shell_error, 0, "the other process: " .. outp)
    vim.wait(3000, function()
      return contains(buf_lines(name), "written by another process")
    end, 10)
    lines = buf_lines(name)
    must_contain(lines, "written by another process", "the watch buffer")
    must_contain(lines, "(from another process)", "the watch buffer")

    -- multi-line outputs (most tool outputs are): every change still shows, as its first line.
    -- Real outputs: this repository's `git log --stat`, `ls -l` of the plugin, a Python traceback,
    -- and, when $DAGCTX_CORPUS is set, tool results from a real Claude Code transcript.
    local texts = {
      vim.fn.system({ "git", "-C", plugin_dir, "log", "-3", "--stat", "--no-color" }),
      vim.fn.system({ "ls", "-l", plugin_dir .. "/lua/dagctx" }),
      vim.fn.system({ python, "-c", "import json; json.loads('{oops')" }),
      "\r\n\n  \nstarts after blank lines\r\nsecond line\r\n",
    }
    local corpus = vim.env.DAGCTX_CORPUS
    if corpus and corpus ~= "" then
      for _, f in ipairs(vim.fn.glob(corpus .. "/claude-code/*.jsonl", false, true)) do
        for _, l in ipairs(vim.fn.readfile(f)) do
          local okj, rec = pcall(vim.json.decode, l)
          local content = okj and type(rec) == "table" and type(rec.message) == "table" and rec.message.content
          if type(content) == "table" then
            for _, part in ipairs(content) do
              if type(part) == "table" and part.type == "tool_result" and type(part.content) == "string"
                and part.content:find("\n") and #texts < 24 then
                texts[#texts + 1] = part.content
              end
            end
          end
        end
      end
    end
    local ui = require("dagctx.ui")
    -- the other process's write may reach the buffer in more than one line (its node, then
    -- its head, from different polls of the daemon; seen once in a loaded full run): count
    -- only once the buffer has been still for 300 ms, three polls
    local count, still = #buf_lines(name), 0
    vim.wait(3000, function()
      local now = #buf_lines(name)
      if now == count then still = still + 1 else count, still = now, 0 end
      return still >= 30
    end, 10)
    local before = #buf_lines(name)
    local prev = mine.node.id
    for i, text in ipairs(texts) do
      check(text:find("\n"), "text %d is multi-line", i)
      local r, aerr = dagctx.request_sync("node/append", {
        sessionId = w.sessionId, node = { role = "llm", name = "multi", output = text, predecessor = prev },
      })
      check(r, "append %d: %s", i, require("dagctx.rpc").format_error(aerr))
      prev = r.node.id
    end
    vim.wait(5000, function()
      return #buf_lines(name) >= before + #texts
    end, 10)
    lines = buf_lines(name)
    eq(#lines - before, #texts, "one watch line per multi-line change")
    for i, text in ipairs(texts) do
      local first = ui.first_line(text, 80)
      check(first ~= "" and not first:find("\n"), "first line of text %d", i)
      -- the line shows the text's first non-blank line (up to 60 characters of it)
      local head = vim.fn.strcharpart(vim.split(first, "…", { plain = true })[1], 0, 60)
      check(lines[before + i]:find(head, 1, true), "watch line %d %q lacks %q", i, lines[before + i], head)
    end
    check(lines[before + 4]:find("starts after blank lines… (+1 line)", 1, true), "CRLF text: %s", lines[before + 4])
    eq(ui.first_line("one\ntwo\nthree\n\n", 80), "one… (+2 lines)", "first_line")
    eq(ui.first_line("single", 80), "single", "first_line of one line")
    eq(dagctx.unwatch(w.sessionId), 1, "unwatch")
    vim.cmd("bwipeout! " .. vim.fn.bufnr(name))
  end)

  test(":DagctxLog shows the notifications", function()
    vim.cmd("DagctxLog")
    local lines = buf_lines("dagctx://log")
    must_contain(lines, "node/didAppend", "dagctx://log")
  end)

  test("shutdown + exit: the daemon exits 0", function()
    local code = dagctx.stop(true, 5000)
    eq(code, 0, "exit code")
    eq(dagctx.client.state, "stopped", "client state")
    -- a request after stop restarts the daemon on the same database
    local res, err = dagctx.request_sync("session/get", { sessionId = S.id })
    check(res, "request after restart: %s", require("dagctx.rpc").format_error(err))
    eq(res.title, "迁移 planning", "title after restart")
    eq(dagctx.stop(true, 5000), 0, "exit code after restart")
  end)

  test("server->client request over a real pipe (fake daemon): on_sampling answers", function()
    local saved = dagctx.config
    local fake = plugin_dir .. "/test/fake_sampler.py"
    dagctx.setup(vim.tbl_extend("force", saved, { cmd = { python, fake }, database = nil }))
    dagctx.client = nil
    local n_appended = appended_events
    local res, err = dagctx.request_sync("test/sample", { text = "summarize 迁移" }, 5000)
    check(res, "test/sample: %s", require("dagctx.rpc").format_error(err))
    local reply = res.reply
    eq(reply.id, "fake-1", "the daemon's string id is echoed")
    eq(reply.error, nil, "error in the reply")
    eq(reply.result.role, "assistant", "reply role")
    eq(reply.result.content.text, "A short summary of the conversation.", "reply text")
    eq(sampled[#sampled].messages[1].content.text, "summarize 迁移", "params seen by on_sampling")
    eq(sampled[#sampled].maxTokens, 64, "maxTokens seen by on_sampling")
    check(res.capabilities.sampling ~= nil, "capabilities.sampling not declared: %s", vim.inspect(res.capabilities))
    eq(dagctx.last_server_request.method, "sampling/createMessage", "last server request")
    -- the notification sent before it, with JSON nulls, arrived too
    check(appended_events > n_appended, "no DagctxNodeAppended from the fake daemon")
    eq(dagctx.last_notification.params.node.caller, nil, "null inside an object")
    eq(dagctx.last_notification.params.node.reads[1], vim.NIL, "null inside an array")
    eq(dagctx.stop(true, 3000), 0, "fake daemon exit code")

    -- without on_sampling: no sampling capability, and the default handler's error
    dagctx.setup(vim.tbl_extend("force", saved, { cmd = { python, fake }, database = nil, on_sampling = false }))
    dagctx.client = nil
    local res2, err2 = dagctx.request_sync("test/sample", { text = "x" }, 5000)
    check(res2, "test/sample: %s", require("dagctx.rpc").format_error(err2))
    eq(res2.capabilities.sampling, nil, "capabilities.sampling without a handler")
    eq(res2.reply.result, nil, "result without a handler")
    eq(res2.reply.error.code, -32601, "error code without a handler")
    check(res2.reply.error.message:find("on_sampling", 1, true), "error message: %s", res2.reply.error.message)
    eq(dagctx.stop(true, 3000), 0, "fake daemon exit code")
    dagctx.setup(saved)
    dagctx.client = nil
  end)

  test(":DagctxRender falls back to session/history on -32601 (fake old daemon)", function()
    local saved = dagctx.config
    dagctx.setup(vim.tbl_extend("force", saved, { cmd = { python, plugin_dir .. "/test/fake_sampler.py" }, database = nil }))
    dagctx.client = nil
    vim.cmd("DagctxRender s-old")
    local lines = buf_lines("dagctx://render/s-old")
    check(vim.startswith(lines[1], "-- context/render is not available"), "first line: %s", lines[1])
    check(lines[1]:find("[MethodNotFound]", 1, true) and lines[1]:find("-32601", 1, true), "first line: %s", lines[1])
    check(lines[1]:find("session/history", 1, true), "first line: %s", lines[1])
    must_contain(lines, "## user", "fallback buffer")
    must_contain(lines, "old daemon question", "fallback buffer")
    must_contain(lines, "## assistant", "fallback buffer")
    must_contain(lines, "old daemon answer", "fallback buffer")
    eq(dagctx.stop(true, 3000), 0, "fake daemon exit code")
    dagctx.setup(saved)
    dagctx.client = nil
  end)

  test("an asynchronous on_sampling (respond later) answers over the pipe", function()
    local saved = dagctx.config
    local timer_fired = false
    dagctx.setup(vim.tbl_extend("force", saved, {
      cmd = { python, plugin_dir .. "/test/fake_sampler.py" },
      database = nil,
      on_sampling = function(params, respond)
        vim.defer_fn(function()
          timer_fired = true
          respond(nil, "async: " .. params.messages[1].content.text)
        end, 50)
      end,
    }))
    dagctx.client = nil
    local res, err = dagctx.request_sync("test/sample", { text = "later" }, 5000)
    check(res, "test/sample: %s", require("dagctx.rpc").format_error(err))
    check(timer_fired, "the deferred respond() never ran")
    eq(res.reply.result and res.reply.result.content.text, "async: later", "reply text")
    eq(dagctx.stop(true, 3000), 0, "fake daemon exit code")
    dagctx.setup(saved)
    dagctx.client = nil
  end)

  test("a handler that raises answers InternalError over the pipe", function()
    local saved = dagctx.config
    dagctx.setup(vim.tbl_extend("force", saved, {
      cmd = { python, plugin_dir .. "/test/fake_sampler.py" },
      database = nil,
      on_sampling = function()
        error("model exploded")
      end,
    }))
    dagctx.client = nil
    local res, err = dagctx.request_sync("test/sample", { text = "x" }, 5000)
    check(res, "test/sample: %s", require("dagctx.rpc").format_error(err))
    eq(res.reply.error.code, -32603, "error code")
    check(res.reply.error.message:find("model exploded", 1, true), "error message: %s", res.reply.error.message)
    eq(dagctx.stop(true, 3000), 0, "fake daemon exit code")
    dagctx.setup(saved)
    dagctx.client = nil
  end)

  test("a database that cannot be opened fails initialize with data.kind", function()
    local saved = dagctx.config
    -- a regular file as the parent directory: cannot be created, whoever runs the test
    local blocker = vim.fn.tempname()
    vim.fn.writefile({ "not a directory" }, blocker)
    dagctx.setup(vim.tbl_extend("force", saved, { database = blocker .. "/sub/test.db" }))
    dagctx.client = nil
    notes = {}
    local buf, err = dagctx.sessions()
    eq(buf, nil, "sessions() with a bad database")
    check(err, "no error")
    eq(err.kind, "InvalidParams", "err.kind")
    check(err.message:find("initialize failed", 1, true), "message: %s", err.message)
    check((notes[#notes] or {}).msg and notes[#notes].msg:find("[InvalidParams]", 1, true), "vim.notify: %s", vim.inspect(notes))
    vim.wait(3000, function()
      return dagctx.client.rpc == nil
    end, 10)
    eq(dagctx.client.rpc, nil, "the failed daemon was stopped")
    eq(dagctx.client.state, "failed", "client state")
    os.remove(blocker)
    dagctx.setup(saved)
    dagctx.client = nil
  end)

  test("a daemon that dies shows its last stderr lines", function()
    local saved = dagctx.config
    local die = "import sys; sys.stderr.write('Traceback (most recent call last):\\n  boom from the daemon\\n'); "
      .. "sys.stderr.flush(); sys.stdin.read(1); sys.exit(3)"
    dagctx.setup(vim.tbl_extend("force", saved, { cmd = { python, "-c", die } }))
    dagctx.client = nil
    notes = {}
    local res, err = dagctx.request_sync("session/list", nil, 5000)
    eq(res, nil, "result")
    check(err and err.kind == "DaemonExited", "error: %s", vim.inspect(err))
    check(err.message:find("code 3", 1, true), "message lacks the exit code: %s", err.message)
    check(err.message:find("boom from the daemon", 1, true), "message lacks the stderr lines: %s", err.message)
    dagctx.setup(saved)
    dagctx.client = nil
  end)

  test("a daemon command that is not executable is reported, not raised", function()
    local saved = dagctx.config
    dagctx.setup(vim.tbl_extend("force", saved, { cmd = { "/nonexistent/dagctx-daemon", "serve" } }))
    dagctx.client = nil
    notes = {}
    local res, err = dagctx.request_sync("session/list", nil, 1000)
    eq(res, nil, "result")
    check(err and err.message:find("not executable", 1, true), "error: %s", vim.inspect(err))
    local buf = dagctx.sessions()
    eq(buf, nil, "sessions()")
    check(#notes > 0 and notes[#notes].msg:find("not executable", 1, true), "vim.notify: %s", vim.inspect(notes))
    dagctx.setup(saved)
    dagctx.client = nil
  end)

  -- ------------------------------------------------------------------ summary

  watchdog:stop()
  vim.notify = real_notify
  os.remove(db)
  os.remove(db .. "-wal")
  os.remove(db .. "-shm")
  out(string.format("(%.1f s)", (vim.loop.hrtime() - started) / 1e9))
  if skipped > 0 then
    out(string.format("%d skipped", skipped))
  end
  if failed > 0 then
    out("failed: " .. table.concat(failures, "; "))
  end
  out(string.format("%d passed, %d failed", passed, failed))
  finish(failed == 0 and 0 or 1)
end

local ok, err = xpcall(main, debug.traceback)
if not ok then
  out("FAIL - the test script raised: " .. tostring(err))
  out("0 passed, 1 failed")
  finish(1)
end
