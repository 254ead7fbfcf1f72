" Syntax of dagctx.nvim scratch buffers (dagctx://sessions, render, search, log).
if exists("b:current_syntax")
  finish
endif

syntax match dagctxTitle   /^# .*$/
syntax match dagctxNote    /^-- .*$/
syntax match dagctxRole    /^## .*$/
syntax match dagctxColumns /^SESSION\s\+NODES\s\+UPDATED\s\+TITLE$/
syntax match dagctxCall    /^→ .*$/
syntax match dagctxResult  /^← .*$/
syntax match dagctxMatch   /\[[^\]]\+\]/
syntax match dagctxHelp    /^<CR> .*$/

highlight default link dagctxTitle   Title
highlight default link dagctxNote    WarningMsg
highlight default link dagctxRole    Statement
highlight default link dagctxColumns Comment
highlight default link dagctxCall    Function
highlight default link dagctxResult  Special
highlight default link dagctxMatch   Search
highlight default link dagctxHelp    Comment

let b:current_syntax = "dagctx"
