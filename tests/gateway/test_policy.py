"""gateway/policy.py: strict loading with file:line errors, defaults, risky settings, relative paths."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest

from gateway.errors import ConfigError, PolicyBlockedError
from gateway.policy import (
    AuthPolicy,
    BudgetPolicy,
    ConsentPolicy,
    PermissionPromptPolicy,
    Policy,
    SandboxPolicy,
    load_policy,
    parse_policy,
)
from gateway.policy_warnings import risky_settings
from gateway.rbac import Permission
from gateway.scope import check_relative_path
from gateway.tools.registry import TOOL_NAMES
from sandbox.guarantees import DEFAULT_REQUIRED, Guarantee

DEFAULTS = tuple(g for g in Guarantee if g in DEFAULT_REQUIRED)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "policy.yaml"
MARK = "# <-"


def parse(text: str, tmp_path: Path) -> Policy:
    return parse_policy(dedent(text), tmp_path / "policy.yaml", TOOL_NAMES)


def marked_line(text: str) -> int:
    """The 1-based line of `text` carrying the `# <-` marker: where the error must point."""
    lines = dedent(text).splitlines()
    marked = [i for i, line in enumerate(lines, start=1) if MARK in line]
    assert len(marked) == 1, "a case marks exactly one line"
    return marked[0]


# --- the shipped default -----------------------------------------------------------------


def test_shipped_policy_loads_with_the_documented_values() -> None:
    policy = load_policy(SHIPPED, TOOL_NAMES)

    assert policy.version == 1
    assert policy.auth == AuthPolicy("mcp-gateway", "mcp-gateway", ("HS256",), 30, 86400)
    assert dict(policy.roles) == {
        "ADMIN": frozenset(Permission),
        "USER": frozenset({Permission.ARTIFACT_READ, Permission.ORCHESTRATION_RUN}),
        "VIEWER": frozenset({Permission.ARTIFACT_READ}),
    }
    assert dict(policy.workspaces) == {"default": (REPO / "examples" / "sample_project").resolve()}
    assert policy.allowlist == ("run_pytest", "list_artifacts", "get_evidence", "get_artifact_content")
    assert policy.budget == BudgetPolicy(3600, 30, 900000)
    assert policy.sandbox == SandboxPolicy(
        True, 300, 1024, 64, 4194304, False, (), ("PATH", "LANG", "LC_ALL"), 256, "native", DEFAULTS, ()
    )
    assert policy.sandbox.required == DEFAULT_REQUIRED  # the shipped list is the default, spelled out
    assert policy.consent.mode == "prompt"
    assert policy.consent.timeout_s == 300
    assert dict(policy.consent.expiry_days) == {"low": 90, "medium": 30, "high": 7}
    assert policy.consent.locale == "en-US"
    assert policy.permission_prompt == PermissionPromptPolicy(
        enabled=False,
        deny=("Bash(rm:*)", "Bash(curl:*)", "Bash(wget:*)"),
        allow=("Bash(pytest -q)", "Read", "Grep", "Glob"),
    )


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("false", False)])
def test_env_token_reads_a_bool(value: str, expected: bool, tmp_path: Path) -> None:
    policy = parse(f"version: 1\nauth:\n  env_token: {value}\n", tmp_path)

    assert policy.auth.env_token is expected


def test_env_token_is_off_by_default(tmp_path: Path) -> None:
    assert parse("version: 1\n", tmp_path).auth.env_token is False
    assert load_policy(SHIPPED, TOOL_NAMES).auth.env_token is False


def test_env_token_on_warns_who_may_act_as_that_user(shipped: Policy, tmp_path: Path) -> None:
    policy = dataclasses.replace(shipped, auth=dataclasses.replace(shipped.auth, env_token=True))

    warnings = risky_settings(policy, tmp_path / "state")

    assert len(warnings) == 1, warnings
    assert "auth.env_token is true" in warnings[0].message
    assert "any process that can start the gateway with that variable acts as that user" in warnings[0].message


def test_shipped_policy_has_no_risky_settings(tmp_path: Path) -> None:
    policy = load_policy(SHIPPED, TOOL_NAMES)

    assert risky_settings(policy, tmp_path / "state") == []
    assert risky_settings(policy, None) == []


def test_load_policy_of_a_missing_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"

    with pytest.raises(ConfigError, match="cannot read policy file") as caught:
        load_policy(missing, TOOL_NAMES)
    assert caught.value.where == str(missing)


def test_load_policy_reports_the_line_in_the_file_it_read(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nbudget:\n  window_s: soon\n", encoding="utf-8")

    with pytest.raises(ConfigError) as caught:
        load_policy(path, TOOL_NAMES)
    assert caught.value.where == f"{path}:3"
    assert str(caught.value).startswith(f"{path}:3: ")


# --- rejections, each at the right line ----------------------------------------------------

REJECTED = [
    pytest.param(
        """\
        version: 1
        sandbox_enabled: true  # <-
        """,
        "unknown key 'sandbox_enabled' in the policy",
        id="unknown-top-level-key",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          issuer: mcp-gateway
          verify: false  # <-
        """,
        "unknown key 'verify' in auth",
        id="unknown-key-in-auth",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          enabled: true
          seccomp: off  # <-
        """,
        "unknown key 'seccomp' in sandbox",
        id="unknown-key-in-sandbox",
    ),
    pytest.param(
        """\
        version: 1
        consent:
          expiry_days:
            low: 90
            forever: 9999  # <-
        """,
        "unknown key 'forever' in consent.expiry_days",
        id="unknown-key-two-levels-down",
    ),
    pytest.param(
        """\
        version: 1
        tools:
          allowlist: []
          denylist: []  # <-
        """,
        "unknown key 'denylist' in tools",
        id="unknown-key-in-tools",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          timeout_s: "300"  # <-
        """,
        "sandbox.timeout_s must be an integer",
        id="string-where-int",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          enabled: 1  # <-
        """,
        "sandbox.enabled must be true or false",
        id="int-where-bool",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          network: "false"  # <-
        """,
        "sandbox.network must be true or false",
        id="string-where-bool",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          issuer: mcp-gateway
          env_token: "yes"  # <-
        """,
        "auth.env_token must be true or false",
        id="env-token-not-a-bool",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          env_token:  # <-
        """,
        "auth.env_token must be true or false",
        id="env-token-empty",
    ),
    pytest.param(
        """\
        version: 1
        budget:
          window_s: true  # <-
        """,
        "budget.window_s must be an integer",
        id="bool-where-int",
    ),
    pytest.param(
        """\
        version: 1
        budget:
          attempts_total: 2.5  # <-
        """,
        "budget.attempts_total must be an integer",
        id="float-where-int",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          memory_limit_mb: 0  # <-
        """,
        "sandbox.memory_limit_mb must be at least 1",
        id="zero-memory",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          leeway_s: -1  # <-
        """,
        "auth.leeway_s must be at least 0",
        id="negative-leeway",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          issuer: ""  # <-
        """,
        "auth.issuer must be a non-empty string",
        id="empty-issuer",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          algorithms: HS256  # <-
        """,
        "auth.algorithms must be a list",
        id="algorithms-not-a-list",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          timeout_s: [300]  # <-
        """,
        "sandbox.timeout_s must be a single value",
        id="list-where-int",
    ),
    pytest.param(
        """\
        version: 1
        budget: 30  # <-
        """,
        "budget must be a mapping",
        id="section-not-a-mapping",
    ),
    pytest.param(
        """\
        version: 1
        roles:
          ADMIN: [ARTIFACT_READ, ORCHESTRATION_RUN]
          USER:
            - ARTIFACT_READ
            - DELETE_EVERYTHING  # <-
        """,
        "unknown permission 'DELETE_EVERYTHING' in roles.USER",
        id="unknown-permission",
    ),
    pytest.param(
        """\
        version: 1
        roles:
          USER: [artifact_read]  # <-
        """,
        "unknown permission 'artifact_read' in roles.USER",
        id="permission-is-case-sensitive",
    ),
    pytest.param(
        """\
        version: 1
        roles:
          USER: ARTIFACT_READ  # <-
        """,
        "roles.USER must be a list",
        id="role-not-a-list",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          issuer: a
        auth:  # <-
          issuer: b
        """,
        "duplicate key 'auth' in the policy",
        id="duplicate-top-level-key",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          enabled: false
          timeout_s: 10
          enabled: true  # <-
        """,
        "duplicate key 'enabled' in sandbox",
        id="duplicate-nested-key",
    ),
    pytest.param(
        """\
        version: 1
        roles:
          USER: [ARTIFACT_READ]
          USER: [ARTIFACT_READ, ORCHESTRATION_RUN]  # <-
        """,
        "duplicate key 'USER' in roles",
        id="duplicate-role",
    ),
    pytest.param(
        """\
        version: 1
        tools:
          allowlist:
            - run_pytest
            - run_pytest  # <-
        """,
        "'run_pytest' is listed twice in tools.allowlist",
        id="duplicate-list-item",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          algorithms:
            - HS256
            - none  # <-
        """,
        "algorithm 'none' is never accepted",
        id="alg-none",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          algorithms: [NONE]  # <-
        """,
        "algorithm 'none' is never accepted",
        id="alg-NONE-any-case",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          algorithms: [HS256, ES256K]  # <-
        """,
        "unsupported algorithm 'ES256K'",
        id="alg-unknown",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          algorithms: [hs256]  # <-
        """,
        "unsupported algorithm 'hs256'",
        id="alg-is-case-sensitive",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          algorithms: []  # <-
        """,
        "auth.algorithms must name at least one algorithm",
        id="alg-empty-list",
    ),
    pytest.param(
        """\
        version: 1
        tools:
          allowlist:
            - run_pytest
            - run_shell  # <-
        """,
        "unknown tool 'run_shell' in tools.allowlist",
        id="unknown-tool",
    ),
    pytest.param(
        """\
        version: 1
        consent:
          mode: prompt
          locale: fr-FR  # <-
        """,
        "consent.locale must be one of en-US, pt-BR (got 'fr-FR')",
        id="bad-locale",
    ),
    pytest.param(
        """\
        version: 1
        consent:
          mode: allow  # <-
        """,
        "consent.mode must be one of prompt, deny (got 'allow')",
        id="bad-mode",
    ),
    pytest.param(
        """\
        version: 1
        workspaces:
          "../up": /tmp  # <-
        """,
        "workspace name '../up'",
        id="bad-workspace-name",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          env_whitelist: [PATH, "LANG=C"]  # <-
        """,
        "'LANG=C' in sandbox.env_whitelist is not an environment variable name",
        id="env-name-with-equals",
    ),
    pytest.param(
        """\
        version: 1
        permission_prompt:
          enabled: "yes please"  # <-
        """,
        "permission_prompt.enabled must be true or false",
        id="permission-prompt-enabled-string",
    ),
    pytest.param(
        """\
        version: !!python/object:os.system echo  # <-
        """,
        "version is not a valid value",
        id="python-tag",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          timeout_s: !custom 300  # <-
        """,
        "sandbox.timeout_s is not a valid value",
        id="custom-tag",
    ),
    pytest.param(
        """\
        version: 1
        budget:
          window_s: !!int soon  # <-
        """,
        "budget.window_s is not a valid value",
        id="int-tag-on-text",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          enabled: !!bool maybe  # <-
        """,
        "sandbox.enabled is not a valid value",
        id="bool-tag-on-text",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          issuer: !!binary "not base64!"  # <-
        """,
        "auth.issuer is not a valid value",
        id="binary-tag",
    ),
    pytest.param(
        """\
        version: 1
        consent:
          timeout_s: !!timestamp later  # <-
        """,
        "consent.timeout_s is not a valid value",
        id="timestamp-tag",
    ),
    pytest.param(
        """\
        # a comment first
        auth:  # <-
          issuer: mcp-gateway
        """,
        "missing required key 'version'",
        id="version-missing",
    ),
    pytest.param(
        """\
        # header
        version: 2  # <-
        """,
        "unsupported policy version 2",
        id="version-2",
    ),
    pytest.param(
        """\
        version: "1"  # <-
        """,
        "version must be an integer",
        id="version-string",
    ),
    pytest.param(
        """\
        version: 0  # <-
        """,
        "version must be at least 1",
        id="version-0",
    ),
    pytest.param(
        """\
        - version: 1  # <-
        """,
        "the policy must be a mapping",
        id="top-level-list",
    ),
    pytest.param(
        """\
        version: 1
        auth:
          issuer: [unclosed
          audience: x  # <-
        budget: {}
        """,
        "not valid YAML",
        id="invalid-yaml-unclosed-flow",
    ),
    pytest.param(
        """\
        version: 1
        \tauth: {}  # <-
        """,
        "not valid YAML",
        id="invalid-yaml-tab",
    ),
    pytest.param(
        """\
        version: 1
        ---  # <-
        version: 1
        """,
        "not valid YAML",
        id="two-documents",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          require: [own_identity, file_grants, landlock]  # <-
        """,
        "'landlock' is not a guarantee (own_identity, file_grants, no_network,",
        id="require-a-layer",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          require: [no_network, file_grants]  # <-
        """,
        "sandbox.require must list own_identity: no policy may waive it",
        id="require-without-identity",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          require: [own_identity, syscall_filter]  # <-
        """,
        "sandbox.require must list file_grants: no policy may waive it",
        id="require-without-file-grants",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          require: [own_identity, file_grants]
          required_layers: [uid_drop]  # <-
        """,
        "sandbox.required_layers is the old form of sandbox.require: keep only require",
        id="require-and-required-layers",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          required_layers: [uid_drop, landlock, bubblewrap]  # <-
        """,
        "'bubblewrap' is not a layer (sandbox.required_layers is replaced by sandbox.require:",
        id="old-required-layer-unknown",
    ),
    pytest.param(
        """\
        version: 1
        permission_prompt:
          allow: ["Bash(pytest:*)", "Read"]
          deny:
            - "WebFetch(example.com)"  # <-
        """,
        "permission_prompt.deny: 'WebFetch(example.com)': WebFetch takes domain:HOST",
        id="permission-rule-bad",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          backend: firejail  # <-
        """,
        "sandbox.backend must be one of native, bubblewrap",
        id="backend-unknown",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          require: all  # <-
        """,
        "sandbox.require must be a list",
        id="require-not-a-list",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          pytest_plugins:
            - xdist
            - "--basetemp=/tmp/x"  # <-
        """,
        "'--basetemp=/tmp/x' in sandbox.pytest_plugins is not a plugin",
        id="plugin-option",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          pytest_plugins: ["no:cacheprovider"]  # <-
        """,
        "'no:cacheprovider' in sandbox.pytest_plugins is not a plugin",
        id="plugin-disabling",
    ),
    pytest.param(
        """\
        version: 1
        sandbox:
          scratch_limit_mb: 0  # <-
        """,
        "sandbox.scratch_limit_mb must be at least 1",
        id="scratch-0",
    ),
]


@pytest.mark.parametrize(("text", "message"), REJECTED)
def test_rejects_with_file_and_line(text: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text, tmp_path)

    assert caught.value.where is not None
    assert caught.value.where.startswith(str(tmp_path / "policy.yaml") + ":")
    assert caught.value.where.endswith(f":{marked_line(text)}")
    assert message in caught.value.bare_message


@pytest.mark.parametrize("depth", [10_000, 200_000])
@pytest.mark.parametrize("opening", ["[", "{a: "])
def test_a_policy_nested_past_any_reason_is_refused_not_a_crash(depth: int, opening: str, tmp_path: Path) -> None:
    """Pure-Python PyYAML raised RecursionError here, a traceback out of every command that loads the policy."""
    closing = "]" if opening == "[" else "}"
    with pytest.raises(ConfigError) as caught:
        parse(f"version: 1\nauth: {opening * depth}1{closing * depth}\n", tmp_path)

    assert caught.value.bare_message.startswith("not valid YAML")
    assert caught.value.where is not None
    assert caught.value.where.startswith(str(tmp_path / "policy.yaml"))


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file_is_rejected_at_line_1(text: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text, tmp_path)

    assert caught.value.bare_message == "the policy file is empty"
    assert caught.value.where == f"{tmp_path / 'policy.yaml'}:1"


# --- defaults ------------------------------------------------------------------------------


def test_missing_sections_take_the_defaults(tmp_path: Path) -> None:
    policy = parse("version: 1\n", tmp_path)

    assert policy.auth == AuthPolicy()
    assert policy.budget == BudgetPolicy()
    assert policy.sandbox == SandboxPolicy()
    assert policy.consent == ConsentPolicy()
    assert policy.permission_prompt == PermissionPromptPolicy()
    assert dict(policy.roles) == {
        "ADMIN": frozenset(Permission),
        "USER": frozenset({Permission.ARTIFACT_READ, Permission.ORCHESTRATION_RUN}),
        "VIEWER": frozenset({Permission.ARTIFACT_READ}),
    }
    assert dict(policy.workspaces) == {}
    # No tools section means no allowlisted tool: the default fails closed.
    assert policy.allowlist == ()


def test_missing_keys_inside_a_section_take_the_defaults(tmp_path: Path) -> None:
    policy = parse(
        """\
        version: 1
        auth:
          issuer: corp
        sandbox:
          timeout_s: 60
        consent:
          expiry_days: {high: 1}
        """,
        tmp_path,
    )

    assert policy.auth == AuthPolicy(issuer="corp")
    assert policy.sandbox == SandboxPolicy(timeout_s=60)
    assert dict(policy.consent.expiry_days) == {"low": 90, "medium": 30, "high": 1}


def test_empty_sections_take_the_defaults(tmp_path: Path) -> None:
    policy = parse("version: 1\nauth: {}\nbudget: {}\nsandbox: {}\nconsent: {}\n", tmp_path)

    assert policy.auth == AuthPolicy()
    assert policy.budget == BudgetPolicy()
    assert policy.sandbox == SandboxPolicy()


def test_zero_budget_totals_are_allowed(tmp_path: Path) -> None:
    policy = parse("version: 1\nbudget:\n  attempts_total: 0\n  elapsed_ms_total: 0\n", tmp_path)

    assert policy.budget == BudgetPolicy(attempts_total=0, elapsed_ms_total=0)


def test_paths_are_relative_to_the_policy_file(tmp_path: Path) -> None:
    policy = parse(
        """\
        version: 1
        workspaces:
          here: ws
          there: /srv/elsewhere
        sandbox:
          allowed_paths: [shared/data]
        """,
        tmp_path,
    )

    assert dict(policy.workspaces) == {"here": (tmp_path / "ws").resolve(), "there": Path("/srv/elsewhere")}
    assert policy.sandbox.allowed_paths == ((tmp_path / "shared" / "data").resolve(),)


def test_sandbox_requirements_plugins_and_scratch_are_read(tmp_path: Path) -> None:
    policy = parse(
        """\
        version: 1
        sandbox:
          scratch_limit_mb: 64
          require: [syscall_filter, own_identity, file_grants]
          pytest_plugins: [timeout, pytest_asyncio.plugin, xdist.looponfail]
        """,
        tmp_path,
    )
    assert policy.sandbox.scratch_limit_mb == 64
    assert policy.sandbox.backend == "native"
    assert policy.sandbox.require == ("own_identity", "file_grants", "syscall_filter")  # in declaration order
    assert policy.sandbox.required == {"own_identity", "file_grants", "syscall_filter"}
    assert policy.sandbox.pytest_plugins == ("timeout", "pytest_asyncio.plugin", "xdist.looponfail")


def test_no_network_listed_is_not_required_once_the_network_is_on(tmp_path: Path) -> None:
    policy = parse(
        "version: 1\nsandbox:\n  network: true\n  require: [own_identity, file_grants, no_network]\n", tmp_path
    )
    assert "no_network" in (policy.sandbox.require or ())
    assert policy.sandbox.required == {"own_identity", "file_grants"}


def test_without_require_the_default_guarantees_apply_to_either_backend(tmp_path: Path) -> None:
    policy = parse("version: 1\nsandbox:\n  backend: bubblewrap\n", tmp_path)
    assert policy.sandbox.require is None
    assert policy.sandbox.required == DEFAULT_REQUIRED
    assert Guarantee.MEMORY_TOTAL not in policy.sandbox.required  # root or a delegated cgroup: docs/operations.md


@pytest.mark.parametrize(
    ("layers", "network", "expected"),
    [
        (
            "[uid_drop, cgroup, network_namespace, ipc_namespace, scratch_tmpfs, rlimits, landlock, seccomp, pid_namespace]",
            False,
            # every guarantee but the proxy's, which no old layer name stood for (a proxied run requires it anyway)
            [g for g in Guarantee if g is not Guarantee.NETWORK_THROUGH_PROXY],
        ),
        ("[uid_drop, landlock]", False, ["own_identity", "file_grants"]),
        ("[uid_drop, mount_tree, network_namespace]", True, ["own_identity", "file_grants"]),
        ("[seccomp]", False, ["own_identity", "file_grants", "syscall_filter"]),  # the unwaivable come along
    ],
    ids=["every-old-layer", "two", "network-allowed", "unwaivable-added"],
)
def test_an_old_required_layers_list_is_read_as_the_guarantees_it_stood_for_with_a_warning(
    tmp_path: Path, layers: str, network: bool, expected: list[str]
) -> None:
    text = f"version: 1\nsandbox:\n  network: {str(network).lower()}\n  required_layers: {layers}\n"
    policy = parse(text, tmp_path)
    assert list(policy.sandbox.require or ()) == expected
    warnings = [str(w) for w in risky_settings(policy, None)]
    replacement = f"it was read as `require: [{', '.join(expected)}]`: write that line in its place"
    assert any("sandbox.required_layers is the old form of sandbox.require" in w and replacement in w for w in warnings)


def test_custom_roles_replace_the_default_roles(tmp_path: Path) -> None:
    policy = parse("version: 1\nroles:\n  AUDITOR: [ARTIFACT_READ]\n  NOBODY: []\n", tmp_path)

    assert dict(policy.roles) == {"AUDITOR": frozenset({Permission.ARTIFACT_READ}), "NOBODY": frozenset()}


# --- risky settings ------------------------------------------------------------------------


@pytest.fixture
def shipped() -> Policy:
    return load_policy(SHIPPED, TOOL_NAMES)


def with_sandbox(policy: Policy, **changes: Any) -> Policy:
    return dataclasses.replace(policy, sandbox=dataclasses.replace(policy.sandbox, **changes))


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        pytest.param({"enabled": False}, "sandbox.enabled is false", id="sandbox-disabled"),
        pytest.param({"network": True}, "sandbox.network is true", id="network"),
        pytest.param({"allowed_paths": (Path("/"),)}, "contains '/'", id="root-readable"),
        pytest.param(
            {"env_whitelist": ("PATH", "AWS_SECRET_ACCESS_KEY")},
            "AWS_SECRET_ACCESS_KEY, which looks like a secret",
            id="aws",
        ),
        pytest.param(
            {"env_whitelist": ("GITHUB_TOKEN",)}, "GITHUB_TOKEN, which looks like a secret", id="github-token"
        ),
        pytest.param({"env_whitelist": ("DB_PASSWORD",)}, "DB_PASSWORD, which looks like a secret", id="password"),
        pytest.param({"env_whitelist": ("PYTHONPATH",)}, "starting with PYTHON are never passed", id="pythonpath"),
        pytest.param({"env_whitelist": ("LD_PRELOAD",)}, "starting with LD_ are never passed", id="ld-preload"),
        pytest.param({"env_whitelist": ("PYTEST_ADDOPTS",)}, "starting with PYTEST_ are never passed", id="pytest"),
        pytest.param(
            {"env_whitelist": ("MCP_GATEWAY_TOKEN",)}, "starting with MCP_GATEWAY are never passed", id="gateway-token"
        ),
        pytest.param(
            {
                "require": (
                    Guarantee.OWN_IDENTITY,
                    Guarantee.FILE_GRANTS,
                    Guarantee.NO_NETWORK,
                    Guarantee.SYSCALL_FILTER,
                )
            },
            "leaves out bounded_scratch, process_total, process_limits, whole_run_kill, process_isolation, "
            "ipc_isolation: on a host that cannot keep it, runs go on",
            id="waived-guarantees",
        ),
        pytest.param(
            {"scratch_limit_mb": 2048}, "scratch_limit_mb is above memory_limit_mb", id="scratch-above-memory"
        ),
    ],
)
def test_risky_sandbox_settings_warn(shipped: Policy, changes: dict[str, Any], fragment: str, tmp_path: Path) -> None:
    warnings = risky_settings(with_sandbox(shipped, **changes), tmp_path / "state")

    assert len(warnings) == 1, warnings
    assert fragment in warnings[0].message
    assert str(warnings[0]).startswith(f"{SHIPPED}: warning: ")


@pytest.mark.parametrize(
    "relative",
    [
        pytest.param(".", id="the-state-folder"),
        pytest.param("artifacts", id="inside-it"),
        pytest.param("..", id="its-parent"),
    ],
)
def test_allowed_path_overlapping_the_state_folder_warns(shipped: Policy, relative: str, tmp_path: Path) -> None:
    home = tmp_path / "state"
    (home / "artifacts").mkdir(parents=True)
    policy = with_sandbox(shipped, allowed_paths=((home / relative).resolve(),))

    warnings = risky_settings(policy, home)

    assert [w.message for w in warnings] == [
        f"sandbox.allowed_paths contains {(home / relative).resolve()}, which overlaps the gateway's state folder {home}"
    ]


def test_allowed_path_beside_the_state_folder_does_not_warn(shipped: Policy, tmp_path: Path) -> None:
    # "state-other" shares a string prefix with "state" but is not inside it.
    (tmp_path / "state-other").mkdir()
    policy = with_sandbox(shipped, allowed_paths=(tmp_path / "state-other",))

    assert risky_settings(policy, tmp_path / "state") == []


def test_empty_allowlist_warns(shipped: Policy, tmp_path: Path) -> None:
    warnings = risky_settings(dataclasses.replace(shipped, allowlist=()), tmp_path / "state")

    assert [w.message for w in warnings] == ["tools.allowlist is empty: every tool call will be refused with -32004"]


def test_an_allow_rule_covering_every_use_of_a_writing_agent_tool_warns(shipped: Policy, tmp_path: Path) -> None:
    rules = ("Bash", "Edit(**)", "Bash(*)", "Bash(git status)", "Read", "Write(src/**)")
    prompt = PermissionPromptPolicy(enabled=True, allow=rules)
    warnings = risky_settings(dataclasses.replace(shipped, permission_prompt=prompt), tmp_path / "state")

    assert [w.message for w in warnings] == [
        f"permission_prompt.allow has {rule!r}: every use of {rule[:4]} is allowed without a person"
        for rule in ("Bash", "Edit(**)", "Bash(*)")
    ]


@pytest.mark.parametrize(
    ("rule", "program", "says"),
    [
        ("Bash(pytest:*)", "pytest", "deletes --basetemp=DIR"),
        ("Bash(pytest*)", "pytest", "-p NAME imports it"),
        ("Bash(pytest *)", "pytest", "--override-ini"),
        ("Bash(python3:*)", "python3", "any code it is given"),
        ("Bash(python3.11:*)", "python3.11", "any code it is given"),
        ("Bash(/usr/bin/python:*)", "python", "any code it is given"),
        ("Bash(node:*)", "node", "any code"),
        ("Bash(npm:*)", "npm", "installs packages"),
        ("Bash(npx*)", "npx", "runs any package"),
        ("Bash(make:*)", "make", "any recipe"),
        ("Bash(bash:*)", "bash", "any code"),
        ("Bash(git:*)", "git", "hooks, aliases"),
        ("Bash(docker:*)", "docker", "the host's root"),
        ("Bash(env:*)", "env", "any command named"),
        ("Bash(xargs:*)", "xargs", "any command named"),
        ("Bash(find:*)", "find", "-exec"),
        ("Bash(uv:*)", "uv", "installs packages"),
        ("Bash(cargo:*)", "cargo", "build scripts"),
    ],
)
def test_a_program_wide_allow_rule_on_a_program_that_runs_code_warns(
    shipped: Policy, tmp_path: Path, rule: str, program: str, says: str
) -> None:
    """Claude Code runs an allowed command unsandboxed; `Bash(pytest:*)` allows `--basetemp=~`."""
    prompt = PermissionPromptPolicy(enabled=True, allow=(rule,))
    (warning,) = risky_settings(dataclasses.replace(shipped, permission_prompt=prompt), tmp_path / "state")

    assert warning.message.startswith(f"permission_prompt.allow has {rule!r}: every argument of {program} is allowed")
    assert says in warning.message
    assert "outside any sandbox" in warning.message


@pytest.mark.parametrize(
    "rule", ["Bash(pytest -q)", "Bash(git status)", "Bash(git diff:*)", "Bash(ls:*)", "Bash(cat *)", "Bash(pytestx:*)"]
)
def test_exact_commands_and_programs_that_run_no_code_do_not_warn(shipped: Policy, tmp_path: Path, rule: str) -> None:
    prompt = PermissionPromptPolicy(enabled=True, allow=(rule,))

    assert risky_settings(dataclasses.replace(shipped, permission_prompt=prompt), tmp_path / "state") == []


def test_workspace_that_is_not_a_directory_warns(shipped: Policy, tmp_path: Path) -> None:
    policy = dataclasses.replace(shipped, workspaces={"gone": tmp_path / "missing"})

    warnings = risky_settings(policy, tmp_path / "state")

    assert len(warnings) == 1
    assert "workspace 'gone'" in warnings[0].message
    assert "not a directory" in warnings[0].message


def test_workspace_inside_the_state_folder_warns(shipped: Policy, tmp_path: Path) -> None:
    home = tmp_path / "state"
    (home / "ws").mkdir(parents=True)
    policy = dataclasses.replace(shipped, workspaces={"w": (home / "ws").resolve()})

    warnings = risky_settings(policy, home)

    assert len(warnings) == 1
    assert "overlaps the gateway's state folder" in warnings[0].message


@pytest.mark.parametrize(
    ("algorithms", "warned"),
    [
        (("HS256",), False),
        (("RS256",), False),
        (("RS256", "EdDSA"), False),
        (("HS256", "RS256"), True),
    ],
)
def test_mixed_algorithm_families_warn(
    shipped: Policy, algorithms: tuple[str, ...], warned: bool, tmp_path: Path
) -> None:
    policy = dataclasses.replace(shipped, auth=dataclasses.replace(shipped.auth, algorithms=algorithms))

    warnings = risky_settings(policy, tmp_path / "state")

    assert any("mixes HMAC and public-key" in w.message for w in warnings) is warned
    assert len(warnings) == int(warned)


@pytest.mark.parametrize(
    ("budget", "warned"),
    [
        (BudgetPolicy(attempts_total=0), True),
        (BudgetPolicy(elapsed_ms_total=0), True),
        (BudgetPolicy(attempts_total=1, elapsed_ms_total=1), False),
    ],
)
def test_zero_budget_warns(shipped: Policy, budget: BudgetPolicy, warned: bool, tmp_path: Path) -> None:
    warnings = risky_settings(dataclasses.replace(shipped, budget=budget), tmp_path / "state")

    assert [w.message for w in warnings] == (
        ["a budget total is 0: every write call will be refused with -32005"] if warned else []
    )


@pytest.mark.parametrize(("consent_timeout_s", "warned"), [(1200, False), (1201, True)])
def test_long_consent_timeout_warns(shipped: Policy, consent_timeout_s: int, warned: bool, tmp_path: Path) -> None:
    policy = dataclasses.replace(shipped, consent=dataclasses.replace(shipped.consent, timeout_s=consent_timeout_s))

    warnings = risky_settings(policy, tmp_path / "state")

    assert len(warnings) == int(warned)


# --- check_relative_path -------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_a.py").write_text("def test_a():\n    pass\n", encoding="utf-8")
    (tmp_path / "outside").mkdir()
    (tmp_path / "ws-evil").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    (root / "tests" / "alias").symlink_to(root / "tests", target_is_directory=True)
    return root


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("../x", "path_outside_workspace"),
        ("tests/../../x", "path_outside_workspace"),
        ("../ws-evil", "path_outside_workspace"),
        ("/etc/passwd", "path_outside_workspace"),
        ("//etc", "path_outside_workspace"),
        ("escape", "path_outside_workspace"),
        ("escape/anything.py", "path_outside_workspace"),
        ("-x", "path_looks_like_option"),
        ("--rootdir=/", "path_looks_like_option"),
        ("tests\x00/x", "path_invalid"),
    ],
)
def test_check_relative_path_rejects(workspace: Path, value: str, reason: str) -> None:
    with pytest.raises(PolicyBlockedError) as caught:
        check_relative_path(workspace, value, "test_path")

    assert caught.value.reason == reason
    assert caught.value.code == -32004


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("tests", "tests"),
        ("tests/", "tests"),
        ("tests/test_a.py", "tests/test_a.py"),
        ("tests/../tests/test_a.py", "tests/test_a.py"),
        ("tests/alias/test_a.py", "tests/test_a.py"),
        (".", "."),
        ("not/there/yet.py", "not/there/yet.py"),
    ],
)
def test_check_relative_path_accepts(workspace: Path, value: str, expected: str) -> None:
    assert check_relative_path(workspace, value, "test_path") == (workspace / expected).resolve()


def test_check_relative_path_follows_a_symlinked_root(workspace: Path, tmp_path: Path) -> None:
    linked_root = tmp_path / "ws-link"
    linked_root.symlink_to(workspace, target_is_directory=True)

    assert check_relative_path(linked_root, "tests", "test_path") == (workspace / "tests").resolve()
    with pytest.raises(PolicyBlockedError):
        check_relative_path(linked_root, "escape", "test_path")


def test_allowed_path_that_does_not_exist_warns(shipped: Policy, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    warnings = risky_settings(with_sandbox(shipped, allowed_paths=(missing,)), tmp_path / "state")
    assert [w.message for w in warnings] == [
        f"sandbox.allowed_paths contains {missing}, which does not exist: every run would fail to start"
    ]


# --- pins: each workspace and allowed path as the policy found it at load (decision 30) -----------


def test_existing_workspaces_and_allowed_paths_are_pinned_at_load_missing_ones_are_not(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "data.txt").write_text("data")
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real", target_is_directory=True)
    policy = parse(
        """\
        version: 1
        workspaces: {here: ws, linked: linked, gone: nope}
        sandbox:
          allowed_paths: [data.txt, missing]
        """,
        tmp_path,
    )

    real = tmp_path.resolve()
    assert set(policy.pins) == {real / "ws", real / "real", real / "data.txt"}
    assert policy.workspaces["linked"] == real / "real", "a link in the configured path is resolved once, at load"
    assert policy.pins[real / "ws"].ino == (tmp_path / "ws").stat().st_ino
    assert not policy.pins[real / "data.txt"].is_dir


def test_a_policy_whose_folders_are_missing_still_loads_and_warns(tmp_path: Path) -> None:
    policy = parse("version: 1\nworkspaces: {w: nope}\nsandbox:\n  allowed_paths: [gone]\n", tmp_path)

    assert dict(policy.pins) == {}
    messages = [w.message for w in risky_settings(policy, None)]
    assert any("which is not a directory" in m for m in messages)
    assert any("which does not exist" in m for m in messages)


# --- consent.channels: who may answer, and what (decision 43) --------------------------------------


def test_consent_channels_default_keeps_lasting_allows_for_the_approver(tmp_path: Path) -> None:
    channels = parse("version: 1\n", tmp_path).consent.channels
    assert channels["elicitation"] == {"ALLOW_ONCE", "ALLOW_SESSION", "DENY_ONCE", "DENY_ALWAYS"}
    assert channels["approver"] == {"ALLOW_ONCE", "ALLOW_SESSION", "ALLOW_ALWAYS", "DENY_ONCE", "DENY_ALWAYS"}
    assert load_policy(SHIPPED, TOOL_NAMES).consent.channels == channels


def test_consent_channels_opt_in_and_switch_off(tmp_path: Path) -> None:
    policy = parse(
        """
        version: 1
        consent:
          channels:
            elicitation: [allow_once, allow_always, deny_once]
        """,
        tmp_path,
    )
    assert policy.consent.channels["elicitation"] == {"ALLOW_ONCE", "ALLOW_ALWAYS", "DENY_ONCE"}
    assert "ALLOW_ALWAYS" in policy.consent.channels["approver"], "a channel not named keeps its default"
    off = parse("version: 1\nconsent:\n  channels:\n    elicitation: []\n", tmp_path)
    assert off.consent.channels["elicitation"] == frozenset()


@pytest.mark.parametrize(
    ("channels", "message"),
    [
        ("{email: [allow_once]}", "unknown key 'email' in consent.channels"),
        (
            "{elicitation: [allow_forever, deny_once]}",
            "'allow_forever' in consent.channels.elicitation is not an answer",
        ),
        ("{elicitation: [allow_once]}", "consent.channels.elicitation must list deny_once"),
        ("{approver: []}", "consent.channels.approver must not be empty"),
        ("{elicitation: [deny_once, deny_once]}", "'deny_once' is listed twice"),
        ("{elicitation: allow_once}", "consent.channels.elicitation must be a list"),
    ],
)
def test_consent_channels_errors(channels: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse(f"version: 1\nconsent:\n  channels: {channels}\n", tmp_path)
    assert ":3:" in str(caught.value)
