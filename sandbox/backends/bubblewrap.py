"""The bubblewrap backend: a PID namespace and a minimal mount tree around the command (decision 26).

bubblewrap (Debian's `bubblewrap`, not setuid) is started by the child after the steps that
need root and after the uid drop (sandbox/confine.py): run by root it would keep
CAP_SYS_ADMIN and a `remount,rw /` escape would work; run by the pool uid it can only
create a user namespace of its own. In it, it builds a new root holding nothing but:

- read-only binds of the grants (the interpreter's prefixes, `/usr`, the workspace,
  `allowed_paths`; a top-level symlink such as `/lib -> usr/lib` as the same symlink); a
  pinned grant (sandbox/pinned.py: the workspace and `allowed_paths` as the policy found them
  at load) is bound from its fd (`--ro-bind-fd`) at its pinned path, whatever that path
  leads to now; bubblewrap checks the mount is the fd's inode and closes the fd;
- the scratch folder, bound read-write: the size-limited tmpfs the child already moved
  there (scratch.ScratchSpace), so the gateway still reads the run's files through its fd;
- a private `/dev` (null, zero, random, urandom, tty...) and a `/proc` of the new PID
  namespace, which shows the run's own processes and nothing else;

then remounts `/` and `/dev` read-only and installs the gateway's seccomp program
(`--seccomp`) just before the command: the filter denies the very namespace and mount
calls bubblewrap makes, so it cannot be installed earlier.

What it adds over the native backend: the host's files, sockets and processes are not there
at all (not merely refused), so `/proc` and unix sockets need no other rule; and the PID
namespace's pid 1 takes every process down with it. What it gives up: Landlock, which
would forbid bubblewrap's own mounts; the mount tree stands in for it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sandbox.backends.probe import child_succeeds
from sandbox.backends.userns import UserNamespace, probe_entry
from sandbox.pinned import Pinned

BWRAP = Path("/usr/bin/bwrap")
_PROBE_UID = 65534  # nobody: the probe runs /usr/bin/true and exits, it needs no pool uid

_NAMESPACES = ("--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try")
_HARDENING = ("--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL")


def bubblewrap_argv(
    *,
    read_only: Sequence[Path | Pinned],
    scratch: Path,
    cwd: Path,
    seccomp_fd: int | None,
    status_fd: int | None = None,
    writable_cwd: Path | None = None,
    bwrap: Path = BWRAP,
) -> list[str]:
    """The bwrap command line that runs a command (appended after it) in the minimal tree. Pure.

    With `status_fd`, bwrap writes JSON status lines there (`command_ran` reads them). The fd of
    each Pinned grant must be inherited by bwrap (`pass_fds`). `writable_cwd` is where the child
    moved the workspace's copy (backends/view.py; a folder of the scratch tmpfs, the gateway's
    own): it is bound read-write over `cwd`, after the read-only grants.
    """
    argv = [str(bwrap), *_NAMESPACES, *_HARDENING]
    # Parents before children: a bind is hidden by a later bind of one of its parents.
    for grant in sorted(dict.fromkeys(read_only), key=lambda g: (len(_path(g).parts), str(_path(g)))):
        if isinstance(grant, Pinned):
            argv += ["--ro-bind-fd", str(grant.fd), str(grant.path)]
            continue
        path = grant
        if path.is_symlink() and path.parent == Path("/"):
            argv += ["--symlink", os.readlink(path), str(path)]
        else:
            argv += ["--ro-bind", str(path), str(path)]
    if writable_cwd is not None:
        argv += ["--bind", str(writable_cwd), str(cwd)]
    argv += ["--dev", "/dev", "--proc", "/proc", "--bind", str(scratch), str(scratch)]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", str(cwd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if status_fd is not None:
        argv += ["--json-status-fd", str(status_fd)]
    argv.append("--")
    return argv


def _path(grant: Path | Pinned) -> Path:
    return grant.path if isinstance(grant, Pinned) else grant


def command_ran(status: bytes) -> bool:
    """Whether bwrap's `--json-status-fd` output shows the command ran and ended.

    bwrap writes `child-pid` before it builds the tree (measured: also when a bind source is
    missing), and `exit-code` only once the command itself ended, by exit or signal. A run
    that ended on its own without `exit-code` never started.
    """
    return b'"exit-code"' in status


def bubblewrap_available(uid: int | None = None, gid: int | None = None, bwrap: Path = BWRAP) -> bool:
    """Whether bwrap runs here as a run would start it.

    As root (no `uid`): after the drop to an unprivileged uid. Rootless (the run's `uid`/`gid`): inside
    the run's own sealed user namespace (backends/userns.py), where bwrap nests one of its own.
    """
    if not bwrap.is_file():
        return False
    if uid is None or gid is None:
        if os.geteuid() != 0:
            return False
        uid, gid, rootless = _PROBE_UID, _PROBE_UID, False
    else:
        rootless = True
    enter = probe_entry(uid, gid) if rootless else None
    seal = UserNamespace(uid, gid, network=False).seal if rootless else None

    def as_a_run() -> None:
        if enter is not None and seal is not None:
            enter()
            seal()
            return
        os.setgroups([])
        os.setresgid(_PROBE_UID, _PROBE_UID, _PROBE_UID)
        os.setresuid(_PROBE_UID, _PROBE_UID, _PROBE_UID)

    try:
        with tempfile.TemporaryDirectory(prefix="mcp-bwrap-probe-") as folder:
            os.chmod(folder, 0o711)  # noqa: S103  (empty; bwrap, run as nobody, must reach it to bind it)
            runtime = tuple(p for p in (Path("/usr"), Path("/lib"), Path("/lib64")) if p.exists())
            argv = bubblewrap_argv(read_only=runtime, scratch=Path(folder), cwd=Path("/"), seccomp_fd=None)
            return child_succeeds([*argv, "/usr/bin/true"], as_a_run, env={"PATH": "/usr/bin:/bin"})
    except OSError:
        return False
