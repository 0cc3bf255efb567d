"""`python -m gateway` is the `mcp-gateway` command (README.md)."""

from gateway.cli import main

raise SystemExit(main())
