"""Bootstrap files and skill roots in the system prompt, through the real daemon on both
backends (SPEC §7): every bootstrap file in the documented order, per-file and total caps
with the visible marker, skills from every root with the documented precedence, the
description/count/character limits, and caps and roots set in ``initialize`` and per
``context/prepare`` (the request's over the connection's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagctx.client import DagctxClient, RpcError

BOOTSTRAP = ["AGENTS.md", "SOUL.md", "TOOLS.md", "IDENTITY.md", "USER.md", "HEARTBEAT.md", "BOOTSTRAP.md"]


def skill(root: Path, folder: str, name: str, description: str) -> None:
    d = root / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n\n# {name}\n\nBody.\n")


def world(tmp_path: Path) -> dict[str, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i, name in enumerate(BOOTSTRAP):
        (ws / name).write_text(f"content of {name} ({i})\n")
    (ws / "MEMORY.md").write_text("remembered: the deploy day is Tuesday\n")
    roots = {k: tmp_path / k for k in ("personal", "managed", "bundled", "extra1", "extra2")}
    # one skill name in every root: the highest root wins
    skill(ws / "skills", "deploy", "deploy", "from the workspace")
    skill(ws / ".agents" / "skills", "deploy", "deploy", "from the project agent")
    skill(ws / ".agents" / "skills", "review", "review", "from the project agent")
    for k, r in roots.items():
        skill(r, "deploy", "deploy", f"from {k}")
        skill(r, "review", "review", f"from {k}")
        skill(r, f"only-{k}", f"only-{k}", f"only in {k}")
    skill(roots["bundled"], "lint", "lint", "x" * 3000)  # a description over the limit
    (roots["extra1"] / "huge").mkdir()
    (roots["extra1"] / "huge" / "SKILL.md").write_text("---\nname: huge\ndescription: big\n---\n" + "y" * 300_000)
    return {"ws": ws, **roots}


def skills_opts(w: dict[str, Path], **more: object) -> dict[str, object]:
    return {"personalDir": str(w["personal"]), "managedDir": str(w["managed"]), "bundledDir": str(w["bundled"]),
            "extraDirs": [str(w["extra1"]), str(w["extra2"])], **more}


async def test_bootstrap_order_caps_and_skill_precedence(database: str, tmp_path: Path) -> None:
    w = world(tmp_path)
    ws = w["ws"]
    init = {"workspace": str(ws), "systemPrompt": {"bootstrapMaxChars": 5000, "skills": skills_opts(w)}}
    c = await DagctxClient.spawn(database, initialization_options=init)
    try:
        s = await c.session_create("bootstrap")
        await c.append(s.session_id, "user", output="hello", predecessor=s.head)
        prep = await c.prepare(s.session_id, model="gpt-4o", format="openai", agent_prompt="INLINE PROMPT")
        text = prep.system
        # every bootstrap file, in the documented order, then the agent prompt, skills, MEMORY.md
        marks = [f"## {n}\ncontent of {n}" for n in BOOTSTRAP] + ["INLINE PROMPT", "## Skills",
                                                                   "## Memory (MEMORY.md)\nremembered"]
        pos = [text.index(m) for m in marks]
        assert pos == sorted(pos), text[:2000]
        # precedence: workspace > project agent > personal > managed > bundled > extra
        lines = [ln for ln in text.split("\n") if ln.startswith("- ")]
        by_name = {ln[2:].split(":")[0].split(" (")[0]: ln for ln in lines}
        assert "from the workspace (path: skills/deploy/SKILL.md)" in by_name["deploy"]
        assert "from the project agent (path: .agents/skills/review/SKILL.md)" in by_name["review"]
        for k in ("personal", "managed", "bundled", "extra1", "extra2"):
            assert f"only in {k} (path: {w[k]}/only-{k}/SKILL.md)" in by_name[f"only-{k}"]
        assert sum(1 for n in by_name if n == "deploy") == 1 and len(lines) == len(by_name) == 8, lines
        shadowed = [n for n in prep.notes if "'deploy'" in n and "shadowed" in n]
        assert len(shadowed) == 6 and all("skills/deploy/SKILL.md (workspace)" in n for n in shadowed), prep.notes
        # the description limit cuts, visibly; a SKILL.md over the byte limit is skipped with a note
        assert by_name["lint"].startswith("- lint: " + "x" * 1023 + "…") and "x" * 1024 not in by_name["lint"]
        assert any("lint/SKILL.md: description cut from 3,000 to 1,024" in n for n in prep.notes)
        assert "huge" not in by_name and any("huge/SKILL.md" in n and "maxSkillFileBytes" in n for n in prep.notes)

        # per request: caps over the connection's (per-file cap with the visible marker, a total
        # cap that leaves later files out, a count limit on skills)
        big = "line of the user file\n" * 400  # 8,800 characters
        (ws / "USER.md").write_text(big)
        prep = await c.prepare(s.session_id, model="gpt-4o", format="openai",
                               system_prompt={"bootstrapMaxChars": 1000, "bootstrapTotalMaxChars": 1050,
                                              "skills": {"maxSkillsInPrompt": 3}})
        text = prep.system
        # AGENTS … IDENTITY take 95 characters, USER.md the 955 left of the total
        shown = big[:955]
        assert f"## USER.md\n{shown}\n[… truncated: 955 of 8,799 characters shown — file USER.md, total " \
               "workspace-file limit 1,050 reached]" in text
        assert "## HEARTBEAT.md" not in text and "## BOOTSTRAP.md" not in text and "## Memory" not in text
        assert any(n.startswith("HEARTBEAT.md: skipped: the total workspace-file limit of 1,050") for n in prep.notes)
        skill_lines = [ln for ln in text.split("\n") if ln.startswith("- ")]
        assert len(skill_lines) == 3 and "+5 more skills not listed" in text
        # the connection's own caps are back on the next request that names none
        prep = await c.prepare(s.session_id, model="gpt-4o", format="openai")
        assert "[… truncated: 5,000 of 8,799 characters shown — file USER.md, per-file limit 5,000]" in prep.system
        assert "## Memory (MEMORY.md)" in prep.system and len([ln for ln in prep.system.split("\n")
                                                                  if ln.startswith("- ")]) == 8
        # the character limit: the largest prefix that fits, never over the limit
        prep = await c.prepare(s.session_id, model="gpt-4o", format="openai",
                               system_prompt={"skills": {"maxSkillsPromptChars": 600}})
        block = next(p for p in prep.system.split("\n\n") if p.startswith("## Skills"))
        assert len(block) <= 600 and block.endswith("more skills not listed")
        shown = len([ln for ln in block.split("\n") if ln.startswith("- ")])
        assert 0 < shown < 8

        # minimal mode: AGENTS.md and TOOLS.md only, no skills, no memory
        prep = await c.prepare(s.session_id, model="gpt-4o", format="openai", prompt_mode="minimal")
        assert "## AGENTS.md" in prep.system and "## TOOLS.md" in prep.system
        for gone in ("## SOUL.md", "## IDENTITY.md", "## USER.md", "## HEARTBEAT.md", "## BOOTSTRAP.md", "## Skills",
                     "## Memory"):
            assert gone not in prep.system
        # none: no bootstrap file, no agent prompt, no skills, no memory
        prep = await c.prepare(s.session_id, model="gpt-4o", format="openai", prompt_mode="none",
                               agent_prompt="INLINE PROMPT")
        for gone in [f"## {n}" for n in BOOTSTRAP] + ["INLINE PROMPT", "## Skills", "## Memory", "remembered"]:
            assert gone not in (prep.system or ""), prep.system

        # a root that does not exist is a note; bad caps are InvalidParams naming the field
        prep = await c.prepare(s.session_id, model="gpt-4o", format="openai",
                               system_prompt={"skills": {"managedDir": str(tmp_path / "nope")}})
        assert any(f"{tmp_path / 'nope'}: no such folder; no managed skills listed" == n for n in prep.notes)
        before = (await c.session_get(s.session_id)).node_count
        for bad, where in [({"bootstrapMaxChars": -1}, "bootstrapMaxChars"),
                           ({"skills": {"maxDescriptionChars": 0}}, "maxDescriptionChars"),
                           ({"skills": {"extraDirs": ["a\u0000b"]}}, "extraDirs")]:
            with pytest.raises(RpcError) as err:
                await c.prepare(s.session_id, model="gpt-4o", format="openai", system_prompt=bad)
            assert err.value.kind == "InvalidParams" and where in err.value.message, err.value.message
        assert (await c.session_get(s.session_id)).node_count == before, "a refused request writes nothing"
    finally:
        await c.close()


async def test_a_skill_root_is_confined_to_itself(database: str, tmp_path: Path) -> None:
    """A skill folder symlinked out of its root is refused, as in the workspace."""
    ws = tmp_path / "ws"
    ws.mkdir()
    personal = tmp_path / "personal"
    skill(personal, "fine", "fine", "stays inside")
    skill(tmp_path / "elsewhere", "secret", "secret", "TOP SECRET DESCRIPTION")
    (personal / "escape").symlink_to(tmp_path / "elsewhere" / "secret")
    c = await DagctxClient.spawn(database, initialization_options={
        "workspace": str(ws), "systemPrompt": {"skills": {"personalDir": str(personal)}}})
    try:
        s = await c.session_create("confined")
        prep = await c.prepare(s.session_id, model="gpt-4o", format="openai")
        assert "- fine: stays inside" in prep.system and "TOP SECRET" not in prep.system
        assert any(n.startswith(f"{personal}/escape/: refused") for n in prep.notes), prep.notes
    finally:
        await c.close()
