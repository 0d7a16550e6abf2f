"""The calculator agent of ``examples/calculator`` with its system prompt and its few-shot examples taken from two
`PromptTemplate` resources (what `APO` optimizes): ``prompt_template`` (text) and ``examples`` (a JSON list of chat
messages put between the system prompt and the question, like ``solve(examples=...)``). The tool, the answer
parsing and the reward are the example's. Loaded by path by the runners of ``bench/apo.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's examples/

from openai import OpenAI  # noqa: E402

from examples.calculator.agent import CALCULATOR, calculate, parse_answer  # noqa: E402
from lightrail import rollout  # noqa: E402


@rollout
def calculator_prompted(task, llm, resources):
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    messages = [
        {"role": "system", "content": resources["prompt_template"].template},
        *json.loads(resources["examples"].template),
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(3):
        message = (
            client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATOR], **llm.sampling)
            .choices[0]
            .message
        )
        if not message.tool_calls:
            return 1.0 if parse_answer(message.content) == task["answer"] else 0.0
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            result = calculate(expression) if expression else "Error: missing 'expression' argument"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0
