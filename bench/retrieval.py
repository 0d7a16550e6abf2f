"""Retrieval at scale: the RAG showcase's vector index (faiss HNSW, inner product on unit vectors = cosine) against
an exact numpy search of the same vectors, at the packaged MiniLM's dimension (384).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/retrieval.py                      # 100k and 300k
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/retrieval.py --sizes 100000 1000000

For each size: the index's build seconds (``--build-threads`` OpenMP threads), then for each ``efSearch`` the
query p50 in ms (one query at a time, one thread) and recall@10 against the exact top 10; beside them the exact
search's p50 (one matrix-vector product and a partial sort in numpy, one BLAS thread) on the same vectors and
queries. The index is `examples.rag_agent.retrieval.VectorIndex`, the one the showcase searches through.

The vectors are random, drawn as sentence embeddings are distributed (clustered, not uniform on the sphere): ``n /
100`` random unit centres, each vector a centre plus Gaussian noise of norm ~``--spread``, normalised (cosine to
its centre ~0.45 at the default 2.0). ``--uniform`` also measures vectors uniform on the sphere at the smallest
size: the worst case for any graph index (every distance nearly equal), reported as ``uniform_*``.

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


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def vectors(n: int, n_queries: int, spread: float | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` corpus and ``n_queries`` query unit vectors of `DIM` float32: clustered (``spread``) or uniform (None)."""
    rng = np.random.default_rng(seed)
    if spread is None:
        return (_unit(rng.standard_normal((m, DIM), dtype=np.float32)) for m in (n, n_queries))  # type: ignore[return-value]
    centres = _unit(rng.standard_normal((max(n // 100, 1), DIM), dtype=np.float32))

    def draw(m: int) -> np.ndarray:
        out = np.empty((m, DIM), dtype=np.float32)
        for start in range(0, m, 100_000):  # in blocks: the noise of 1M vectors at once would double the memory
            size = min(100_000, m - start)
            noise = rng.standard_normal((size, DIM), dtype=np.float32) * np.float32(spread / np.sqrt(DIM))
            out[start : start + size] = _unit(centres[rng.integers(0, len(centres), size)] + noise)
        return out

    return draw(n), draw(n_queries)


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


def measure(n: int, args: argparse.Namespace, spread: float | None) -> dict:
    t0 = time.perf_counter()
    corpus, queries = vectors(n, args.queries, spread, args.seed)
    print(f"  {n:,} vectors drawn in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    truth, exact_p50 = exact(corpus, queries)
    print(f"  exact numpy: p50 {exact_p50:.2f} ms", file=sys.stderr, flush=True)
    import faiss

    faiss.omp_set_num_threads(args.build_threads)
    start = time.perf_counter()
    index = VectorIndex(corpus, exact_below=0)  # HNSW at every size, as the showcase's from 50,000 passages
    build_s = time.perf_counter() - start
    faiss.omp_set_num_threads(1)  # queries one at a time on one thread, as the exact baseline
    print(f"  index built in {build_s:.1f} s", file=sys.stderr, flush=True)
    row: dict = {"n": n, "build_s": round(build_s, 1), "exact_p50_ms": round(exact_p50, 3), "ef": {}}
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


KEYS = ("library", "index", "dim", "queries", "load_1min_start", "load_1min_end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2,000 vectors, one efSearch, 20 queries (seconds)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000])
    parser.add_argument("--ef", type=int, nargs="+", default=[32, 64, 128, 256], help="efSearch values to measure")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--spread", type=float, default=2.0)
    parser.add_argument("--uniform", action="store_true", help="also the worst case: uniform, at the smallest size")
    parser.add_argument("--build-threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.ef, args.queries = [2_000], [32], 20
    import faiss

    out: dict = {"library": f"faiss-cpu {faiss.__version__}", "index": "IndexHNSWFlat M=32 efConstruction=40, "
                 "inner product on unit vectors", "dim": DIM, "queries": args.queries, "spread": args.spread,
                 "build_threads": args.build_threads, "machine": f"{os.cpu_count()} cores, {platform.machine()}",
                 "load_1min_start": round(os.getloadavg()[0], 2)}  # fmt: skip
    for n in args.sizes:
        print(f"clustered, n={n:,}", file=sys.stderr, flush=True)
        row = measure(n, args, args.spread)
        best = min((ef for ef, r in row["ef"].items() if r["recall_at_10"] >= 0.95), default=None)
        out[f"n{n}"] = row | {"ef_for_recall_0.95": best}
    if args.uniform:
        n = min(args.sizes)
        print(f"uniform, n={n:,}", file=sys.stderr, flush=True)
        out[f"uniform_n{n}"] = measure(n, args, None)
    out["load_1min_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
