"""Embedding providers of memory search (SPEC §5.1): text → unit-length float32 vectors.

``local`` — the default — is a static embedding model whose weights ship inside a registry
package (``wordllama``'s wheel: a 32,000 × 256 token-embedding matrix and its tokenizer
file); a text's vector is the mean of its tokens' vectors, normalised. Nothing is
downloaded: the files are read from the installed package (``dagctx[embed]``); without it
there is no local provider and memory search runs on keywords alone. ``openai`` calls an
OpenAI-compatible ``POST {baseUrl}/embeddings``. Each vector is stored with the provider
and model that made it; a search only compares vectors of one model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from dagctx.protocol.errors import DagctxError

#: the local model's name, recorded with each vector it makes
LOCAL_MODEL = "wordllama-l2-supercat-256"
#: texts per endpoint request
ENDPOINT_BATCH = 64
#: each text is cut at this many characters before it is embedded (a chunk is ~400 tokens)
MAX_TEXT_CHARS = 8000


class Embedder(Protocol):
    provider: str
    model: str
    dim: int

    def embed(self, texts: list[str]) -> Any:
        """A float32 array ``(len(texts), dim)``, each row of unit length (or zero)."""
        ...


def _numpy() -> Any:
    import numpy as np

    return np


def _normalise(m: Any) -> Any:
    np = _numpy()
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (m / norms).astype(np.float32, copy=False)


def local_files() -> tuple[str, str] | None:
    """(weights, tokenizer) of the packaged static model, or None when it is not installed."""
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    weights = os.path.join(root, "weights", "l2_supercat_256.safetensors")
    tokenizer = os.path.join(root, "tokenizers", "l2_supercat_tokenizer_config.json")
    if not (os.path.isfile(weights) and os.path.isfile(tokenizer)):
        return None
    return weights, tokenizer


class LocalStatic:
    """Mean of packaged token vectors (``local_files``), normalised."""

    provider = "local"
    model = LOCAL_MODEL

    def __init__(self, weights: str, tokenizer: str) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        np = _numpy()
        tensors = load_file(weights)
        if len(tensors) != 1:
            raise DagctxError("EmbeddingFailed", f"{weights}: expected one embedding matrix, found {len(tensors)}")
        self.matrix = np.ascontiguousarray(next(iter(tensors.values())), dtype=np.float32)
        self.dim = int(self.matrix.shape[1])
        self.tokenizer = Tokenizer.from_file(tokenizer)
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.special = {i for t, i in self.tokenizer.get_vocab().items() if t in ("<s>", "</s>", "<unk>", "<pad>")}

    def embed(self, texts: list[str]) -> Any:
        np = _numpy()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encoded = self.tokenizer.encode_batch([t[:MAX_TEXT_CHARS] for t in texts], add_special_tokens=False)
        # each text's mean token vector, one text at a time: gathering a whole batch's token rows
        # at once wrote hundreds of MiB per batch and was ~5× slower (bench_memory_vectors.py)
        for j, enc in enumerate(encoded):
            ids = [i for i in enc.ids if i not in self.special]
            if ids:
                out[j] = self.matrix[np.asarray(ids, dtype=np.intp)].mean(axis=0)
        return _normalise(out)


_local: LocalStatic | None = None
_local_lock = threading.Lock()


def local_embedder() -> LocalStatic | None:
    """The process's local provider (loaded once), or None when its package is not installed."""
    global _local
    with _local_lock:
        if _local is None:
            files = local_files()
            if files is None:
                return None
            _local = LocalStatic(*files)
        return _local


@dataclass
class Endpoint:
    """An OpenAI-compatible ``/embeddings`` endpoint (loopback or wherever the client points it)."""

    base_url: str
    model: str
    api_key: str | None = None
    dim: int = 0  # learnt from the first answer unless given
    timeout: float = 30.0
    provider: str = "openai"

    def embed(self, texts: list[str]) -> Any:
        np = _numpy()
        rows: list[list[float]] = []
        for start in range(0, len(texts), ENDPOINT_BATCH):
            batch = [t[:MAX_TEXT_CHARS] or " " for t in texts[start:start + ENDPOINT_BATCH]]
            body = json.dumps({"model": self.model, "input": batch}).encode()
            req = urllib.request.Request(self.base_url.rstrip("/") + "/embeddings", data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - the client's URL
                    data = json.loads(resp.read())
            except urllib.error.HTTPError as err:
                raise DagctxError("EmbeddingUnavailable", f"the embedding endpoint {self.base_url} answered HTTP "
                                  f"{err.code}; check embedding.baseUrl, model and key") from None
            except (urllib.error.URLError, OSError, TimeoutError) as err:
                reason = getattr(err, "reason", err)
                raise DagctxError("EmbeddingUnavailable", f"the embedding endpoint {self.base_url} is not reachable "
                                  f"({reason}); start it, or search with mode 'fts'") from None
            except ValueError:
                raise DagctxError("EmbeddingFailed", f"the embedding endpoint {self.base_url} did not answer JSON") from None
            try:
                got = sorted(data["data"], key=lambda d: d["index"])
                vecs = [list(map(float, d["embedding"])) for d in got]
            except (KeyError, TypeError, ValueError):
                raise DagctxError("EmbeddingFailed", f"the embedding endpoint {self.base_url} answered without "
                                  "data[].embedding (an OpenAI-compatible /embeddings answer)") from None
            if len(vecs) != len(batch):
                raise DagctxError("EmbeddingFailed", f"the embedding endpoint {self.base_url} answered {len(vecs)} "
                                  f"vectors for {len(batch)} texts")
            for v in vecs:
                if not self.dim:
                    self.dim = len(v)
                if len(v) != self.dim:
                    raise DagctxError("EmbeddingFailed", f"the embedding endpoint {self.base_url} answered a vector "
                                      f"of {len(v)} dimensions, expected {self.dim} (embedding.dimensions, or the "
                                      "model's first answer); nothing was stored")
            rows.extend(vecs)
        return _normalise(np.asarray(rows, dtype=np.float32).reshape(len(rows), self.dim or 1))
