"""The host a WebFetch URL reaches, read as Claude Code's fetcher reads it (docs/claude-code.md; decision 39).

Claude Code fetches with Node, and Node reads a URL by the WHATWG URL standard; `ada-url` is the
parser Node itself is built on. Python's urllib reads some URLs otherwise: after a backslash
(`https://evil.example\\@docs.example.com/` is host `evil.example` to WHATWG and
`docs.example.com` to urllib), with percent-encoded or full-width letters, a trailing dot, an IPv4
address in hexadecimal or as one number. So a URL is read three ways, and:

- `host` is the WHATWG host, the one the fetcher connects to: rules allow on it, the approver is
  shown it;
- `readings` holds every plausible host (WHATWG, urllib, each piece of the authority around an
  `@`), each normalised as WHATWG would (lowercase, percent-decoded, IDNA to punycode, IPv4 to a
  dotted quad, an IPv4-mapped IPv6 address also as its IPv4 address) and without trailing dots: a
  deny or ask rule matches if any reading is its host;
- `unplain` says why no allow rule may match, or is None for a plain URL: printable ASCII, http or
  https, no userinfo, no backslash, one host that both parsers read alike, written as WHATWG
  writes it, and neither IPv6 nor an internationalised (punycode) name.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit

import ada_url

_SCHEMES = {"http:": 80, "https:": 443}
_PRINTABLE = re.compile(r"[!-~]+")  # printable ASCII: no blank, control, or non-ASCII character
_HOSTNAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_AUTHORITY = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:)?[\\/]*(?P<authority>[^/\\?#]*)")
_NOT_IN_A_HOST = re.compile(r"[\s/\\?#@]")


@dataclass(frozen=True, slots=True)
class HostReading:
    host: str | None
    """The WHATWG host (IPv6 in brackets), as the fetcher connects to it; None when WHATWG reads no host."""
    readings: frozenset[str]
    """Every plausible host, normalised: what deny and ask rules are judged on."""
    unplain: str | None
    """Why no allow rule may match this URL; None when it is plain."""


@functools.lru_cache(maxsize=256)  # each rule asks about the same URL
def read_host(url: str) -> HostReading:
    """Read a URL's host the fetcher's way and every other plausible way."""
    whatwg = _whatwg(url)
    host = (whatwg.hostname or None) if whatwg is not None else None
    try:
        split: SplitResult | None = urlsplit(url)
    except ValueError:
        split = None
    pieces = [host, split.hostname if split else None, *_authority_pieces(url)]
    readings = frozenset().union(*(host_forms(p) for p in pieces if p))
    return HostReading(host, readings, _why_unplain(url, whatwg, split))


def host_forms(host: str) -> frozenset[str]:
    """A host as written, percent-decoded and NFKC-folded, and as WHATWG would write it; lowercase,
    without trailing dots. A rule's domain and each reading of a URL go through this."""
    raw = host.strip().lower()
    decoded = unicodedata.normalize("NFKC", unquote(raw)).lower()
    forms = {raw, decoded}
    forms.update(c for c in (canonical_host(raw), canonical_host(decoded)) if c)
    forms.update(_mapped_ipv4(f) for f in list(forms) if f.startswith("["))
    return frozenset(f.rstrip(".") for f in forms if f.rstrip("."))


def _mapped_ipv4(host: str) -> str:
    """`[::ffff:7f00:1]` reaches 127.0.0.1 on a dual-stack socket: that address too (else "")."""
    try:
        mapped = ipaddress.IPv6Address(host.strip("[]")).ipv4_mapped
    except ValueError:
        return ""
    return str(mapped) if mapped else ""


def canonical_host(host: str) -> str | None:
    """The host WHATWG reads when `host` is written as a URL's authority; None if it reads none."""
    if not host or _NOT_IN_A_HOST.search(host):
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # urllib gives IPv6 without its brackets
    try:
        return ada_url.URL(f"http://{host}/").hostname or None
    except ValueError:
        return None


def check_domain(domain: str) -> None:
    """Raise ValueError unless `domain` (a rule's `domain:HOST`) is one host WHATWG can read."""
    if "*" in domain:
        raise ValueError("takes one host (no wildcards; list each host)")
    if canonical_host(domain.lower()) is None:
        raise ValueError("takes a host name or address (no scheme, port, path or user)")


def is_rule_host(domain: str, reading: HostReading) -> bool:
    """Allow side: the URL is plain and its WHATWG host is the rule's host exactly."""
    wanted = canonical_host(domain.lower())
    return reading.unplain is None and wanted is not None and reading.host == wanted.rstrip(".")


def reaches_rule_host(domain: str, reading: HostReading) -> bool:
    """Deny and ask side: some plausible reading of the URL's host is the rule's host."""
    return not host_forms(domain).isdisjoint(reading.readings)


def _whatwg(url: str) -> ada_url.URL | None:
    try:
        return ada_url.URL(url)
    except ValueError:
        return None


def _authority_pieces(url: str) -> list[str]:
    """The authority as a lenient reader might cut it: each side of every `@`, without port or password."""
    match = _AUTHORITY.match(url.replace("\t", "").replace("\n", "").replace("\r", "").strip())
    if match is None:
        return []
    pieces = []
    for piece in match.group("authority").split("@"):
        if piece.startswith("["):
            pieces.append(piece.split("]", 1)[0] + "]")
        else:
            pieces.append(piece.split(":", 1)[0])
    return [p for p in pieces if p]


def _why_unplain(url: str, whatwg: ada_url.URL | None, split: SplitResult | None) -> str | None:
    if not _PRINTABLE.fullmatch(url):
        return "characters outside printable ASCII (blanks, controls, unicode)"
    if "\\" in url:
        return "a backslash"
    if whatwg is None or split is None:
        return "not a URL the fetcher can read"
    if whatwg.protocol not in _SCHEMES:
        return f"scheme {whatwg.protocol} (only http and https)"
    if whatwg.username or whatwg.password or "@" in split.netloc:
        return "userinfo (user@host)"
    host = whatwg.hostname
    if not host:
        return "no host"
    if split.hostname != host:
        return "the parsers read different hosts"
    try:
        port = split.port
    except ValueError:
        return "a port the parsers read differently"
    if (port or _SCHEMES[whatwg.protocol]) != int(whatwg.port or _SCHEMES[whatwg.protocol]):
        return "a port the parsers read differently"
    if whatwg.host_type == ada_url.HostType.IPV6:
        return "an IPv6 address"
    if whatwg.host_type == ada_url.HostType.IPV4:
        return None  # both parsers read the same dotted quad: 0x7f.1 or 2130706433 differ above
    if host.endswith(".") or ".." in host:
        return "an empty label (trailing dot)"
    if not _HOSTNAME.fullmatch(host):
        return "a host name with characters other than letters, digits, '-', '_' and '.'"
    if any(label.startswith("xn--") for label in host.split(".")):
        return "an internationalised (punycode) name"
    return None
