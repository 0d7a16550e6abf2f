"""The calculator as an MCP server (stdio transport), so the agent can use it as a separate process.

The tool is the same safe evaluator the in-process path uses (`examples.calculator.agent.calculate`): ``+ - *``
and parentheses parsed with `ast`, never `eval`. Bad input raises `ToolError` (an anticipated failure: no
traceback in the server's log), so the MCP result is marked ``is_error`` and its text reads ``Error executing
tool calculator: ...`` (what a client, and lightrail's `looks_like_error`, recognise as a failed call).

The agent spawns it itself (`examples.calc_agent.agent.mcp_server_params`); to try it by hand::

    python -m examples.calc_agent.mcp_server      # speaks MCP on stdin/stdout
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from examples.calculator.agent import calculate

server = MCPServer("calculator", instructions="Exact integer arithmetic with + - * and parentheses.")


@server.tool(description="Evaluate an arithmetic expression with + - * and parentheses, e.g. '12+30*2'.")
def calculator(expression: str) -> str:
    """The expression's value as text; raises for anything that is not ``+ - *`` arithmetic."""
    result = calculate(expression) if expression.strip() else "Error: empty expression"
    if result.startswith("Error"):
        raise ToolError(result.removeprefix("Error: "))
    return result


if __name__ == "__main__":
    server.run("stdio")
