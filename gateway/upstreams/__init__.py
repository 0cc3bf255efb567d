"""Upstream MCP servers behind the pipeline (docs/upstreams.md): the servers' tools and their pins."""
