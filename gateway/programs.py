"""A declared tool's program (docs/declared-tools.md, decision 77): found once at policy load, pinned, checked before each run.

`find_program` resolves the command's first word: an absolute path as written, a relative path
(with a '/') against the policy file's folder, a bare name through the gateway's own PATH when
it loads the policy. `pin_program` records what it found: the path the run will execute (links
not resolved, so a virtualenv's launcher still finds its `pyvenv.cfg`), the file it leads to,
that file's identity (device, inode, size, mtime and ctime in nanoseconds) and its sha256; for a
`#!` script, its interpreter, pinned the same way. `program_change` compares the identities
again (the path resolved and one stat: 16-33 µs measured); the content hash is taken at load
only (42-57 ms for the 24.5 MB ruff binary, 164 ms for the 99 MB node) and goes into the tool's consent fingerprint, so a program upgraded
between two loads asks the person again even if its inode was reused.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.errors import PolicyBlockedError, Reason

_SHEBANG_BYTES = 256
"""Linux reads at most this much of a '#!' line (BINPRM_BUF_SIZE)."""
_HASH_CHUNK = 1 << 20


class ProgramError(Exception):
    """The program cannot be used; the message says why and what to change."""


@dataclass(frozen=True, slots=True)
class Program:
    path: Path
    """What the run executes: absolute, its links left as they are."""
    real: Path
    """The file `path` leads to."""
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    sha256: str
    interpreter: Program | None = None
    """A '#!' script's interpreter (its first word), pinned likewise; `/usr/bin/env NAME` pins env, not NAME."""

    def identity(self) -> dict[str, Any]:
        """What the consent fingerprint covers of the program (and of its interpreter)."""
        return {
            "path": str(self.path),
            "real": str(self.real),
            "sha256": self.sha256,
            "size": self.size,
            "interpreter": None if self.interpreter is None else self.interpreter.identity(),
        }


def find_program(word: str, base: Path, search_path: str) -> Path:
    """The absolute path `word` names (not yet checked to be a program). Raises ProgramError."""
    if "\x00" in word:
        raise ProgramError("the program's name holds a NUL byte")
    if "/" in word:
        return Path(os.path.abspath(base / word))  # absolute stays as is; `..` folded, links kept
    for folder in search_path.split(os.pathsep):
        if not folder or not os.path.isabs(folder):
            continue  # an empty or relative PATH entry would mean the gateway's working folder
        candidate = Path(folder) / word
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ProgramError(f"program {word!r} not found on the gateway's PATH ({search_path or 'empty'})")


def pin_program(path: Path, *, depth: int = 0) -> Program:
    """Pin the regular, executable file `path` leads to. Raises ProgramError naming the problem."""
    try:
        real = path.resolve(strict=True)
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ProgramError(f"program {str(path)!r} cannot be opened ({exc.strerror})") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ProgramError(f"program {str(path)!r} is not a regular file")
        if not info.st_mode & 0o111:
            raise ProgramError(f"program {str(path)!r} is not executable (chmod +x)")
        digest = hashlib.sha256()
        first = b""
        while chunk := os.read(fd, _HASH_CHUNK):
            first = first or chunk[:_SHEBANG_BYTES]
            digest.update(chunk)
    except OSError as exc:
        raise ProgramError(f"program {str(path)!r} cannot be read ({exc.strerror})") from exc
    finally:
        os.close(fd)
    interpreter = None
    if first.startswith(b"#!"):
        if depth > 0:
            raise ProgramError(f"interpreter {str(path)!r} is itself a '#!' script: name a binary interpreter")
        interpreter = pin_program(_interpreter(path, first), depth=depth + 1)
    return Program(
        path=path,
        real=real,
        device=info.st_dev,
        inode=info.st_ino,
        size=info.st_size,
        mtime_ns=info.st_mtime_ns,
        ctime_ns=info.st_ctime_ns,
        sha256=digest.hexdigest(),
        interpreter=interpreter,
    )


def _interpreter(script: Path, first: bytes) -> Path:
    line = first[2:].split(b"\n", 1)[0].strip()
    word = line.split(maxsplit=1)[0] if line else b""
    if not word.startswith(b"/"):
        raise ProgramError(f"script {str(script)!r} names no absolute interpreter on its '#!' line")
    return Path(os.fsdecode(word))


def program_change(program: Program) -> str | None:
    """Why the program is no longer the one pinned (None: it is). The path is followed again, so a
    file replaced by rename, edited in place (mtime, ctime) or a link pointed elsewhere all count."""
    try:
        real = program.path.resolve(strict=True)
        info = os.stat(real, follow_symlinks=False)
    except OSError as exc:
        return f"{str(program.path)!r} cannot be reached ({exc.strerror})"
    if real != program.real:
        return f"{str(program.path)!r} now leads to {str(real)!r}, not {str(program.real)!r}"
    pinned = (program.device, program.inode, program.size, program.mtime_ns, program.ctime_ns)
    now = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    if now != pinned or not stat.S_ISREG(info.st_mode):
        return f"{str(program.path)!r} was replaced or changed since the policy was loaded"
    if program.interpreter is not None:
        return program_change(program.interpreter)
    return None


def check_program_unchanged(program: Program, owner: str) -> None:
    """-32004 `program_changed` when `owner`'s program (`tools.declared.NAME`, `upstreams.NAME`) is no longer
    the one pinned at load."""
    why = program_change(program)
    if why is not None:
        raise PolicyBlockedError(
            Reason.PROGRAM_CHANGED,
            f"{owner}'s program changed since the policy was loaded: {why};"
            " restore it, or restart the gateway to pin the new one (a person is then asked again)",
        )
