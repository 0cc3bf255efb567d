"""mcp-write-gateway: a stdio MCP server that puts auth, policy, budget, consent and a sandbox
in front of write tools (README.md, docs/architecture.md)."""

__version__ = "0.1.0"
