"""The words the Semantic Kernel solver (`agent.py`) and its teacher program (`teacher.py`) share: the agent's name,
its instructions and its tool's name. No Semantic Kernel import: the teacher and the data run in the trainer's
environment, which has no Semantic Kernel (it runs in ``.venv-sk``)."""

from __future__ import annotations

SOLVER = "solver"
PLUGIN = "calculator"
FUNCTION = "evaluate"
TOOL = f"{PLUGIN}-{FUNCTION}"
"""The tool's name in the model's requests: Semantic Kernel's ``<plugin>-<function>``."""

SOLVER_SYSTEM = (
    "Solve the arithmetic word problem. Call the calculator with the arithmetic expression, "
    "then reply with 'Answer: <number>'."
)
EVALUATE_DESCRIPTION = "Evaluate an arithmetic expression with + - * and parentheses, e.g. '12+30*2'."
EXPRESSION_DESCRIPTION = "The arithmetic expression, e.g. '12+30*2'."
