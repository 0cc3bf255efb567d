"""WebFetch hosts are read as the fetcher reads them (decision 39), table by table.

Claude Code fetches with Node, whose URL parser is WHATWG's (ada). Each URL is judged under two rule
sets: DENYING (deny rules on the hosts an attacker wants, an allow rule on the docs host) and
ALLOWING (the allow rules alone), and the host the approver is shown is checked. A deny rule must
match every plausible reading of the host; an allow rule only a plain URL whose WHATWG host is its host.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.previews import preview
from gateway.rules.hosts import read_host
from gateway.rules.permissions import RuleSet, judge, parse_rule

ALLOW = ["WebFetch(domain:docs.example.com)", "WebFetch(domain:10.0.0.1)", "WebFetch(domain:xn--mnchen-3ya.de)"]
DENY = [
    "WebFetch(domain:evil.example)",
    "WebFetch(domain:127.0.0.1)",
    "WebFetch(domain:::1)",
    "WebFetch(domain:münchen.de)",
]
DENYING = RuleSet.parse(DENY, [], ALLOW)
ALLOWING = RuleSet.parse([], [], ALLOW)

# (url, verdict under DENYING, verdict under ALLOWING, the host shown: the WHATWG host)
CASES: list[tuple[str, str, str, str | None]] = [
    # plain URLs
    ("https://docs.example.com/a?b=1", "allow", "allow", "docs.example.com"),
    ("http://docs.example.com/", "allow", "allow", "docs.example.com"),
    ("HTTPS://DOCS.Example.COM/", "allow", "allow", "docs.example.com"),  # uppercase scheme and host
    ("https://docs.example.com:443/", "allow", "allow", "docs.example.com"),
    ("https://docs.example.com:8443/x", "allow", "allow", "docs.example.com"),
    ("https://docs.example.com#@evil.example", "allow", "allow", "docs.example.com"),  # `@` after the host
    ("https://docs.example.com?@evil.example", "allow", "allow", "docs.example.com"),
    ("https://docs.example.com/@evil.example", "allow", "allow", "docs.example.com"),
    ("https://evil.example/", "deny", "ask", "evil.example"),
    ("https://sub.docs.example.com/", "ask", "ask", "sub.docs.example.com"),  # not its subdomains
    ("https://docs.example.com.evil.example/", "ask", "ask", "docs.example.com.evil.example"),
    # an outside review's cases: a backslash, a trailing dot, percent-encoding, full-width letters
    ("https://evil.example\\@docs.example.com/", "deny", "ask", "evil.example"),
    ("https://evil.example./", "deny", "ask", "evil.example."),
    ("https://%65vil.example/", "deny", "ask", "evil.example"),
    ("https://\uff45\uff56\uff49\uff4c.example/", "deny", "ask", "evil.example"),
    ("https://\uff24\uff2f\uff23\uff33.example.com/", "ask", "ask", "docs.example.com"),
    ("https://docs%2Eexample.com/", "ask", "ask", "docs.example.com"),
    ("https://docs.example.com./", "ask", "ask", "docs.example.com."),
    ("https://evil.example../", "deny", "ask", "evil.example.."),
    # userinfo, every way round
    ("https://user:pw@docs.example.com/", "ask", "ask", "docs.example.com"),
    ("https://docs.example.com@evil.example/", "deny", "ask", "evil.example"),
    ("https://docs.example.com:443@evil.example/", "deny", "ask", "evil.example"),
    ("https://a@docs.example.com@evil.example/", "deny", "ask", "evil.example"),
    ("https://evil.example@docs.example.com/", "deny", "ask", "docs.example.com"),  # a deny reads the user part too
    ("https://@docs.example.com/", "ask", "ask", "docs.example.com"),
    # backslashes and slashes the two parsers read differently
    ("http:\\\\docs.example.com/", "ask", "ask", "docs.example.com"),
    ("https:\\\\evil.example\\", "deny", "ask", "evil.example"),
    ("https:/docs.example.com/", "ask", "ask", "docs.example.com"),
    ("https:docs.example.com/", "ask", "ask", "docs.example.com"),
    ("https:///docs.example.com/", "ask", "ask", "docs.example.com"),
    ("//docs.example.com/x", "ask", "ask", None),  # scheme-relative: no URL to the fetcher
    ("//evil.example/x", "deny", "ask", None),
    # blanks and controls WHATWG strips, unicode dots, zero-width characters
    ("https://docs.exa\tmple.com/", "ask", "ask", "docs.example.com"),
    ("https://evil.exa\nmple/", "deny", "ask", "evil.example"),
    ("https://evil.example\r/", "deny", "ask", "evil.example"),
    (" https://docs.example.com/", "ask", "ask", "docs.example.com"),
    ("https://evil。example/", "deny", "ask", "evil.example"),
    ("https://evil\uff0eexample/", "deny", "ask", "evil.example"),
    ("https://docs.example.com。evil.example/", "ask", "ask", "docs.example.com.evil.example"),
    ("https://docs\u200b.example.com/", "ask", "ask", "docs.example.com"),
    ("https://evil\u200b.example/", "deny", "ask", "evil.example"),
    ("https://evil\u00ad.example/", "deny", "ask", "evil.example"),  # a soft hyphen
    # IP addresses in odd forms
    ("http://127.0.0.1/", "deny", "ask", "127.0.0.1"),
    ("http://0x7f.1/", "deny", "ask", "127.0.0.1"),
    ("http://2130706433/", "deny", "ask", "127.0.0.1"),
    ("http://0177.0.0.1/", "deny", "ask", "127.0.0.1"),
    ("http://127.1/", "deny", "ask", "127.0.0.1"),
    ("http://127.0.0.1./", "deny", "ask", "127.0.0.1"),
    ("http://[::ffff:127.0.0.1]/", "deny", "ask", "[::ffff:7f00:1]"),
    ("http://[::1]/", "deny", "ask", "[::1]"),
    ("http://[0:0:0:0:0:0:0:1]:8080/", "deny", "ask", "[::1]"),
    ("http://10.0.0.1/", "allow", "allow", "10.0.0.1"),
    ("http://0xa.0.0.1/", "ask", "ask", "10.0.0.1"),
    ("http://167772161/", "ask", "ask", "10.0.0.1"),
    # internationalised names: never allowed, denied in either spelling
    ("https://xn--mnchen-3ya.de/", "deny", "ask", "xn--mnchen-3ya.de"),
    ("https://münchen.de/", "deny", "ask", "xn--mnchen-3ya.de"),
    ("https://MÜNCHEN.de/", "deny", "ask", "xn--mnchen-3ya.de"),
    # ports, empty hosts, other schemes
    ("https://docs.example.com:99999/", "ask", "ask", None),
    ("https://docs.example.com:0x1bb/", "ask", "ask", None),
    ("https://docs.example.com:80:90/", "ask", "ask", None),
    ("https:///", "ask", "ask", None),
    ("https://:443/", "ask", "ask", None),
    ("", "ask", "ask", None),
    ("data:text/html,<script>", "ask", "ask", None),
    ("file:///etc/passwd", "ask", "ask", None),
    ("file://docs.example.com/etc/passwd", "ask", "ask", "docs.example.com"),
    ("javascript:alert(1)", "ask", "ask", None),
    ("ftp://docs.example.com/", "ask", "ask", "docs.example.com"),
    ("ws://docs.example.com/", "ask", "ask", "docs.example.com"),
    ("blob:https://docs.example.com/x", "ask", "ask", None),
    ("docs.example.com", "ask", "ask", None),
]


@pytest.mark.parametrize(("url", "denying", "allowing", "host"), CASES)
def test_webfetch_hosts(url: str, denying: str, allowing: str, host: str | None) -> None:
    assert judge(DENYING, "WebFetch", {"url": url}).verdict == denying
    assert judge(ALLOWING, "WebFetch", {"url": url}).verdict == allowing
    assert read_host(url).host == host


@pytest.mark.parametrize("tool_input", [{}, {"url": None}, {"url": 5}, {"url": ["https://docs.example.com/"]}])
def test_a_missing_url_is_asked(tool_input: dict[str, Any]) -> None:
    assert judge(DENYING, "WebFetch", tool_input).verdict == "ask"


def test_a_bare_webfetch_rule_still_covers_every_url() -> None:
    assert judge(RuleSet.parse(["WebFetch"], [], []), "WebFetch", {"url": "x"}).verdict == "deny"
    assert (
        judge(RuleSet.parse([], [], ["WebFetch"]), "WebFetch", {"url": "https://evil.example\\@a/"}).verdict == "allow"
    )


@pytest.mark.parametrize(
    "text", ["WebFetch(domain:Docs.Example.COM)", "WebFetch(domain:münchen.de)", "WebFetch(domain:127.0.0.1)",
             "WebFetch(domain:::1)", "WebFetch(domain:[::1])", "WebFetch(domain:docs.example.com.)"],
)  # fmt: skip
def test_domain_rules_parse(text: str) -> None:
    assert parse_rule(text).text == text


def test_a_rule_host_is_compared_as_the_fetcher_writes_it() -> None:
    for rule in ("WebFetch(domain:DOCS.example.com)", "WebFetch(domain:docs.example.com.)"):
        assert judge(RuleSet.parse([], [], [rule]), "WebFetch", {"url": "https://docs.example.com/"}).verdict == "allow"
    full_width = RuleSet.parse(["WebFetch(domain:\uff45\uff56\uff49\uff4c.example)"], [], [])
    assert judge(full_width, "WebFetch", {"url": "https://evil.example/"}).verdict == "deny"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("WebFetch(domain:*.example.com)", "no wildcards"),
        ("WebFetch(domain:https://example.com)", "no scheme, port, path or user"),
        ("WebFetch(domain:example.com:443)", "no scheme, port, path or user"),
        ("WebFetch(domain:example.com/path)", "no scheme, port, path or user"),
        ("WebFetch(domain:user@example.com)", "no scheme, port, path or user"),
        ("WebFetch(domain:exa mple.com)", "no scheme, port, path or user"),
    ],
)
def test_domain_rules_that_name_no_single_host_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rule(text)


def test_the_host_shown_is_the_one_the_fetcher_connects_to() -> None:
    shown = preview("WebFetch", {"url": "https://evil.example\\@docs.example.com/", "prompt": "p"}, None)
    assert shown is not None and "host: evil.example" in shown and "host: docs.example.com" not in shown
