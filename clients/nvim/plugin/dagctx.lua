-- dagctx.nvim: user commands. Nothing is loaded (and no daemon is spawned)
-- until a command runs: each command requires the "dagctx" module lazily.

if vim.g.loaded_dagctx then
  return
end
vim.g.loaded_dagctx = true

if vim.fn.has("nvim-0.7") ~= 1 then
  vim.api.nvim_err_writeln("dagctx.nvim needs Neovim 0.7 or newer")
  return
end

local command = vim.api.nvim_create_user_command

command("DagctxSessions", function()
  require("dagctx").sessions()
end, { nargs = 0, desc = "dagctx: list the sessions of the database" })

command("DagctxRender", function(opts)
  local id = opts.args ~= "" and vim.trim(opts.args) or nil
  require("dagctx").render(id)
end, {
  nargs = "?",
  desc = "dagctx: render a session's HEAD (default: the newest session)",
  complete = function(arglead)
    return require("dagctx").complete_sessions(arglead)
  end,
})

command("DagctxSearch", function(opts)
  require("dagctx").search(opts.args)
end, { nargs = "+", desc = "dagctx: full-text search across sessions" })

command("DagctxWatch", function(opts)
  local id = opts.args ~= "" and vim.trim(opts.args) or nil
  require("dagctx").watch(id)
end, {
  nargs = "?",
  desc = "dagctx: show a session's changes live, from every client (default: the newest session)",
  complete = function(arglead)
    return require("dagctx").complete_sessions(arglead)
  end,
})

command("DagctxUnwatch", function(opts)
  require("dagctx").unwatch(opts.args ~= "" and vim.trim(opts.args) or nil)
end, { nargs = "?", desc = "dagctx: stop watching a session (all without an argument)" })

command("DagctxLog", function()
  require("dagctx").show_log()
end, { nargs = 0, desc = "dagctx: notifications and server requests received" })

command("DagctxStop", function()
  require("dagctx").stop(true)
end, { nargs = 0, desc = "dagctx: shut the daemon down (the next command restarts it)" })
