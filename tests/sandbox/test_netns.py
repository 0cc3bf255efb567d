"""No network in a fresh network namespace: TCP and UDP to a listener the test opened both fail."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from sandbox.backends.identity import RunIdentity
from sandbox.backends.netns import network_namespace_available
from tests.sandbox.confined_child import confine, leased_identity, requires_root, resource_limits, run_python

pytestmark = requires_root

TCP_CONNECT = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
    print("connected")
except OSError as exc:
    print("refused", exc.errno)
"""

UDP_SEND = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.sendto(b"leak", ("127.0.0.1", int(sys.argv[1])))
    print("sent")
except OSError as exc:
    print("refused", exc.errno)
"""


@pytest.fixture
def who() -> Iterator[RunIdentity]:
    with leased_identity() as leased:
        yield leased


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(5)
        yield listener


@pytest.fixture
def udp_receiver() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind(("127.0.0.1", 0))
        receiver.settimeout(5)
        yield receiver


def test_network_namespaces_are_available_here() -> None:
    assert network_namespace_available()


def test_tcp_connect_to_the_tests_listener_fails_inside_the_netns(
    who: RunIdentity, tcp_listener: socket.socket
) -> None:
    port = str(tcp_listener.getsockname()[1])
    result = run_python(TCP_CONNECT, confine(who, resource_limits()), port)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "refused"


def test_tcp_connect_works_without_the_netns(who: RunIdentity, tcp_listener: socket.socket) -> None:
    """The control: the same dropped child without the namespace reaches the listener."""
    port = str(tcp_listener.getsockname()[1])
    result = run_python(TCP_CONNECT, confine(who, resource_limits(), network=True), port)
    assert result.stdout.strip() == "connected", result.stderr
    tcp_listener.accept()[0].close()


def test_udp_sendto_fails_inside_the_netns(who: RunIdentity, udp_receiver: socket.socket) -> None:
    port = str(udp_receiver.getsockname()[1])
    result = run_python(UDP_SEND, confine(who, resource_limits()), port)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "refused"
    udp_receiver.settimeout(0.2)
    with pytest.raises(TimeoutError):
        udp_receiver.recvfrom(16)


def test_udp_sendto_arrives_without_the_netns(who: RunIdentity, udp_receiver: socket.socket) -> None:
    port = str(udp_receiver.getsockname()[1])
    result = run_python(UDP_SEND, confine(who, resource_limits(), network=True), port)
    assert result.stdout.strip() == "sent", result.stderr
    assert udp_receiver.recvfrom(16)[0] == b"leak"
