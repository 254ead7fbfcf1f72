"""dagctx.context.models and dagctx.context.budget: the model table, the reserve,
the budget, BudgetExceeded, thresholds and calibration."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from dagctx.context.budget import (
    COMPACT_AT,
    RECOMMEND_AT,
    TOOL_OVERHEAD_TOKENS,
    calibrate,
    check_fits,
    compute_budget,
    distribute,
    measured_prompt_tokens,
    output_reserve,
    thresholds,
    tools_schema_tokens,
)
from dagctx.context.models import DEFAULT_CONTEXT_WINDOW, DEFAULT_MAX_OUTPUT, ModelInfo, ModelTable
from dagctx.context.tokens import TokenCounter
from dagctx.protocol.context_messages import Budget, Usage
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.messages import ModelSpec


@pytest.fixture
def counter(tmp_path: Path) -> TokenCounter:
    return TokenCounter(cache_dir=tmp_path)  # no o200k vocabulary


@pytest.fixture
def table(counter: TokenCounter) -> ModelTable:
    return ModelTable(counter=counter)


def info(window: int, max_output: int) -> ModelInfo:
    return ModelInfo(name="m", context_window=window, max_output=max_output, tokenizer="estimate")


# ---------------------------------------------------------------- model table


@pytest.mark.parametrize(
    ("name", "window", "max_output"),
    [
        ("gpt-4o", 128_000, 16_384),
        ("gpt-4o-mini", 128_000, 16_384),
        ("gpt-4.1", 1_047_576, 32_768),
        ("gpt-4.1-mini", 1_047_576, 32_768),
        ("o3", 200_000, 100_000),
        ("o4-mini", 200_000, 100_000),
        ("gpt-5", 400_000, 128_000),
        ("gpt-3.5-turbo", 16_385, 4_096),
        ("gpt-4-turbo", 128_000, 4_096),
        ("claude-opus-4-1", 200_000, 32_000),
        ("claude-sonnet-4-5", 200_000, 64_000),
        ("claude-haiku-4-5", 200_000, 64_000),
        ("claude-3-7-sonnet", 200_000, 64_000),
        ("claude-3-5-sonnet", 200_000, 8_192),
        ("claude-3-5-haiku", 200_000, 8_192),
        ("gemini-2.5-pro", 1_048_576, 65_536),
        ("gemini-2.5-flash", 1_048_576, 65_536),
        ("gemini-2.0-flash", 1_048_576, 8_192),
        ("llama-3.3", 131_072, 8_192),
        ("deepseek-reasoner", 128_000, 65_536),
    ],
)
def test_builtin_exact_entries(table: ModelTable, name: str, window: int, max_output: int) -> None:
    got = table.get(name)
    assert (got.context_window, got.max_output, got.known, got.matched) == (window, max_output, True, name)


@pytest.mark.parametrize(
    ("name", "matched"),
    [
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("claude-3-5-sonnet-20241022", "claude-3-5-sonnet"),
        ("claude-3-7-sonnet-latest", "claude-3-7-sonnet"),
        ("claude-sonnet-4@20250514", "claude-sonnet-4"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),  # the longest prefix wins
        ("gpt-4o-2024-05-13", "gpt-4o-2024-05-13"),
        ("gpt-4.1-2025-04-14", "gpt-4.1"),
        ("gpt-4-0613", "gpt-4"),
        ("gpt-4-1106-preview", "gpt-4-1106"),
        ("gpt-5.1-codex", "gpt-5.1"),
        ("o3-mini-2025-01-31", "o3-mini"),
        ("openai/gpt-4o", "gpt-4o"),
        ("openrouter/anthropic/claude-opus-4.5", "claude-opus-4.5"),
        ("us.anthropic.claude-3-5-haiku-20241022-v1:0", "claude-3-5-haiku"),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5"),
        ("llama3.1:8b", "llama3.1"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3"),
        ("GPT-4o", "gpt-4o"),
    ],
)
def test_prefix_lookup(table: ModelTable, name: str, matched: str) -> None:
    got = table.get(name)
    assert got.matched == matched
    assert got.known
    assert got.name == name


def test_snapshot_numbers_follow_the_prefix(table: ModelTable) -> None:
    got = table.get("claude-sonnet-4-5-20250929")
    assert (got.context_window, got.max_output, got.tokenizer) == (200_000, 64_000, "estimate")
    assert table.get("gpt-4o-2024-05-13").max_output == 4_096
    assert table.get("gpt-4o-2024-11-20").max_output == 16_384


@pytest.mark.parametrize("name", [None, "", "my-local-model", "gpt-4ox", "o1x", "claude"])
def test_default_for_unknown(table: ModelTable, name: str | None) -> None:
    got = table.get(name)
    assert (got.context_window, got.max_output, got.tokenizer) == (DEFAULT_CONTEXT_WINDOW, DEFAULT_MAX_OUTPUT, "estimate")
    assert (DEFAULT_CONTEXT_WINDOW, DEFAULT_MAX_OUTPUT) == (128_000, 8_192)
    assert got.known is False
    assert got.matched is None
    assert got.name == (name or "default")


def test_tokenizers_resolved(table: ModelTable) -> None:
    assert (table.get("gpt-4").tokenizer, table.get("gpt-4").exact) == ("cl100k_base", True)
    assert (table.get("gpt-3.5-turbo-0125").tokenizer, table.get("gpt-3.5-turbo-0125").exact) == ("cl100k_base", True)
    # no o200k vocabulary on disk: cl100k stands in, and is not claimed exact
    assert (table.get("gpt-4o").tokenizer, table.get("gpt-4o").exact) == ("cl100k_base", False)
    assert (table.get("gpt-5").tokenizer, table.get("gpt-5").exact) == ("cl100k_base", False)
    for name in ("claude-sonnet-4-5", "gemini-2.5-pro", "qwen3", "deepseek-chat", "mistral-large"):
        assert (table.get(name).tokenizer, table.get(name).exact) == ("estimate", False)


def test_model_info_wire_shape(table: ModelTable) -> None:
    wire = json.loads(msgspec.json.encode(table.get("gpt-4o")))
    assert wire["contextWindow"] == 128_000
    assert wire["maxOutput"] == 16_384


# ---------------------------------------------------------------- overrides


def test_override_precedence(table: ModelTable, tmp_path: Path) -> None:
    cfg = tmp_path / "models.toml"
    cfg.write_text(
        '[models."gpt-4o"]\ncontextWindow = 100000\n\n'
        '[models."my-local"]\ncontextWindow = 32768\nmaxOutput = 4096\ntokenizer = "cl100k_base"\n',
        encoding="utf-8",
    )
    from_file = table.load_config_file(cfg)
    assert from_file.get("gpt-4o").context_window == 100_000
    assert from_file.get("gpt-4o").max_output == 16_384  # missing field kept from the built-in
    assert from_file.get("gpt-4o-2024-08-06").context_window == 100_000  # snapshots follow
    layered = from_file.with_overrides({"gpt-4o": ModelSpec(context_window=90_000)})
    assert layered.get("gpt-4o").context_window == 90_000  # initializationOptions beat the file
    assert layered.get("gpt-4o").max_output == 16_384
    assert table.get("gpt-4o").context_window == 128_000  # tables are immutable
    assert from_file.get("gpt-4o").context_window == 100_000

    local = layered.get("my-local-v2")
    assert (local.context_window, local.max_output, local.tokenizer, local.known) == (32_768, 4_096, "cl100k_base", True)
    assert local.exact is False  # cl100k is not my-local's own tokenizer


def test_override_of_a_prefix_resolved_name(table: ModelTable) -> None:
    t = table.with_overrides({"claude-sonnet-4-5-20250929": ModelSpec(max_output=1_000)})
    got = t.get("claude-sonnet-4-5-20250929")
    assert (got.context_window, got.max_output, got.matched) == (200_000, 1_000, "claude-sonnet-4-5-20250929")
    assert t.get("claude-sonnet-4-5").max_output == 64_000


def test_override_takes_the_wire_model_spec(table: ModelTable) -> None:
    t = table.with_overrides({"qwen3-32b": ModelSpec(context_window=131_072, max_output=16_384)})
    assert (t.get("qwen3-32b").context_window, t.get("qwen3-32b").max_output) == (131_072, 16_384)


def test_config_file_keys_are_the_wire_names(table: ModelTable, tmp_path: Path) -> None:
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({"models": {"deepseek-chat": {"context_window": 64_000}}}), encoding="utf-8")
    with pytest.raises(DagctxError) as err:
        table.load_config_file(cfg)
    assert "unknown setting 'context_window'" in err.value.message and "contextWindow" in err.value.message


def test_override_o200k_without_vocabulary_resolves_to_cl100k(table: ModelTable) -> None:
    t = table.with_overrides({"my-gpt": ModelSpec(context_window=50_000, tokenizer="o200k_base")})
    assert t.get("my-gpt").tokenizer == "cl100k_base"


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"contextWindow": 0}, "contextWindow must be a positive integer"),
        ({"contextWindow": "big"}, "Expected `int | null`, got `str` - at `$.contextWindow`"),
        ({"maxOutput": -5}, "maxOutput must be a positive integer"),
        ({"tokenizer": "claude"}, "unknown tokenizer 'claude'"),
        ("128000", "expected a table of settings"),
    ],
)
def test_bad_overrides_are_refused(table: ModelTable, tmp_path: Path, spec: object, fragment: str) -> None:
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({"models": {"x": spec}}), encoding="utf-8")
    with pytest.raises(DagctxError) as err:
        table.load_config_file(cfg)
    assert err.value.kind == "InvalidParams"
    assert fragment in err.value.message


def test_json_config_file_and_errors(table: ModelTable, tmp_path: Path) -> None:
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({"models": {"gemini-2.5-pro": {"maxOutput": 32_000}}, "other": 1}), encoding="utf-8")
    assert table.load_config_file(cfg).get("gemini-2.5-pro").max_output == 32_000

    missing = tmp_path / "absent.toml"
    assert table.load_config_file(missing, missing_ok=True) is table
    with pytest.raises(DagctxError, match="does not exist"):
        table.load_config_file(missing)

    broken = tmp_path / "broken.toml"
    broken.write_text("[models\n", encoding="utf-8")
    with pytest.raises(DagctxError, match="does not parse") as err:
        table.load_config_file(broken)
    assert err.value.path == str(broken)

    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"models": [1, 2]}', encoding="utf-8")
    with pytest.raises(DagctxError, match="'models' must be"):
        table.load_config_file(wrong)


# ---------------------------------------------------------------- output reserve


def test_output_reserve_formula() -> None:
    assert output_reserve(info(200_000, 64_000)) == 16_384
    assert output_reserve(info(16_385, 4_096)) == 4_096
    assert output_reserve(info(8_192, 8_192)) == 2_048
    assert output_reserve(info(8_000, 8_000)) == 2_000
    assert output_reserve(info(1_047_576, 32_768)) == 16_384
    assert output_reserve(info(200_000, 8_192)) == 8_192


def test_output_reserve_explicit_cap_unchanged() -> None:
    assert output_reserve(info(200_000, 64_000), 50_000) == 50_000
    assert output_reserve(info(8_192, 8_192), 6_000) == 6_000  # more than window/4: still as given
    assert output_reserve(info(200_000, 64_000), 0) == 0
    with pytest.raises(DagctxError) as err:
        output_reserve(info(200_000, 64_000), -1)
    assert err.value.kind == "InvalidParams"


def test_output_reserve_from_the_table(table: ModelTable) -> None:
    assert output_reserve(table.get("claude-sonnet-4-5-20250929")) == 16_384
    assert output_reserve(table.get("gpt-3.5-turbo")) == 4_096
    assert output_reserve(table.get("gpt-4")) == 2_048
    assert output_reserve(table.get("claude-3-5-haiku")) == 8_192


# ---------------------------------------------------------------- budget


def test_compute_budget_numbers() -> None:
    b = compute_budget(info(200_000, 64_000), 5_000, 100_000, 3_000)
    assert isinstance(b, Budget)
    assert b.context_window == 200_000
    assert b.output_reserve == 16_384
    assert b.input_used == 108_000
    assert b.input_budget == 183_616
    assert b.percent_used == 58.8
    assert b.headroom == 75_616
    assert b.source == "estimate"
    wire = json.loads(msgspec.json.encode(b))
    assert wire["inputBudget"] == 183_616 and wire["percentUsed"] == 58.8 and wire["toolsSchema"] == 3_000


def test_compute_budget_over_and_explicit_reserve() -> None:
    b = compute_budget(info(16_385, 4_096), 2_000, 12_000, 500, requested_output=1_000, source="calibrated")
    assert (b.output_reserve, b.input_budget, b.input_used, b.headroom) == (1_000, 15_385, 14_500, 885)
    assert b.source == "calibrated"
    over = compute_budget(info(16_385, 4_096), 2_000, 12_000, 500)
    assert over.headroom == 12_289 - 14_500
    assert over.percent_used == 118.0
    none_left = compute_budget(info(8_000, 8_000), 10, 0, 0, requested_output=8_000)
    assert (none_left.input_budget, none_left.percent_used, none_left.headroom) == (0, 100.0, -10)


def test_budget_over_100k_stored_counts() -> None:
    stored = [37 + (i % 200) for i in range(100_000)]  # per-node counts, computed once when stored
    b = compute_budget(info(10_000_000, 8_192), 1_000, sum(stored), 0)
    assert b.history == sum(stored)


def test_thresholds() -> None:
    assert (RECOMMEND_AT, COMPACT_AT) == (70.0, 80.0)
    m = info(200_000, 64_000)

    def at(history: int) -> tuple[bool, bool]:
        b = compute_budget(m, 0, history, 0, requested_output=100_000)
        assert b.input_budget == 100_000
        return thresholds(b)

    assert at(69_999) == (False, False)
    assert at(70_000) == (True, False)
    assert at(79_999) == (True, False)
    assert at(80_000) == (True, True)
    # unrounded: 79.96 % shows as 80.0 but is not yet at the threshold
    assert compute_budget(m, 0, 79_960, 0, requested_output=100_000).percent_used == 80.0
    assert at(79_960) == (True, False)
    # no input budget at all
    assert thresholds(compute_budget(info(8_000, 8_000), 0, 0, 0, requested_output=8_000)) == (True, True)


# ---------------------------------------------------------------- check_fits


def test_check_fits_returns_room() -> None:
    b = compute_budget(info(200_000, 64_000), 5_000, 100_000, 3_000)
    assert check_fits(b, 9_000) == 183_616 - 9_000


def test_budget_exceeded_carries_the_numbers() -> None:
    b = compute_budget(info(16_385, 4_096), 6_000, 20_000, 5_000)
    with pytest.raises(DagctxError) as err:
        check_fits(b, 13_000, model="gpt-3.5-turbo")
    e = err.value
    assert e.kind == "BudgetExceeded"
    assert e.details == {
        "model": "gpt-3.5-turbo",
        "contextWindow": 16_385,
        "outputReserve": 4_096,
        "inputBudget": 12_289,
        "protectedTokens": 13_000,
        "systemPrompt": 6_000,
        "toolsSchema": 5_000,
        "newestUserTurn": 2_000,
        "overBy": 711,
        "source": "estimate",
    }
    for text in ("13,000", "12,289", "16,385", "4,096", "711", "gpt-3.5-turbo", "larger context window", "fewer", "maxOutputTokens"):
        assert text in e.message
    wire = e.to_response_error()
    assert wire.code == -32001 and wire.data.kind == "BudgetExceeded"


# ---------------------------------------------------------------- tools schema


def test_tools_schema_tokens(counter: TokenCounter) -> None:
    tools = [
        {"name": "read_file", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
        {"name": "bash", "description": "Run a command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
    ]
    compact = msgspec.json.encode(tools).decode()
    assert " " not in compact.replace("Read a file", "").replace("Run a command", "")
    for tok in ("cl100k_base", "estimate"):
        assert tools_schema_tokens(tools, counter, tok) == counter.count(compact, tok) + 2 * TOOL_OVERHEAD_TOKENS
    assert tools_schema_tokens([], counter, "cl100k_base") == 0
    assert TOOL_OVERHEAD_TOKENS == 8


# ---------------------------------------------------------------- calibration


def test_measured_prompt_tokens() -> None:
    assert measured_prompt_tokens(Usage(input=120, output=900, cache_read=40_000, cache_write=2_000)) == 42_120


def test_calibrate() -> None:
    # the estimate is of exactly the measured prompt: the provider's number
    assert calibrate(10_000, 12_000, 10_000) == (12_000, "provider")
    assert calibrate(10_500, 12_000, 10_000, same_messages=True) == (12_000, "provider")
    # a newer prompt: the measured/estimated ratio of the earlier call scales it
    assert calibrate(15_000, 12_000, 10_000) == (18_000, "calibrated")
    assert calibrate(10_000, 12_000, 10_000, same_messages=False) == (12_000, "calibrated")
    # nothing measured, nothing to compare with, or a ratio that cannot be right
    assert calibrate(15_000, None, None) == (15_000, "estimate")
    assert calibrate(15_000, 0, 10_000) == (15_000, "estimate")
    assert calibrate(15_000, 12_000, None) == (15_000, "estimate")
    assert calibrate(15_000, 12_000, 0) == (15_000, "estimate")
    assert calibrate(15_000, 50_000, 10_000) == (15_000, "estimate")
    assert calibrate(15_000, 2_000, 10_000) == (15_000, "estimate")


def test_distribute_never_double_counts() -> None:
    assert distribute(12_000, 1_000, 8_000, 1_000) == (1_200, 9_600, 1_200)
    for total, parts in ((3, (1, 0, 1)), (18_001, (3_333, 10_000, 777)), (0, (5, 5, 5)), (100, (0, 0, 0))):
        split = distribute(total, *parts)
        assert sum(split) == total
        assert min(split) >= 0
