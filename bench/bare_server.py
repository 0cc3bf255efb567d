"""The baseline for bench/stdio_refusals.py: a bare MCP SDK server that answers every tools/call at once.

Nothing but the SDK: the lowlevel `Server` over the SDK's own `stdio_server`, one tool,
no authentication, database or audit. Whatever the gateway adds per call is measured
against this. bench/upstream_cost.py also puts it behind the gateway as an upstream whose own
time is about nil (`--tool NAME` names its one tool; it says it is read-only and closed world).
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

_TOOL = types.Tool(
    name=sys.argv[2] if sys.argv[1:2] == ["--tool"] else "run_pytest",
    description="Answers at once; runs nothing.",
    input_schema={"type": "object", "properties": {"test_path": {"type": "string"}}},
    annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
)


async def list_tools(
    _ctx: ServerRequestContext[Any, Any], _params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[_TOOL])


async def call_tool(_ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"{params.name}: ok")])


async def serve() -> None:
    server: Server[Any] = Server("bare-sdk-server", version="0", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve)
