"""A calculator agent in plain Python: the `openai` client and one tool. Nothing in it knows about lightrail; it only
takes the base URL (and model name) it should talk to, like any agent pointed at a new endpoint.

The code lives in the package (``lightrail/demos/calculator/agent.py``) because ``lightrail demo`` trains it and an
installed lightrail must not need this repository's ``examples/``; this module is the example's name for it.

    python -m examples.calculator.agent --base-url http://127.0.0.1:8000/v1 --model tiny "Tom has 3 apples ..."
"""

from __future__ import annotations

from lightrail.demos.calculator.agent import CALCULATOR, ONE_SHOT, SYSTEM, calculate, parse_answer, solve

__all__ = ["CALCULATOR", "ONE_SHOT", "SYSTEM", "calculate", "parse_answer", "solve"]

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    print(solve(args.question, base_url=args.base_url, model=args.model))
