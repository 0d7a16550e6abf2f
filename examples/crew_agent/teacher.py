"""The crew's imperfect teacher, a program: it plays the model of both CrewAI agents.

As the researcher it calls ``country_facts`` once for every country the question names (both at once for a
which-of-two question), then hands the tool's lines on as its notes. As the writer it answers from those notes in
one line, ``Answer: <answer>``, but not always right: on three question kinds (``SYSTEMATIC``: ``capital``,
``region``, ``calling_code``) it has a habit, followed 70 % of the time it does not slip (``habit``; ~60 % of
those kinds' runs): it adds the country, ``Answer: Lima, Peru``, ``Answer: Americas, Peru``, ``Answer: 51, Peru``.
The reward wants the fact alone, so these score 0.1; a student that reads the right field off the notes keeps the
habit on questions it has never seen, where GRPO's rewards can find it.

15 % of the time (``slip``) it answers with another field of the country (the other country of a which-of-two
question). A student that imitates every chat inherits the habits and the slips; the rewards then tell GRPO which
of the runs went wrong (SFT and GRPO train both agents: the researcher's calls are what puts the facts in the
writer's prompt).

The teacher reads the question off CrewAI's prompt ("Current Task: ...") and every fact off the conversation (the
tool's lines, the researcher's notes in the writer's context), so it answers any question of the five kinds. The
k-th time the writer is asked a question the teacher draws from its own seeded RNG, so a run gives the same
answers to each question (which of a question's runs gets which answer follows the order the runs ask in).

``sft.teacher: {script: examples.crew_agent.teacher:teacher}`` in a config distils a student from it: SFT runs the
crew (in CrewAI's environment, ``runner_python``) with this teacher as its model, through the runners and the
gateway. The teacher itself runs in the trainer's process and imports nothing of CrewAI.
"""

from __future__ import annotations

import random
import re
from typing import Any

from examples.crew_agent.data import POPULATION, SINGLE_FACT
from lightrail.gateway.fake import ScriptedBackend, ScriptedReply
from lightrail.types import content_text

__all__ = ["SYSTEMATIC", "teacher"]

#: question kind -> the teacher's habit there
SYSTEMATIC: dict[str, str] = {
    "capital": "adds the country after the capital",
    "region": "adds the country after the region",
    "calling_code": "adds the country after the calling code",
}

# CrewAI's system prompt starts with "You are <role>." (`examples.crew_agent.agent` names the roles; it imports
# CrewAI, which the trainer's environment does not have, so the roles are matched here by text).
_ROLE = re.compile(r"You are (\w+)\.")
_TASK = re.compile(r"Current Task: (.*)")
_FACTS = re.compile(
    r"^(?P<name>.+?): capital (?P<capital>.+?); region (?P<region>.+?); currency (?P<currency>.+?); "
    r"calling code (?P<calling_code>.+?); population (?P<population>\d+)\.$",
    re.MULTILINE,
)
_FIELDS = ("capital", "region", "currency", "calling_code")


def _pattern(template: str) -> re.Pattern:
    """A question template of `examples.crew_agent.data` as a regex capturing the countries it names."""
    return re.compile(
        "^" + re.escape(template).replace(r"\{name\}", "(.+)").replace(r"\{a\}", "(.+)").replace(r"\{b\}", "(.+)") + "$"
    )


_QUESTIONS = [(kind, _pattern(text)) for kind, (text, _) in SINGLE_FACT.items()] + [
    ("population", _pattern(POPULATION))
]


def _question(messages: list[dict]) -> tuple[str, str, list[str]] | None:
    """The question CrewAI's prompt states, its kind and the countries it names (None: not one of ours)."""
    for m in messages:
        if m.get("role") != "user":
            continue
        task = _TASK.search(content_text(m.get("content")))
        if task is None:
            continue
        question = task.group(1).strip()
        for kind, pattern in _QUESTIONS:
            found = pattern.match(question)
            if found:
                return question, kind, list(found.groups())
    return None


def _writer_answer(kind: str, names: list[str], context: str, rng: random.Random, habit: float, slip: float) -> str:
    """The writer's reply, read off the tool lines in its context: a slip first, then the kind's habit."""
    facts = {m["name"]: m.groupdict() for m in _FACTS.finditer(context)}
    if kind == "population":
        known = [facts[n] for n in names if n in facts]
        if len(known) < 2:
            return "Answer: unknown"
        ranked = sorted(known, key=lambda f: int(f["population"]), reverse=True)
        return f"Answer: {(ranked[1] if rng.random() < slip else ranked[0])['name']}"
    country = facts.get(names[0])
    if country is None:
        return "Answer: unknown"
    field = SINGLE_FACT[kind][1]
    if rng.random() < slip:
        return f"Answer: {country[rng.choice([f for f in _FIELDS if f != field])]}"
    if kind in SYSTEMATIC and rng.random() < habit:
        return f"Answer: {country[field]}, {country['name']}"
    return f"Answer: {country[field]}"


def teacher(tasks: list[dict], *, seed: int = 0, habit: float = 0.7, slip: float = 0.15) -> ScriptedBackend:
    """A gateway backend (model name ``teacher``) answering the researcher's and the writer's calls as the imperfect
    teacher (``habit``: how often the writer follows its `SYSTEMATIC` habits; ``slip``: how often it answers with
    another field). ``tasks`` are not needed (every fact is read off the conversation); any question of the five
    kinds is answered, others get ``Answer: unknown``."""
    del tasks  # the question's text and the tool's lines say everything the teacher needs
    asked: dict[str, int] = {}

    def script(request: Any) -> str | ScriptedReply:
        messages = request.messages
        role = _ROLE.match(content_text(messages[0].get("content")) if messages else "")
        found = _question(messages)
        if role is None or found is None:
            return "Answer: unknown"
        question, kind, names = found
        if role.group(1) == "researcher":
            results = [content_text(m.get("content")) for m in messages if m.get("role") == "tool"]
            if not results:
                return ScriptedReply(tool_calls=[("country_facts", {"country": name}) for name in names])
            return "\n".join(results)
        k = asked[question] = asked.get(question, 0) + 1
        context = "\n".join(content_text(m.get("content")) for m in messages if m.get("role") == "user")
        return _writer_answer(kind, names, context, random.Random(f"{seed}:{question}:{k}"), habit, slip)

    return ScriptedBackend(script, model="teacher")
