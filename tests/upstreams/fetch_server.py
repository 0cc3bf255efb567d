"""An upstream MCP server for the network tests (docs/policy.md, "Network by domain"): one tool, `fetch`, urllib as any client.

urllib reads HTTP_PROXY from the environment the sandbox gives a proxied server; the answer is the status and
the body (or the error), as JSON text; with `then`, a second URL fetched once the first has ended, both answers. The tests copy it beside the policy with their interpreter on its `#!` line.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

FETCH = types.Tool(
    name="fetch",
    description="Fetch a URL",
    input_schema={
        "type": "object",
        "properties": {"url": {"type": "string"}, "later": {"type": "boolean"}, "then": {"type": "string"}},
        "required": ["url"],
    },
    annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=True),
)


def fetch(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:  # noqa: S310  (the test's own http:// URL)
            return {"status": response.status, "body": response.read().decode()}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read().decode()}
    except OSError as exc:
        return {"status": None, "body": f"{type(exc).__name__}: {exc}"}


async def list_tools(
    _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[FETCH])


async def call_tool(_ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    url = str(arguments.get("url", ""))
    if arguments.get("later"):  # the server's own traffic: fetched a second after the call has ended

        def later() -> None:
            time.sleep(1)
            fetch(url)

        threading.Thread(target=later, daemon=True).start()
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps({"later": url}))])
    answer = await anyio.to_thread.run_sync(fetch, url)
    if arguments.get("then"):  # a second fetch after the first ended, in the same call
        answer = {"first": answer, "then": await anyio.to_thread.run_sync(fetch, str(arguments["then"]))}
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(answer))])


async def main() -> None:
    server: Server[Any] = Server("test-fetch", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
