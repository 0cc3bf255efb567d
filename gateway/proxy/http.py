"""HTTP/1.1 heads as the proxy reads and writes them (RFC 9112; decision 90): strict, bounded, no guessing.

A request head the proxy cannot read one way only (a folded line, a bare CR, two Content-Lengths that
differ, Content-Length with Transfer-Encoding, a Host header naming another host than the URL) is
refused with 400 rather than passed on for the server to read otherwise.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import ada_url

from gateway.rules.egress import read_host

MAX_HEAD = 64 * 1024
"""A request's or a response's head, start line and headers: larger is refused (431 or 502)."""

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "upgrade"}
)  # fmt: skip
"""Headers for one hop only (RFC 9110 7.6.1), dropped both ways; Transfer-Encoding stays with the body it frames."""

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_VERSION = re.compile(rb"HTTP/1\.[01]")


class BadRequest(Exception):
    """A head the proxy refuses to read: `status` and why, for the 4xx it answers with."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


@dataclass(frozen=True, slots=True)
class Head:
    start: tuple[bytes, bytes, bytes]
    """The start line's three parts (method, target, version; or version, status, reason)."""
    headers: tuple[tuple[bytes, bytes], ...]

    def values(self, name: bytes) -> list[bytes]:
        return [v for n, v in self.headers if n.lower() == name]


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes: the host as the proxy connects to it, the port, and the origin-form path."""

    host: str
    port: int
    path: bytes = b""
    """The request target the origin server gets (`/path?query`); empty for CONNECT."""


def parse_head(raw: bytes, *, response: bool = False) -> Head:
    """A head, `raw` ending with its blank line. Raises BadRequest."""
    lines = raw[:-4].split(b"\r\n") if raw.endswith(b"\r\n\r\n") else None
    if lines is None or any(b"\r" in line or b"\n" in line or b"\0" in line for line in lines):
        raise BadRequest(400, "lines must end with CRLF, without a bare CR, LF or NUL")
    parts = lines[0].split(b" ", 2)
    if len(parts) != 3:
        raise BadRequest(400, "the start line must have three parts")
    start = (parts[0], parts[1], parts[2])
    if response:
        if not _VERSION.fullmatch(start[0]) or not re.fullmatch(rb"[1-5][0-9][0-9]", start[1]):
            raise BadRequest(502, "the server's status line is not HTTP/1.x")
    elif not _TOKEN.fullmatch(start[0]) or not _VERSION.fullmatch(start[2]) or not start[1]:
        raise BadRequest(400, "the request line must be METHOD TARGET HTTP/1.x")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise BadRequest(400, "a header line is not 'Name: value' (folded lines are refused)")
        value = value.strip(b" \t")
        if not _VALUE.fullmatch(value):
            raise BadRequest(400, "a header value holds a control character")
        headers.append((name, value))
    return Head(start, tuple(headers))


def connect_target(head: Head) -> Target:
    """`CONNECT host:port`: the authority-form target, a port required."""
    authority = head.start[1].decode("ascii", "replace")
    host_text, sep, port_text = authority.rpartition(":")
    if not sep or not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise BadRequest(400, "CONNECT takes host:port")
    host = read_host(host_text)
    if host is None or "@" in host_text or "/" in host_text:
        raise BadRequest(400, "CONNECT names no host the WHATWG URL parser reads")
    return Target(host, int(port_text))


def request_target(head: Head) -> Target:
    """An absolute-form `http://host[:port]/path` target; its Host header, if any, must name the same host and port."""
    raw = head.start[1]
    try:
        text = raw.decode("ascii")
        url = ada_url.URL(text)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest(400, "the request target is not an absolute http:// URL") from None
    if url.protocol != "http:" or not text.lower().startswith("http://"):
        raise BadRequest(400, "a proxy request names an http:// URL (https goes through CONNECT)")
    if url.username or url.password:
        raise BadRequest(400, "a URL with a user or password is refused")
    host = read_host(url.hostname)
    if host is None:
        raise BadRequest(400, "the URL names no host")
    port = int(url.port or 80)
    path = (url.pathname or "/") + url.search
    hosts = head.values(b"host")
    if len(hosts) > 1:
        raise BadRequest(400, "more than one Host header")
    if hosts and _host_header(hosts[0]) != (host, port):
        raise BadRequest(400, "the Host header names another host than the URL")
    return Target(host, port, path.encode("ascii"))


def _host_header(value: bytes) -> tuple[str | None, int] | None:
    """The host and port a Host header names; None when it names none. One of at most HOST_KEPT bytes is
    remembered (a pure function of the bytes, read on every connection; decision 102); a longer one is read anew."""
    return _read_host_header(value) if len(value) > HOST_KEPT else _kept_host_header(value)


HOST_KEPT = 300
"""The longest Host header whose reading is remembered (4,096 of them at most: about 1 MiB)."""


@functools.lru_cache(maxsize=4096)
def _kept_host_header(value: bytes) -> tuple[str | None, int] | None:
    return _read_host_header(value)


def _read_host_header(value: bytes) -> tuple[str | None, int] | None:
    try:
        url = ada_url.URL("http://" + value.decode("ascii") + "/")
    except (UnicodeDecodeError, ValueError):
        return None
    if url.username or url.password or url.pathname != "/" or url.search:
        return None
    return read_host(url.hostname), int(url.port or 80)


def body_framing(head: Head) -> int | None:
    """The request body's length, or None for a chunked body. Raises BadRequest on framing read two ways."""
    encodings = head.values(b"transfer-encoding")
    lengths = head.values(b"content-length")
    if encodings:
        if lengths:
            raise BadRequest(400, "Content-Length and Transfer-Encoding together")
        if [e.strip().lower() for e in b",".join(encodings).split(b",")] != [b"chunked"]:
            raise BadRequest(501, "a Transfer-Encoding other than chunked")
        return None
    if not lengths:
        return 0
    values = {v.strip() for v in b",".join(lengths).split(b",")}
    if len(values) != 1:
        raise BadRequest(400, "Content-Length values that differ")
    value = values.pop()
    if not value.isdigit() or len(value) > 15:
        raise BadRequest(400, "a Content-Length that is not a number")
    return int(value)


UNTIL_CLOSE = -1
"""A response body that ends when the origin closes (no length, no chunked coding)."""


def response_framing(head: Head, method: bytes) -> int | None:
    """The response body's length, None for chunked, UNTIL_CLOSE when only the origin's close ends it (RFC 9112
    6.3). Raises BadRequest (502) on a length read two ways."""
    status = head.start[1]
    if method == b"HEAD" or status in (b"204", b"304"):
        return 0
    encodings = [e.strip().lower() for e in b",".join(head.values(b"transfer-encoding")).split(b",") if e.strip()]
    if encodings:
        return None if encodings[-1] == b"chunked" else UNTIL_CLOSE
    lengths = head.values(b"content-length")
    if not lengths:
        return UNTIL_CLOSE
    values = {v.strip() for v in b",".join(lengths).split(b",")}
    value = values.pop()
    if values or not value.isdigit() or len(value) > 15:
        raise BadRequest(502, "the origin's Content-Length is not one number")
    return int(value)


def forwarded_request(head: Head, target: Target) -> bytes:
    """The request head the origin server gets: origin-form, its Host, no hop-by-hop header, Connection: close."""
    dropped = _dropped(head)
    lines = [b" ".join((head.start[0], target.path, b"HTTP/1.1"))]
    lines.append(b"Host: " + _authority(target).encode("ascii"))
    lines += [n + b": " + v for n, v in head.headers if n.lower() not in dropped and n.lower() != b"host"]
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def forwarded_response(head: Head) -> bytes:
    """The response head the client gets: no hop-by-hop header, Connection: close (one request per connection)."""
    dropped = _dropped(head)
    lines = [b" ".join(head.start)]
    lines += [n + b": " + v for n, v in head.headers if n.lower() not in dropped]
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _dropped(head: Head) -> frozenset[bytes]:
    named = {t.strip().lower() for v in head.values(b"connection") for t in v.split(b",")}
    return frozenset({h.encode() for h in HOP_BY_HOP} | named) - {b"transfer-encoding", b""}


def _authority(target: Target) -> str:
    return target.host if target.port == 80 else f"{target.host}:{target.port}"


def refusal(status: int, text: str) -> bytes:
    """A complete response the proxy answers with itself: `text` as its body, the connection then closed."""
    reasons = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 501: "Not Implemented",
               502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}  # fmt: skip
    body = (text + "\n").encode("utf-8", "replace")
    return (
        f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nX-Mcp-Gateway-Proxy: refused\r\n\r\n"
    ).encode("ascii") + body
