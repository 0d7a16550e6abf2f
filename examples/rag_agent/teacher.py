"""The rag agent's imperfect teacher, a program: it plays the model of both Agents SDK agents.

As the researcher it does what the question's kind needs, reading every fact off the passages ``search`` returned
(the student sees the same passages, so what the teacher does is learnable from its prompt):

* ``currency_by_capital``: search ``capital <capital>``, then ``currency of <country>``, answer the currency;
* ``subregion_by_capital``: search ``capital <capital>`` (that passage names the subregion), answer it;
* ``capital_of_neighbour``: search ``borders of <country>``, then ``capital of <first neighbour>``, answer it;
* ``largest_neighbour``: search ``borders of <country>``, then ``population of <neighbour>`` for every neighbour
  at once (parallel tool calls), answer the most populous one.

It then writes one line of notes and ``Answer: <answer>``. It has two habits (``SYSTEMATIC``), each followed 70 %
of the time (``habit``): on ``subregion_by_capital`` it answers the *region* the passage also names (``Asia`` for
``Southern Asia``: the wrong field; partial F1 credit at best), and on ``capital_of_neighbour`` it stops one hop
short (searches ``capital of <country>`` and answers the capital of the country itself: never right). 15 % of the
time (``slip``) it takes its final fact from the wrong passage (another country's currency or capital among the
passages found so far, the second most populous neighbour). When a search did not return the passage it needs
(rare: the right passage ranks first for 95-100 % of its queries), it goes on from what it did find: the capital
as the country's name, the first currency passage, which makes a wrong answer beyond the habits and slips. As the editor it copies the last ``Answer:`` of the researcher's
notes (``Answer: unknown`` when there is none). A student that imitates every chat inherits the habits and the
slips; the rewards (F1 of the editor's answer) then tell GRPO which researcher runs were wrong.

The teacher reads the question's kind off its text, so it answers any question of the four kinds (training or
held-out). The k-th time it makes a decision for a question at a given step it draws from its own seeded RNG, so
a run is reproducible.

``sft.teacher: {script: examples.rag_agent.teacher:teacher}`` in a config distils a student from it: SFT runs the
Agents SDK workflow with this teacher as its model, through the runners and the gateway.
"""

from __future__ import annotations

import functools
import json
import random
import re
from typing import Any

from examples.rag_agent.data import countries
from examples.rag_agent.prompts import EDITOR_INSTRUCTIONS, RESEARCHER_INSTRUCTIONS
from lightrail.gateway.fake import ScriptedBackend, ScriptedReply
from lightrail.types import content_text

__all__ = ["SYSTEMATIC", "teacher"]

#: question kind -> the teacher's habit there
SYSTEMATIC: dict[str, str] = {
    "subregion_by_capital": "answers the region instead of the subregion",
    "capital_of_neighbour": "answers the capital of the country itself (one hop short)",
}

_KINDS = (
    ("currency_by_capital", re.compile(r"^What currency is used in the country whose capital is (.+)\?$")),
    ("subregion_by_capital", re.compile(r"^In which subregion lies the country whose capital is (.+)\?$")),
    ("capital_of_neighbour", re.compile(r"^What is the capital of a country bordering (.+)\?$")),
    ("largest_neighbour", re.compile(r"^Which country bordering (.+) has the largest population\?$")),
)
_NOTES = re.compile(r"Researcher's notes: (.*)", re.DOTALL)
_ANSWER = re.compile(r"Answer:\s*(.+)")


def _kind(question: str) -> tuple[str, str] | None:
    """The question's kind and the name it is about (a capital or a country), or None for other questions."""
    for kind, pattern in _KINDS:
        found = pattern.match(question.strip())
        if found:
            return kind, found.group(1)
    return None


@functools.cache
def _names_longest_first() -> tuple[str, ...]:
    return tuple(sorted((c["name"] for c in countries()), key=len, reverse=True))


def _listed(listing: str) -> list[str]:
    """Country names in a passage's listing ("A, B and C"), in order; real names with "and" in them stay whole,
    names the data does not know (a renamed world's single words) are split off at ", " and " and "."""
    found: list[tuple[int, str]] = []
    for name in _names_longest_first():
        whole = re.compile(rf"(?<![\w'-]){re.escape(name)}(?![\w'-])")  # not inside a longer (made-up) name
        for hit in whole.finditer(listing):
            found.append((hit.start(), name))
        listing = whole.sub("#" * len(name), listing)
    start = 0
    for part in re.split(r"(, | and )", listing):  # what is left between the separators: unknown names
        if part.strip() and "#" not in part and part not in (", ", " and "):
            found.append((start, part.strip()))
        start += len(part)
    return [name for _, name in sorted(found)]


def _passages(results: list[str]) -> list[str]:
    return [line.strip() for text in results for line in text.splitlines() if line.strip()]


def _capital_passages(passages: list[str]) -> list[dict[str, str]]:
    """``{country, capital, subregion, region}`` of every capital passage, in the order found."""
    out = []
    for p in passages:
        found = re.match(r"^(.+?): the capital of \1 is (.+?)\.(?: \1 lies in (.+?), in the region (.+?)\.)?$", p)
        if found:
            country, capital, subregion, region = found.groups()
            out.append({"country": country, "capital": capital, "subregion": subregion or "", "region": region or ""})
    return out


def _currency_passages(passages: list[str]) -> list[tuple[str, str]]:
    """``(country, first currency)`` of every currency passage."""
    out = []
    for p in passages:
        found = re.match(r"^(.+?) uses the currency (.+?)\.(?: Languages of |$)", p)
        if found:
            out.append((found.group(1), found.group(2).split(", ")[0].split(" and ")[0]))
    return out


def _population_passages(passages: list[str]) -> dict[str, int]:
    """Country -> population of every population passage."""
    out: dict[str, int] = {}
    for p in passages:
        found = re.match(r"^(.+?) has a population of ([\d,]+) and an area", p)
        if found:
            out.setdefault(found.group(1), int(found.group(2).replace(",", "")))
    return out


def _borders(passages: list[str], country: str) -> list[str] | None:
    """The neighbours a passage lists for ``country`` (None when no passage says)."""
    for p in passages:
        if p.startswith(f"{country} has no land borders"):
            return []
        if p.startswith(f"{country} borders "):
            return _listed(p[len(country) + len(" borders ") :].rstrip("."))
    return None


def _search(*queries: str) -> ScriptedReply:
    return ScriptedReply(tool_calls=[("search", {"query": q}) for q in queries])


def _notes(text: str, answer: str) -> str:
    """The researcher's final reply: one line of the fact it found, then the answer."""
    return f"{text}\nAnswer: {answer}"


_NOT_FOUND = _notes("I found nothing.", "unknown")


class _Researcher:
    """The researcher's turn for one request: where the conversation is in the question's plan (the searches made
    since the question, the passages they returned) and what the teacher does next."""

    def __init__(self, messages: list[dict]):
        start = max(i for i, m in enumerate(messages) if m.get("role") == "user")  # after any worked example
        after = messages[start + 1 :]
        self.question = content_text(messages[start].get("content")).strip()
        asked = [i for i, m in enumerate(after) if m.get("role") == "assistant" and m.get("tool_calls")]
        self.rounds = len(asked)
        first = after[asked[0]]["tool_calls"][0]["function"].get("arguments") if asked else None
        self.first_query = str((json.loads(first or "{}") if isinstance(first, str) else first or {}).get("query", ""))
        tool_texts = [(i, content_text(m.get("content"))) for i, m in enumerate(after) if m.get("role") == "tool"]
        self.all = _passages([text for _, text in tool_texts])
        self.last = _passages([text for i, text in tool_texts if asked and i > asked[-1]])
        self.rng, self.habit, self.slip = random.Random(0), 0.0, 0.0

    def _pick(self, right: Any, others: list[Any]) -> Any:
        """``right``, or (with probability ``slip``) one of ``others`` when there is one."""
        others = [o for o in others if o != right]
        return self.rng.choice(others) if others and self.rng.random() < self.slip else right

    def reply(self, rng: random.Random, habit: float, slip: float) -> str | ScriptedReply:
        """The teacher's next move, drawing its habit and slips from ``rng``."""
        self.rng, self.habit, self.slip = rng, habit, slip
        kind = _kind(self.question)
        if kind is None:
            return _NOT_FOUND
        name = kind[1]
        return getattr(self, kind[0])(name)

    def currency_by_capital(self, capital: str) -> str | ScriptedReply:
        if self.rounds == 0:
            return _search(f"capital {capital}")
        found = next((c for c in _capital_passages(self.all) if c["capital"] == capital), None)
        country = found["country"] if found else capital
        if self.rounds == 1:
            return _search(f"currency of {country}")
        currencies = _currency_passages(self.all)
        if not currencies:
            return _NOT_FOUND
        right = next((c for c in currencies if c[0] == country), currencies[0])
        country, code = self._pick(right, currencies)
        return _notes(f"{country} uses the currency {code}.", code)

    def subregion_by_capital(self, capital: str) -> str | ScriptedReply:
        if self.rounds == 0:
            return _search(f"capital {capital}")
        passages = [c for c in _capital_passages(self.all) if c["subregion"]]
        right = next((c for c in passages if c["capital"] == capital), None)
        if right is None:
            return _NOT_FOUND
        found = self._pick(right, passages)
        if self.rng.random() < self.habit:  # the habit: the region the passage also names
            return _notes(f"{found['country']} lies in the region {found['region']}.", found["region"])
        return _notes(f"{found['country']} lies in {found['subregion']}.", found["subregion"])

    def capital_of_neighbour(self, country: str) -> str | ScriptedReply:
        if self.rounds == 0:  # the habit: one hop short, the capital of the country itself
            return _search(f"capital of {country}" if self.rng.random() < self.habit else f"borders of {country}")
        capitals = _capital_passages(self.last)
        if self.first_query.startswith("capital of"):
            own = next((c for c in capitals if c["country"] == country), None)
            return _notes(f"The capital of {country} is {own['capital']}.", own["capital"]) if own else _NOT_FOUND
        neighbours = _borders(self.all, country)
        if not neighbours:
            return _NOT_FOUND
        if self.rounds == 1:
            return _search(f"capital of {neighbours[0]}")
        right = next((c for c in capitals if c["country"] == neighbours[0]), None)
        if right is None:
            return _NOT_FOUND
        found = self._pick(right, capitals)
        return _notes(
            f"{country} borders {neighbours[0]}. The capital of {found['country']} is {found['capital']}.",
            found["capital"],
        )

    def largest_neighbour(self, country: str) -> str | ScriptedReply:
        if self.rounds == 0:
            return _search(f"borders of {country}")
        neighbours = _borders(self.all, country)
        if not neighbours:
            return _NOT_FOUND
        if self.rounds == 1:
            return _search(*(f"population of {n}" for n in neighbours))
        populations = {n: p for n, p in _population_passages(self.all).items() if n in neighbours}
        if not populations:
            return _NOT_FOUND
        ranked = sorted(populations, key=lambda n: populations[n], reverse=True)
        best = self._pick(ranked[0], ranked[1:2])
        return _notes(f"{best} has the largest population, {populations[best]:,}.", best)


def teacher(tasks: list[dict], *, seed: int = 0, habit: float = 0.7, slip: float = 0.15) -> ScriptedBackend:
    """A gateway backend (model name ``teacher``) answering the researcher's and the editor's calls as the imperfect
    teacher (``habit``: how often it follows its `SYSTEMATIC` habits; ``slip``: how often its final fact comes from
    the wrong passage). ``tasks`` are not needed (every fact is read off the conversation); any question of the
    four kinds is answered."""
    del tasks  # the question's text says everything the teacher needs
    asked: dict[tuple[str, int], int] = {}

    def script(request: Any) -> str | ScriptedReply:
        messages = request.messages
        system = next((content_text(m.get("content")) for m in messages if m.get("role") == "system"), "")
        if system == EDITOR_INSTRUCTIONS:
            brief = next((content_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
            notes = _NOTES.search(brief)
            answers = _ANSWER.findall(notes.group(1)) if notes else []
            return f"Answer: {answers[-1].strip() if answers else 'unknown'}"
        if system != RESEARCHER_INSTRUCTIONS:
            return "Answer: unknown"
        researcher = _Researcher(messages)
        key = (researcher.question, researcher.rounds)
        k = asked[key] = asked.get(key, 0) + 1
        return researcher.reply(random.Random(f"{seed}:{researcher.question}:{researcher.rounds}:{k}"), habit, slip)

    return ScriptedBackend(script, model="teacher")
