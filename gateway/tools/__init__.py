"""The gateway's tools: the catalogue in `registry`, one module per implementation."""
