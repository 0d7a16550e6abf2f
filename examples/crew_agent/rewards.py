"""The crew's reward: the writer's ``Answer:`` line checked against the gold answer.

    1.0  the answer line is the gold answer (case, accents, punctuation and spacing ignored: ``+33`` = ``33``)
    0.1  an answer line with a wrong answer (the format is right: a small signal a near-random model can find)
    0.0  no answer line at all

No credit for mentioning the gold answer somewhere else: for "which has more people, A or B?" repeating the
question would mention it for free.
"""

from __future__ import annotations

import re

from examples.crew_agent.countries import normalize

CORRECT = 1.0
WRONG_ANSWER = 0.1
NO_ANSWER = 0.0

_ANSWER_LINE = re.compile(r"answer\s*:\s*(.*)", re.IGNORECASE)


def parse_answer(text: str | None) -> str | None:
    """What follows the first ``Answer:`` on its line (None if there is no such line, or it is empty)."""
    match = _ANSWER_LINE.search(text or "")
    if match is None:
        return None
    return match.group(1).strip() or None


def answer_reward(text: str | None, gold: str) -> float:
    """The reward of the crew's final text ``text`` for a question whose answer is ``gold``."""
    answer = parse_answer(text)
    if answer is None:
        return NO_ANSWER
    return CORRECT if normalize(answer) == normalize(gold) else WRONG_ANSWER
