"""The solver's imperfect teacher, a program: the calculator demo's scripted teacher, calling the calculator by
the name Semantic Kernel gives it (``calculator-evaluate``).

It answers the way `examples.calculator.teacher.demonstration` does: usually a calculator call on the problem's
expression, then ``Answer: <result>``; sometimes no tool and a slipped digit, and on two problem shapes mostly the
wrong expression (``SYSTEMATIC``): a student that imitates it inherits those habits, and GRPO has them to fix.

``sft.teacher: {script: examples.sk_agent.teacher:teacher}`` in a config distils a student from it: SFT runs the
Semantic Kernel agent (in its own environment, ``runner_python``) with this teacher as its model, through the
runners and the gateway. The teacher runs in the trainer's process and imports nothing of Semantic Kernel.
"""

from __future__ import annotations

from typing import Any

from examples.calculator.teacher_server import teacher_script
from examples.sk_agent.prompts import TOOL
from lightrail.gateway.fake import ScriptedBackend, ScriptedReply

__all__ = ["teacher"]


def teacher(tasks: list[dict], *, seed: int = 0, **rates: float) -> ScriptedBackend:
    """A gateway backend (model name ``teacher``) answering the solver's calls on ``tasks`` as the imperfect
    teacher (``rates``: see `examples.calculator.teacher.demonstration`)."""
    solver = teacher_script(tasks, seed=seed, **rates)

    def script(request: Any) -> str | ScriptedReply:
        reply = solver(request)
        if isinstance(reply, ScriptedReply) and reply.tool_calls:
            return ScriptedReply(tool_calls=[(TOOL, arguments) for _, arguments in reply.tool_calls])
        return reply

    return ScriptedBackend(script, model="teacher")
