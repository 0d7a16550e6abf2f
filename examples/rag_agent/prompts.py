"""The text the rag workflow sends its two agents besides the question and the passages: their instructions and
the editor's brief. Kept apart from `agent.py` (which imports the Agents SDK) so that the tokenizer corpus
(`examples.rag_agent.data.tokenizer_corpus`) and the teacher program can use them without the SDK."""

from __future__ import annotations

RESEARCHER_INSTRUCTIONS = (
    "You research questions about countries. Use the search tool to look facts up; most questions need two "
    "searches (first find the country, then the fact about it). Reply with the facts you found and your answer."
)
EDITOR_INSTRUCTIONS = (
    "You are given a question and a researcher's notes. Reply with one line 'Answer: <answer>', the answer as "
    "short as possible (a name or a code)."
)


def editor_brief(question: str, notes: str | None) -> str:
    """What the editor is given: the question and the researcher's notes (``(none)`` when it wrote none)."""
    return f"Question: {question}\nResearcher's notes: {notes or '(none)'}"
