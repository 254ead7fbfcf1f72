"""The system prompt's options for one request: bootstrap-file caps and skill roots and
limits from ``context/prepare``'s ``systemPrompt`` over ``initializationOptions.systemPrompt``
over the defaults, field by field (SPEC §7)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from dagctx.context.skills import SkillRoot
from dagctx.context.system_prompt import PromptOptions
from dagctx.protocol.messages import SkillsOptions, SystemPromptOptions

if TYPE_CHECKING:
    from .ports import Host

#: the personal agent skills root when the client names none
PERSONAL_SKILLS_DEFAULT = "~/.agents/skills"


def _pick(name: str, *layers: Any) -> Any:
    for layer in layers:
        value = getattr(layer, name, None) if layer is not None else None
        if value is not None:
            return value
    return None


def _shown(path: str) -> str:
    """How a root outside the workspace is written in the prompt: ``~/…`` below the home folder."""
    home = os.path.expanduser("~")
    if home and home != "/" and (path == home or path.startswith(home.rstrip("/") + "/")):
        return "~" + path[len(home.rstrip("/")):]
    return path


def skill_roots(host: Host, req: SkillsOptions | None, init: SkillsOptions | None,
                field: str) -> tuple[SkillRoot, ...]:
    """The roots outside the workspace, highest precedence first: personal agent, managed,
    bundled, extra folders (each an absolute path as the client meant it)."""
    roots: list[SkillRoot] = []
    personal = _pick("personal_dir", req, init)
    spec = [("personal-agent", PERSONAL_SKILLS_DEFAULT if personal is None else personal, personal is not None,
             "personalDir"),
            ("managed", _pick("managed_dir", req, init), True, "managedDir"),
            ("bundled", _pick("bundled_dir", req, init), True, "bundledDir")]
    extras = _pick("extra_dirs", req, init) or []
    spec += [("extra", d, True, f"extraDirs[{i}]") for i, d in enumerate(extras)]
    for source, raw, explicit, name in spec:
        if not raw:
            continue
        path = os.path.normpath(host.client_path(raw, f"{field}.skills.{name}"))
        roots.append(SkillRoot(source=source, path=path, shown=_shown(path), explicit=explicit))
    return tuple(roots)


def prompt_options(host: Host, req: SystemPromptOptions | None, *, field: str = "systemPrompt",
                   **inline: Any) -> PromptOptions:
    """``PromptOptions`` for a request: ``inline`` (mode, identity, agent prompt, hooks) plus
    the caps and roots of ``req`` over the connection's ``initializationOptions.systemPrompt``."""
    init: SystemPromptOptions | None = getattr(host.options, "system_prompt", None)
    d = PromptOptions()
    req_sk = req.skills if req is not None else None
    init_sk = init.skills if init is not None else None

    def pick(name: str, layers: tuple[Any, ...], default: Any) -> Any:
        value = _pick(name, *layers)
        return default if value is None else value

    return PromptOptions(
        per_file_chars=pick("bootstrap_max_chars", (req, init), d.per_file_chars),
        total_chars=pick("bootstrap_total_max_chars", (req, init), d.total_chars),
        skills_max_count=pick("max_skills_in_prompt", (req_sk, init_sk), d.skills_max_count),
        skills_max_chars=pick("max_skills_prompt_chars", (req_sk, init_sk), d.skills_max_chars),
        skills_max_description_chars=pick("max_description_chars", (req_sk, init_sk), d.skills_max_description_chars),
        skills_max_file_bytes=pick("max_skill_file_bytes", (req_sk, init_sk), d.skills_max_file_bytes),
        skills_max_candidates_per_root=pick("max_candidates_per_root", (req_sk, init_sk),
                                            d.skills_max_candidates_per_root),
        skill_roots=skill_roots(host, req_sk, init_sk, field),
        **inline,
    )
