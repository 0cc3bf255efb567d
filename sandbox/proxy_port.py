"""Where a proxied run finds the gateway's proxy: one address, the same in every run's namespace (decision 89).

A run with `Limits.proxy` has a network namespace of its own whose only interface is its loopback;
the gateway's listener is bound there, at PROXY_PORT, before the command starts
(sandbox/backends/proxy_listener.py). The run's environment names it (`proxy_environment`), and
nothing the policy's `env` says can point a run elsewhere or exempt a host from it.
"""

from __future__ import annotations

from collections.abc import Mapping

PROXY_HOST = "127.0.0.1"
PROXY_PORT = 3128
PROXY_URL = f"http://{PROXY_HOST}:{PROXY_PORT}"
PROXY_BACKLOG = 128
"""Connections the kernel completes before the gateway accepts them; past it, a run's connect waits."""

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
"""Set to PROXY_URL in a proxied run's environment, whatever the policy's `env` says."""


def proxy_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with every proxy variable set to PROXY_URL, and every other `*_proxy` name removed, in any case.

    Python's urllib reads these names case-insensitively (`No_Proxy`, `Http_Proxy`), so `NO_PROXY` and
    `no_proxy` alone would not be enough: no host goes around the proxy, none is sent elsewhere."""
    out = {name: value for name, value in env.items() if not name.lower().endswith("_proxy")}
    out.update(dict.fromkeys(PROXY_VARIABLES, PROXY_URL))
    return out
