"""MuSiQue as it is published (Trivedi et al. 2022, https://github.com/StonyBrookNLP/musique): multi-hop questions,
each with 20 paragraphs of which two to four support the answer. Nothing is downloaded; point ``path`` at the
unpacked ``data/`` folder (``musique_ans_v1.0_train.jsonl``, ``musique_ans_v1.0_dev.jsonl``; the ``musique_full``
files too). One JSON object a line::

    {"id": "2hop__13548_13529",
     "paragraphs": [{"idx": 0, "title": "...", "paragraph_text": "...", "is_supporting": false}, ...],
     "question": "When was the person who ... born?",
     "question_decomposition": [{"id": 13548, "question": "...", "answer": "...", "paragraph_support_idx": 5}, ...],
     "answer": "1922", "answer_aliases": ["..."], "answerable": true}

A task (JSON-able) keeps what the showcase reads::

    {"id": "2hop__13548_13529", "question": "...", "answers": ["1922", *aliases],
     "hops": 2, "decomposition": [["sub-question", "its answer"], ...], "supporting": ["Title: text", ...],
     "passages": ["Title: text", ...]}                                    # corpus: question
     or "corpus": {"files": ["/abs/musique_ans_v1.0_train.jsonl", ...]}   # corpus: pooled

``answers`` is what the reward takes the best F1 over (`examples.rag_agent.reward`: Agent Lightning's format +
F1); ``supporting`` are the paragraphs marked ``is_supporting``; a passage is ``"<title>: <paragraph_text>"``. With
``corpus: question`` the search tool searches the question's own 20 paragraphs (MuSiQue's distractor setting);
with ``corpus: pooled`` it searches every paragraph of the files named (each distinct paragraph once,
`pooled_passages`), as Agent Lightning's RAG setup searches one large corpus. Unanswerable questions
(``answerable: false``, only in the ``musique_full`` files) are left out: they have no answer to score. Anything
the showcase cannot use is refused in one line naming it (the file, the line, the field).
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Any

__all__ = ["CORPORA", "MusiqueFormatError", "load", "passage", "pooled_passages", "splits"]

CORPORA = ("question", "pooled")
#: The fields of a question the showcase reads, and of each of its paragraphs and decomposition steps.
FIELDS = ("id", "paragraphs", "question", "question_decomposition", "answer", "answer_aliases", "answerable")
PARAGRAPH_FIELDS = ("idx", "title", "paragraph_text", "is_supporting")
STEP_FIELDS = ("question", "answer")


class MusiqueFormatError(ValueError):
    """The file is not MuSiQue's published jsonl; the message names the file, the line and the field."""


def passage(paragraph: dict[str, Any]) -> str:
    """A paragraph as the search tool returns it: ``"<title>: <paragraph_text>"``."""
    return f"{paragraph['title']}: {paragraph['paragraph_text']}"


def _check(file: Path, line: int, record: Any) -> None:
    where = f"{file}:{line}"
    if not isinstance(record, dict):
        raise MusiqueFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for field in FIELDS:
        if field not in record:
            raise MusiqueFormatError(f"{where}: no field {field!r}")
    for i, paragraph in enumerate(record["paragraphs"]):
        for field in PARAGRAPH_FIELDS:
            if field not in paragraph:
                raise MusiqueFormatError(f"{where}: paragraphs[{i}] has no field {field!r}")
    for i, step in enumerate(record["question_decomposition"]):
        for field in STEP_FIELDS:
            if field not in step:
                raise MusiqueFormatError(f"{where}: question_decomposition[{i}] has no field {field!r}")


def load(file: str | Path) -> list[dict[str, Any]]:
    """Every record of a MuSiQue jsonl file, checked (`MusiqueFormatError` names the first thing missing)."""
    file = Path(file).expanduser().resolve()
    if not file.is_file():
        raise MusiqueFormatError(f"{file}: no such file")
    records = []
    with file.open(encoding="utf-8") as lines:
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise MusiqueFormatError(f"{file}:{number}: not JSON ({exc.msg})") from None
            _check(file, number, record)
            records.append(record)
    return records


@functools.cache
def pooled_passages(files: tuple[str, ...]) -> tuple[str, ...]:
    """Every distinct paragraph of ``files`` (absolute paths), as `passage` texts, in first-seen order: the pooled
    corpus. MuSiQue repeats a paragraph across the questions that share a sub-question; it is indexed once."""
    seen: dict[str, None] = {}
    for file in files:
        for record in load(file):
            for paragraph in record["paragraphs"]:
                seen.setdefault(passage(paragraph), None)
    return tuple(seen)


def _task(record: dict[str, Any], corpus: str, files: list[str]) -> dict[str, Any]:
    paragraphs = sorted(record["paragraphs"], key=lambda p: p["idx"])
    task = {
        "id": record["id"],
        "question": record["question"],
        "answers": [record["answer"], *(a for a in record["answer_aliases"] if a != record["answer"])],
        "hops": len(record["question_decomposition"]),
        "decomposition": [[step["question"], step["answer"]] for step in record["question_decomposition"]],
        "supporting": [passage(p) for p in paragraphs if p["is_supporting"]],
    }
    if corpus == "question":
        task["passages"] = [passage(p) for p in paragraphs]
    else:
        task["corpus"] = {"files": files}
    return task


def splits(
    path: str,
    train: str = "musique_ans_v1.0_train.jsonl",
    val: str = "musique_ans_v1.0_dev.jsonl",
    corpus: str = "question",
    n_train: int | None = None,
    n_val: int | None = None,
    seed: int = 0,
) -> tuple[list[dict], list[dict]]:
    """The ``data:`` function of a config (``data: examples.rag_agent.musique:splits``): training tasks from
    ``<path>/<train>``, held-out tasks from ``<path>/<val>`` (MuSiQue's own split), answerable questions only.
    ``corpus``: ``question`` (each question searches its own 20 paragraphs) or ``pooled`` (every question searches
    the distinct paragraphs of both files). ``n_train`` / ``n_val``: a sample of that many, drawn with ``seed``
    (None: all)."""
    if corpus not in CORPORA:
        raise ValueError(f"corpus must be one of {CORPORA}, got {corpus!r}")
    root = Path(path).expanduser().resolve()
    names = [train] + ([val] if n_val != 0 else [])
    files = [str(root / name) for name in names]
    loaded = [[r for r in load(f) if r["answerable"]] for f in files]
    train_records, val_records = loaded[0], (loaded[1] if n_val != 0 else [])
    rng = random.Random(seed)
    picked = []
    for records, n, name in ((train_records, n_train, "train"), (val_records, n_val, "val")):
        if n is not None and n > len(records):
            raise ValueError(f"n_{name}={n}, but {name} has {len(records)} answerable questions")
        picked.append(rng.sample(records, n) if n is not None else records)
    return [_task(r, corpus, files) for r in picked[0]], [_task(r, corpus, files) for r in picked[1]]
