"""The egress proxy (docs/security-model.md, "Network by domain"; decision 90): a run's or an upstream server's only way out.

- `server.py`: `serve_proxy`, one run's listener served until cancelled, and `NetConnect`, what NET_CONNECT records;
- `http.py`: HTTP/1.1 heads read strictly and rewritten for the next hop;
- `sni.py`: the server name a TLS ClientHello asks for.

The rules it applies are pure values (gateway/rules/egress.py); who calls it hands it a listener, the rules,
the caps and where each connection's record goes.
"""

from gateway.proxy.server import (
    Asker,
    ConnectionLog,
    NetConnect,
    NobodyToAsk,
    OpenConnection,
    Outcome,
    ProxyLimits,
    RefusedFor,
    proxy_starter,
    serve_proxy,
)

__all__ = [
    "Asker",
    "ConnectionLog",
    "NetConnect",
    "NobodyToAsk",
    "OpenConnection",
    "Outcome",
    "ProxyLimits",
    "RefusedFor",
    "proxy_starter",
    "serve_proxy",
]
