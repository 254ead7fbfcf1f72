"""The model table: context window, maximum output and tokenizer of each model.

Lookup of a name (case-insensitive; a provider path such as ``openrouter/`` or
``openai/`` is dropped after an exact match on the full name fails):

1. an exact entry;
2. the longest entry that is a prefix of the name and ends at a boundary
   (``-``, ``_``, ``.``, ``:``, ``@``), so ``claude-sonnet-4-5-20250929`` resolves to
   ``claude-sonnet-4-5`` and ``gpt-4o-2024-08-06`` to ``gpt-4o``;
3. the default: window ``DEFAULT_CONTEXT_WINDOW`` (128,000), max output
   ``DEFAULT_MAX_OUTPUT`` (8,192), tokenizer ``"estimate"``, ``known=False``.

Layers: ``with_overrides`` and ``load_config_file`` each return a new table whose
entries win over the table they were called on. The daemon builds
``ModelTable().load_config_file(user file).with_overrides(initializationOptions.models)``,
so initialization options beat the user file, which beats the built-in table.
An override may give only some fields; the others come from what the name
resolved to before the override.

The built-in numbers are the providers' published limits (standard tier, no
beta headers). Open-weight models list the window the weights support without
RoPE scaling; their max output is a server setting, 8,192 here unless the
publisher states one.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from dagctx.protocol.errors import DagctxError
from dagctx.protocol.messages import ModelSpec
from .tokens import TokenCounter, bare_model_name, default_counter

DEFAULT_CONTEXT_WINDOW = 128_000
DEFAULT_MAX_OUTPUT = 8_192
_BOUNDARY = "-_.:@"


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What the budget needs to know about one model.

    ``tokenizer`` is always a resolved id (``cl100k_base``, ``o200k_base`` only
    when its vocabulary is on disk, or ``estimate``). ``exact`` is True when that
    tokenizer gives this model's own counts. ``matched`` is the table entry the
    name resolved to (None for the default); ``known`` is False for the default.
    """

    name: str
    context_window: int
    max_output: int
    tokenizer: str
    known: bool = True
    exact: bool = False
    matched: str | None = None


@dataclass(frozen=True, slots=True)
class _Entry:
    context_window: int
    max_output: int
    tokenizer: str | None = None  # None: TokenCounter.tokenizer_for(the model name)


def _e(window: int, max_output: int) -> _Entry:
    return _Entry(window, max_output)


#: Built-in models. Keys are lower-case; prefixes cover dated snapshots.
BUILTIN_MODELS: dict[str, _Entry] = {
    # ---- OpenAI
    "gpt-5": _e(400_000, 128_000),
    "gpt-5-mini": _e(400_000, 128_000),
    "gpt-5-nano": _e(400_000, 128_000),
    "gpt-5-codex": _e(400_000, 128_000),
    "gpt-5-pro": _e(400_000, 272_000),
    "gpt-5-chat": _e(128_000, 16_384),
    "gpt-5.1": _e(400_000, 128_000),
    "gpt-5.1-chat": _e(128_000, 16_384),
    "gpt-4.1": _e(1_047_576, 32_768),
    "gpt-4.1-mini": _e(1_047_576, 32_768),
    "gpt-4.1-nano": _e(1_047_576, 32_768),
    "gpt-4.5-preview": _e(128_000, 16_384),
    "gpt-4o": _e(128_000, 16_384),
    "gpt-4o-2024-05-13": _e(128_000, 4_096),
    "gpt-4o-mini": _e(128_000, 16_384),
    "chatgpt-4o-latest": _e(128_000, 16_384),
    "o1": _e(200_000, 100_000),
    "o1-pro": _e(200_000, 100_000),
    "o1-mini": _e(128_000, 65_536),
    "o1-preview": _e(128_000, 32_768),
    "o3": _e(200_000, 100_000),
    "o3-pro": _e(200_000, 100_000),
    "o3-mini": _e(200_000, 100_000),
    "o4-mini": _e(200_000, 100_000),
    "codex-mini": _e(200_000, 100_000),
    "gpt-oss-120b": _e(131_072, 131_072),
    "gpt-oss-20b": _e(131_072, 131_072),
    "gpt-4-turbo": _e(128_000, 4_096),
    "gpt-4-1106": _e(128_000, 4_096),
    "gpt-4-0125": _e(128_000, 4_096),
    "gpt-4-vision-preview": _e(128_000, 4_096),
    "gpt-4": _e(8_192, 8_192),
    "gpt-4-32k": _e(32_768, 8_192),
    "gpt-3.5-turbo": _e(16_385, 4_096),
    "gpt-35-turbo": _e(16_385, 4_096),
    "gpt-3.5-turbo-instruct": _e(4_096, 4_096),
    # ---- Anthropic (200k window; 1M for Sonnet 4/4.5 only behind a beta header)
    "claude-opus-4-5": _e(200_000, 64_000),
    "claude-opus-4-1": _e(200_000, 32_000),
    "claude-opus-4": _e(200_000, 32_000),
    "claude-sonnet-4-5": _e(200_000, 64_000),
    "claude-sonnet-4": _e(200_000, 64_000),
    "claude-haiku-4-5": _e(200_000, 64_000),
    "claude-3-7-sonnet": _e(200_000, 64_000),
    "claude-3-5-sonnet": _e(200_000, 8_192),
    "claude-3-5-haiku": _e(200_000, 8_192),
    "claude-3-opus": _e(200_000, 4_096),
    "claude-3-haiku": _e(200_000, 4_096),
    # OpenRouter spells versions with dots (anthropic/claude-opus-4.5)
    "claude-opus-4.5": _e(200_000, 64_000),
    "claude-opus-4.1": _e(200_000, 32_000),
    "claude-sonnet-4.5": _e(200_000, 64_000),
    "claude-haiku-4.5": _e(200_000, 64_000),
    "claude-3.7-sonnet": _e(200_000, 64_000),
    "claude-3.5-sonnet": _e(200_000, 8_192),
    "claude-3.5-haiku": _e(200_000, 8_192),
    # ---- Google
    "gemini-3-pro": _e(1_048_576, 65_536),
    "gemini-2.5-pro": _e(1_048_576, 65_536),
    "gemini-2.5-flash": _e(1_048_576, 65_536),
    "gemini-2.5-flash-lite": _e(1_048_576, 65_536),
    "gemini-2.0-flash": _e(1_048_576, 8_192),
    "gemini-2.0-flash-lite": _e(1_048_576, 8_192),
    "gemini-1.5-pro": _e(2_097_152, 8_192),
    "gemini-1.5-flash": _e(1_048_576, 8_192),
    # ---- Meta Llama (128K = 131,072)
    "llama-3.1": _e(131_072, 8_192),
    "llama-3.2": _e(131_072, 8_192),
    "llama-3.3": _e(131_072, 8_192),
    "meta-llama-3.1": _e(131_072, 8_192),
    "meta-llama-3.3": _e(131_072, 8_192),
    "llama3.1": _e(131_072, 8_192),
    "llama3.2": _e(131_072, 8_192),
    "llama3.3": _e(131_072, 8_192),
    # ---- Qwen (native windows; 2.5 and 3 reach 131,072 only with YaRN scaling)
    "qwen2.5": _e(32_768, 8_192),
    "qwen2.5-coder": _e(32_768, 8_192),
    "qwen3": _e(32_768, 8_192),
    "qwen3-235b-a22b-instruct-2507": _e(262_144, 32_768),
    "qwen3-235b-a22b-thinking-2507": _e(262_144, 32_768),
    "qwen3-30b-a3b-instruct-2507": _e(262_144, 32_768),
    "qwen3-30b-a3b-thinking-2507": _e(262_144, 32_768),
    "qwen3-coder": _e(262_144, 65_536),
    "qwen-max": _e(32_768, 8_192),
    "qwen-plus": _e(131_072, 8_192),
    # ---- DeepSeek API (128K since V3.1; was 64K before)
    "deepseek-chat": _e(128_000, 8_192),
    "deepseek-reasoner": _e(128_000, 65_536),
    "deepseek-v3": _e(128_000, 8_192),
    "deepseek-r1": _e(128_000, 32_768),
    # ---- Mistral
    "mistral-large": _e(131_072, 8_192),
    "mistral-medium": _e(131_072, 8_192),
    "mistral-small": _e(131_072, 8_192),
    "mistral-nemo": _e(131_072, 8_192),
    "open-mistral-nemo": _e(131_072, 8_192),
    "codestral": _e(256_000, 8_192),
}


def _invalid(message: str, path: str | None = None) -> DagctxError:
    return DagctxError("InvalidParams", message, path=path)


def _positive_int(name: str, field: str, value: Any, path: str | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise _invalid(f"model {name!r}: {field} must be a positive integer (64-bit), got {value!r}", path)
    return value


class ModelTable:
    """Model name → ``ModelInfo``. Immutable: the layering methods return new tables."""

    def __init__(
        self,
        entries: Mapping[str, _Entry] | None = None,
        *,
        counter: TokenCounter | None = None,
    ) -> None:
        source = BUILTIN_MODELS if entries is None else entries
        self._entries: dict[str, _Entry] = {k.lower(): v for k, v in source.items()}
        self._counter = counter if counter is not None else default_counter()

    @property
    def counter(self) -> TokenCounter:
        return self._counter

    def names(self) -> list[str]:
        """Every entry name, sorted."""
        return sorted(self._entries)

    # ------------------------------------------------------------ lookup

    def _prefix_match(self, key: str) -> str | None:
        best: str | None = None
        for entry in self._entries:
            if (
                len(entry) < len(key)
                and key.startswith(entry)
                and key[len(entry)] in _BOUNDARY
                and (best is None or len(entry) > len(best))
            ):
                best = entry
        return best

    def _lookup(self, name: str) -> str | None:
        full = name.strip().lower()
        bare = bare_model_name(name)
        keys = (full,) if full == bare else (full, bare)
        for key in keys:
            if key in self._entries:
                return key
        for key in keys:
            found = self._prefix_match(key)
            if found is not None:
                return found
        return None

    def get(self, name: str | None) -> ModelInfo:
        """The model's info; the documented default (``known=False``) when nothing matches."""
        label = name if name else "default"
        matched = self._lookup(name) if name else None
        if matched is None:
            return ModelInfo(
                name=label,
                context_window=DEFAULT_CONTEXT_WINDOW,
                max_output=DEFAULT_MAX_OUTPUT,
                tokenizer=self._counter.tokenizer_for(name),
                known=False,
                exact=self._counter.is_exact_for(name),
            )
        entry = self._entries[matched]
        if entry.tokenizer is None:
            tokenizer = self._counter.tokenizer_for(name)
        else:
            tokenizer = self._counter.resolve(entry.tokenizer)
        return ModelInfo(
            name=label,
            context_window=entry.context_window,
            max_output=entry.max_output,
            tokenizer=tokenizer,
            known=True,
            exact=self._counter.is_exact_for(name, tokenizer),
            matched=matched,
        )

    # ------------------------------------------------------------ layering

    def with_overrides(self, mapping: Mapping[str, ModelSpec], *, path: str | None = None) -> ModelTable:
        """A new table with ``mapping``'s entries on top.

        ``mapping`` is ``{name: ModelSpec}`` (the wire type of
        ``initializationOptions.models`` and of the config file's ``models`` table).
        Fields a spec leaves out keep what ``name`` resolved to before (or the
        default). Bad values raise ``DagctxError("InvalidParams")``.
        """
        entries = dict(self._entries)
        for name, spec in mapping.items():
            fields = {"context_window": spec.context_window, "max_output": spec.max_output, "tokenizer": spec.tokenizer}
            base_key = self._lookup(name)
            if base_key is not None:
                base = self._entries[base_key]
            else:
                base = _Entry(DEFAULT_CONTEXT_WINDOW, DEFAULT_MAX_OUTPUT, None)
            window = base.context_window
            max_output = base.max_output
            tokenizer = base.tokenizer
            if fields["context_window"] is not None:
                window = _positive_int(name, "contextWindow", fields["context_window"], path)
            if fields["max_output"] is not None:
                max_output = _positive_int(name, "maxOutput", fields["max_output"], path)
            if fields["tokenizer"] is not None:
                if not isinstance(fields["tokenizer"], str):
                    raise _invalid(f"model {name!r}: tokenizer must be a string", path)
                try:
                    self._counter.resolve(fields["tokenizer"])
                except ValueError as exc:
                    raise _invalid(f"model {name!r}: {exc}", path) from None
                tokenizer = fields["tokenizer"].strip().lower()
            entries[name.strip().lower()] = _Entry(window, max_output, tokenizer)
        return ModelTable(entries, counter=self._counter)

    def load_config_file(
        self, path: str | os.PathLike[str], *, missing_ok: bool = False, raw: bytes | None = None
    ) -> ModelTable:
        """A new table with the models of a TOML or JSON file on top.

        The file holds ``{"models": {name: {contextWindow, maxOutput, tokenizer}}}``;
        in TOML, ``[models."gpt-4o"]`` tables. ``.toml`` files parse as TOML,
        ``.json`` as JSON, anything else as JSON and then TOML. Other top-level keys
        are ignored. A missing file returns this table when ``missing_ok``. ``raw`` is
        the file's content when the caller read it already (the daemon reads it with
        ``dagctx.engine.config.read_config_file``: regular files only, size-capped).
        """
        where = os.fspath(path)
        try:
            if raw is None:
                raw = Path(where).read_bytes()
        except FileNotFoundError:
            if missing_ok:
                return self
            raise _invalid(f"model config file {where} does not exist", where) from None
        except OSError as exc:
            raise _invalid(f"cannot read model config file {where}: {exc.strerror or exc}", where) from None
        data = _parse_config(raw, where)
        if not isinstance(data, dict):
            raise _invalid(f"model config file {where}: the top level must be a table/object", where)
        models = data.get("models", {})
        if not isinstance(models, dict):
            raise _invalid(f"model config file {where}: 'models' must be a table/object of models", where)
        specs: dict[str, ModelSpec] = {}
        known = {f.encode_name for f in msgspec.structs.fields(ModelSpec)}
        for name, raw_spec in models.items():
            if not isinstance(raw_spec, Mapping):
                raise _invalid(f"model config file {where}: model {name!r}: expected a table of settings, "
                               f"got {type(raw_spec).__name__}", where)
            for key in raw_spec:
                if key not in known:
                    raise _invalid(f"model config file {where}: model {name!r}: unknown setting {key!r} "
                                   f"(the settings are {', '.join(sorted(known))})", where)
            try:
                specs[str(name)] = msgspec.convert(raw_spec, ModelSpec)
            except msgspec.ValidationError as exc:
                raise _invalid(f"model config file {where}: model {name!r}: {exc} "
                               "(expected contextWindow, maxOutput, tokenizer)", where) from None
        return self.with_overrides(specs, path=where)


def _parse_config(raw: bytes, where: str) -> Any:
    suffix = os.path.splitext(where)[1].lower()
    errors: list[str] = []
    order = ("toml",) if suffix == ".toml" else ("json",) if suffix == ".json" else ("json", "toml")
    for kind in order:
        try:
            text = raw.decode("utf-8")
            return json.loads(text) if kind == "json" else tomllib.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
            errors.append(f"{kind.upper()}: {exc}")
    raise _invalid(f"model config file {where} does not parse ({'; '.join(errors)})", where)


__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_CONTEXT_WINDOW",
    "DEFAULT_MAX_OUTPUT",
    "ModelInfo",
    "ModelTable",
]
