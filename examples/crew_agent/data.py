"""Questions about countries with exact answers, generated from the country table (`countries.py`) and a seed.

Each task is ``{"question": str, "answer": str, "kind": str, "countries": [name, ...]}``. Kinds: ``capital``,
``currency`` (ISO code), ``calling_code``, ``region`` (one fact of one country) and ``population`` (which of two
countries has more people: two look-ups and a comparison; pairs closer than 1.5x are never asked, so a stale
figure cannot flip the answer). Splits are disjoint by construction: a question's split is decided by a hash of
its text, so the held-out set never repeats a training question.
"""

from __future__ import annotations

import hashlib
import random

from examples.crew_agent.countries import countries, describe

SINGLE_FACT = {
    "capital": ("What is the capital of {name}?", "capital"),
    "currency": ("What is the currency code of {name}?", "currency"),
    "calling_code": ("What is the calling code of {name}?", "calling_code"),
    "region": ("In which region is {name}?", "region"),
}
POPULATION = "Which country has more people, {a} or {b}?"
MIN_POPULATION_RATIO = 1.5
KINDS = (*SINGLE_FACT, "population")


def _question(rng: random.Random, kinds: tuple[str, ...] = KINDS) -> dict:
    table = countries()
    kind = rng.choice(kinds)
    if kind != "population":
        country = rng.choice(table)
        text, field = SINGLE_FACT[kind]
        return {
            "question": text.format(name=country["name"]),
            "answer": country[field],
            "kind": kind,
            "countries": [country["name"]],
        }
    while True:
        a, b = rng.sample(table, 2)
        small, large = sorted((a["population"], b["population"]))
        if large >= MIN_POPULATION_RATIO * small:
            break
    bigger = a if a["population"] > b["population"] else b
    return {
        "question": POPULATION.format(a=a["name"], b=b["name"]),
        "answer": bigger["name"],
        "kind": "population",
        "countries": [a["name"], b["name"]],
    }


def _split_of(question: str, val_fraction: float) -> str:
    bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "val" if bucket < val_fraction else "train"


def splits(
    seed: int = 0,
    n_train: int = 400,
    n_val: int = 100,
    val_fraction: float = 0.2,
    kinds: list[str] | tuple[str, ...] | None = None,
) -> tuple[list, list]:
    """``n_train`` training and ``n_val`` held-out questions, deterministic for a seed, never overlapping; only
    questions of ``kinds`` (a subset of `KINDS`, drawn equally often; None: all). A question's split depends on its
    text alone, never on the kinds asked for."""
    if n_train < 0 or n_val < 0 or not 0.0 < val_fraction < 1.0:
        raise ValueError("n_train and n_val must be >= 0 and val_fraction in (0, 1)")
    if kinds is not None and (not kinds or set(kinds) - set(KINDS)):
        raise ValueError(f"kinds must be some of {list(KINDS)}, got {list(kinds)}")
    chosen = tuple(kind for kind in KINDS if kinds is None or kind in kinds)
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[dict]] = {"train": [], "val": []}
    want = {"train": n_train, "val": n_val}
    repeats = 0  # draws in a row that found nothing new: the question space is (nearly) exhausted
    while len(out["train"]) < n_train or len(out["val"]) < n_val:
        task = _question(rng, chosen)
        if task["question"] in seen:
            repeats += 1
            if repeats > 10_000:
                raise ValueError(f"cannot draw {n_train} + {n_val} distinct questions from the country table")
            continue
        repeats = 0
        seen.add(task["question"])
        split = _split_of(task["question"], val_fraction)
        if len(out[split]) < want[split]:
            out[split].append(task)
    return out["train"], out["val"]


def tokenizer_corpus() -> list[str]:
    """Text the crew's calls are made of (questions, tool results, answers, CrewAI's prompt phrases), so the tiny
    model's tokenizer makes them short."""
    train, val = splits(n_train=400, n_val=100)
    crewai_phrases = [
        "You are researcher. You use the country_facts tool.\nYour personal goal is: Look up the facts the question needs.",
        "You are writer. You reply with one line: Answer: <the answer>.\nYour personal goal is: Answer from the notes.",
        "\nCurrent Task: \n\nThis is the expected criteria for your final answer: The facts found.\n"
        "you MUST return the actual complete content as the final answer, not a summary.",
        "This is the context you're working with:\n\nProvide your complete response:",
        "country_facts Facts about one country: capital, region, currency code, calling code, population.",
    ]
    return [
        *crewai_phrases * 20,  # repeated: the tokenizer merges only what recurs, and every call carries these phrases
        *(describe(c["name"]) for c in countries()),
        *(t["question"] for t in train + val),
        *(f"Answer: {t['answer']}" for t in train + val),
    ]
