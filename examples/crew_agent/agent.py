"""A two-agent CrewAI crew that answers questions about countries. Nothing in it knows about lightrail: it takes
the base URL, model name and API key of any OpenAI-compatible server, like any crew pointed at a new endpoint.

    researcher ──(country_facts tool)──► notes ──► writer ──► "Answer: <answer>"

The researcher looks facts up with one tool over the country table in ``countries.json``; the writer reads the
researcher's notes (task context) and answers in a fixed form, so the answer can be checked exactly.

    python -m examples.crew_agent.agent --base-url http://127.0.0.1:8000/v1 --model tiny "What is the capital of Peru?"

CrewAI is set up to send nothing anywhere else: its anonymous telemetry and its trace upload are switched off
before it is imported (an environment variable set by the caller wins), and it never installs a global
OpenTelemetry tracer provider, so an application's own provider (lightrail's, when it runs the crew) is the one
the OpenInference instrumentation records to.
"""

from __future__ import annotations

import copy
import logging
import os

for _name in ("CREWAI_DISABLE_TELEMETRY", "CREWAI_DISABLE_TRACKING"):
    os.environ.setdefault(_name, "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import LLM, Agent, Crew, Process, Task  # noqa: E402 - after the telemetry switches above
from crewai.tools import tool  # noqa: E402

from examples.crew_agent.countries import describe  # noqa: E402

# CrewAI estimates a prompt's size before each call to a non-OpenAI server and warns about the estimate every
# time; one line per LLM call would bury everything else a runner logs.
logging.getLogger("crewai.llms.base_llm").addFilter(
    lambda record: not record.getMessage().startswith("Using an approximate input token count")
)

RESEARCHER = "researcher"
WRITER = "writer"

_PERU = "Peru: capital Lima; region Americas; currency PEN; calling code 51; population 30814175."
ONE_SHOT: dict[str, list[dict]] = {
    RESEARCHER: [
        {
            "role": "user",
            "content": "\nCurrent Task: What is the capital of Peru?\n\nThis is the expected criteria for your final "
            "answer: The facts found.\nyou MUST return the actual complete content as the final answer, not a summary.",
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_example",
                    "type": "function",
                    "function": {"name": "country_facts", "arguments": '{"country": "Peru"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_example", "content": _PERU},
        {"role": "assistant", "content": _PERU},
    ],
    WRITER: [
        {
            "role": "user",
            "content": "\nCurrent Task: What is the capital of Peru?\n\nThis is the expected criteria for your final "
            "answer: Answer: <answer>\nyou MUST return the actual complete content as the final answer, not a "
            f"summary.\n\nThis is the context you're working with:\n{_PERU}\n\nProvide your complete response:",
        },
        {"role": "assistant", "content": "Answer: Lima"},
    ],
}
"""One worked exchange per agent, in the form CrewAI writes its own turns (``one_shot=True``): the researcher calls
the tool and hands its line on, the writer answers in one line. Without them SmolLM2-135M does neither."""


def _show_one_shot(context) -> None:
    """A CrewAI ``before_llm_call`` hook: put the agent's worked exchange (`ONE_SHOT`, a copy: CrewAI may edit
    messages in place) between its system message and its task, once per conversation (the executor keeps the list
    across its iterations). CrewAI swallows a hook's exceptions; a failure here is raised as `HookAborted`, which it
    lets through, so a crew never runs without its examples unnoticed."""
    from crewai.hooks.dispatch import HookAborted

    try:
        example = ONE_SHOT.get(context.agent.role) if context.agent is not None else None
        if example and example[0] not in context.messages:
            at = 1 if context.messages and context.messages[0].get("role") == "system" else 0
            context.messages[at:at] = copy.deepcopy(example)  # in place: CrewAI's executor holds this list
    except Exception as exc:
        raise HookAborted(f"the one-shot hook failed: {type(exc).__name__}: {exc}") from exc


@tool("country_facts")
def country_facts(country: str) -> str:
    """Facts about one country: capital, region, currency code, calling code, population."""
    return describe(country)


def build_crew(*, base_url: str, model: str, api_key: str = "none", max_iter: int = 2, **sampling) -> Crew:
    """The crew, with both agents on one OpenAI-compatible endpoint. ``sampling`` (``temperature``,
    ``max_tokens``, ``top_p``, ...) goes to every call. ``provider="openai"`` makes CrewAI use its native OpenAI
    client for any model name (``tiny``, a local path): no LiteLLM, no model-name checks."""
    llm = LLM(model=model, provider="openai", base_url=base_url, api_key=api_key, max_retries=0, **sampling)
    researcher = Agent(
        role=RESEARCHER,
        goal="Look up the facts the question needs.",
        backstory="You use the country_facts tool.",
        tools=[country_facts],
        llm=llm,
        max_iter=max_iter,
        allow_delegation=False,
        verbose=False,
    )
    writer = Agent(
        role=WRITER,
        goal="Answer from the notes.",
        backstory="You reply with one line: Answer: <the answer>.",
        llm=llm,
        max_iter=1,
        allow_delegation=False,
        verbose=False,
    )
    research = Task(description="{question}", expected_output="The facts found.", agent=researcher)
    answer = Task(description="{question}", expected_output="Answer: <answer>", agent=writer, context=[research])
    return Crew(
        agents=[researcher, writer],
        tasks=[research, answer],
        process=Process.sequential,
        verbose=False,
        tracing=False,
    )


def answer(
    question: str,
    *,
    base_url: str,
    model: str,
    api_key: str = "none",
    max_iter: int = 2,
    one_shot: bool = False,
    **sampling,
) -> str:
    """Run the crew on one question; returns the writer's final text (``"Answer: ..."`` when the crew behaves).
    ``one_shot``: each agent is shown its worked exchange first (`ONE_SHOT`, through a hook scoped to this run)."""
    crew = build_crew(base_url=base_url, model=model, api_key=api_key, max_iter=max_iter, **sampling)
    if not one_shot:
        return crew.kickoff(inputs={"question": question}).raw
    from crewai.hooks.dispatch import InterceptionPoint, scoped_hooks  # (CrewAI 1.x's execution-scoped hooks)

    with scoped_hooks({InterceptionPoint.PRE_MODEL_CALL: [_show_one_shot]}):
        return crew.kickoff(inputs={"question": question}).raw


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--one-shot", action="store_true", help="show each agent its worked exchange (ONE_SHOT)")
    args = parser.parse_args()
    print(
        answer(
            args.question,
            base_url=args.base_url,
            model=args.model,
            api_key=args.api_key,
            one_shot=args.one_shot,
            max_tokens=args.max_tokens,
        )
    )
