"""Which hosts a run or an upstream server may reach through the gateway's proxy (docs/policy.md, "Network by domain"; decision 90).

`sandbox.network` (and an upstream's `network`) may be a mapping of host patterns: `allow`, `ask`,
`deny`, and `resolve` (host -> address overrides). A host is read as the WHATWG URL parser reads it
(`hosts.canonical_host`: lowercase, IDNA to punycode, `0x7f.1` to `127.0.0.1`), the same reading the
proxy connects to, so what a rule is judged on is what is reached. Patterns:

- `host`: that host alone; `*.host`: any name below `host`, at any depth, never `host` itself (list
  both when both are meant); `*`: any name; an IP literal (`10.0.0.5`, `[::1]`): that address;
- `:port` after any of them: that port alone; without one, 80 and 443 (a deny pattern: every port);
- `*` and `*.host` never match an IP literal: an address passes only where a rule names it.

Any deny pattern wins; then a pattern naming the host, ask over allow; then `*`, ask over allow; no rule =
refused (`decide`). After resolving, an address that is not public
(loopback, link-local and the metadata address, private, unspecified, shared, reserved, multicast)
is refused unless it came from `resolve` or the host is an IP literal a rule names (`refusal_for_address`):
a public name that resolves to 127.0.0.1 (DNS rebinding) does not pass.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from gateway.rules.hosts import canonical_host

DEFAULT_PORTS = (80, 443)
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Verdict(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class HostPattern:
    text: str
    """As written in the policy."""
    host: str
    """The WHATWG host without trailing dot ("" for `*`); for `*.x`, `x`."""
    below: bool
    """`*.x`: names below `host`, never `host` itself."""
    port: int | None
    """None: 80 and 443."""
    literal: bool
    """`host` is an IP literal (IPv6 in brackets)."""

    def matches(self, host: str, port: int, *, any_port: bool = False) -> bool:
        """Whether this pattern names `host` (a `read_host` result) on `port`; without a port of its own it stands
        for 80 and 443, or for every port with `any_port` (a deny pattern: `deny: [evil.example]` means all of it)."""
        if self.port is not None and port != self.port:
            return False
        if self.port is None and not any_port and port not in DEFAULT_PORTS:
            return False
        return self.names(host)

    def names(self, host: str) -> bool:
        """Whether this pattern names `host`, whatever the port."""
        if is_ip_literal(host):
            return self.literal and self.host == host
        if self.literal:
            return False
        if self.host == "":
            return True
        if self.below:
            return host.endswith("." + self.host)
        return host == self.host


@dataclass(frozen=True, slots=True)
class EgressRules:
    allow: tuple[HostPattern, ...] = ()
    ask: tuple[HostPattern, ...] = ()
    deny: tuple[HostPattern, ...] = ()
    resolve: Mapping[str, Address] = field(default_factory=lambda: MappingProxyType({}))
    """host (as `read_host` reads it) -> the address the proxy connects to instead of asking DNS."""


@dataclass(frozen=True, slots=True)
class HostDecision:
    verdict: Verdict
    rule: str | None
    """`deny: *.internal`, the list and the pattern that decided; None: no rule names the host."""
    hint: str | None = None
    """Why no rule matched when one nearly did (another port; an IP literal under `*`)."""


def read_host(text: str) -> str | None:
    """A request's host as the proxy connects to it: the WHATWG host, lowercase, without trailing dot; None when
    WHATWG reads no host in `text` (an IPv6 address comes in brackets)."""
    if not text or len(text) > 255:
        return None
    return _read_host(text)


@functools.lru_cache(maxsize=4096)
def _read_host(text: str) -> str | None:
    """`read_host` of a text of at most 255 characters, remembered (a pure function of it; at most 4,096 of them,
    about 1 MiB): the proxy reads a run's few hosts on every connection (decision 102)."""
    if ":" in text and not text.startswith("["):
        text = f"[{text}]"
    host = canonical_host(text)
    if host is None:
        return None
    host = host.rstrip(".")
    return host or None


def is_ip_literal(host: str) -> bool:
    return address_of(host) is not None


def address_of(host: str) -> Address | None:
    """The address an IP-literal host (`10.0.0.5`, `[::1]`) names; None for a name."""
    try:
        return ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        return None


def parse_pattern(text: str) -> HostPattern:
    """One host pattern; ValueError saying what is wrong with it."""
    host_part, port = _split_port(text)
    if host_part == "*":
        return HostPattern(text, "", below=False, port=port, literal=False)
    below = host_part.startswith("*.")
    if below:
        host_part = host_part[2:]
    if "*" in host_part:
        raise ValueError("a '*' stands alone or as the first label ('*' or '*.example.com')")
    host = read_host(host_part)
    if host is None:
        raise ValueError("is not a host the WHATWG URL parser reads (no scheme, path or user)")
    literal = is_ip_literal(host)
    if literal and below:
        raise ValueError("'*.' takes a domain name, not an IP address")
    return HostPattern(text, host, below=below, port=port, literal=literal)


def _split_port(text: str) -> tuple[str, int | None]:
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError("an IPv6 address needs its closing ']'")
        host, rest = text[: close + 1], text[close + 1 :]
    elif text.count(":") > 1:
        raise ValueError("write an IPv6 address in brackets ('[2001:db8::1]' or '[2001:db8::1]:8443')")
    else:
        host, colon, port_text = text.partition(":")
        rest = colon + port_text
    if not rest:
        return host, None
    digits = rest[1:]
    if not rest.startswith(":") or not digits.isascii() or not digits.isdigit() or not 1 <= int(digits) <= 65535:
        raise ValueError("a port is ':' and a number from 1 to 65535")
    return host, int(digits)


def parse_address(text: str) -> Address:
    """A `resolve` target: one IP address; ValueError otherwise."""
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        raise ValueError("must be an IP address (resolve maps a name to an address)") from None


def decide(rules: EgressRules, host: str, port: int) -> HostDecision:
    """Any deny pattern wins; then a pattern that names the host (ask over allow); then `*` (ask over allow); no
    rule that names the host on this port refuses it. So `allow: [pypi.org]` with `ask: ["*"]` lets pypi.org
    through and asks for the rest, as docs/policy.md's example means (decision 90)."""
    tiers = (
        (Verdict.DENY, rules.deny, None),
        (Verdict.ASK, rules.ask, False),
        (Verdict.ALLOW, rules.allow, False),
        (Verdict.ASK, rules.ask, True),
        (Verdict.ALLOW, rules.allow, True),
    )
    for verdict, patterns, catch_all in tiers:
        for pattern in patterns:
            deny = catch_all is None
            if (deny or (pattern.host == "") == catch_all) and pattern.matches(host, port, any_port=deny):
                return HostDecision(verdict, f"{verdict}: {pattern.text}")
    return HostDecision(Verdict.DENY, None, _near_miss(rules, host, port))


def _near_miss(rules: EgressRules, host: str, port: int) -> str | None:
    listed = (*rules.allow, *rules.ask)
    if any(p.names(host) for p in listed):
        return f"port {port} is not named: a pattern without ':port' stands for 80 and 443 (add '{host}:{port}')"
    if is_ip_literal(host) and any(p.host == "" for p in listed):
        return f"'*' never matches an IP address: name the address itself ('{host}') if it is meant"
    return None


def refusal_for_address(address: Address) -> str | None:
    """Why a resolved address is refused (a name's: not from `resolve`, not an IP literal a rule names); None when
    it is a public address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return refusal_for_address(embedded)
    for test, what in (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local (the cloud metadata address among them)"),
        (address.is_multicast, "multicast"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
    ):
        if test:
            return what
    if not address.is_global:
        return "not public"
    return None


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches: mapped (`::ffff:a.b.c.d`), NAT64, 6to4, Teredo's server side."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None
