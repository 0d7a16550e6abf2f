"""The training demo behind ``lightrail demo`` (a calculator agent gets better at its job on a CPU), defined in
``lightrail/demos/calculator/demo.py``: model, supervised warm start on an imperfect teacher, then GRPO through
runner processes, the gateway, the embedded engine and a SQLite store.

    python -m examples.calculator.demo            # the same as `lightrail demo --quick`
"""

from __future__ import annotations

from lightrail.demos.calculator.demo import AGENT, AGENT_ONE_SHOT, DemoSettings, build_model, run_demo, warm_start

__all__ = ["AGENT", "AGENT_ONE_SHOT", "DemoSettings", "build_model", "run_demo", "warm_start"]

if __name__ == "__main__":
    run_demo(DemoSettings.quick())
