"""Passages and multi-hop questions generated from the `countryinfo` package's JSON files (no network).

Every country becomes a few short passages (capital and region; land borders; currency and languages; population
and area) that the agent's ``search`` tool retrieves. Each question needs two facts from two passages, often of
two countries, for example "What currency is used in the country whose capital is Lima?" (Lima -> Peru -> PEN).
A task is ``{"question", "answers", "kind", "country"}``: ``answers`` lists every accepted answer ("the capital of
a country bordering Peru" accepts the capital of each neighbour) and ``country`` is the country the question
starts from. The held-out split is by that country: no validation question starts from a training country.

The data is read from the installed package (``countryinfo/data/*.json``); nothing is downloaded or cached here
(the passage embeddings are cached by `examples.rag_agent.retrieval`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import random
from collections import Counter
from pathlib import Path

from examples.rag_agent.prompts import EDITOR_INSTRUCTIONS, RESEARCHER_INSTRUCTIONS, editor_brief

KINDS = ("currency_by_capital", "subregion_by_capital", "capital_of_neighbour", "largest_neighbour")
"""Question templates; each needs two retrieval hops (see `_questions`)."""


def _data_dir() -> Path:
    spec = importlib.util.find_spec("countryinfo")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the rag_agent example needs the 'countryinfo' package (its JSON data files)")
    return Path(spec.submodule_search_locations[0]) / "data"


@functools.cache
def countries() -> tuple[dict, ...]:
    """One record per country with a name and a single capital, sorted by name: ``name``, ``capital``,
    ``region``, ``subregion``, ``borders`` (neighbour names), ``currencies``, ``languages`` (ISO 639-1 codes),
    ``population``, ``area``. A fact the data lacks is None (or an empty list)."""
    raw: dict[str, dict] = {}
    for path in sorted(_data_dir().glob("*.json")):
        c = json.loads(path.read_text(encoding="utf-8"))
        # one file names its capital as a list (Vatican City); a name may repeat (Curaçao): keep the first
        if isinstance(c.get("capital"), str) and c["capital"] and c["name"] not in raw:
            raw[c["name"]] = c
    by_code = {c["ISO"]["alpha3"]: c["name"] for c in raw.values() if c.get("ISO", {}).get("alpha3")}
    records: dict[str, dict] = {}
    for c in raw.values():
        records[c["name"]] = {
            "name": c["name"],
            "capital": c["capital"],
            "region": c.get("region") or None,
            "subregion": c.get("subregion") or None,
            # neighbours without a record here (Kosovo, Macau) are dropped: no passage names their capital
            "borders": sorted(by_code[b] for b in c.get("borders") or () if b in by_code),
            "currencies": list(c.get("currencies") or ()),
            "languages": list(c.get("languages") or ()),
            "population": c.get("population") or None,
            "area": c.get("area") or None,
        }
    return tuple(records[name] for name in sorted(records))


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _passages_of(c: dict) -> list[str]:
    name = c["name"]
    texts = [f"{name}: the capital of {name} is {c['capital']}."]
    if c["subregion"]:
        texts[0] += f" {name} lies in {c['subregion']}, in the region {c['region']}."
    texts.append(f"{name} borders {_listing(c['borders'])}." if c["borders"] else f"{name} has no land borders.")
    if c["currencies"]:
        money = f"{name} uses the currency {_listing(c['currencies'])}."
        if c["languages"]:
            money += f" Languages of {name} (ISO 639-1 codes): {', '.join(c['languages'])}."
        texts.append(money)
    if c["population"] and c["area"]:
        texts.append(f"{name} has a population of {c['population']:,} and an area of {c['area']:,} square km.")
    return texts


@functools.cache
def passages() -> tuple[str, ...]:
    """The retrieval corpus: two to four passages per country, each naming its country (so a search for a
    country finds it), in a fixed order."""
    return tuple(text for c in countries() for text in _passages_of(c))


def corpus_hash() -> str:
    """A short content hash of `passages` (the embedding cache key)."""
    return hashlib.sha256("\n".join(passages()).encode()).hexdigest()[:16]


def _questions() -> list[dict]:
    """Every question the data supports, in a fixed order (capitals shared by two countries are skipped)."""
    records = countries()
    by_name = {c["name"]: c for c in records}
    capital_count = Counter(c["capital"] for c in records)
    out: list[dict] = []

    def add(kind: str, question: str, answers: list[str], c: dict) -> None:
        out.append({"question": question, "answers": answers, "kind": kind, "country": c["name"]})

    for c in records:
        unique_capital = capital_count[c["capital"]] == 1
        if unique_capital and c["currencies"]:
            add(
                "currency_by_capital",
                f"What currency is used in the country whose capital is {c['capital']}?",
                list(c["currencies"]),
                c,
            )
        if unique_capital and c["subregion"]:
            add(
                "subregion_by_capital",
                f"In which subregion lies the country whose capital is {c['capital']}?",
                [c["subregion"]],
                c,
            )
        neighbours = [by_name[n] for n in c["borders"]]
        if neighbours:
            add(
                "capital_of_neighbour",
                f"What is the capital of a country bordering {c['name']}?",
                sorted({n["capital"] for n in neighbours}),
                c,
            )
        counted = [n for n in neighbours if n["population"]]
        populations = Counter(n["population"] for n in counted)
        if len(counted) >= 2 and len(counted) == len(neighbours):
            largest = max(counted, key=lambda n: n["population"])
            if populations[largest["population"]] == 1:  # a tie would have two right answers
                add(
                    "largest_neighbour",
                    f"Which country bordering {c['name']} has the largest population?",
                    [largest["name"]],
                    c,
                )
    return out


def _is_val(country: str, val_fraction: float) -> bool:
    bucket = int(hashlib.sha256(country.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return bucket < val_fraction


def splits(
    seed: int = 0,
    n_train: int = 256,
    n_val: int = 64,
    val_fraction: float = 0.25,
    kinds: list[str] | tuple[str, ...] | None = None,
) -> tuple[list[dict], list[dict]]:
    """``n_train`` training and ``n_val`` held-out questions, shuffled by ``seed``; only questions of ``kinds``
    (some of `KINDS`) when given.

    A question's split is decided by a hash of the country it starts from (not by the seed), so the held-out
    questions never start from a country a training question starts from, whatever the seed. Raises ValueError
    for an unknown kind and when a split has fewer questions than asked for (the data has 567 train and 208 val
    questions of all kinds; 463 and 170 without ``largest_neighbour``).
    """
    if n_train < 0 or n_val < 0:
        raise ValueError(f"n_train and n_val must be >= 0, got {n_train}, {n_val}")
    unknown = sorted(set(kinds or ()) - set(KINDS))
    if unknown or (kinds is not None and not kinds):
        raise ValueError(f"kinds must be some of {list(KINDS)}, got {list(kinds or ())}")
    questions = [q for q in _questions() if kinds is None or q["kind"] in kinds]
    random.Random(seed).shuffle(questions)
    val = [q for q in questions if _is_val(q["country"], val_fraction)]
    train = [q for q in questions if not _is_val(q["country"], val_fraction)]
    if len(train) < n_train or len(val) < n_val:
        raise ValueError(
            f"asked for {n_train} train / {n_val} val questions; the data has {len(train)} / {len(val)} "
            f"(val_fraction={val_fraction}, kinds={list(kinds) if kinds else 'all'})"
        )
    return train[:n_train], val[:n_val]


def tokenizer_corpus() -> list[str]:
    """Text the tiny model's tokenizer is trained on: passages, questions and answers in the agent's format, and
    the agents' instructions and the editor's brief, repeated (the tokenizer merges only what recurs, and every
    call carries them: 102 tokens of researcher instructions become ~40)."""
    questions = _questions()
    prompts = [RESEARCHER_INSTRUCTIONS, EDITOR_INSTRUCTIONS, editor_brief("", "")]
    return [
        *passages(),
        *(q["question"] for q in questions),
        *(f"Answer: {q['answers'][0]}" for q in questions),
        *prompts * 20,
    ]
