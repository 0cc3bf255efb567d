"""The suite's fork helper (tests/forked_gateway.py) ends as soon as its pytest process lets it go.

Each pytest process stops its helper as its session ends (tests/conftest.py); a helper that missed
its socket's end was killed only after 30 s, which every worker of `make unit` then waited out."""

from __future__ import annotations

import os

from tests import forked_gateway


def test_a_helper_exits_by_itself_when_closed_while_its_reader_waits_for_a_message() -> None:
    helper = forked_gateway._Helper(bare=True)  # what it preloads is no part of its ending (0.35 s of CPU)
    try:
        null = os.open(os.devnull, os.O_RDWR)
        try:
            pid = helper.fork(forked_gateway._request(["--no-such-option"], None, serve=False), (null, null, null))
        finally:
            os.close(null)
        assert helper.returncode(pid, 60) == 2  # argparse's usage error: the command ran and was reaped
        assert helper.reader.is_alive()  # back in its recv, waiting for the next message
    finally:
        helper.close()
    assert helper.process.returncode == 0, "killed at close's deadline: it never read the socket's end"
    helper.reader.join(10)
    assert not helper.reader.is_alive()
