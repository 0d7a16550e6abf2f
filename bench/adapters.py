"""Micro-benchmark of the adapter: spans → transitions with per-turn credit.

Same shape as the reference measurement (anchor-bench (e): `TracerTraceToTriplet`, 500 rollouts × 20 spans,
15,042 spans/s): per rollout 12 LLM-call spans (60 prompt + 20 response ids, ~2 KB of request/response text),
1 final + 3 intermediate reward spans, a rollout span, an agent span and 2 event spans. Half the calls name
their agent themselves, half inherit it from the agent span (ancestor lookup). Spans are built before timing;
the timed part is `spans_to_transitions(spans, credit=PerTurn())` for every rollout.

Run:  .venv/bin/python bench/adapters.py [--rollouts 500] [--passes 5]
The last stdout line is JSON: ``adapter_spans_per_s`` (best pass, as the reference was measured), the median
pass, the reference baseline and the ratio. Passes vary with when Python's cyclic GC runs a full collection
over the 10,000 input spans, hence both figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ when run from a checkout

from bench._util import SMOKE_HELP  # noqa: E402
from lightrail.adapters import PerTurn, build_episode, episode_transitions, spans_to_transitions, to_rows  # noqa: E402
from lightrail.types import Attr, Span, next_seq  # noqa: E402

KEYS = ("adapter_spans_per_s", "median_spans_per_s", "reference_spans_per_s", "ratio", "spans", "transitions",
        "rows_per_s")  # fmt: skip
REFERENCE_SPANS_PER_S = 15_042
CALLS, REWARDS, OTHERS = 12, 4, 4  # 20 spans per rollout


def make_rollout(i: int, rng: random.Random) -> list[Span]:
    """The spans of one attempt in ``seq`` order, as a store query returns them."""
    rid, aid = f"ro-{i}", f"at-{i}"
    rollout = Span(rollout_id=rid, attempt_id=aid, seq=next_seq(), name=Attr.SPAN_ROLLOUT)
    agent = Span(
        rollout_id=rid,
        attempt_id=aid,
        seq=next_seq(),
        name="invoke_agent solver",
        parent_id=rollout.span_id,
        attributes={"gen_ai.agent.name": "solver", "gen_ai.operation.name": "invoke_agent"},
    )
    spans = [rollout, agent]
    text = "lorem ipsum dolor sit amet " * 28  # ~750 chars per message, ~2 KB per call
    for k in range(2):
        spans.append(
            Span(
                rollout_id=rid,
                attempt_id=aid,
                seq=next_seq(),
                name=Attr.SPAN_EVENT,
                attributes={Attr.EVENT_NAME: f"step-{k}", "detail": text[:200]},
            )
        )
    response_ids = []
    for t in range(CALLS):
        resp_id = f"chatcmpl-{i}-{t}"
        response_ids.append(resp_id)
        token_ids = [rng.randrange(32000) for _ in range(20)]
        attributes = {
            Attr.REQUEST: {
                "model": "policy",
                "messages": [{"role": "system", "content": text}, {"role": "user", "content": text}],
            },
            Attr.RESPONSE: {
                "id": resp_id,
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text[:500]}, "finish_reason": "stop"}
                ],
            },
            Attr.ENDPOINT: "chat.completions",
            Attr.PROMPT_IDS: [rng.randrange(32000) for _ in range(60)],
            Attr.CHOICES: [
                {"token_ids": token_ids, "logprobs": [-rng.random() for _ in token_ids], "finish_reason": "stop"}
            ],
            Attr.TOKEN_IDS_AVAILABLE: True,
            Attr.POLICY_VERSION: 3,
            Attr.RESPONSE_ID: resp_id,
            Attr.MODEL: "policy",
        }
        if t % 2 == 0:
            attributes[Attr.AGENT_NAME] = "solver"
        spans.append(
            Span(
                rollout_id=rid,
                attempt_id=aid,
                seq=next_seq(),
                name=Attr.SPAN_LLM_CALL,
                parent_id=None if t % 2 == 0 else agent.span_id,
                attributes=attributes,
            )
        )
    for k in range(REWARDS - 1):
        spans.append(
            Span(
                rollout_id=rid,
                attempt_id=aid,
                seq=next_seq(),
                name=Attr.SPAN_REWARD,
                attributes={
                    Attr.REWARD: 0.1 * (k + 1),
                    Attr.REWARD_FINAL: False,
                    Attr.LINKED_RESPONSE_ID: response_ids[3 * k + 1],
                },
            )
        )
    spans.append(
        Span(
            rollout_id=rid,
            attempt_id=aid,
            seq=next_seq(),
            name=Attr.SPAN_REWARD,
            attributes={Attr.REWARD: float(i % 2), Attr.REWARD_FINAL: True},
        )
    )
    assert len(spans) == CALLS + REWARDS + OTHERS
    spans.sort(key=lambda s: s.seq)
    return spans


def adapt(attempts: list[list[Span]]) -> int:
    """The timed work: every attempt to transitions with per-turn credit. Returns the transition count."""
    credit = PerTurn()
    return sum(len(spans_to_transitions(spans, credit=credit)[0]) for spans in attempts)


def run(rollouts: int = 500, passes: int = 5, *, verbose: bool = False) -> dict[str, float]:
    """Build the input, time ``passes`` passes of `adapt` and return the result dict (bench/update.py calls this)."""
    rng = random.Random(0)
    attempts = [make_rollout(i, rng) for i in range(rollouts)]
    n_spans = sum(len(a) for a in attempts)

    times = []
    transitions = 0
    for _ in range(passes):
        t0 = time.perf_counter()
        transitions = adapt(attempts)
        times.append(time.perf_counter() - t0)
        if verbose:
            print(f"pass: {n_spans / times[-1]:,.0f} spans/s ({transitions} transitions)")
    best = min(times)
    median = statistics.median(times)

    # rows (transition mode) on top, for the record: what the policy update consumes
    episodes = [build_episode(a) for a in attempts]
    all_t = [
        t
        for e in episodes
        for t in episode_transitions(e, PerTurn()(e.calls, e.final_reward or 0.0, e.intermediate), [0.0] * len(e.calls))
    ]
    rows_s = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        rows, _ = to_rows(all_t)
        rows_s = min(rows_s, time.perf_counter() - t0)

    rate = n_spans / best
    return {
        "adapter_spans_per_s": round(rate),
        "reference_spans_per_s": REFERENCE_SPANS_PER_S,
        "ratio": round(rate / REFERENCE_SPANS_PER_S, 1),
        "median_spans_per_s": round(n_spans / median),
        "spans": n_spans,
        "transitions": transitions,
        "best_pass_s": round(best, 4),
        "rows_per_s": round(len(rows) / rows_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=500)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.rollouts, args.passes = 10, 1
    print(json.dumps(run(args.rollouts, args.passes, verbose=True)))


if __name__ == "__main__":
    main()
