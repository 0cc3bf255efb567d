"""The server name a TLS ClientHello asks for (RFC 8446 4.1.2, RFC 6066 3), read from a tunnel's first bytes (decision 90).

The proxy lets a `CONNECT host:443` through only when the TLS handshake that follows names the same host
(or none): a ClientHello for another name behind an allowed host's address is domain fronting. Only
what the check needs is read: the handshake message, reassembled from its records, up to `MAX_HELLO`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MAX_HELLO = 64 * 1024
"""The largest ClientHello the proxy reads (one with post-quantum key shares is about 2 KiB)."""

_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_SERVER_NAME = 0x0000
_HOST_NAME = 0x00


class HelloState(StrEnum):
    MORE = "more"
    """Not all of the ClientHello has come yet."""
    NOT_TLS = "not_tls"
    """The tunnel does not start with a TLS handshake: nothing to check."""
    HELLO = "hello"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class Hello:
    state: HelloState
    server_name: str | None = None
    """The SNI host name as sent (ASCII), None when the ClientHello has none."""


class _Malformed(Exception):
    pass


def read_hello(data: bytes) -> Hello:
    """What `data`, a tunnel's first bytes from the client, says of the server name it asks for."""
    if not data:
        return Hello(HelloState.MORE)
    if data[0] != _HANDSHAKE:
        return Hello(HelloState.NOT_TLS)
    try:
        message = _handshake_message(data)
        if message is None:
            return Hello(HelloState.MORE)
        return Hello(HelloState.HELLO, _server_name(message))
    except _Malformed:
        return Hello(HelloState.MALFORMED)


def _handshake_message(data: bytes) -> bytes | None:
    """The ClientHello's body, reassembled from its records; None until all of it has come."""
    body = bytearray()
    at = 0
    while True:
        if len(data) < at + 5:
            return None
        if data[at] != _HANDSHAKE or data[at + 1] != 0x03:
            raise _Malformed
        length = int.from_bytes(data[at + 3 : at + 5], "big")
        if length == 0 or length > 16384 + 2048:
            raise _Malformed
        if len(data) < at + 5 + length:
            return None
        body += data[at + 5 : at + 5 + length]
        at += 5 + length
        if len(body) >= 4:
            if body[0] != _CLIENT_HELLO:
                raise _Malformed
            size = int.from_bytes(body[1:4], "big")
            if size > MAX_HELLO:
                raise _Malformed
            if len(body) >= 4 + size:
                return bytes(body[4 : 4 + size])
        if at > MAX_HELLO + 4096:
            raise _Malformed


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise _Malformed
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))

    @property
    def done(self) -> bool:
        return self.at == len(self.data)


def _server_name(message: bytes) -> str | None:
    hello = _Reader(message)
    hello.take(2 + 32)  # legacy_version, random
    hello.vector(1)  # legacy_session_id
    hello.vector(2)  # cipher_suites
    hello.vector(1)  # legacy_compression_methods
    if hello.done:
        return None  # no extensions at all
    extensions = _Reader(hello.vector(2))
    if not hello.done:
        raise _Malformed
    names: list[str] = []
    seen: set[int] = set()
    while not extensions.done:
        kind = extensions.number(2)
        data = extensions.vector(2)
        if kind in seen:
            raise _Malformed  # a repeated extension: which one the server reads is not ours to guess
        seen.add(kind)
        if kind == _SERVER_NAME:
            names.extend(_names(data))
    if len(names) > 1:
        raise _Malformed
    return names[0] if names else None


def _names(data: bytes) -> list[str]:
    listed = _Reader(data)
    entries = _Reader(listed.vector(2))
    if not listed.done:
        raise _Malformed
    out = []
    while not entries.done:
        kind = entries.number(1)
        name = entries.vector(2)
        if kind != _HOST_NAME or not name:
            raise _Malformed
        try:
            out.append(name.decode("ascii"))
        except UnicodeDecodeError:
            raise _Malformed from None
    return out
