-- dagctx.ui: scratch buffers and the text shown in them.
--
-- The format_* functions are pure (result table -> list of lines, plus the item
-- under each line for <CR>), so they are easy to test; open_scratch() puts lines
-- into a `dagctx://...` buffer (buftype=nofile, bufhidden=wipe, filetype=dagctx).

local M = {}

-- bufnr -> { [lnum] = item }: what <CR> acts on in a scratch buffer
M.items = {}

-- ------------------------------------------------------------------ text helpers

---A value as one-line JSON (for tool inputs and structured outputs).
local function to_json(v)
  if v == nil or v == vim.NIL then
    return "null"
  end
  local ok, s = pcall(vim.json.encode, v)
  if ok then
    return s
  end
  return vim.inspect(v)
end
M.to_json = to_json

---Split text into buffer lines (nvim_buf_set_lines refuses embedded newlines).
local function text_lines(s)
  s = tostring(s):gsub("\r\n", "\n"):gsub("\r", "\n")
  return vim.split(s, "\n", { plain = true })
end
M.text_lines = text_lines

---One line: newlines become " ⏎ ".
local function one_line(s)
  if s == nil or s == vim.NIL then
    return ""
  end
  return (tostring(s):gsub("\r\n", "\n"):gsub("[\r\n]", " ⏎ "))
end
M.one_line = one_line

---The first non-blank line of a text, cut at `max` characters, with how much was left out:
---"line one … (+41 lines)". A live view shows one line per change, whatever its text holds.
local function first_line(s, max)
  if s == nil or s == vim.NIL then
    return ""
  end
  local lines = text_lines(s)
  local first, at = "", 0
  for i, l in ipairs(lines) do
    if l:match("%S") then
      first, at = l, i
      break
    end
  end
  local cut = false
  if max and vim.fn.strchars(first) > max then
    first, cut = vim.fn.strcharpart(first, 0, max), true
  end
  local last = at
  for i = #lines, at + 1, -1 do
    if lines[i]:match("%S") then
      last = i
      break
    end
  end
  local rest = last - at
  if rest > 0 then
    return string.format("%s… (+%d line%s)", first, rest, rest == 1 and "" or "s")
  end
  return cut and (first .. "…") or first
end
M.first_line = first_line

local islist = vim.islist or vim.tbl_islist

local function append_all(dst, src)
  for _, l in ipairs(src) do
    dst[#dst + 1] = l
  end
end

---A stored output (string or any JSON value) as lines.
local function value_lines(v)
  if v == nil or v == vim.NIL then
    return {}
  end
  if type(v) == "string" then
    return text_lines(v)
  end
  return text_lines(to_json(v))
end

local function fmt_time(t)
  if type(t) ~= "number" then
    return "-"
  end
  return os.date("%Y-%m-%d %H:%M:%S", math.floor(t))
end

local function pad(s, width)
  s = tostring(s)
  local w = vim.fn.strdisplaywidth(s)
  if w >= width then
    return s
  end
  return s .. string.rep(" ", width - w)
end

local function plural(n, word)
  return string.format("%d %s%s", n, word, n == 1 and "" or "s")
end

-- ------------------------------------------------------------------ content blocks

local block_lines -- forward

---Content of a message or tool result: a string, a list of blocks, or a value.
local function content_lines(content)
  if content == nil or content == vim.NIL then
    return {}
  end
  if type(content) == "string" then
    return text_lines(content)
  end
  if type(content) == "table" and islist(content) and not vim.tbl_isempty(content) then
    local out = {}
    for _, b in ipairs(content) do
      append_all(out, block_lines(b))
    end
    return out
  end
  if type(content) == "table" and content.type then
    return block_lines(content)
  end
  return value_lines(content)
end

---One content block (neutral, Anthropic or OpenAI shapes).
block_lines = function(b)
  if type(b) == "string" then
    return text_lines(b)
  end
  if type(b) ~= "table" then
    return value_lines(b)
  end
  local t = b.type
  if t == "text" or t == "input_text" or t == "output_text" then
    return text_lines(b.text or "")
  elseif t == "tool_call" or t == "tool_use" then
    local input = b.input
    if input == nil then
      input = b.arguments
    end
    return { string.format("→ %s(%s)  [call %s]", tostring(b.name or "?"), type(input) == "string" and input or to_json(input), tostring(b.id or "?")) }
  elseif t == "tool_result" then
    local id = b.toolCallId or b.tool_use_id or "?"
    local err = (b.isError == true or b.is_error == true) and " (error)" or ""
    local out = { string.format("← result of call %s%s:", tostring(id), err) }
    append_all(out, content_lines(b.content))
    return out
  elseif t == "image" or t == "image_url" then
    local ref = b.url or b.path or (type(b.image_url) == "table" and b.image_url.url) or nil
    if ref == nil and type(b.source) == "table" then
      ref = b.source.url or b.source.path or ((b.source.media_type or b.source.mediaType or "inline") .. " data")
    end
    return { "[image " .. one_line(ref or "") .. "]" }
  elseif t == "file" then
    return { "[file " .. one_line(b.path or b.name or b.url or to_json(b)) .. "]" }
  elseif t == "thinking" then
    local out = { "[thinking]" }
    append_all(out, text_lines(b.thinking or b.text or ""))
    return out
  end
  return { "[" .. tostring(t or "block") .. "] " .. to_json(b) }
end
M.content_lines = content_lines

-- ------------------------------------------------------------------ views

---session/list result -> lines, items
function M.format_sessions(result, database)
  local sessions = (result and result.sessions) or {}
  local total = (result and result.total) or #sessions
  local lines, items = {}, {}
  local head = string.format("# dagctx sessions: %d of %d", #sessions, total)
  if database then
    head = head .. "  (" .. database .. ")"
  end
  lines[1] = head
  lines[2] = ""
  if #sessions == 0 then
    lines[3] = "(no sessions yet)"
    return lines, items
  end
  local idw = 7
  for _, s in ipairs(sessions) do
    idw = math.max(idw, vim.fn.strdisplaywidth(tostring(s.sessionId)))
  end
  lines[#lines + 1] = pad("SESSION", idw) .. "  " .. pad("NODES", 5) .. "  " .. pad("UPDATED", 19) .. "  TITLE"
  for _, s in ipairs(sessions) do
    local title = one_line(s.title)
    if title == "" then
      title = "(untitled)"
    end
    lines[#lines + 1] = pad(s.sessionId, idw)
      .. "  "
      .. pad(tostring(s.nodeCount or "?"), 5)
      .. "  "
      .. pad(fmt_time(s.updatedAt), 19)
      .. "  "
      .. title
    items[#lines] = { sessionId = s.sessionId, head = s.head }
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "<CR> renders the session under the cursor, q closes."
  return lines, items
end

---context/render result -> lines
function M.format_render(result, session_id)
  local messages = (result and result.messages) or {}
  local tokens = result and result.tokens
  local total = type(tokens) == "table" and tokens.total or nil
  local lines = {}
  local head = string.format("# context/render: session %s, %s", session_id, plural(#messages, "message"))
  if total then
    head = head .. string.format(", %d tokens", total)
    if type(tokens.source) == "string" then
      head = head .. " (" .. tokens.source .. ")"
    end
  end
  lines[1] = head
  if result and type(result.system) == "string" and result.system ~= "" then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "## system"
    append_all(lines, text_lines(result.system))
  end
  for _, msg in ipairs(messages) do
    lines[#lines + 1] = ""
    lines[#lines + 1] = "## " .. tostring(msg.role or "?")
    append_all(lines, content_lines(msg.content))
    -- OpenAI's assistant tool calls live beside the content
    if type(msg.tool_calls) == "table" then
      for _, call in ipairs(msg.tool_calls) do
        local fn = call["function"] or {}
        lines[#lines + 1] = string.format("→ %s(%s)  [call %s]", tostring(fn.name or "?"), tostring(fn.arguments or ""), tostring(call.id or "?"))
      end
    end
    if msg.tool_call_id then
      table.insert(lines, #lines, "← result of call " .. tostring(msg.tool_call_id) .. ":")
    end
  end
  if #messages == 0 then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "(nothing to render: the branch is empty)"
  end
  return lines
end

local role_names = { user = "user", llm = "assistant", code = "tool" }

---session/history result -> lines; `note` becomes the first line.
function M.format_history(result, session_id, note)
  local nodes = (result and result.nodes) or {}
  local lines = {}
  lines[1] = note or string.format("# session/history: session %s", session_id)
  lines[2] = string.format("# session %s, head %s, %s", session_id, tostring(result and result.head or "?"), plural(#nodes, "node"))
  for _, n in ipairs(nodes) do
    lines[#lines + 1] = ""
    local title = "## " .. (role_names[n.role] or tostring(n.role))
    if n.name and n.name ~= "" then
      title = title .. " " .. n.name
    end
    if n.status and n.status ~= "completed" then
      title = title .. " [" .. n.status .. "]"
    end
    lines[#lines + 1] = title
    if n.role == "code" then
      if n.input ~= nil and n.input ~= vim.NIL then
        lines[#lines + 1] = "→ " .. tostring(n.name or "?") .. "(" .. (type(n.input) == "string" and one_line(n.input) or to_json(n.input)) .. ")"
      end
      local out = value_lines(n.output)
      if #out > 0 then
        lines[#lines + 1] = "← result:"
        append_all(lines, out)
      end
    else
      append_all(lines, value_lines(n.output))
    end
  end
  if #nodes == 0 then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "(the branch is empty)"
  end
  return lines
end

---search/query result -> lines, items
function M.format_search(result, query)
  local hits = (result and result.hits) or {}
  local lines, items = {}, {}
  lines[1] = string.format("# dagctx search: %q, %s", query, plural(#hits, "hit"))
  lines[2] = ""
  if #hits == 0 then
    lines[3] = "(no hits)"
    return lines, items
  end
  for _, h in ipairs(hits) do
    local where = h.role or "?"
    if h.name and h.name ~= "" then
      where = where .. " " .. h.name
    end
    lines[#lines + 1] = string.format(
      "%s  %s  #%s %s  %s",
      tostring(h.sessionId),
      tostring(h.nodeId),
      tostring(h.seq or "?"),
      where,
      one_line(h.snippet)
    )
    items[#lines] = { sessionId = h.sessionId, nodeId = h.nodeId }
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "<CR> renders the hit's session, q closes."
  return lines, items
end

---The notification log -> lines
function M.format_log(entries)
  local lines = { string.format("# dagctx log: %s (newest last)", plural(#entries, "entry")), "" }
  for _, e in ipairs(entries) do
    local summary = e.summary
    if summary == nil then
      local ok, s = pcall(vim.json.encode, e.params)
      summary = ok and s or vim.inspect(e.params)
    end
    lines[#lines + 1] = string.format("%s  %s  %s", os.date("%H:%M:%S", e.time), tostring(e.method), one_line(summary))
  end
  return lines
end

-- ------------------------------------------------------------------ scratch buffers

local function find_buf(name)
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_valid(b) and vim.api.nvim_buf_get_name(b) == name then
      return b
    end
  end
  return nil
end
M.find_buf = find_buf

local function show(buf, how)
  for _, win in ipairs(vim.api.nvim_tabpage_list_wins(0)) do
    if vim.api.nvim_win_get_buf(win) == buf then
      vim.api.nvim_set_current_win(win)
      return
    end
  end
  if how == "current" then
    vim.api.nvim_win_set_buf(0, buf)
  elseif how == "vsplit" then
    vim.cmd("vertical sbuffer " .. buf)
  elseif how == "tab" then
    vim.cmd("tab sbuffer " .. buf)
  else
    vim.cmd("sbuffer " .. buf)
  end
end

---Fill (or refill) the scratch buffer `name` with lines and show it.
---opts: window ("split"|"vsplit"|"tab"|"current"), items (lnum -> item),
---on_enter fun(item) for <CR>. Returns the buffer number.
function M.open_scratch(name, lines, opts)
  opts = opts or {}
  local buf = find_buf(name)
  local fresh = buf == nil
  if fresh then
    buf = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_name(buf, name)
  end
  local bo = function(k, v)
    vim.bo[buf][k] = v
  end
  bo("buftype", "nofile")
  bo("bufhidden", "wipe")
  bo("swapfile", false)
  bo("modifiable", true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  bo("modifiable", false)
  bo("modified", false)
  M.items[buf] = opts.items or {}
  if fresh then
    vim.api.nvim_create_autocmd("BufWipeout", {
      buffer = buf,
      once = true,
      callback = function()
        M.items[buf] = nil
      end,
    })
    vim.api.nvim_buf_set_keymap(buf, "n", "q", "", {
      noremap = true,
      silent = true,
      nowait = true,
      callback = function()
        if #vim.api.nvim_tabpage_list_wins(0) > 1 then
          vim.cmd("close")
        else
          vim.cmd("bwipeout " .. buf)
        end
      end,
    })
  end
  if opts.on_enter then
    local on_enter = opts.on_enter
    vim.api.nvim_buf_set_keymap(buf, "n", "<CR>", "", {
      noremap = true,
      silent = true,
      callback = function()
        local item = (M.items[buf] or {})[vim.api.nvim_win_get_cursor(0)[1]]
        if item then
          on_enter(item)
        end
      end,
    })
  end
  bo("filetype", "dagctx")
  show(buf, opts.window or "split")
  return buf
end

return M
