"""Shaped like the reference's RAG example: an OpenAI Agents SDK agent with a retrieval tool over a small corpus;
the reward is the token F1 of its answer (-0.1 when it gives none). The agent is built at the top of the script."""

import argparse
from collections import Counter

import agentlightning as agl
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.model_settings import ModelSettings
from openai import AsyncOpenAI

set_tracing_disabled(True)
CORPUS = {"paris": "Paris is the capital of France.", "oslo": "Oslo is the capital of Norway."}


@function_tool
def retrieve(query: str) -> str:
    """Look up passages about the query."""
    return "\n".join(text for key, text in CORPUS.items() if key in query.lower()) or "no passage"


def f1(prediction: str, truth: str) -> float:
    pred, gold = prediction.lower().split(), truth.lower().split()
    common = sum((Counter(pred) & Counter(gold)).values())
    if not pred:
        return -0.1
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


class RAGAgent(agl.LitAgent):
    async def training_rollout_async(self, task, resources, rollout):
        return await self.answer(task, resources, rollout)

    async def validation_rollout_async(self, task, resources, rollout):
        return await self.answer(task, resources, rollout)

    async def answer(self, task, resources, rollout):
        llm = resources["main_llm"]
        client = AsyncOpenAI(base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id), api_key="x")
        agent = Agent(
            name="rag",
            instructions="Answer with the retrieved passage.",
            model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client),
            model_settings=ModelSettings(max_tokens=8, temperature=llm.sampling_parameters.get("temperature")),
            tools=[retrieve],
        )
        result = await Runner.run(agent, task["question"], max_turns=3)
        return f1(str(result.final_output or ""), task["answer"])


agent = RAGAgent()
tasks = [
    {"question": "What is the capital of France?", "answer": "Paris"},
    {"question": "What is the capital of Norway?", "answer": "Oslo"},
]

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dev")
    parser.add_argument("--train")
    args = parser.parse_args()
    if args.dev:
        llm = agl.LLM(endpoint=args.dev, model="gpt-4.1-mini", sampling_parameters={"temperature": 0.0})
        agl.Trainer(n_workers=1, initial_resources={"main_llm": llm}).dev(agent, tasks)
    else:
        config = {
            "algorithm": {"adv_estimator": "grpo"},
            "data": {"train_batch_size": 2, "max_response_length": 8},
            "actor_rollout_ref": {
                "rollout": {"n": 2},
                "actor": {"ppo_mini_batch_size": 2},
                "model": {"path": args.train},
            },
            "trainer": {"total_epochs": 1, "val_before_train": False, "experiment_name": "rag"},
        }
        agl.Trainer(n_runners=2, algorithm=agl.VERL(config)).fit(agent, train_dataset=tasks, val_dataset=tasks[:1])
