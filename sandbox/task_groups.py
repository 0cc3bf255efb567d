"""anyio task groups whose failures come out as themselves, never as an ExceptionGroup.

anyio wraps whatever leaves a task group, the body's own exception included, in an
`ExceptionGroup`: a `GatewayError` (or a `SandboxStartError`) raised in the body of a group would
reach its handler as a group, and be answered as the gateway failing (-32603) instead of as the
refusal it is. Every task group of the gateway and of the sandbox is this one. It lives here, not
in gateway/, because the sandbox never imports the gateway.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from anyio.abc import TaskGroup


@contextlib.asynccontextmanager
async def task_group() -> AsyncIterator[TaskGroup]:
    """`anyio.create_task_group()`, but a failure leaves it as the exception that was raised.

    The body's exception wins: the children are cancelled, then it is raised as itself. Else a
    child's, when it is the only one (its siblings and the body were cancelled for it). Several
    children failing at once stay a group: no one of them is the failure. Cancellation is anyio's.
    """
    from_body: Exception | None = None
    sole: Exception | None = None
    try:
        async with anyio.create_task_group() as group:
            try:
                yield group
            except Exception as exc:  # never BaseException: cancellation passes through as anyio's
                from_body = exc
                group.cancel_scope.cancel()
    except BaseExceptionGroup as exc:
        sole = _sole(exc) if from_body is None else None
        if from_body is None and sole is None:
            raise
    # Raised here, outside the `except`, so neither is chained to the group that carried it.
    if from_body is not None:
        raise from_body
    if sole is not None:
        raise sole


def _sole(group: BaseExceptionGroup[BaseException]) -> Exception | None:
    """The one exception a group (and the groups nested in it) holds, if it holds one and it is an Exception."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        item = pending.pop()
        if isinstance(item, BaseExceptionGroup):
            pending.extend(item.exceptions)
        else:
            leaves.append(item)
    if len(leaves) == 1 and isinstance(leaves[0], Exception):
        return leaves[0]
    return None
