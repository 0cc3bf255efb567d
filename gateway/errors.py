"""The refusals a tools/call can end in, one class per JSON-RPC code (spec section 4).

| code   | class                   | when                                                       |
|--------|-------------------------|------------------------------------------------------------|
| -32001 | AuthRequiredError       | no token, bad signature/alg/iss/aud, expired, not yet      |
|        |                         | valid, revoked, unknown or disabled user                   |
| -32003 | PermissionDeniedError   | the role lacks the tool's permission                       |
| -32004 | PolicyBlockedError      | not allowlisted, empty allowlist, argument outside policy  |
| -32005 | BudgetExceededError     | attempts or elapsed time over the window (retry_after_s)   |
| -32006 | SandboxViolationError   | sandbox disabled for a write tool, or a limit stopped it   |
| -32007 | ToolTimeoutError        | hard kill at the time limit                                |
| -32008 | ConsentDeniedError      | a person denied, or no decision before the timeout         |
| -32602 | InvalidParamsError      | unknown tool, arguments not matching the schema            |
| -32603 | InternalError           | the gateway itself failed; nothing ran                     |

`reason` is a short slug for machines and reviewers; it never carries a secret or the
text of a foreign exception.
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    """A refusal with a JSON-RPC code, a fixed message and a machine-readable reason."""

    code: ClassVar[int]
    message: ClassVar[str]

    def __init__(self, reason: str, detail: str | None = None, **data: Any) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.data = data
        self.stage: str | None = None
        """The pipeline stage that refused (set by gateway/pipeline.py; not sent to the client)."""

    def public_message(self) -> str:
        return f"{self.message}: {self.detail}" if self.detail else self.message


class AuthRequiredError(GatewayError):
    code = -32001
    message = "Authentication required"


class PermissionDeniedError(GatewayError):
    code = -32003
    message = "Permission denied"


class PolicyBlockedError(GatewayError):
    code = -32004
    message = "Blocked by policy"


class BudgetExceededError(GatewayError):
    code = -32005
    message = "Budget exceeded"

    def __init__(self, reason: str, retry_after_s: int, detail: str | None = None) -> None:
        super().__init__(reason, detail, retry_after_s=retry_after_s)
        self.retry_after_s = retry_after_s


class SandboxViolationError(GatewayError):
    code = -32006
    message = "Sandbox violation"


class ToolTimeoutError(GatewayError):
    code = -32007
    message = "Execution timeout"


class ConsentDeniedError(GatewayError):
    code = -32008
    message = "Consent denied"


class InvalidParamsError(GatewayError):
    code = -32602
    message = "Invalid params"


class InternalError(GatewayError):
    code = -32603
    message = "Internal error"


class CommandError(Exception):
    """A command's expected failure: one line on stderr, exit 1 (spec section 3)."""


class ConfigError(Exception):
    """A configuration file or value is invalid; `where` is `file:line` when known."""

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
        self.bare_message = message
