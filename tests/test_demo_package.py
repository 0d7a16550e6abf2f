"""``lightrail demo`` ships in the package: nothing under ``lightrail/`` imports the repository's ``examples/``, and the
demo's entry, its agent (as runners import it, by reference), data and teacher all load with ``examples`` made
unimportable, from a directory outside the checkout."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lightrail"

PROBE = r"""
import importlib, importlib.abc, json, sys

class NoExamples(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "examples" or name.startswith("examples."):
            raise ModuleNotFoundError(f"blocked: {name}", name=name)
        return None

sys.meta_path.insert(0, NoExamples())
captured = []
import lightrail.demos.calculator.demo as demo
demo.run_demo = lambda settings: captured.append(settings)   # the entry up to the (slow) run itself
from lightrail.cli import main
code = main(["demo", "--quick", "--steps", "3", "--out", "run-dir"])
settings = captured[0]
module, _, attr = settings.agent.partition(":")
agent = getattr(importlib.import_module(module), attr)        # what each runner process does
from lightrail.demos.calculator.data import make_splits
from lightrail.demos.calculator.teacher import demonstrations
train, val = make_splits(20, 5, seed=0)
corpus = demo._tokenizer_corpus(train)
print(json.dumps({
    "code": code, "agent": settings.agent, "agent_found": agent is not None,
    "steps": settings.grpo_steps, "tasks": [len(train), len(val)], "demos": len(demonstrations(train)),
    "corpus": len(corpus), "examples_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "examples"),
}))
"""


def test_the_package_never_imports_examples():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value] if node.value.startswith("examples.") and ":" in node.value else []
            offenders += [f"{path.relative_to(PACKAGE)}: {n}" for n in names if n.split(".")[0] == "examples"]
    assert offenders == []


def test_the_demo_entry_runs_without_the_repository_examples(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] == 0 and result["steps"] == 3 and result["agent_found"]
    assert result["agent"] == "lightrail.demos.calculator.train:calculator_agent"
    assert result["tasks"] == [20, 5] and result["demos"] == 20 and result["corpus"] == 20
    assert result["examples_loaded"] == []


def test_the_example_is_the_package_demo():
    """``examples/calculator`` re-exports the package's objects (configs naming either reach the same agent)."""
    import examples.calculator.agent as ex_agent
    import examples.calculator.data as ex_data
    import examples.calculator.demo as ex_demo
    import examples.calculator.train as ex_train
    from lightrail.demos.calculator import agent, data, demo, train

    assert ex_train.calculator_agent is train.calculator_agent
    assert ex_agent.solve is agent.solve and ex_data.make_splits is data.make_splits
    assert ex_demo.DemoSettings is demo.DemoSettings
