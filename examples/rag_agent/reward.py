"""The rag agent's reward: a small bonus for the answer format plus the answer's token F1 against the gold answers.

The format: the reply's last non-empty line is ``Answer: <text>`` with some text. The answer is the text after the
last ``Answer:`` in the reply (wherever it is: a reply in the wrong format still gets F1 credit for a right answer
it states), or nothing when the reply never says ``Answer:``.

    reward = FORMAT_WEIGHT * format_ok + F1_WEIGHT * max(F1(answer, gold) for gold in answers)

F1 is SQuAD's token F1 after normalising both sides as SQuAD's evaluation script does (lower case, punctuation
deleted, the articles "a", "an", "the" dropped, whitespace collapsed), with HotpotQA's rule for yes/no answers (a
"yes", "no" or "noanswer" on either side scores 0 unless both sides are equal). A question with several right
answers (any neighbour's capital; MuSiQue's ``answer`` and its ``answer_aliases``) takes the best match.

This is Agent Lightning's RAG reward (``examples/rag_agent/utils.py`` of microsoft/agent-lightning:
``0.1 + 0.9 * max(EM, F1)`` for a reply with an answer, EM implying F1 = 1) with two differences: accents are
folded ("Bogotá" matches "Bogota"; there they are not), and the best match over every accepted answer is taken
(there the one ``answer``). Its answer is wrapped in ``<answer>`` tags, here it is the ``Answer:`` line.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter

__all__ = ["F1_WEIGHT", "FORMAT_WEIGHT", "extract_answer", "format_ok", "normalize", "reward", "token_f1"]

FORMAT_WEIGHT = 0.1
F1_WEIGHT = 0.9

_ANSWER = re.compile(r"answer:", re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)  # deleted, as SQuAD's script does ("U.S." -> "us")
_YES_NO = (["yes"], ["no"], ["noanswer"])


def normalize(text: str) -> list[str]:
    """The tokens F1 compares: accents stripped ("Bogotá" -> "bogota"), lower case, punctuation deleted, articles
    out (SQuAD's ``normalize_answer``, accents folded first)."""
    plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return _ARTICLES.sub(" ", plain.lower().translate(_PUNCTUATION)).split()


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall (0 when either side has no tokens, and when either side is a
    bare "yes", "no" or "noanswer" the other is not: HotpotQA's and Agent Lightning's rule)."""
    pred, ref = normalize(prediction), normalize(gold)
    if (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def format_ok(reply: str | None) -> bool:
    """True when the reply's last non-empty line is ``Answer: <something>``."""
    lines = [line.strip() for line in (reply or "").splitlines() if line.strip()]
    if not lines:
        return False
    match = _ANSWER.match(lines[-1])
    return match is not None and bool(lines[-1][match.end() :].strip())


def extract_answer(reply: str | None) -> str | None:
    """The text after the last ``Answer:`` up to the end of its line; None when the reply has no ``Answer:``."""
    matches = list(_ANSWER.finditer(reply or ""))
    if not matches:
        return None
    return reply[matches[-1].end() :].split("\n", 1)[0].strip()


def reward(reply: str | None, answers: list[str]) -> float:
    """``FORMAT_WEIGHT * format_ok + F1_WEIGHT * best F1``; in [0, 1]. ``reply`` None (the agent gave no final
    answer: out of turns, a malformed tool call) scores 0."""
    if not answers:
        raise ValueError("a question needs at least one accepted answer")
    answer = extract_answer(reply)
    f1 = max(token_f1(answer, gold) for gold in answers) if answer else 0.0
    return FORMAT_WEIGHT * format_ok(reply) + F1_WEIGHT * f1
