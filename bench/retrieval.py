"""Retrieval at scale: the RAG showcase's vector index (faiss HNSW, inner product on unit vectors = cosine) against
an exact numpy search of the same vectors, at the packaged MiniLM's dimension (384).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/retrieval.py                      # 100k and 1M
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/retrieval.py --data clustered --sizes 100000 300000

For each size: the index's build seconds (``--build-threads`` OpenMP threads), then for each ``efSearch`` the
query p50 in ms (one query at a time, one thread) and recall@10 against the exact top 10; beside them the exact
search's p50 (one matrix-vector product and a partial sort in numpy, one BLAS thread) on the same vectors and
queries. The index is `examples.rag_agent.retrieval.VectorIndex`, the one the showcase searches through.

The vectors are random. How hard a set of vectors is to search approximately is measured by its local intrinsic
dimension (LID: the Levina-Bickel maximum-likelihood estimate from each point's 20 nearest neighbours, median over
points; Aumüller & Ceccarello, "The role of local intrinsic dimensionality in benchmarking nearest neighbor search",
2019), which the run prints for every set, beside that of the packaged MiniLM's own embeddings of the showcase's
passages (``minilm_lid``). ``--data``:

* ``embedding`` (default): drawn to have a real embedding's LID, not the dimension's: ``n / 100`` clusters in a random
  32-dimensional subspace (each point a centre plus Gaussian noise in it), plus isotropic noise of a quarter of that
  norm in all 384 dimensions, normalised. LID ~18-20, against MiniLM's ~16 on the showcase's passages: a little
  harder to search than the real thing.
* ``clustered``: ``n / 100`` random unit centres, each vector a centre plus Gaussian noise of norm ~``--spread`` in
  all 384 dimensions, normalised (cosine to its centre ~0.45 at the default 2.0): LID ~60, a stress case.

``--uniform`` also measures vectors uniform on the sphere at the smallest size: the worst case for any graph index
(every distance nearly equal, LID the dimension's), reported as ``uniform_*``.

Prints progress on stderr and one JSON line on stdout.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: the exact baseline gets one thread, as queries do

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.rag_agent.retrieval import VectorIndex  # noqa: E402

DIM = 384
K = 10
#: The ``embedding`` vectors' subspace dimension and noise (see the module docstring).
LATENT, LATENT_NOISE, AMBIENT_NOISE = 32, 0.7, 0.3


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def vectors(n: int, n_queries: int, data: str, spread: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` corpus and ``n_queries`` query unit vectors of `DIM` float32, both drawn from ``data``'s distribution
    (``embedding``, ``clustered`` or ``uniform``: see the module docstring)."""
    rng = np.random.default_rng(seed)
    if data == "uniform":
        return (_unit(rng.standard_normal((m, DIM), dtype=np.float32)) for m in (n, n_queries))  # type: ignore[return-value]
    clusters = max(n // 100, 1)
    if data == "embedding":
        basis = np.linalg.qr(rng.standard_normal((DIM, LATENT)))[0].T.astype(np.float32)  # [LATENT, DIM], orthonormal
        centres = rng.standard_normal((clusters, LATENT), dtype=np.float32)
    else:
        centres = _unit(rng.standard_normal((clusters, DIM), dtype=np.float32))

    def block(size: int) -> np.ndarray:
        chosen = centres[rng.integers(0, clusters, size)]
        if data == "clustered":
            return chosen + rng.standard_normal((size, DIM), dtype=np.float32) * np.float32(spread / np.sqrt(DIM))
        latent = chosen + rng.standard_normal((size, LATENT), dtype=np.float32) * np.float32(LATENT_NOISE)
        noise = rng.standard_normal((size, DIM), dtype=np.float32) * np.float32(AMBIENT_NOISE * np.sqrt(LATENT / DIM))
        return latent @ basis + noise

    def draw(m: int) -> np.ndarray:
        out = np.empty((m, DIM), dtype=np.float32)
        for start in range(0, m, 100_000):  # in blocks: the noise of 1M vectors at once would double the memory
            size = min(100_000, m - start)
            out[start : start + size] = _unit(block(size))
        return out

    return draw(n), draw(n_queries)


def lid(x: np.ndarray, k: int = 20, points: int = 200, seed: int = 0) -> float:
    """The median over ``points`` sampled points of the Levina-Bickel maximum-likelihood estimate of the local
    intrinsic dimension from each one's ``k`` nearest neighbours in ``x`` (unit vectors; Euclidean distances):
    ``(1/(k-1) * sum_j log(d_k / d_j))^-1`` over ``j < k`` (Levina & Bickel, NeurIPS 2004)."""
    rng = np.random.default_rng(seed)
    estimates = []
    for i in rng.choice(len(x), min(points, len(x)), replace=False):
        d = np.sqrt(np.maximum(2.0 - 2.0 * (x @ x[i]), 0.0))
        d[i] = np.inf
        near = np.partition(d, k - 1)[:k]
        near.sort()
        estimates.append(1.0 / np.mean(np.log(near[-1] / near[:-1])))
    return float(np.median(estimates))


def exact(corpus: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, float]:
    """The exact top `K` of each query (by inner product) and the p50 ms of one query's search."""
    top = np.empty((len(queries), K), dtype=np.int64)
    times = []
    for i, q in enumerate(queries):
        start = time.perf_counter()
        scores = corpus @ q
        part = np.argpartition(-scores, K - 1)[:K]
        top[i] = part[np.argsort(-scores[part], kind="stable")]
        times.append(time.perf_counter() - start)
    return top, 1000 * float(np.median(times))


def measure(n: int, args: argparse.Namespace, data: str) -> dict:
    t0 = time.perf_counter()
    corpus, queries = vectors(n, args.queries, data, args.spread, args.seed)
    dimension = lid(corpus)
    print(
        f"  {n:,} vectors drawn in {time.perf_counter() - t0:.1f} s, LID {dimension:.1f}", file=sys.stderr, flush=True
    )
    truth, exact_p50 = exact(corpus, queries)
    print(f"  exact numpy: p50 {exact_p50:.2f} ms", file=sys.stderr, flush=True)
    import faiss

    faiss.omp_set_num_threads(args.build_threads)
    start = time.perf_counter()
    index = VectorIndex(corpus, exact_below=0)  # HNSW at every size, as the showcase's from 50,000 passages
    build_s = time.perf_counter() - start
    faiss.omp_set_num_threads(1)  # queries one at a time on one thread, as the exact baseline
    print(f"  index built in {build_s:.1f} s", file=sys.stderr, flush=True)
    row: dict = {"n": n, "lid": round(dimension, 1), "build_s": round(build_s, 1), "exact_p50_ms": round(exact_p50, 3)}
    row["ef"] = {}
    for ef in args.ef:
        times, hits = [], 0
        for q, want in zip(queries, truth, strict=True):
            start = time.perf_counter()
            got = index.search(q, K, ef_search=ef)
            times.append(time.perf_counter() - start)
            hits += len(set(got[0].tolist()) & set(want.tolist()))
        p50, recall = 1000 * float(np.median(times)), hits / (K * len(queries))
        row["ef"][ef] = {"p50_ms": round(p50, 3), "recall_at_10": round(recall, 4)}
        print(f"  efSearch {ef}: p50 {p50:.3f} ms, recall@10 {recall:.4f}", file=sys.stderr, flush=True)
    return row


KEYS = ("library", "index", "data", "dim", "queries", "load_1min_start", "load_1min_end")


def minilm_lid() -> float:
    """The LID of the packaged MiniLM's embeddings of the RAG showcase's passages (world 0; embedded on first use,
    ~15 s, then read from the cache)."""
    from examples.rag_agent.retrieval import index

    return lid(index(0).embeddings.astype(np.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2,000 vectors, one efSearch, 20 queries (seconds)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--data", choices=("embedding", "clustered"), default="embedding", help="the vectors' law")
    parser.add_argument("--ef", type=int, nargs="+", default=[32, 64, 128, 256], help="efSearch values to measure")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--spread", type=float, default=2.0, help="--data clustered: the noise's norm")
    parser.add_argument("--uniform", action="store_true", help="also the worst case: uniform, at the smallest size")
    parser.add_argument("--build-threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.ef, args.queries = [2_000], [32], 20
    import faiss

    out: dict = {"library": f"faiss-cpu {faiss.__version__}", "index": "IndexHNSWFlat M=32 efConstruction=40, "
                 "inner product on unit vectors", "data": args.data, "dim": DIM, "queries": args.queries,
                 "build_threads": args.build_threads, "machine": f"{os.cpu_count()} cores, {platform.machine()}",
                 "load_1min_start": round(os.getloadavg()[0], 2)}  # fmt: skip
    if args.data == "clustered":
        out["spread"] = args.spread
    if not args.smoke:  # (the smoke run stays off the encoder: seconds, and no model package needed)
        out["minilm_lid"] = round(minilm_lid(), 1)
        print(f"MiniLM's embeddings of the showcase's passages: LID {out['minilm_lid']}", file=sys.stderr, flush=True)
    for n in args.sizes:
        print(f"{args.data}, n={n:,}", file=sys.stderr, flush=True)
        row = measure(n, args, args.data)
        best = min((ef for ef, r in row["ef"].items() if r["recall_at_10"] >= 0.95), default=None)
        out[f"n{n}"] = row | {"ef_for_recall_0.95": best}
    if args.uniform:
        n = min(args.sizes)
        print(f"uniform, n={n:,}", file=sys.stderr, flush=True)
        out[f"uniform_n{n}"] = measure(n, args, "uniform")
    out["load_1min_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
