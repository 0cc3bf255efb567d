"""gateway/policy_trust.py: the gateway acts only on a policy nobody but its user or root could have
written, outside every workspace it names, and never one from the working folder (decision 42)."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.policy import load_policy
from gateway.policy_trust import (
    GroupIsPrivate,
    check_outside_workspaces,
    check_policy_location,
    entries_to,
    group_is_private,
    load_trusted_policy,
    policy_for,
)
from gateway.settings import resolve_settings
from gateway.tools.registry import TOOL_NAMES

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another user (needs root)")


def policy_in(folder: Path, workspace: Path | None = None, name: str = "policy.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    ws = f"workspaces:\n  default: {workspace}\n" if workspace else ""
    path.write_text(f"version: 1\n{ws}")
    path.chmod(0o644)
    return path


def refusal(path: Path, private: GroupIsPrivate = group_is_private) -> str:
    with pytest.raises(ConfigError) as caught:
        check_policy_location(path, private=private)
    return str(caught.value)


def test_a_policy_in_a_folder_of_ours_is_fine_and_every_entry_on_the_way_is_walked(tmp_path: Path) -> None:
    path = policy_in(tmp_path / "etc")
    walked = [e.path for e in check_policy_location(path)]
    assert walked[0] == Path("/") and walked[-1] == path
    assert tmp_path / "etc" in walked


def test_a_world_writable_policy_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = policy_in(tmp_path)
    path.chmod(0o666)
    message = refusal(path)
    assert f"{path} is writable by every user" in message and f"chmod go-w {path}" in message


def test_a_world_writable_folder_on_the_way_is_refused(tmp_path: Path) -> None:
    path = policy_in(tmp_path / "shared" / "etc")
    (tmp_path / "shared").chmod(0o777)
    message = refusal(path)
    assert f"{tmp_path / 'shared'} is writable by every user" in message


def test_a_sticky_folder_like_tmp_is_fine_when_what_is_in_it_is_ours(tmp_path: Path) -> None:
    path = policy_in(tmp_path / "shared" / "etc")
    (tmp_path / "shared").chmod(0o1777)
    check_policy_location(path)


def test_a_group_writable_entry_is_refused_unless_the_group_is_the_owners_alone(tmp_path: Path) -> None:
    path = policy_in(tmp_path)
    path.chmod(0o664)
    assert "writable by group" in refusal(path, private=lambda gid, uid: False)
    check_policy_location(path, private=lambda gid, uid: True)


def test_a_group_with_another_member_is_not_private(tmp_path: Path) -> None:
    path = policy_in(tmp_path)
    os.chown(path, 0, NOBODY)  # nogroup: nobody's primary group
    path.chmod(0o664)
    assert "writable by group" in refusal(path)


def grant_write_by_acl(path: Path, uid: int) -> None:
    """A POSIX ACL letting `uid` write `path` (setfacl -m u:UID:rw), written as the kernel stores it."""
    undefined = 0xFFFFFFFF
    entries = [(0x01, 6, undefined), (0x02, 6, uid), (0x04, 4, undefined), (0x10, 6, undefined), (0x20, 4, undefined)]
    value = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries)
    try:
        os.setxattr(path, "system.posix_acl_access", value)
    except OSError as exc:
        pytest.skip(f"no POSIX ACLs on this filesystem ({exc.strerror})")


def test_an_acl_letting_another_user_write_is_refused_even_with_a_private_group(tmp_path: Path) -> None:
    path = policy_in(tmp_path)
    grant_write_by_acl(path, NOBODY)
    assert stat.S_IMODE(path.stat().st_mode) & stat.S_IWGRP, "the ACL's mask shows as the group bits"
    message = refusal(path, private=lambda gid, uid: True)
    assert f"{path} has an ACL that lets others write it" in message and "setfacl -b" in message


@pytest.mark.parametrize("whose", ["file", "folder"])
def test_an_entry_belonging_to_another_user_is_refused(tmp_path: Path, whose: str) -> None:
    path = policy_in(tmp_path / "theirs")
    os.chown(path if whose == "file" else tmp_path / "theirs", NOBODY, NOBODY)
    message = refusal(path)
    assert "belongs to nobody (uid 65534)" in message and "chown root" in message


def test_root_owned_entries_are_fine_for_another_gateway_user(tmp_path: Path) -> None:
    check_policy_location(policy_in(tmp_path), uid=1234)


def test_a_link_is_followed_and_where_it_leads_is_checked(tmp_path: Path) -> None:
    target = policy_in(tmp_path / "open")
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "policy.yaml").symlink_to(target)
    assert f"{tmp_path / 'open'} is writable by every user" in refusal(tmp_path / "mine" / "policy.yaml")


def test_a_link_owned_by_another_user_in_a_sticky_folder_is_refused(tmp_path: Path) -> None:
    target = policy_in(tmp_path / "mine")
    (tmp_path / "sticky").mkdir(mode=0o1777)
    (tmp_path / "sticky").chmod(0o1777)
    link = tmp_path / "sticky" / "policy.yaml"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)  # they may replace their own link in a sticky folder
    assert f"{link} belongs to nobody" in refusal(link)


def test_dot_dot_after_a_link_is_the_targets_parent_as_the_kernel_reads_it(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "a" / "b")
    policy_in(tmp_path / "a", name="p.yaml")
    walked = [e.path for e in entries_to(tmp_path / "link" / ".." / "p.yaml")]
    assert walked[-1] == tmp_path / "a" / "p.yaml"
    assert tmp_path / "link" in walked


def test_a_policy_with_several_names_and_a_folder_are_refused(tmp_path: Path) -> None:
    path = policy_in(tmp_path)
    os.link(path, tmp_path / "other-name.yaml")
    assert "2 names (hard links)" in refusal(path)
    assert "not a regular file" in refusal(tmp_path)
    assert "cannot read policy file" in refusal(tmp_path / "missing.yaml")


def test_a_policy_inside_a_workspace_it_names_is_refused(tmp_path: Path) -> None:
    project = tmp_path / "project"
    path = policy_in(project, workspace=project)
    with pytest.raises(ConfigError, match=r"inside workspace 'default'.*where the agent's tools write"):
        load_trusted_policy(path, TOOL_NAMES)


def test_a_link_inside_a_workspace_leading_to_a_good_policy_is_refused(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    good = policy_in(tmp_path / "etc", workspace=project)
    (project / "policy.yaml").symlink_to(good)
    policy = load_policy(good, TOOL_NAMES)
    check_outside_workspaces(policy, check_policy_location(good))  # the file itself is outside
    with pytest.raises(ConfigError, match=r"project/policy.yaml is inside workspace 'default'"):
        check_outside_workspaces(policy, check_policy_location(project / "policy.yaml"))


def test_no_command_reads_a_policy_from_the_working_folder(tmp_path: Path) -> None:
    agents = tmp_path / "project"
    policy_in(agents)  # the agent's own policy.yaml, in the folder the client starts the gateway in
    settings = resolve_settings(home=str(tmp_path / "state"), environ={}, cwd=agents)
    assert settings.policy_path == tmp_path / "state" / "policy.yaml"
    with pytest.raises(ConfigError) as caught:
        policy_for(settings, TOOL_NAMES)
    message = str(caught.value)
    assert "mcp-gateway --home" in message and "init" in message and "--policy" in message
    assert "working folder" in message
