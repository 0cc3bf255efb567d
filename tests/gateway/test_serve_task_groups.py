"""The stdio transport's task group (gateway/transport.py): what fails inside it leaves as itself.

Run in a child process: `stdio_transport` takes over the process's fd 0 and fd 1 while it is open.
"""

from __future__ import annotations

import subprocess
import sys

from tests.harness import REPO

SCRIPT = r"""
import anyio
from gateway.errors import ConsentDeniedError, Reason
from gateway.transport import stdio_transport

async def main() -> str:
    try:
        async with stdio_transport():
            await anyio.sleep(0.2)  # its reader and writer are on
            raise ConsentDeniedError(Reason.CONSENT_DENIED, "a person denied this call")
    except ConsentDeniedError as exc:
        return "itself: " + exc.reason
    except BaseException as exc:
        return "changed: " + type(exc).__name__

print(anyio.run(main), flush=True)  # fd 1 is the process's stdout again
"""


def test_an_error_inside_the_stdio_transport_leaves_it_as_itself() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    try:
        child.wait(timeout=60)  # stdin open all along: the transport's reader waits on it when the error comes
    finally:
        child.kill()
        child.wait()
        child.stdin.close()
    out, err = child.stdout.read().decode(), child.stderr.read().decode()
    child.stdout.close()
    child.stderr.close()
    assert out.strip() == "itself: consent_denied", err
