"""Passages and multi-hop questions generated from the `countryinfo` package's JSON files (no network).

Every country becomes a few short passages (capital and region; land borders; currency and languages; population
and area) that the agent's ``search`` tool retrieves. Each question needs two facts from two passages, often of
two countries, for example "What currency is used in the country whose capital is Lima?" (Lima -> Peru -> PEN).
A task is ``{"question", "answers", "kind", "country"}``: ``answers`` lists every accepted answer ("the capital of
a country bordering Peru" accepts the capital of each neighbour) and ``country`` is the country the question
starts from. The held-out split is by that country: no validation question starts from a training country. A
renamed world's task (below) also carries ``world`` and ``origin`` (the real country it renames, which decides
its split).

The data is read from the installed package (``countryinfo/data/*.json``); nothing is downloaded or cached here
(the passage embeddings are cached by `examples.rag_agent.retrieval`).

**Renamed worlds** (`world`): world 0 is the real data; world ``k > 0`` is the same countries with every country
name, capital and currency code replaced by a made-up one, spliced from pieces of real names (``Nig`` + ``mark``),
and its own passages (its own search corpus). A task from world ``k`` carries ``"world": k``. Training on a few of
them (``splits(..., renamed=K)``) shows a small model thousands of names it cannot memorise, so it has to learn
to copy a name from the question or a passage, which is what held-out countries need.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import random
import re
import string
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


def _pieces(words: list[str]) -> tuple[list[str], list[str]]:
    """Heads (a word's first 2-4 letters) and tails (its last 3-5, never the whole word) of the single words of
    five letters or more among ``words``: the parts renamed names are spliced from, so they tokenize like real
    ones."""
    heads, tails = set(), set()
    for word in words:
        if not re.fullmatch(r"[A-Z][a-z]{4,}", word):
            continue
        for n in (2, 3, 4):
            heads.add(word[:n])
        for n in (3, 4, 5):
            if n < len(word):
                tails.add(word[-n:])
    return sorted(heads), sorted(tails)


def _renamer(rng: random.Random, words: list[str], taken: set[str]) -> dict[str, str]:
    """A fresh spliced name (a head and a tail of ``words``) for each of ``words``, none of them a
    real word in ``taken`` nor used twice; ``taken`` grows with the names given."""
    heads, tails = _pieces(words)
    names: dict[str, str] = {}
    for word in words:
        while True:
            name = rng.choice(heads) + rng.choice(tails)
            if name not in taken:
                break
        taken.add(name)
        names[word] = name
    return names


@functools.cache
def world(k: int) -> tuple[dict, ...]:
    """The countries of world ``k``: `countries` itself for 0; for ``k > 0`` the same records with made-up
    country names, capitals and currency codes (seeded by ``k``, the same in every process), sorted by the new
    name. Each record also keeps ``origin``, the real country it renames (the held-out split follows it)."""
    if k < 0:
        raise ValueError(f"world must be >= 0, got {k}")
    real = countries()
    if k == 0:
        return tuple({**c, "origin": c["name"]} for c in real)
    rng = random.Random(f"rag_agent world {k}")
    taken = {w for c in real for w in (c["name"], c["capital"])}
    name = _renamer(rng, [c["name"] for c in real], taken)
    capital = _renamer(rng, sorted({c["capital"] for c in real}), taken)
    codes = sorted({code for c in real for code in c["currencies"]})
    fresh: list[str] = []
    while len(fresh) < len(codes):
        code = "".join(rng.choice(string.ascii_uppercase) for _ in range(3))
        if code not in codes and code not in fresh:
            fresh.append(code)
    currency = dict(zip(codes, fresh, strict=True))
    renamed = [
        {
            **c,
            "name": name[c["name"]],
            "capital": capital[c["capital"]],
            "borders": sorted(name[b] for b in c["borders"]),
            "currencies": [currency[code] for code in c["currencies"]],
            "origin": c["name"],
        }
        for c in real
    ]
    return tuple(sorted(renamed, key=lambda c: c["name"]))


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
def passages(k: int = 0) -> tuple[str, ...]:
    """World ``k``'s retrieval corpus: two to four passages per country, each naming its country (so a search for
    a country finds it), in a fixed order."""
    return tuple(text for c in world(k) for text in _passages_of(c))


def corpus_hash(k: int = 0) -> str:
    """A short content hash of ``passages(k)`` (the embedding cache key)."""
    return hashlib.sha256("\n".join(passages(k)).encode()).hexdigest()[:16]


def _questions(k: int = 0) -> list[dict]:
    """Every question world ``k`` supports, in a fixed order (capitals shared by two countries are skipped); a
    renamed world's tasks also carry ``"world": k`` and ``origin``, the real country ``country`` renames."""
    records = world(k)
    by_name = {c["name"]: c for c in records}
    capital_count = Counter(c["capital"] for c in records)
    out: list[dict] = []

    def add(kind: str, question: str, answers: list[str], c: dict) -> None:
        task = {"question": question, "answers": answers, "kind": kind, "country": c["name"]}
        out.append(task if k == 0 else {**task, "world": k, "origin": c["origin"]})

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
    renamed: int = 0,
) -> tuple[list[dict], list[dict]]:
    """``n_train`` training and ``n_val`` held-out questions, shuffled by ``seed``; only questions of ``kinds``
    (some of `KINDS`) when given. ``renamed`` adds, for each of worlds 1..``renamed``, the renamed copies of
    those ``n_train`` training questions (shuffled in with them); held-out questions are always real.

    A question's split is decided by a hash of the country it starts from (not by the seed), so the held-out
    questions never start from a country a training question starts from, whatever the seed. Raises ValueError
    for an unknown kind and when a split has fewer questions than asked for (the data has 567 train and 208 val
    questions of all kinds; 463 and 170 without ``largest_neighbour``).
    """
    if n_train < 0 or n_val < 0 or renamed < 0:
        raise ValueError(f"n_train, n_val and renamed must be >= 0, got {n_train}, {n_val}, {renamed}")
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
    train = train[:n_train]
    if renamed:
        chosen = {(q["kind"], q["country"]) for q in train}
        train += [q for k in range(1, renamed + 1) for q in _questions(k) if (q["kind"], q["origin"]) in chosen]
        random.Random(seed).shuffle(train)
    return train, val[:n_val]


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
