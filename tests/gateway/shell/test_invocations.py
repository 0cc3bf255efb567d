"""The deny side's reading (gateway/rules/shell/): words, wrappers, texts a shell runs, bounds."""

from __future__ import annotations

import time

import pytest

from gateway.rules.permissions import Judgement, RuleSet, judge
from gateway.rules.shell import invocations, lexer, read_invocations, tree
from gateway.rules.shell.invocations import MAX_DEPTH
from gateway.rules.shell.words import WordBuilder, decode_ansi_c, expand_braces, word_of


def programs(command: str) -> list[str]:
    """The invocations read, as text (an expansion shown as `?`), in a stable order."""
    return sorted({i.text for i in read_invocations(command).invocations})


@pytest.mark.parametrize(
    ("body", "value"),
    [
        ("\\x72m", "rm"), ("\\162m", "rm"), ("\\u0072m", "rm"), ("\\U00000072m", "rm"), ("a\\tb", "a\tb"),
        ("\\'", "'"), ("\\\\", "\\"), ("\\cA", "\x01"), ("\\e[0m", "\x1b[0m"), ("\\q", "\\q"), ("x\\", "x\\"),
        ("\\xg", "\\xg"), ("\\u", "\\u"),  # no digit after `\\x`/`\\u`: bash keeps the backslash
        ("a[\\x24(touch P)]", "a[$(touch P)]"),
    ],
)  # fmt: skip
def test_ansi_c_strings_are_decoded_as_bash_does(body: str, value: str) -> None:
    assert decode_ansi_c(body) == value


def chars(text: str, quoted: str = "") -> tuple[tuple[str, bool], ...]:
    return tuple((c, c in quoted) for c in text)


def test_brace_expansion_applies_to_unquoted_braces_with_a_comma_and_is_bounded() -> None:
    assert ["".join(c for c, _ in w) for w in expand_braces(chars("{rm,-rf,x}"))] == ["rm", "-rf", "x"]
    assert ["".join(c for c, _ in w) for w in expand_braces(chars("a{b,c{d,e}}f"))] == ["abf", "acdf", "acef"]
    assert len(expand_braces(chars("{a,b}" * 10))) == 64
    assert expand_braces(chars("{rm,x}", quoted="{}")) == [chars("{rm,x}", quoted="{}")]
    assert expand_braces(chars("{rm}")) == [chars("{rm}")]
    quoted_comma = expand_braces((*chars("{rm"), (",", True), *chars("-rf,x}")))  # `{rm','-rf,x}`
    assert ["".join(c for c, _ in w) for w in quoted_comma] == ["rm,-rf", "x"]


def test_a_word_with_glob_characters_may_be_any_value_they_match() -> None:
    word = word_of(chars("/bin/r[mx]")).basename()
    assert word.may_be("rm") and word.may_be("rx") and not word.may_be("ls")
    assert word_of(chars("r*", quoted="*")).may_be("r*") and not word_of(chars("r*", quoted="*")).may_be("rm")
    star = word_of(chars("/bin/rm**")).basename()  # a trailing star may be nothing: `rm**` may be `rm`
    assert star.may_be("rm") and star.may_be("rmdir") and not star.may_be("r")


@pytest.mark.parametrize("command", ['rm *"*"; rm "*"*', 'rm "*"*; rm *"*"'])
def test_two_programs_whose_words_read_alike_but_match_differently_are_both_kept(command: str) -> None:
    """`*"*"` and `"*"*` are both `**`, but only the second may be `*a`: neither reading hides the other."""
    rules = RuleSet.parse(["Bash(rm *a:*)"], [], ["Bash"])
    assert judge(rules, "Bash", {"command": command}) == Judgement("deny", "Bash(rm *a:*)")


def test_a_word_holding_an_expansion_may_be_anything_but_names_a_program_only_by_its_known_start() -> None:
    builder = WordBuilder()
    builder.add("rm", quoted=False)
    builder.add_unknown()
    (word,) = builder.take()
    assert not word.known and word.may_be("anything")
    assert word.may_name("rm") and word.may_name("rmdir") and not word.may_name("ls")
    builder.add_unknown()
    (computed,) = builder.take()
    assert not computed.may_name("rm")  # `$EDITOR x`: asked, never matched


@pytest.mark.parametrize(
    ("command", "found"),
    [
        ("nice -n 5 grep rm file", ["grep rm file", "nice -n 5 grep rm file"]),  # grep's argument is no command
        ("sudo -u rm ls", ["ls", "sudo -u rm ls"]),  # -u takes a value
        ("timeout 5 ls", ["ls", "timeout 5 ls"]),
        ("sudo --weird ls x", ["ls x", "sudo --weird ls x", "x"]),  # an unknown option: read both ways
        ("command -v rm", ["command -v rm"]),  # only says where rm is
        ("xargs -n1 -I{} rm {}", ["rm {}", "xargs -n1 -I{} rm {}"]),
        ("find . -exec rm {} + -exec ls \\;", ["find . -exec rm {} + -exec ls ;", "ls", "rm {}"]),
        ("bash script.sh", ["bash script.sh"]),  # a script file is not read
        ("env -S 'rm x'", ["env -S rm x", "rm x"]),
    ],
)
def test_wrappers_are_read_by_their_options(command: str, found: list[str]) -> None:
    assert programs(command) == found


def test_nested_shell_strings_are_read_to_a_bounded_depth() -> None:
    command = "rm x"
    for _ in range(MAX_DEPTH):
        command = f"sh -c {_quote(command)}"
    reading = read_invocations(command)
    assert "rm x" in {i.text for i in reading.invocations} and reading.complete
    deeper = read_invocations(f"sh -c {_quote(command)}")
    assert not deeper.complete and deeper.exceeded, "past the bound: never allowed by a rule, denied"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@pytest.mark.parametrize("command", ["{rm,x}", 'rm "x', "pytest $(", "case", "f() {"])
def test_a_command_tree_sitter_cannot_read_is_incomplete(command: str) -> None:
    assert not read_invocations(command).complete


def test_a_huge_command_stays_bounded() -> None:
    reading = read_invocations("; ".join(f"p{i} x" for i in range(5000)))
    assert not reading.complete and reading.exceeded and len(reading.invocations) <= 2048


def test_heredocs_are_stdin_not_commands_unless_a_shell_reads_them() -> None:
    assert programs("cat <<'EOF'\nrm -rf ~\nEOF") == ["cat"]
    assert programs("cat <<EOF\nrm $(ls)\nEOF") == ["cat", "ls"]  # expanded: its substitutions run
    assert "rm -rf ~" in programs("sh <<'EOF'\nrm -rf ~\nEOF")
    assert "rm x" in programs("echo -e 'rm\\x20x' | bash")


def lexed(command: str) -> tuple[list[list[str]], list[list[str]], list[str]]:
    """The lexer's words (an expansion shown as `?`), standard inputs and substitution bodies."""
    commands, nested = lexer.lex(command)
    return [[w.text if w.known else "?" for w in c.words] for c in commands], [c.stdin for c in commands], nested


@pytest.mark.parametrize(
    ("command", "words", "nested"),
    [
        ("rm a#b c$% $", [["rm", "a#b", "c$%", "$"]], []),  # `#` inside a word and a bare `$` are characters
        ('rm "-r\\\nf" x', [["rm", "-rf", "x"]], []),  # a line continuation inside double quotes is removed
        ('rm "$1" "x$HOME" "a$ b" "\\$"', [["rm", "?", "?", "a$ b", "$"]], []),
        ("rm -rf /x>/dev/null", [["rm", "-rf", "/x"]], []),  # a word ending at `>` is an argument
        ("rm 2>/dev/null x", [["rm", "x"]], []),  # `2>`: the number belongs to the redirection
        ("rm $1 $@ $?", [["rm", "?", "?", "?"]], []),
        ("echo $(echo \\); rm y)", [["echo", "?"]], ["echo \\); rm y"]),  # an escaped `)` does not close it
        ('echo $(echo ")\\""; rm z)', [["echo", "?"]], ['echo ")\\""; rm z']),  # nor one in double quotes
    ],
)
def test_the_lexer_reads_words_as_bash_does(command: str, words: list[list[str]], nested: list[str]) -> None:
    assert lexed(command)[0] == words and lexed(command)[2] == nested


def test_the_lexer_reads_a_heredoc_delimiter_after_blanks() -> None:
    assert lexed("cat << \t EOF\nrm x\nEOF\nls") == ([["cat"], ["ls"]], [["rm x"], []], [])


def test_a_here_string_piped_through_a_redirection_reaches_the_shell() -> None:
    (cat, sh), _ = tree.parse("cat <<< 'rm x' >&2 | sh")
    assert cat.stdin == ["rm x"] and sh.piped_from is cat
    assert "rm x" in programs("cat <<< 'rm x' >&2 | sh") and "rm -rf /" in programs("cat <<EOF | sh\nrm -rf /\nEOF")
    assert programs("<<< 'rm x' | sh") == ["sh"]  # no command before the pipe: nothing written to the shell
    assert programs("tr a b <<< 'rm x' | sh") == ["sh", "tr a b"]  # what tr writes is not known: not read


@pytest.mark.parametrize(
    "command",
    [
        "while read l; do echo $l; done <<< 'rm x' | sh",  # a loop's input, written on to a shell
        "if true; then cat; fi <<< 'rm x' | sh",
        "while true; do sh; done <<< 'rm x'",  # a shell inside the loop reads the loop's input
        "echo rm x | ( bash )",  # into a subshell
        "{ echo rm x; } | sh",  # out of a group
        "cat <<< 'rm x' | { cat; } | sh",  # through a group
        "{ cat; } < <(echo rm x) | sh",
        # Past what tree-sitter parses (a here-string or here-document after `}` or `)`): the lexer reads them.
        "{ cat; } <<< 'rm x' | sh",
        "( cat ) <<< 'rm x' | sh",
        "{ sh; } <<< 'rm x'",
        "( sh ) <<< 'rm x'",
        "{ cat; } <<EOF | sh\nrm x\nEOF",
        "( cat ) <<EOF | bash\nrm x\nEOF",
        "for i in 1; do cat; done <<< 'rm x' | sh",
    ],
)
def test_input_into_or_out_of_a_compound_command_reaches_a_shell(command: str) -> None:
    """A group, a subshell, a loop or an `if` passes its input to the commands inside, and what they write on
    down the pipe: a shell there runs it. Each was `ask` where the deny rule applies (the rule never saw `rm`)."""
    assert judge(RuleSet.parse(["Bash(rm:*)"], [], ["Bash"]), "Bash", {"command": command}).verdict == "deny"


def test_a_rule_longer_than_the_command_does_not_match_it() -> None:
    (invocation,) = read_invocations("git push").invocations
    assert not invocation.starts_with(["git", "push", "origin"]) and invocation.starts_with(["git", "push"])
    rules = RuleSet.parse(["Bash(git push origin:*)"], [], ["Bash"])
    assert judge(rules, "Bash", {"command": "git push"}).verdict == "allow"  # the deny rule does not apply


def test_tree_sitter_stops_at_its_cpu_deadline() -> None:
    """Its error recovery is superlinear on some input: past the deadline the parse is cancelled."""
    command = "{|{{||{" * 4000
    started = time.thread_time()
    with pytest.raises(tree.ParseTooSlow):
        tree.parse(command, started + 0.05)
    assert time.thread_time() - started < 1.0
    assert tree.parse("ls", started + 100)[1]


def test_a_reading_past_tree_sitters_time_is_incomplete(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(invocations, "TREE_SITTER_S", 0.0)  # the limit reached before the first parse
    reading = read_invocations("ls " + "x " * 4000)
    assert not reading.complete and "ls " + "x " * 3999 + "x" in {i.text for i in reading.invocations}
