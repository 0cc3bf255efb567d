"""The refusals a tools/call can end in, one class per JSON-RPC code (docs/error-codes.md).

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
| -32603 | StorageUnavailableError | an InternalError: the database failed (audit_unavailable,  |
|        |                         | database_unavailable); raised by gateway/db/errors.py      |

`reason` is a short slug for machines and reviewers (a `Reason`, every one listed in
docs/error-codes.md); it never carries a secret or the text of a foreign exception.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar


class Reason(StrEnum):
    """`data.reason` of every refusal, grouped by code as docs/error-codes.md lists them."""

    # -32001
    TOKEN_MISSING = "token_missing"  # noqa: S105  (a reason, not a secret)
    TOKEN_MALFORMED = "token_malformed"  # noqa: S105  (a reason, not a secret)
    ALG_NOT_ALLOWED = "alg_not_allowed"
    BAD_SIGNATURE = "bad_signature"
    WRONG_AUDIENCE = "wrong_audience"
    WRONG_ISSUER = "wrong_issuer"
    MISSING_CLAIM = "missing_claim"
    CLAIM_INVALID = "claim_invalid"
    TOKEN_EXPIRED = "token_expired"  # noqa: S105  (a reason, not a secret)
    TOKEN_NOT_YET_VALID = "token_not_yet_valid"  # noqa: S105  (a reason, not a secret)
    TOKEN_TTL_TOO_LONG = "token_ttl_too_long"  # noqa: S105  (a reason, not a secret)
    TOKEN_REVOKED = "token_revoked"  # noqa: S105  (a reason, not a secret)
    USER_UNKNOWN = "user_unknown"
    USER_DISABLED = "user_disabled"
    TOKEN_INVALID = "token_invalid"  # noqa: S105  (a reason, not a secret)
    # -32003
    MISSING_PERMISSION = "missing_permission"
    ROLE_UNKNOWN = "role_unknown"
    # -32004
    ALLOWLIST_EMPTY = "allowlist_empty"
    TOOL_NOT_ALLOWLISTED = "tool_not_allowlisted"
    TIMEOUT_OVER_POLICY = "timeout_over_policy"
    WORKSPACE_NOT_ALLOWED = "workspace_not_allowed"
    WORKSPACE_NOT_FOUND = "workspace_not_found"
    WORKSPACE_CHANGED = "workspace_changed"
    ALLOWED_PATH_NOT_FOUND = "allowed_path_not_found"
    ALLOWED_PATH_CHANGED = "allowed_path_changed"
    PATH_INVALID = "path_invalid"
    PATH_LOOKS_LIKE_OPTION = "path_looks_like_option"
    PATH_OUTSIDE_WORKSPACE = "path_outside_workspace"
    PROGRAM_CHANGED = "program_changed"
    CHANGES_CONFLICT = "changes_conflict"
    TOOL_DEFINITION_CHANGED = "tool_definition_changed"
    # -32005
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    ELAPSED_EXHAUSTED = "elapsed_exhausted"
    # -32006
    SANDBOX_DISABLED = "sandbox_disabled"
    SANDBOX_LAYER_MISSING = "sandbox_layer_missing"
    SANDBOX_START_FAILED = "sandbox_start_failed"
    RUN_PATH_UNREACHABLE = "run_path_unreachable"
    OUTPUT_LIMIT = "output_limit"
    MEMORY_LIMIT = "memory_limit"
    WORKSPACE_VIEW_UNAVAILABLE = "workspace_view_unavailable"
    WORKSPACE_TOO_LARGE_FOR_VIEW = "workspace_too_large_for_view"
    WORKSPACE_COPY_FAILED = "workspace_copy_failed"
    WORKSPACE_VIEW_BUSY = "workspace_view_busy"
    CHANGES_UNREADABLE = "changes_unreadable"
    CHANGES_TOO_LARGE = "changes_too_large"
    CHANGES_APPLY_FAILED = "changes_apply_failed"
    # -32007
    TIMEOUT = "timeout"
    # -32008
    CONSENT_DENIED = "consent_denied"
    CONSENT_DENIED_ALWAYS = "consent_denied_always"
    CONSENT_TIMEOUT = "consent_timeout"
    CONSENT_NO_ANSWER = "consent_no_answer"
    CONSENT_MODE_DENY = "consent_mode_deny"
    CONSENT_STATE_INVALID = "consent_state_invalid"
    CONSENT_QUESTIONS_LIMIT = "consent_questions_limit"
    CHANGES_DENIED = "changes_denied"
    # -32602
    UNKNOWN_TOOL = "unknown_tool"
    UNHASHABLE_ARGUMENTS = "unhashable_arguments"
    INVALID_ARGUMENTS = "invalid_arguments"
    RUN_NOT_FOUND = "run_not_found"
    EVIDENCE_NOT_FOUND = "evidence_not_found"
    UNKNOWN_RESOURCE = "unknown_resource"
    ARTIFACT_NOT_FOUND = "artifact_not_found"
    # -32603
    AUDIT_UNAVAILABLE = "audit_unavailable"
    DATABASE_UNAVAILABLE = "database_unavailable"
    ARTIFACTS_UNAVAILABLE = "artifacts_unavailable"
    INTERNAL_ERROR = "internal_error"
    TOOL_NOT_IMPLEMENTED = "tool_not_implemented"
    WORKSPACE_MISSING = "workspace_missing"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"


class GatewayError(Exception):
    """A refusal with a JSON-RPC code, a fixed message and a machine-readable reason."""

    code: ClassVar[int]
    message: ClassVar[str]

    def __init__(self, reason: Reason, detail: str | None = None, **data: Any) -> None:
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

    def __init__(self, reason: Reason, retry_after_s: int, detail: str | None = None) -> None:
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


class StorageUnavailableError(InternalError):
    """The database failed (`audit_unavailable` for an audit append, else `database_unavailable`).

    Raised by `gateway.db.errors.storage_errors`, from the SQLAlchemyError, once its cause is logged,
    and by gateway/db/threads.py for work no database thread could start within its bound; nothing
    more is written for the call (no terminal event: the log itself may be gone).
    """


class CommandError(Exception):
    """A command's expected failure: one line on stderr, exit 1 (docs/operations.md)."""


class UsageError(Exception):
    """A command-line value of the wrong form, found once argparse is done: one line naming the flag and
    the form it takes on stderr, exit 2 like argparse's own usage errors (docs/operations.md)."""


class ConfigError(Exception):
    """A configuration file or value is invalid; `where` is `file:line` when known."""

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
        self.bare_message = message
