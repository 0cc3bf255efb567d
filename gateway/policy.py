"""policy.yaml (docs/policy.md): strict loading with file:line errors, into frozen values.

The loader walks PyYAML's node tree rather than the loaded dict so that every error can
name the line it is about, and so that a duplicated key (which plain `yaml.safe_load`
silently resolves to the last value) is an error a reviewer cannot be fooled by. What is valid but
risky is warned about in gateway/policy_warnings.py; stage 4 (gateway/scope.py) checks calls against it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal, TypeVar

import yaml

from gateway.declarations import Ceilings, Declaration, read_declared
from gateway.egress_policy import Network, read_network
from gateway.errors import ConfigError
from gateway.policy_nodes import NodeReader, compose
from gateway.rbac import Permission
from gateway.rules.egress import EgressRules
from gateway.rules.permissions import parse_rule
from gateway.upstream_policy import Upstream, read_upstreams
from sandbox.backends.landlock import runtime_read_only_paths
from sandbox.guarantees import ALWAYS_REQUIRED, LAYER_GUARANTEES, Guarantee, from_layers
from sandbox.limits import BACKENDS, Backend, required_guarantees
from sandbox.pinned import Pinned, pin

SUPPORTED_ALGORITHMS = ("HS256", "HS384", "HS512", "RS256", "EdDSA")
LOCALES = ("en-US", "pt-BR")
CONSENT_MODES = ("prompt", "deny")
CONSENT_CHANNELS = ("elicitation", "approver")
CONSENT_ANSWERS = ("allow_once", "allow_session", "allow_always", "deny_once", "deny_always")
"""What a channel may answer (consent.channels), spelled as in the elicitation form; stored upper-case."""
RISK_TIERS = ("low", "medium", "high")
DEFAULT_PROTECTED_PATHS = (".git/hooks", ".git/config", ".mcp.json", ".vscode", ".claude", ".cursor", ".envrc")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_PLUGIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")  # a module or a pytest11 entry point name


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class AuthPolicy:
    issuer: str = "mcp-gateway"
    audience: str = "mcp-gateway"
    algorithms: tuple[str, ...] = ("HS256",)
    leeway_s: int = 30
    max_ttl_s: int = 86400
    env_token: bool = False
    """A call without `params.auth` authenticates with the server's MCP_GATEWAY_TOKEN (hosts that cannot send it)."""


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    window_s: int = 3600
    attempts_total: int = 30
    elapsed_ms_total: int = 900000


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    enabled: bool = True
    timeout_s: int = 300
    memory_limit_mb: int = 1024
    max_processes: int = 64
    max_output_bytes: int = 4194304
    network: bool = False
    """`sandbox.network: true`: the host's whole network. A mapping sets `egress` instead (network stays false)."""
    allowed_paths: tuple[Path, ...] = ()
    env_whitelist: tuple[str, ...] = ("PATH", "LANG", "LC_ALL")
    scratch_limit_mb: int = 256
    backend: Backend = "native"
    require: tuple[Guarantee, ...] | None = None
    """As listed in the policy; None: sandbox.guarantees.DEFAULT_REQUIRED (see `required`)."""
    pytest_plugins: tuple[str, ...] = ()
    migrated_layers: tuple[str, ...] = ()
    """The old `required_layers` list this policy still has, read as `require` (a warning says so)."""
    protected_paths: tuple[str, ...] = DEFAULT_PROTECTED_PATHS
    """Workspace-relative paths no run may change (`workspace: write` and `review`: docs/declared-tools.md)."""
    max_change_files: int = 1000
    max_change_bytes: int = 16 * 1024 * 1024
    egress: EgressRules | None = None
    """`sandbox.network` as a mapping: the run reaches only what these rules let through the gateway's proxy."""
    max_network_bytes: int = 256 * 1024 * 1024
    """Through the proxy, per run (or per upstream server's life), each way."""

    @property
    def required(self) -> frozenset[Guarantee]:
        """The guarantees without which no write tool runs (the unwaivable ones included)."""
        return required_guarantees(self.require, network=self.network, proxy=self.egress is not None)


@dataclass(frozen=True, slots=True)
class ConsentPolicy:
    mode: Literal["prompt", "deny"] = "prompt"
    timeout_s: int = 300
    expiry_days: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({"low": 90, "medium": 30, "high": 7})
    )
    locale: Literal["en-US", "pt-BR"] = "en-US"
    channels: Mapping[str, frozenset[str]] = field(
        default_factory=lambda: MappingProxyType(
            {
                "elicitation": frozenset({"ALLOW_ONCE", "ALLOW_SESSION", "DENY_ONCE", "DENY_ALWAYS"}),
                "approver": frozenset({"ALLOW_ONCE", "ALLOW_SESSION", "ALLOW_ALWAYS", "DENY_ONCE", "DENY_ALWAYS"}),
            }
        )
    )
    """Who may answer a question and with which decisions (consent.Decision values): `elicitation`, the
    client in band; `approver`, a person at `mcp-gateway approvals`. An empty set: never asked. By
    default only the approver's Allow always is stored (decision 43)."""


@dataclass(frozen=True, slots=True)
class PermissionPromptPolicy:
    enabled: bool = False
    deny: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Policy:
    source: Path
    version: int
    auth: AuthPolicy
    roles: Mapping[str, frozenset[Permission]]
    workspaces: Mapping[str, Path]
    allowlist: tuple[str, ...]
    budget: BudgetPolicy
    sandbox: SandboxPolicy
    consent: ConsentPolicy
    permission_prompt: PermissionPromptPolicy
    declared: Mapping[str, Declaration] = field(default_factory=lambda: MappingProxyType({}))
    """`tools.declared`: the tools this policy's author declared (gateway/declarations.py), by name."""
    upstreams: Mapping[str, Upstream] = field(default_factory=lambda: MappingProxyType({}))
    """`upstreams`: MCP servers put behind the pipeline (gateway/upstream_policy.py), by name."""
    pins: Mapping[Path, Pinned] = field(default_factory=lambda: MappingProxyType({}))
    """Each workspace root and `sandbox.allowed_paths` entry that existed at load, opened then without
    following links and held open for the policy's life (sandbox/pinned.py): stage 4 checks that
    its path still leads to the same inode, and the sandbox uses the fd, never the path again."""


_TOP_KEYS = (
    "version", "auth", "roles", "workspaces", "tools", "budget", "sandbox", "consent", "permission_prompt",
    "upstreams",
)  # fmt: skip


def load_policy(path: Path, known_tools: frozenset[str]) -> Policy:
    """Read and validate a policy file; raise ConfigError with file:line on the first problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read policy file ({exc.strerror})", str(path)) from exc
    return parse_policy(text, path, known_tools)


def parse_policy(text: str, source: Path, known_tools: frozenset[str]) -> Policy:
    try:
        root = compose(text)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise ConfigError(f"not valid YAML: {exc.problem}", f"{source}:{line}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError("not valid YAML", str(source)) from exc
    except RecursionError as exc:  # PyYAML without libyaml composes nested collections recursively
        raise ConfigError("not valid YAML: nested too deeply", str(source)) from exc
    if root is None:
        raise ConfigError("the policy file is empty", f"{source}:1")
    r = NodeReader(source)
    top = r.mapping(root, "the policy", _TOP_KEYS)
    if "version" not in top:
        raise r.fail(root, "missing required key 'version'")
    version = r.integer(top["version"], "version")
    if version != 1:
        raise r.fail(top["version"], f"unsupported policy version {version} (this gateway reads version 1)")
    base = source.parent.resolve()
    # Each section is read on its own, so one pass reports the first error of every section.
    errors: list[ConfigError] = []

    def section(read: Callable[[], _T]) -> _T | None:
        try:
            return read()
        except ConfigError as exc:
            errors.append(exc)
            return None

    workspaces = section(lambda: _workspaces(r, top.get("workspaces"), base))
    sandbox = section(lambda: _sandbox(r, top.get("sandbox"), base))
    auth = section(lambda: _auth(r, top.get("auth")))
    roles = section(lambda: _roles(r, top.get("roles")))
    tools = section(lambda: _tools(r, top.get("tools"), known_tools, sandbox, workspaces))
    upstreams = section(
        lambda: _upstreams(r, top.get("upstreams"), known_tools, sandbox=sandbox, workspaces=workspaces, tools=tools)
    )
    if tools is not None and upstreams is not None:
        section(lambda: _check_allowlist(r, top.get("tools"), known_tools, tools[1], upstreams))
    budget = section(lambda: _budget(r, top.get("budget")))
    consent = section(lambda: _consent(r, top.get("consent")))
    permission_prompt = section(lambda: _permission_prompt(r, top.get("permission_prompt")))
    if errors:
        raise PolicyErrors(errors)
    return Policy(
        source=source,
        version=version,
        auth=_read(auth),
        roles=_read(roles),
        workspaces=_read(workspaces),
        allowlist=_read(tools)[0],
        declared=_read(tools)[1],
        upstreams=_read(upstreams),
        budget=_read(budget),
        sandbox=_read(sandbox),
        consent=_read(consent),
        permission_prompt=_read(permission_prompt),
        pins=pin_existing((*_read(workspaces).values(), *_read(sandbox).allowed_paths)),
    )


def _read(value: _T | None) -> _T:
    """A section that was read (every one is, once no error was collected)."""
    if value is None:
        raise ConfigError("a policy section was not read")
    return value


class PolicyErrors(ConfigError):
    """Every section's first error, in file order; reads as the first one (`where`, `bare_message`) plus the rest."""

    def __init__(self, errors: list[ConfigError]) -> None:
        ordered = sorted(errors, key=_line_of)
        first = ordered[0]
        super().__init__(first.bare_message, first.where)
        self.errors = ordered
        self.args = ("\n".join(str(e) for e in ordered),)


def _line_of(error: ConfigError) -> int:
    where = error.where or ""
    tail = where.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def pin_existing(paths: Iterable[Path]) -> Mapping[Path, Pinned]:
    """Pin each path (already resolved, links followed once) that can be reached now without a link.

    One that cannot (missing, unreachable, swapped for a link since it was resolved) is left
    out: `policy check` and the CLI still work, and stage 4 refuses calls that need it.
    """
    pins: dict[Path, Pinned] = {}
    for path in dict.fromkeys(paths):
        with contextlib.suppress(OSError):
            pins[path] = pin(path)
    return MappingProxyType(pins)


def _section(r: NodeReader, node: yaml.Node | None, name: str, keys: tuple[str, ...]) -> dict[str, yaml.Node]:
    return {} if node is None else r.mapping(node, name, keys)


_Read = TypeVar("_Read")
_Default = TypeVar("_Default")


def _optional(
    d: Mapping[str, yaml.Node], what: str, read: Callable[[yaml.Node, str], _Read], default: _Default
) -> _Read | _Default:
    """The setting `what` (`section.key`) as `read` reads it when the policy sets it, else `default`."""
    key = what.rpartition(".")[2]
    return read(d[key], what) if key in d else default


def _auth(r: NodeReader, node: yaml.Node | None) -> AuthPolicy:
    d = _section(r, node, "auth", ("issuer", "audience", "algorithms", "leeway_s", "max_ttl_s", "env_token"))
    default = AuthPolicy()
    algorithms = default.algorithms
    if "algorithms" in d:
        items = r.strings(d["algorithms"], "auth.algorithms")
        if not items:
            raise r.fail(d["algorithms"], "auth.algorithms must name at least one algorithm")
        for name, item in items:
            if name.lower() == "none":
                raise r.fail(item, "algorithm 'none' is never accepted")
            if name not in SUPPORTED_ALGORITHMS:
                raise r.fail(item, f"unsupported algorithm {name!r} (supported: {', '.join(SUPPORTED_ALGORITHMS)})")
        algorithms = tuple(name for name, _ in items)
    return AuthPolicy(
        issuer=_optional(d, "auth.issuer", r.string, default.issuer),
        audience=_optional(d, "auth.audience", r.string, default.audience),
        algorithms=algorithms,
        leeway_s=_optional(d, "auth.leeway_s", r.count, default.leeway_s),
        max_ttl_s=_optional(d, "auth.max_ttl_s", r.integer, default.max_ttl_s),
        env_token=_optional(d, "auth.env_token", r.boolean, default.env_token),
    )


def _roles(r: NodeReader, node: yaml.Node | None) -> Mapping[str, frozenset[Permission]]:
    if node is None:
        return MappingProxyType(
            {
                "ADMIN": frozenset(Permission),
                "USER": frozenset({Permission.ARTIFACT_READ, Permission.ORCHESTRATION_RUN}),
                "VIEWER": frozenset({Permission.ARTIFACT_READ}),
            }
        )
    roles: dict[str, frozenset[Permission]] = {}
    for name, value in r.mapping(node, "roles", None).items():
        if not _NAME.fullmatch(name):
            raise r.fail(value, f"role name {name!r} must be letters, digits, '_', '.' or '-'")
        perms: set[Permission] = set()
        for perm, item in r.strings(value, f"roles.{name}"):
            if perm not in Permission.__members__:
                known = ", ".join(Permission)
                raise r.fail(item, f"unknown permission {perm!r} in roles.{name} (known: {known})")
            perms.add(Permission(perm))
        roles[name] = frozenset(perms)
    return MappingProxyType(roles)


def _workspaces(r: NodeReader, node: yaml.Node | None, base: Path) -> Mapping[str, Path]:
    if node is None:
        return MappingProxyType({})
    out: dict[str, Path] = {}
    for name, value in r.mapping(node, "workspaces", None).items():
        if not _NAME.fullmatch(name):
            raise r.fail(value, f"workspace name {name!r} must be letters, digits, '_', '.' or '-'")
        out[name] = (base / r.string(value, f"workspaces.{name}")).resolve()
    return MappingProxyType(out)


def _tools(
    r: NodeReader,
    node: yaml.Node | None,
    known_tools: frozenset[str],
    sandbox: SandboxPolicy | None,
    workspaces: Mapping[str, Path] | None,
) -> tuple[tuple[str, ...], Mapping[str, Declaration]]:
    """`tools.allowlist` and `tools.declared` (whose names the allowlist may then list)."""
    d = _section(r, node, "tools", ("allowlist", "declared"))
    declared: Mapping[str, Declaration] = MappingProxyType({})
    if "declared" in d:
        if sandbox is None or workspaces is None:
            raise ConfigError(
                "tools.declared not read: fix the sandbox and workspaces sections first", r.where(d["declared"])
            )
        declared = read_declared(r, d["declared"], _ceilings(sandbox, workspaces), known_tools)
    if "allowlist" not in d:
        return (), declared
    return tuple(name for name, _ in r.strings(d["allowlist"], "tools.allowlist")), declared


def _ceilings(sandbox: SandboxPolicy, workspaces: Mapping[str, Path]) -> Ceilings:
    return Ceilings(
        timeout_s=sandbox.timeout_s,
        memory_limit_mb=sandbox.memory_limit_mb,
        max_processes=sandbox.max_processes,
        readable=(*runtime_read_only_paths(), *sandbox.allowed_paths),
        workspaces=tuple(workspaces.values()),
    )


def _upstreams(
    r: NodeReader,
    node: yaml.Node | None,
    known_tools: frozenset[str],
    *,
    sandbox: SandboxPolicy | None,
    workspaces: Mapping[str, Path] | None,
    tools: tuple[tuple[str, ...], Mapping[str, Declaration]] | None,
) -> Mapping[str, Upstream]:
    """`upstreams` (docs/upstreams.md): read once the sections it depends on are."""
    if node is None:
        return MappingProxyType({})
    if sandbox is None or workspaces is None or tools is None:
        raise ConfigError("upstreams not read: fix the sandbox, workspaces and tools sections first", r.where(node))
    taken = known_tools | frozenset(tools[1])
    return read_upstreams(r, node, _ceilings(sandbox, workspaces), sandbox.max_output_bytes, taken)


def _check_allowlist(
    r: NodeReader,
    node: yaml.Node | None,
    known_tools: frozenset[str],
    declared: Mapping[str, Declaration],
    upstreams: Mapping[str, Upstream],
) -> None:
    """Every name in tools.allowlist is a tool: a built-in, a declared one, or an upstream's offered tool
    (`<upstream>__<tool>`, its tool listed in the upstream's `tools`)."""
    d = _section(r, node, "tools", ("allowlist", "declared"))
    if "allowlist" not in d:
        return
    offered = {u.offered_name(tool) for u in upstreams.values() for tool in u.tools}
    known = known_tools | frozenset(declared) | offered
    for name, item in r.strings(d["allowlist"], "tools.allowlist"):
        if name not in known:
            raise r.fail(item, f"unknown tool {name!r} in tools.allowlist (known: {', '.join(sorted(known))})")


def _budget(r: NodeReader, node: yaml.Node | None) -> BudgetPolicy:
    d = _section(r, node, "budget", ("window_s", "attempts_total", "elapsed_ms_total"))
    default = BudgetPolicy()
    return BudgetPolicy(
        window_s=_optional(d, "budget.window_s", r.integer, default.window_s),
        attempts_total=_optional(d, "budget.attempts_total", r.count, default.attempts_total),
        elapsed_ms_total=_optional(d, "budget.elapsed_ms_total", r.count, default.elapsed_ms_total),
    )


_SANDBOX_KEYS = (
    "enabled", "timeout_s", "memory_limit_mb", "max_processes", "max_output_bytes", "network",
    "allowed_paths", "env_whitelist", "scratch_limit_mb", "backend", "require", "required_layers", "pytest_plugins",
    "protected_paths", "max_change_files", "max_change_bytes", "max_network_bytes",
)  # fmt: skip


def _sandbox(r: NodeReader, node: yaml.Node | None, base: Path) -> SandboxPolicy:
    d = _section(r, node, "sandbox", _SANDBOX_KEYS)
    default = SandboxPolicy()
    allowed_paths = default.allowed_paths
    if "allowed_paths" in d:
        allowed_paths = tuple((base / p).resolve() for p, _ in r.strings(d["allowed_paths"], "sandbox.allowed_paths"))
    env_whitelist = default.env_whitelist
    if "env_whitelist" in d:
        items = r.strings(d["env_whitelist"], "sandbox.env_whitelist")
        for name, item in items:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise r.fail(item, f"{name!r} in sandbox.env_whitelist is not an environment variable name")
        env_whitelist = tuple(name for name, _ in items)
    chosen = _optional(d, "sandbox.backend", r.one_of(BACKENDS), default.backend)
    backend: Backend = "bubblewrap" if chosen == "bubblewrap" else "native"
    network = read_network(r, d["network"], "sandbox.network") if "network" in d else Network()
    require, migrated = _require(r, d, network=network.open)
    plugins = default.pytest_plugins
    if "pytest_plugins" in d:
        items = r.strings(d["pytest_plugins"], "sandbox.pytest_plugins")
        for name, item in items:
            if not _PLUGIN_NAME.fullmatch(name):
                raise r.fail(item, f"{name!r} in sandbox.pytest_plugins is not a plugin (module or entry point) name")
        plugins = tuple(name for name, _ in items)
    return SandboxPolicy(
        enabled=_optional(d, "sandbox.enabled", r.boolean, default.enabled),
        timeout_s=_optional(d, "sandbox.timeout_s", r.integer, default.timeout_s),
        memory_limit_mb=_optional(d, "sandbox.memory_limit_mb", r.integer, default.memory_limit_mb),
        max_processes=_optional(d, "sandbox.max_processes", r.integer, default.max_processes),
        max_output_bytes=_optional(d, "sandbox.max_output_bytes", r.integer, default.max_output_bytes),
        network=network.open,
        egress=network.rules,
        max_network_bytes=_optional(d, "sandbox.max_network_bytes", r.integer, default.max_network_bytes),
        allowed_paths=allowed_paths,
        env_whitelist=env_whitelist,
        scratch_limit_mb=_optional(d, "sandbox.scratch_limit_mb", r.integer, default.scratch_limit_mb),
        backend=backend,
        require=require,
        pytest_plugins=plugins,
        migrated_layers=migrated,
        protected_paths=_protected_paths(r, d),
        max_change_files=_optional(d, "sandbox.max_change_files", r.integer, default.max_change_files),
        max_change_bytes=_optional(d, "sandbox.max_change_bytes", r.integer, default.max_change_bytes),
    )


def _protected_paths(r: NodeReader, d: dict[str, yaml.Node]) -> tuple[str, ...]:
    """`sandbox.protected_paths`: relative, normalised, never leaving the workspace."""
    if "protected_paths" not in d:
        return DEFAULT_PROTECTED_PATHS
    out = []
    for value, item in r.strings(d["protected_paths"], "sandbox.protected_paths"):
        parts = Path(value).parts
        if Path(value).is_absolute() or ".." in parts or "\x00" in value:
            raise r.fail(item, f"{value!r} in sandbox.protected_paths must be relative to the workspace, without '..'")
        out.append(str(Path(*parts)))
    return tuple(out)


def _require(
    r: NodeReader, d: dict[str, yaml.Node], *, network: bool
) -> tuple[tuple[Guarantee, ...] | None, tuple[str, ...]]:
    """`sandbox.require` (guarantees), or the old `sandbox.required_layers` read as the guarantees it stood for.

    With `sandbox.network: true`, no_network stays listed but is not required (SandboxPolicy.required):
    turning the network on is one edit, and `policy check` warns about it."""
    names = ", ".join(Guarantee)
    if "require" in d and "required_layers" in d:
        raise r.fail(
            d["required_layers"], "sandbox.required_layers is the old form of sandbox.require: keep only require"
        )
    if "required_layers" in d:
        items = r.strings(d["required_layers"], "sandbox.required_layers")
        for name, item in items:
            if name not in LAYER_GUARANTEES:
                raise r.fail(
                    item, f"{name!r} is not a layer (sandbox.required_layers is replaced by sandbox.require: {names})"
                )
        layers = tuple(name for name, _ in items)
        chosen = from_layers(layers) | ALWAYS_REQUIRED
        if network:
            chosen -= {Guarantee.NO_NETWORK}
        return tuple(g for g in Guarantee if g in chosen), layers
    if "require" not in d:
        return None, ()
    items = r.strings(d["require"], "sandbox.require")
    listed: set[Guarantee] = set()
    for name, item in items:
        if name not in Guarantee.__members__.values():
            raise r.fail(item, f"{name!r} is not a guarantee ({names})")
        listed.add(Guarantee(name))
    for guarantee in sorted(ALWAYS_REQUIRED - listed):
        raise r.fail(d["require"], f"sandbox.require must list {guarantee}: no policy may waive it")
    return tuple(g for g in Guarantee if g in listed), ()


def _consent(r: NodeReader, node: yaml.Node | None) -> ConsentPolicy:
    d = _section(r, node, "consent", ("mode", "timeout_s", "expiry_days", "locale", "channels"))
    default = ConsentPolicy()
    expiry = dict(default.expiry_days)
    if "expiry_days" in d:
        for tier, value in r.mapping(d["expiry_days"], "consent.expiry_days", RISK_TIERS).items():
            expiry[tier] = r.integer(value, f"consent.expiry_days.{tier}")
    channels = dict(default.channels)
    if "channels" in d:
        for name, value in r.mapping(d["channels"], "consent.channels", CONSENT_CHANNELS).items():
            channels[name] = _channel(r, value, name)
    mode = _optional(d, "consent.mode", r.one_of(CONSENT_MODES), default.mode)
    locale = _optional(d, "consent.locale", r.one_of(LOCALES), default.locale)
    return ConsentPolicy(
        mode="deny" if mode == "deny" else "prompt",
        timeout_s=_optional(d, "consent.timeout_s", r.integer, default.timeout_s),
        expiry_days=MappingProxyType(expiry),
        locale="pt-BR" if locale == "pt-BR" else "en-US",
        channels=MappingProxyType(channels),
    )


def _channel(r: NodeReader, node: yaml.Node, name: str) -> frozenset[str]:
    what = f"consent.channels.{name}"
    answers = r.strings(node, what)
    for answer, item in answers:
        if answer not in CONSENT_ANSWERS:
            raise r.fail(item, f"{answer!r} in {what} is not an answer (one of {', '.join(CONSENT_ANSWERS)})")
    chosen = frozenset(answer.upper() for answer, _ in answers)
    if chosen and "DENY_ONCE" not in chosen:
        raise r.fail(node, f"{what} must list deny_once: whoever may answer may always say no")
    if name == "approver" and not chosen:
        raise r.fail(
            node,
            f"{what} must not be empty: a client that cannot elicit would have nobody to ask"
            " (for stored decisions only, set consent.mode: deny)",
        )
    return chosen


def _permission_prompt(r: NodeReader, node: yaml.Node | None) -> PermissionPromptPolicy:
    d = _section(r, node, "permission_prompt", ("enabled", "deny", "ask", "allow"))

    def rules(key: str) -> tuple[str, ...]:
        if key not in d:
            return ()
        items = r.strings(d[key], f"permission_prompt.{key}")
        for text, item in items:
            try:
                parse_rule(text)
            except ValueError as exc:
                raise r.fail(item, f"permission_prompt.{key}: {exc}") from None
        return tuple(text for text, _ in items)

    enabled = _optional(d, "permission_prompt.enabled", r.boolean, PermissionPromptPolicy().enabled)
    return PermissionPromptPolicy(enabled=enabled, deny=rules("deny"), ask=rules("ask"), allow=rules("allow"))
