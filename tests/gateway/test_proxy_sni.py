"""gateway/proxy/sni.py: the server name of real ClientHellos (Python's ssl writes them), whole, cut, split across
records, and forged into shapes a server might read otherwise."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable

import pytest

from gateway.proxy.sni import Hello, HelloState, read_hello


def client_hello(server_name: str | None) -> bytes:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    context = ssl.create_default_context()
    if server_name is None:
        context.check_hostname = False
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_whole_client_hello_names_its_server_and_a_cut_one_asks_for_more() -> None:
    hello = client_hello("pypi.org")
    assert read_hello(hello) == Hello(HelloState.HELLO, "pypi.org")
    assert all(read_hello(hello[:n]).state is HelloState.MORE for n in (0, 1, 5, 40, len(hello) - 1))
    assert read_hello(client_hello(None)) == Hello(HelloState.HELLO, None)


def test_a_client_hello_split_across_records_is_put_back_together() -> None:
    hello = client_hello("files.pythonhosted.org")
    body = hello[5:]
    first, second = body[:30], body[30:]
    split = (
        b"\x16\x03\x01"
        + len(first).to_bytes(2, "big")
        + first
        + b"\x16\x03\x01"
        + len(second).to_bytes(2, "big")
        + second
    )
    assert read_hello(split) == Hello(HelloState.HELLO, "files.pythonhosted.org")


def test_bytes_that_are_not_a_handshake_are_not_tls() -> None:
    assert read_hello(b"SSH-2.0-OpenSSH\r\n").state is HelloState.NOT_TLS
    assert read_hello(b"GET / HTTP/1.1\r\n").state is HelloState.NOT_TLS


def with_extension(hello: bytes, extension: bytes) -> bytes:
    """`hello` with `extension` appended to its extensions, every length fixed up."""
    body = bytearray(hello[9:])  # past the record header and the handshake header
    at = 2 + 32
    at += 1 + body[at]
    at += 2 + int.from_bytes(body[at : at + 2], "big")
    at += 1 + body[at]
    length = int.from_bytes(body[at : at + 2], "big")
    body[at : at + 2] = (length + len(extension)).to_bytes(2, "big")
    body += extension
    handshake = b"\x01" + len(body).to_bytes(3, "big") + bytes(body)
    return b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake


def sni(*names: bytes, kind: int = 0) -> bytes:
    entries = b"".join(bytes([kind]) + len(n).to_bytes(2, "big") + n for n in names)
    listed = len(entries).to_bytes(2, "big") + entries
    return b"\x00\x00" + len(listed).to_bytes(2, "big") + listed


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(lambda h: with_extension(h, sni(b"evil.test")), id="a second server-name extension"),
        pytest.param(lambda h: h[:5] + b"\x02" + h[6:], id="not a ClientHello"),
        pytest.param(lambda h: h[:1] + b"\x09" + h[2:], id="not TLS 1.x record"),
        pytest.param(lambda h: h[:3] + b"\x00\x00" + h[5:], id="an empty record"),
    ],
)
def test_a_forged_client_hello_is_malformed_never_read_one_way(forged: Callable[[bytes], bytes]) -> None:
    hello = client_hello("a.test")
    assert read_hello(forged(hello)).state is HelloState.MALFORMED


def test_two_names_in_one_extension_or_a_name_of_another_kind_are_malformed() -> None:
    plain = client_hello(None)
    assert read_hello(with_extension(plain, sni(b"a.test"))) == Hello(HelloState.HELLO, "a.test")
    assert read_hello(with_extension(plain, sni(b"a.test", b"b.test"))).state is HelloState.MALFORMED
    assert read_hello(with_extension(plain, sni(b"a.test", kind=1))).state is HelloState.MALFORMED
    assert read_hello(with_extension(plain, sni("ü.test".encode()))).state is HelloState.MALFORMED
