"""gateway/rules/egress.py and gateway/egress_policy.py: host patterns, the verdict, the addresses a name may lead to."""

from __future__ import annotations

from ipaddress import ip_address
from pathlib import Path
from textwrap import dedent

import pytest

from gateway.egress_policy import Network, describe_network
from gateway.errors import ConfigError
from gateway.policy import parse_policy
from gateway.policy_warnings import risky_settings
from gateway.proxy import http
from gateway.rules.egress import EgressRules, Verdict, decide, parse_pattern, read_host, refusal_for_address
from gateway.tools.registry import TOOL_NAMES

RULES = EgressRules(
    allow=tuple(parse_pattern(p) for p in ("pypi.org", "*.pythonhosted.org", "10.0.0.5", "[2001:db8::1]:8443", "git.test:22")),
    ask=tuple(parse_pattern(p) for p in ("*",)),
    deny=tuple(parse_pattern(p) for p in ("*.internal", "169.254.169.254", "evil.pypi.org")),
)  # fmt: skip

# (host as the request names it, port, verdict, the rule that decided)
CASES: list[tuple[str, int, Verdict, str | None]] = [
    ("pypi.org", 443, Verdict.ALLOW, "allow: pypi.org"),
    ("PyPI.org.", 80, Verdict.ALLOW, "allow: pypi.org"),  # case and a trailing dot read away
    ("pypi.org", 8080, Verdict.DENY, None),  # another port: no pattern names it (`*` too stands for 80 and 443)
    ("files.pythonhosted.org", 443, Verdict.ALLOW, "allow: *.pythonhosted.org"),
    ("a.b.pythonhosted.org", 443, Verdict.ALLOW, "allow: *.pythonhosted.org"),  # any depth
    ("x.pypi.org", 443, Verdict.ASK, "ask: *"),
    ("pythonhosted.org", 443, Verdict.ASK, "ask: *"),  # `*.x` is never x itself
    ("evilpythonhosted.org", 443, Verdict.ASK, "ask: *"),  # a label boundary, not a suffix
    ("evil.pypi.org", 443, Verdict.DENY, "deny: evil.pypi.org"),  # deny wins
    ("db.internal", 443, Verdict.DENY, "deny: *.internal"),
    ("db.internal", 5432, Verdict.DENY, "deny: *.internal"),  # a deny pattern without a port: every port
    ("10.0.0.5", 443, Verdict.ALLOW, "allow: 10.0.0.5"),  # the literal a rule names
    ("10.0.0.6", 443, Verdict.DENY, None),  # `*` never matches an IP literal
    ("127.0.0.1", 80, Verdict.DENY, None),
    ("169.254.169.254", 80, Verdict.DENY, "deny: 169.254.169.254"),
    ("[2001:db8::1]", 8443, Verdict.ALLOW, "allow: [2001:db8::1]:8443"),
    ("[2001:db8::1]", 443, Verdict.DENY, None),  # its port only
    ("git.test", 22, Verdict.ALLOW, "allow: git.test:22"),
    ("git.test", 443, Verdict.ASK, "ask: *"),
]


@pytest.mark.parametrize(("host", "port", "verdict", "rule"), CASES)
def test_deny_wins_then_named_hosts_then_the_catch_all_and_ports_and_literals_are_named(
    host: str, port: int, verdict: Verdict, rule: str | None
) -> None:
    read = read_host(host)
    assert read is not None
    decision = decide(RULES, read, port)
    assert (decision.verdict, decision.rule) == (verdict, rule)


def test_no_rule_refuses_and_says_when_a_port_or_a_literal_nearly_matched() -> None:
    only_allow = EgressRules(allow=(parse_pattern("pypi.org"), parse_pattern("*")))
    assert decide(only_allow, "pypi.org", 8080).hint == (
        "port 8080 is not named: a pattern without ':port' stands for 80 and 443 (add 'pypi.org:8080')"
    )
    assert "'*' never matches an IP address" in str(decide(only_allow, "127.0.0.1", 80).hint)
    assert decide(EgressRules(), "pypi.org", 443).verdict is Verdict.DENY


@pytest.mark.parametrize(
    ("host", "read"),
    [("0x7f.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("::1", "[::1]"), ("bücher.example", "xn--bcher-kva.example"),
     ("a b", None), ("a/b", None), ("", None), ("x" * 300, None)],
)  # fmt: skip
def test_hosts_are_read_as_the_whatwg_parser_reads_them(host: str, read: str | None) -> None:
    assert read_host(host) == read


@pytest.mark.parametrize(
    ("address", "refused"),
    [("8.8.8.8", None), ("2606:4700::1111", None), ("127.0.0.1", "loopback"), ("::1", "loopback"),
     ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("10.1.2.3", "private"), ("192.168.1.1", "private"),
     ("fd00:ec2::254", "private"), ("0.0.0.0", "unspecified"), ("100.64.0.1", "not public"),  # noqa: S104
     ("224.0.0.1", "multicast"), ("::ffff:127.0.0.1", "loopback"), ("64:ff9b::a9fe:a9fe", "link-local"),
     ("2002:7f00:1::", "loopback")],
)  # fmt: skip
def test_an_address_that_is_not_public_is_refused_however_it_is_written(address: str, refused: str | None) -> None:
    why = refusal_for_address(ip_address(address))
    assert (why if why is None else why.split(" ")[0]) == (refused if refused is None else refused.split(" ")[0])


@pytest.mark.parametrize(
    ("pattern", "words"),
    [("*.*.example.com", "stands alone"), ("a*.example.com", "stands alone"), ("*.10.0.0.1", "domain name"),
     ("2001:db8::1", "in brackets"), ("pypi.org:0", "a port"), ("pypi.org:http", "a port"), ("[::1", "closing"),
     ("http://pypi.org", "a port"), ("pypi.org/simple", "WHATWG")],
)  # fmt: skip
def test_a_bad_pattern_says_what_is_wrong(pattern: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_pattern(pattern)


POLICY = """\
version: 1
workspaces:
  default: ws
sandbox:
  max_network_bytes: 1000000
  network:
    allow: [pypi.org, "*.pythonhosted.org"]
    ask: ["*"]
    deny: ["169.254.169.254", "*.internal"]
    resolve: {mirror.test: 127.0.0.1}
"""


def test_the_network_mapping_is_read_into_rules(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    policy = parse_policy(POLICY, tmp_path / "policy.yaml", TOOL_NAMES)
    sandbox = policy.sandbox
    assert sandbox.network is False and sandbox.egress is not None
    assert [p.text for p in sandbox.egress.allow] == ["pypi.org", "*.pythonhosted.org"]
    assert dict(sandbox.egress.resolve) == {"mirror.test": ip_address("127.0.0.1")}
    assert sandbox.max_network_bytes == 1000000
    assert "network_through_proxy" in sandbox.required and "no_network" not in sandbox.required


@pytest.mark.parametrize(
    ("line", "replacement", "words"),
    [
        (7, '    allow: ["*.*.x"]', "'*.*.x' in sandbox.network.allow: a '*' stands alone"),
        (7, "    allow: pypi.org", "sandbox.network.allow must be a list"),
        (7, "    permit: [pypi.org]", "unknown key 'permit' in sandbox.network"),
        (
            10,
            "    resolve: {mirror.test: nowhere}",
            "sandbox.network.resolve.mirror.test: 'nowhere' must be an IP address",
        ),
        (10, '    resolve: {"*.test": 127.0.0.1}', "is not a host name"),
        (10, '    resolve: {"10.0.0.1": 127.0.0.1}', "is not a host name"),
        (6, "  network: maybe", "sandbox.network must be true or false, or a mapping"),
    ],
)
def test_a_bad_network_key_is_a_file_line_error(tmp_path: Path, line: int, replacement: str, words: str) -> None:
    (tmp_path / "ws").mkdir()
    lines = POLICY.splitlines()
    lines[line - 1] = replacement
    if line == 6:
        lines = lines[:6]
    with pytest.raises(ConfigError) as caught:
        parse_policy("\n".join(lines) + "\n", tmp_path / "policy.yaml", TOOL_NAMES)
    assert words in str(caught.value)
    assert f"policy.yaml:{line}" in str(caught.value)


def test_an_upstream_takes_the_same_mapping(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "bin").mkdir()
    server = tmp_path / "bin" / "server"
    server.write_text("#!/bin/sh\nexec cat\n")
    server.chmod(0o755)
    text = POLICY.replace("sandbox:\n", "sandbox:\n  allowed_paths: [bin]\n") + dedent(
        f"""\
        upstreams:
          fetch:
            command: [{server}]
            network:
              allow: [api.github.com]
        """
    )
    upstream = parse_policy(text, tmp_path / "policy.yaml", TOOL_NAMES).upstreams["fetch"]
    assert upstream.network is False and upstream.egress is not None
    assert [p.text for p in upstream.egress.allow] == ["api.github.com"]


def test_ask_on_a_named_host_wins_over_allow_and_deny_star_wins_over_everything() -> None:
    both = EgressRules(allow=(parse_pattern("*.example.com"),), ask=(parse_pattern("pay.example.com"),))
    assert decide(both, "pay.example.com", 443).verdict is Verdict.ASK
    assert decide(both, "www.example.com", 443).verdict is Verdict.ALLOW
    closed = EgressRules(allow=(parse_pattern("pypi.org"),), deny=(parse_pattern("*"),))
    assert decide(closed, "pypi.org", 443) == decide(closed, "other.org", 443)
    assert decide(closed, "pypi.org", 443).rule == "deny: *"


def test_policy_check_warns_about_allow_star_and_describes_the_rules(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    text = POLICY.replace("allow: [pypi.org", 'allow: ["*", pypi.org')
    policy = parse_policy(text, tmp_path / "policy.yaml", TOOL_NAMES)
    messages = [w.message for w in risky_settings(policy, None)]
    assert any(m.startswith("sandbox.network.allow has '*'") for m in messages)
    assert policy.sandbox.egress is not None
    assert describe_network(Network(rules=policy.sandbox.egress)) == (
        "through the gateway's proxy (deny: 169.254.169.254, *.internal; ask: *; allow: *, pypi.org,"
        " *.pythonhosted.org; resolve: mirror.test -> 127.0.0.1)"
    )
    assert describe_network(Network()) == "no network"


@pytest.mark.parametrize(
    "spelling",
    ["db.internal", "DB.INTERNAL", "db.internal.", "db%2einternal", "\uff44\uff42.internal"],
)
def test_a_denied_name_is_denied_however_it_is_spelled(spelling: str) -> None:
    read = read_host(spelling)
    assert read == "db.internal"
    assert decide(RULES, read, 443).verdict is Verdict.DENY


@pytest.mark.parametrize("spelling", ["169.254.169.254", "0xa9.0xfe.0xa9.0xfe", "2852039166", "169.254.43518"])
def test_the_metadata_address_is_the_same_literal_however_it_is_written(spelling: str) -> None:
    read = read_host(spelling)
    assert read == "169.254.169.254"
    assert decide(RULES, read, 80).rule == "deny: 169.254.169.254"


def test_the_remembered_readings_of_hosts_are_bounded_and_read_alike() -> None:
    """Decision 102: a host's reading and a Host header's are remembered, but only short ones (a run's hostile 64 KiB
    header is read anew, never kept), and a remembered reading is the reading."""
    before = http._kept_host_header.cache_info().currsize
    long_header = b"a" * (http.HOST_KEPT + 1) + b".test"
    assert http._host_header(long_header) == (None, 80)  # longer than a host may be: no host
    assert http._kept_host_header.cache_info().currsize == before
    for _ in range(2):
        assert http._host_header(b"Example.TEST.:8080") == ("example.test", 8080)
        assert read_host("EXAMPLE.test.") == "example.test" and read_host("x" * 256) is None
    assert http._kept_host_header.cache_info().hits >= 1
