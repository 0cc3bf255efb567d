"""Reading Bash commands for `check_permission`'s rules (docs/claude-code.md; decision 41), pure: no I/O, nothing run.

Two readers, one per side of a rule, because the two sides need opposite kinds of error:

- `literal`: the allow side. A command is allow-eligible only if every part is a plain command
  word followed by literal words that bash, sh/dash and zsh all read the same way. A small
  whitelist lexer decides this; anything it does not know is not eligible (a false "ask" at
  worst, never a false "allow").
- `invocations`: the deny and ask side. Every program the command runs that the gateway can
  read: separators, substitutions, subshells, groups, compound-command and function bodies,
  `bash -c`/`eval` strings, wrappers (`env`, `sudo`, `xargs`, `find -exec`, ...), assignments,
  quoting, paths and blanks seen through. tree-sitter-bash reads the structure and a lexer of
  our own reads the same text again; a deny rule applies if either finds a match (wide, so
  that a reader's mistake fails toward deny or ask).
"""

from gateway.rules.shell.invocations import Invocation, Reading, read_invocations
from gateway.rules.shell.literal import LiteralCommand, literal_commands

__all__ = ["Invocation", "LiteralCommand", "Reading", "literal_commands", "read_invocations"]
