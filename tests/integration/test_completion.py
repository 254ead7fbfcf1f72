"""``dagctx completion bash|zsh|fish``: the scripts, loaded into the real shells.

bash: the completion function is called with ``COMP_WORDS``/``COMP_CWORD`` as bash sets
them. fish: ``complete -C`` asks fish itself what it would complete. zsh: the script is
loaded as an autoloaded function with ``_describe``/``compadd`` standing in for the
completion system's output (zsh completes only inside its line editor). Session ids
come from ``dagctx completion --session-ids``, from the running daemon of the test.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dagctx.cli import build_parser
from dagctx.cli.completion import script, tree
from dagctx.client import DagctxClient

BIN = Path(sys.executable).parent


def _need(shell: str) -> str:
    path = shutil.which(shell)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{shell} is required in CI (scripts/test.sh installs it)")
        pytest.skip(f"{shell} is not installed")
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_the_tree_is_the_parser() -> None:
    root = tree(build_parser())
    assert {"show", "history", "search", "mcp", "daemon", "completion"} <= set(root.subcommands)
    assert set(root.subcommands["daemon"].subcommands) == {"run", "status", "stop"}
    assert any("--json" in opts for opts, _, _ in root.subcommands["show"].options)
    for shell in ("bash", "zsh", "fish"):
        text = script(shell, build_parser())
        assert all(name in text for name in root.subcommands), shell


def bash_complete(words: list[str]) -> list[str]:
    bash = _need("bash")
    line = " ".join(f"'{w}'" for w in words)
    prog = (f"source <(dagctx completion bash)\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
            "_dagctx; printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    out = subprocess.run([bash, "--norc", "-c", prog], env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.split("\n") if w]


def fish_complete(line: str) -> list[str]:
    fish = _need("fish")
    prog = f"dagctx completion fish | source; complete -C '{line}'"
    out = subprocess.run([fish, "--no-config", "-c", prog], env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [w.split("\t")[0] for w in out.stdout.split("\n") if w]


def zsh_complete(words: list[str]) -> list[str]:
    zsh = _need("zsh")
    line = " ".join(f"'{w}'" for w in words)
    # what the completion system would show: the names _describe and compadd are given
    prog = ("_describe() { local -a items; items=(${(P)4}); for i in $items; do print -r -- ${i%%:*}; done }\n"
            "compadd() { local a; [[ $1 == -a ]] && { for a in ${(P)2}; do print -r -- $a; done } }\n"
            "compdef() { :; }\n"
            "eval \"$(dagctx completion zsh)\"\n"
            f"words=({line}); CURRENT={len(words)}\n_dagctx\n")
    out = subprocess.run([zsh, "-f", "-c", prog], env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.split("\n") if w]


@pytest.fixture
async def session_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two sessions in the shared daemon of this test's private runtime folder."""
    import getpass

    # fish sets USER when it is unset, and the socket's name carries it: one USER for all
    monkeypatch.setenv("USER", getpass.getuser())
    db = tmp_path / "c.db"
    c = await DagctxClient.connect(db)
    try:
        ids = [(await c.session_create(t)).session_id for t in ("first", "second")]
    finally:
        await c.close()
    monkeypatch.setenv("DAGCTX_DB", str(db))
    try:
        yield ids
    finally:
        subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "daemon", "stop"], capture_output=True, timeout=60)


async def test_shells_complete_commands_options_and_session_ids(session_ids: list[str]) -> None:
    run = asyncio.to_thread
    # commands, nested commands, options
    assert {"show", "history", "completion"} <= set(await run(bash_complete, ["dagctx", ""]))
    assert await run(bash_complete, ["dagctx", "da"]) == ["daemon"]
    assert await run(bash_complete, ["dagctx", "daemon", "st"]) == ["status", "stop"]
    assert await run(bash_complete, ["dagctx", "--db", "x.db", "hist"]) == ["history"]
    assert "--json" in await run(bash_complete, ["dagctx", "show", "--j"])
    # a session id where a session goes, and only there
    assert set(session_ids) <= set(await run(bash_complete, ["dagctx", "history", ""]))
    assert set(session_ids) <= set(await run(bash_complete, ["dagctx", "show", "--session", ""]))
    assert not set(session_ids) & set(await run(bash_complete, ["dagctx", "history", session_ids[0], ""]))

    fish = await run(fish_complete, "dagctx ")
    assert {"show", "history", "daemon", "completion"} <= set(fish)
    assert set(await run(fish_complete, "dagctx daemon ")) == {"run", "status", "stop"}
    assert "--json" in await run(fish_complete, "dagctx show --")
    assert set(session_ids) <= set(await run(fish_complete, "dagctx history "))

    assert {"show", "history", "daemon"} <= set(await run(zsh_complete, ["dagctx", ""]))
    assert set(await run(zsh_complete, ["dagctx", "daemon", ""])) == {"run", "status", "stop"}
    assert "--json" in await run(zsh_complete, ["dagctx", "show", "--"])
    assert set(session_ids) <= set(await run(zsh_complete, ["dagctx", "history", ""]))


def test_session_ids_print_nothing_without_a_daemon(short_dir: Path) -> None:
    tmp_path = short_dir
    env = {**_env(), "XDG_RUNTIME_DIR": str(tmp_path)}
    env.pop("DAGCTX_STANDALONE", None)
    out = subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "completion", "--session-ids"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""
    assert not list(tmp_path.glob("dagctx/*.sock")), "completion never starts a daemon"
    out = subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "completion"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "name a shell: bash, zsh, fish" in out.stderr
