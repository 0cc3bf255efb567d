"""`sandbox.network` and an upstream's `network` read from policy.yaml (docs/policy.md, "Network by domain"): false, true, or a mapping of host rules.

gateway/policy.py and gateway/upstream_policy.py read the key with `read_network`; the rules themselves are
pure values (gateway/rules/egress.py), which the proxy (gateway/proxy/) applies to every connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import yaml

from gateway.policy_nodes import NodeReader
from gateway.rules.egress import (
    Address,
    EgressRules,
    HostPattern,
    is_ip_literal,
    parse_address,
    parse_pattern,
    read_host,
)

NETWORK_KEYS = ("allow", "ask", "deny", "resolve")


@dataclass(frozen=True, slots=True)
class Network:
    """What `network` says: the host's whole network (`open`), or the proxy's rules (`rules`), or neither."""

    open: bool = False
    rules: EgressRules | None = None


def read_network(r: NodeReader, node: yaml.Node, what: str) -> Network:
    """`false`, `true`, or `{allow, ask, deny, resolve}`: every pattern and address checked, with file:line errors."""
    if not isinstance(node, yaml.MappingNode):
        value = r.scalar(node, what)
        if not isinstance(value, bool):
            raise r.fail(
                node, f"{what} must be true or false, or a mapping of {', '.join(NETWORK_KEYS)} (found {value!r})"
            )
        return Network(open=value)
    d = r.mapping(node, what, NETWORK_KEYS)

    def patterns(key: str) -> tuple[HostPattern, ...]:
        if key not in d:
            return ()
        out = []
        for text, item in r.strings(d[key], f"{what}.{key}"):
            try:
                out.append(parse_pattern(text))
            except ValueError as exc:
                raise r.fail(item, f"{text!r} in {what}.{key}: {exc}") from None
        return tuple(out)

    resolve: dict[str, Address] = {}
    if "resolve" in d:
        for name, value in r.mapping(d["resolve"], f"{what}.resolve", None).items():
            host = read_host(name)
            if host is None or is_ip_literal(host) or "*" in name or ":" in name:
                raise r.fail(value, f"{name!r} in {what}.resolve is not a host name (no pattern, port or scheme)")
            text = r.string(value, f"{what}.resolve.{name}")
            try:
                resolve[host] = parse_address(text)
            except ValueError as exc:
                raise r.fail(value, f"{what}.resolve.{name}: {text!r} {exc}") from None
    return Network(
        rules=EgressRules(
            allow=patterns("allow"), ask=patterns("ask"), deny=patterns("deny"), resolve=MappingProxyType(resolve)
        )
    )


def describe_network(network: Network) -> str:
    """One line for `policy explain` and a consent prompt: what a run (or a server) may reach."""
    if network.rules is None:
        return "the host's network" if network.open else "no network"
    rules = network.rules
    parts = [
        f"{key}: {', '.join(p.text for p in patterns)}"
        for key, patterns in (("deny", rules.deny), ("ask", rules.ask), ("allow", rules.allow))
        if patterns
    ]
    if rules.resolve:
        parts.append("resolve: " + ", ".join(f"{h} -> {a}" for h, a in sorted(rules.resolve.items())))
    return "through the gateway's proxy (" + ("; ".join(parts) or "no host") + ")"
