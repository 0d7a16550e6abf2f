"""The calculator team's imperfect teacher, a program: the calculator demo's scripted teacher playing the solver,
and a checker that approves.

As the solver it answers the way `examples.calculator.teacher.demonstration` does: usually a calculator call on
the problem's expression, then ``Answer: <result>``; sometimes no tool and a slipped digit, and on two problem
shapes mostly the wrong expression (``SYSTEMATIC``): a student that imitates it inherits those habits, and GRPO
has them to fix. As the checker it replies ``CORRECT``, so a chat ends after the solver's first answer.

``sft.teacher: {script: examples.calc_agent.teacher:teacher}`` in a config distils a student from it: SFT runs the
AutoGen team with this teacher as its model, through the runners and the gateway, and keeps the right answers.
"""

from __future__ import annotations

from typing import Any

from examples.calc_agent.agent import CHECKER_SYSTEM
from examples.calculator.teacher_server import teacher_script
from lightrail.gateway.fake import ScriptedBackend, ScriptedReply

__all__ = ["teacher"]


def teacher(tasks: list[dict], *, seed: int = 0, **rates: float) -> ScriptedBackend:
    """A gateway backend (model name ``teacher``) answering the team's calls on ``tasks`` as the imperfect teacher
    (``rates``: see `examples.calculator.teacher.demonstration`)."""
    solver = teacher_script(tasks, seed=seed, **rates)

    def script(request: Any) -> str | ScriptedReply:
        system = next((m.get("content") for m in request.messages if m.get("role") == "system"), None)
        return "CORRECT" if system == CHECKER_SYSTEM else solver(request)

    return ScriptedBackend(script, model="teacher")
