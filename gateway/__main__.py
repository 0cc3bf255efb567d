"""`python -m gateway` is the `mcp-gateway` command (spec section 1)."""

from gateway.cli import main

raise SystemExit(main())
