"""Shaped like the reference's APO example: a prompt-template agent picks a meeting room; APO improves the template
with an optimizer model reached through an OpenAI-compatible client. The judge is an exact match here."""

import argparse

import agentlightning as agl
from openai import AsyncOpenAI, OpenAI

ROOMS = "A (4 seats, no screen), B (8 seats, screen), C (12 seats, screen)"


@agl.rollout
def room_selector(task, prompt_template: agl.PromptTemplate, rollout: agl.Rollout) -> float:
    llm = rollout_llm.get(rollout.rollout_id)
    client = OpenAI(base_url=llm.endpoint, api_key="dummy")
    prompt = prompt_template.format(rooms=ROOMS, **task)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0
    )
    choice = (reply.choices[0].message.content or "").strip()[:1]
    return 1.0 if choice == task["expected"] else 0.0


class _Endpoint:
    """The agent model's endpoint, as the reference's example hard-codes it (an environment variable there)."""

    def __init__(self):
        self.endpoint, self.model = "", "gpt-4.1-nano"

    def get(self, rollout_id):
        return self


rollout_llm = _Endpoint()
TASKS = [{"people": 3, "screen": "no", "expected": "A"}, {"people": 7, "screen": "yes", "expected": "B"}]
TEMPLATE = "Rooms: {rooms}. We are {people} people, screen needed: {screen}. Answer with one letter."


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dev")
    parser.add_argument("--train")
    args = parser.parse_args()
    resources = {"prompt_template": agl.PromptTemplate(template=TEMPLATE, engine="f-string")}
    if args.dev:
        rollout_llm.endpoint = args.dev
        agl.Trainer(n_workers=1, initial_resources=resources).dev(room_selector, TASKS)
        return
    client = AsyncOpenAI(base_url=args.train, api_key="dummy")
    algo = agl.APO(
        client,
        gradient_model="gpt-5-mini",
        val_batch_size=2,
        gradient_batch_size=2,
        beam_width=1,
        branch_factor=1,
        beam_rounds=1,
    )
    rollout_llm.endpoint = args.train
    trainer = agl.Trainer(
        n_runners=2,
        algorithm=algo,
        initial_resources={**resources, "main_llm": agl.LLM(endpoint=args.train, model="gpt-4.1-nano")},
    )
    trainer.fit(room_selector, train_dataset=TASKS, val_dataset=TASKS)


if __name__ == "__main__":
    main()
