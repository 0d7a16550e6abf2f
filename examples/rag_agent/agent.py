"""A retrieval workflow built with the OpenAI Agents SDK: the "researcher" looks facts up with a ``search`` tool
over the country passages and writes notes; the "editor" (no tools) turns the question and those notes into the
final ``Answer: ...`` line. Both run in one SDK trace. Nothing in it knows about lightrail; it takes the base URL,
model name, API key and sampling settings of any server that speaks the OpenAI Responses API.

    python -m examples.rag_agent.agent --base-url http://127.0.0.1:8000/v1 --model tiny \\
        "What currency is used in the country whose capital is Lima?"

The model is the SDK's default, `OpenAIResponsesModel` (the Responses API, which lightrail's gateway serves and
records like chat calls); the client is handed to it with ``OpenAIProvider(openai_client=...)`` in the run config,
so nothing process-wide changes. A reply cut by ``max_tokens`` is an incomplete response, which the SDK raises as a
`ModelBehaviorError`: that agent gives no output (the call is still recorded). The SDK's default trace processor,
which uploads every run to OpenAI's servers, is removed before each run (`keep_traces_local`); the SDK's tracing
itself stays on, so an OpenTelemetry instrumentor (OpenInference's) still sees every agent, model call and tool
call.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from typing import Any

from agents import Agent, ModelSettings, OpenAIProvider, RunConfig, Runner, function_tool, trace
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from openai import AsyncOpenAI, BadRequestError

from examples.rag_agent.prompts import EDITOR_INSTRUCTIONS, RESEARCHER_INSTRUCTIONS, editor_brief

RESEARCHER = "researcher"
EDITOR = "editor"
WORKFLOW_NAME = "rag_agent"

#: One worked example for models that need to be shown the tool once (SmolLM2): two searches, then an answer.
#: Agents SDK input items (Responses format), sent as they are: function calls with their outputs. The
#: question is from the training split, the tool outputs are exactly what ``search`` returns for those queries.
ONE_SHOT: list[dict[str, Any]] = [
    {"role": "user", "content": "What currency is used in the country whose capital is Lima?"},
    {"type": "function_call", "call_id": "call_1", "name": "search", "arguments": '{"query": "capital Lima"}'},
    {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "Peru: the capital of Peru is Lima. Peru lies in Latin America and the Caribbean, in the region "
        "Americas.\nPeru borders Bolivia, Brazil, Chile, Colombia and Ecuador.\nBolivia: the capital of Bolivia "
        "is Sucre. Bolivia lies in Latin America and the Caribbean, in the region Americas.",
    },
    {"type": "function_call", "call_id": "call_2", "name": "search", "arguments": '{"query": "currency of Peru"}'},
    {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": "Peru uses the currency PEN. Languages of Peru (ISO 639-1 codes): es.\nBolivia uses the currency "
        "BOB and BOV. Languages of Bolivia (ISO 639-1 codes): es, ay, qu.\nPeru: the capital of Peru is Lima. Peru "
        "lies in Latin America and the Caribbean, in the region Americas.",
    },
    {"role": "assistant", "content": "Lima is the capital of Peru, and Peru uses the currency PEN.\nAnswer: PEN"},
]

#: The editor's worked example: the brief it gets (question and notes) and the one line it answers.
EDITOR_ONE_SHOT: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": "Question: What currency is used in the country whose capital is Lima?\n"
        "Researcher's notes: Lima is the capital of Peru, and Peru uses the currency PEN.",
    },
    {"role": "assistant", "content": "Answer: PEN"},
]

#: Sampling parameters the Responses API has (``max_tokens`` is sent as ``max_output_tokens``); any other key goes
#: into the request body as is, where a server that does not know it refuses it (penalties are chat-only).
_SETTINGS = {"temperature", "top_p", "max_tokens", "top_logprobs"}


def keep_traces_local() -> None:
    """Remove the Agents SDK's default trace processor (it posts every trace to OpenAI's servers with the
    environment's OPENAI_API_KEY) and keep every other one, such as the OpenInference instrumentor's.

    Called before each run, not once at import: an instrumentor may register its processor before or after
    this module is imported. The SDK has no public way to list its processors; like the OpenInference
    instrumentor, this reads the default provider's list.
    """
    from agents import set_trace_processors
    from agents.tracing import get_trace_provider
    from agents.tracing.processors import BackendSpanExporter

    registered = getattr(getattr(get_trace_provider(), "_multi_processor", None), "_processors", None)
    if registered is None:
        warnings.warn("cannot read the Agents SDK's trace processors: traces may be sent to OpenAI", stacklevel=2)
        return
    kept = [p for p in registered if not isinstance(getattr(p, "_exporter", None), BackendSpanExporter)]
    if len(kept) != len(registered):
        set_trace_processors(kept)


def model_settings(sampling: dict[str, Any]) -> ModelSettings:
    """OpenAI sampling parameters as `ModelSettings`; the ones it has no field for go into the request body."""
    known = {k: v for k, v in sampling.items() if k in _SETTINGS}
    extra = {k: v for k, v in sampling.items() if k not in _SETTINGS}
    return ModelSettings(**known, extra_body=extra or None)


def build_agents(
    model: str, *, k: int = 3, world: int = 0, corpus: Callable[[], Any] | None = None, **sampling: Any
) -> tuple[Agent, Agent]:
    """The researcher (with the ``search`` tool returning the ``k`` best passages of ``world``'s corpus: 0 is the
    real countries, see `examples.rag_agent.data.world`; or of ``corpus()``, a `retrieval.PassageIndex` made on
    the first search, e.g. a MuSiQue question's paragraphs) and the editor, both calling ``model`` with the SDK's
    default model (the Responses API) through the run's client (`run_config`)."""
    from examples.rag_agent.retrieval import index

    searched = corpus or (lambda: index(world))

    @function_tool
    async def search(query: str) -> str:
        """Search facts about countries (capital, region, borders, currency, languages, population, area).

        Args:
            query: What to look for, e.g. "capital Lima" or "currency of Peru".
        """
        # in a worker thread: the first search of a process loads the encoder (and may embed the corpus), and
        # the event loop it would block also runs other rollouts and the runner's heartbeats
        found = await asyncio.to_thread(lambda: searched().search(query, k))
        return "\n".join(found) if found else "No passages found: search for a country name or a capital."

    settings = model_settings(sampling)
    researcher = Agent(
        name=RESEARCHER, instructions=RESEARCHER_INSTRUCTIONS, tools=[search], model=model, model_settings=settings
    )
    editor = Agent(name=EDITOR, instructions=EDITOR_INSTRUCTIONS, model=model, model_settings=settings)
    return researcher, editor


def run_config(client: AsyncOpenAI) -> RunConfig:
    """Runs whose models (named by the agents) are the SDK's default Responses model over ``client``."""
    return RunConfig(model_provider=OpenAIProvider(openai_client=client, use_responses=True))


async def _final_output(
    agent: Agent, text: str | list[dict[str, Any]], max_turns: int, config: RunConfig
) -> str | None:
    """The agent's final text, or None when it gave none: out of turns, a malformed or unknown tool call, or a
    conversation grown past the model's context (the model's doing, like running out of turns)."""
    try:
        result = await Runner.run(agent, text, max_turns=max_turns, run_config=config)
    except (MaxTurnsExceeded, ModelBehaviorError):
        return None
    except BadRequestError as exc:
        if exc.code != "context_length_exceeded":
            raise
        return None
    return result.final_output if isinstance(result.final_output, str) else None


async def answer(
    question: str,
    *,
    base_url: str,
    model: str,
    api_key: str = "none",
    max_turns: int = 4,
    k: int = 3,
    world: int = 0,
    examples: list[dict[str, Any]] | None = None,
    editor_examples: list[dict[str, Any]] | None = None,
    corpus: Callable[[], Any] | None = None,
    **sampling: Any,
) -> str | None:
    """Run the workflow on one question: the researcher's notes (``max_turns`` model calls at most), then the
    editor's reply, which is returned (None when the editor gave none). ``examples`` (e.g. `ONE_SHOT`) come
    before the question in the researcher's conversation, ``editor_examples`` (`EDITOR_ONE_SHOT`) in the
    editor's; ``world`` or ``corpus`` picks the search corpus (`build_agents`). Errors reaching the server propagate: they are
    not the model's."""
    keep_traces_local()
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        researcher, editor = build_agents(model, k=k, world=world, corpus=corpus, **sampling)
        config = run_config(client)
        with trace(WORKFLOW_NAME):
            notes = await _final_output(researcher, _after(examples, question), max_turns, config)
            brief = editor_brief(question, notes)
            return await _final_output(editor, _after(editor_examples, brief), 1, config)


def _after(examples: list[dict[str, Any]] | None, text: str) -> str | list[dict[str, Any]]:
    """The agent's input: ``text``, after the worked examples if there are any."""
    return [*examples, {"role": "user", "content": text}] if examples else text


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Answer one question about countries (researcher, then editor).")
    parser.add_argument("question")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--one-shot", action="store_true", help="show each agent one worked example first")
    args = parser.parse_args()
    reply = asyncio.run(
        answer(
            args.question,
            base_url=args.base_url,
            model=args.model,
            api_key=args.api_key,
            max_turns=args.max_turns,
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            examples=ONE_SHOT if args.one_shot else None,
            editor_examples=EDITOR_ONE_SHOT if args.one_shot else None,
        )
    )
    print(reply)
