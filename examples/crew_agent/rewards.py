"""The crew's reward: the writer's ``Answer:`` line checked against the gold answer.

    1.0  the answer line is the gold answer (case, accents, punctuation and spacing ignored: ``+33`` = ``33``)
    0.5  no answer line, but the text names the gold answer (as whole words) and none of ``others``
    0.1  an answer line with a wrong answer
    0.0  neither

The middle grades are shaping for small models, which rarely follow the format at first: naming the right answer
in prose is worth more than the right format with the wrong answer. ``others`` are the wrong options of a
which-of-two question ("which has more people, A or B?"): repeating the question names both, and earns nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from examples.crew_agent.countries import normalize

CORRECT = 1.0
MENTIONED = 0.5
WRONG_ANSWER = 0.1
NO_ANSWER = 0.0

_ANSWER_LINE = re.compile(r"answer\s*:\s*(.*)", re.IGNORECASE)


def parse_answer(text: str | None) -> str | None:
    """What follows the first ``Answer:`` on its line (None if there is no such line, or it is empty)."""
    match = _ANSWER_LINE.search(text or "")
    if match is None:
        return None
    return match.group(1).strip() or None


def _names(text: str, phrase: str) -> bool:
    return f" {normalize(phrase)} " in f" {normalize(text)} "


def answer_reward(text: str | None, gold: str, others: Iterable[str] = ()) -> float:
    """The reward of the crew's final text ``text`` for a question whose answer is ``gold``."""
    answer = parse_answer(text)
    if answer is not None:
        return CORRECT if normalize(answer) == normalize(gold) else WRONG_ANSWER
    if text and _names(text, gold) and not any(_names(text, other) for other in others):
        return MENTIONED
    return NO_ANSWER
