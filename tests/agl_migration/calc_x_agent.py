"""Shaped like the reference's Calc-X example: an AutoGen assistant with a calculator tool answers arithmetic
questions; the reward is numeric equality (tolerance 1e-2), emitted with emit_reward. Its debug driver runs one
task with a hosted model through Trainer.dev."""

import argparse
import re

import agentlightning as agl
from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelFamily
from autogen_ext.models.openai import OpenAIChatCompletionClient


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
        return "error: not arithmetic"
    return str(eval(expression))  # noqa: S307 - digits and operators only


def score(answer: str, expected: float) -> float:
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
    return 1.0 if numbers and abs(float(numbers[-1]) - expected) < 1e-2 else 0.0


class CalcAgent(agl.LitAgent[dict]):
    async def rollout_async(self, task: dict, resources: agl.NamedResources, rollout: agl.Rollout) -> None:
        llm: agl.LLM = resources["main_llm"]
        client = OpenAIChatCompletionClient(
            model=llm.model,
            base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
            api_key="dummy",
            temperature=llm.sampling_parameters.get("temperature", 0.7),
            max_tokens=8,
            model_info={
                "vision": False,
                "function_calling": True,
                "json_output": False,
                "family": ModelFamily.UNKNOWN,
                "structured_output": False,
            },
        )
        agent = AssistantAgent(
            name="calc",
            model_client=client,
            tools=[calculator],
            system_message="Use the calculator, then give the number.",
        )
        try:
            result = await agent.run(task=task["question"])
        finally:
            await client.close()
        answer = str(result.messages[-1].content)
        agl.emit_reward(score(answer, task["result"]))


def debug(endpoint: str):
    trainer = agl.Trainer(
        n_workers=1,
        initial_resources={
            "main_llm": agl.LLM(endpoint=endpoint, model="gpt-4.1-nano", sampling_parameters={"temperature": 0.7})
        },
    )
    trainer.dev(CalcAgent(), [{"question": "What is 12 * 7?", "result": 84}])


def train(model: str):
    tasks = [{"question": "What is 3 + 4?", "result": 7}, {"question": "What is 9 - 2?", "result": 7}]
    config = {
        "algorithm": {"adv_estimator": "grpo"},
        "data": {"train_batch_size": 2, "max_response_length": 8},
        "actor_rollout_ref": {
            "rollout": {"n": 2},
            "actor": {"ppo_mini_batch_size": 2, "optim": {"lr": 1e-6}},
            "model": {"path": model},
        },
        "trainer": {"total_epochs": 1, "val_before_train": False, "experiment_name": "calc_x", "logger": ["console"]},
    }
    agl.Trainer(n_runners=2, algorithm=agl.VERL(config)).fit(CalcAgent(), train_dataset=tasks, val_dataset=tasks)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dev")
    parser.add_argument("--train")
    args = parser.parse_args()
    debug(args.dev) if args.dev else train(args.train)
