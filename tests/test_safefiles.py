"""``harvest.safefiles.Folder``: a folder checked with its parents, then used through its descriptor.

Unit level, as root: the renames and links an attacker would make are made by the test itself, to
show what the held descriptor does on its own (tests/security/test_held_folders.py makes them as
another user, through the commands).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harvest.errors import UnsafePathError
from harvest.safefiles import Folder, hold
from tests.realparts import require

def snap(top: Path) -> dict[str, tuple[bytes, int, int]]:
    return {str(p): (p.read_bytes() if p.is_file() else b"", stat.S_IMODE(p.lstat().st_mode), p.lstat().st_mtime_ns)
            for p in [top, *sorted(top.rglob("*"))]}


def test_a_held_folder_renamed_and_replaced_by_a_link_keeps_every_write(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    for name in ("progress.json", "timeline.json", "ledger.lock"):
        (victim / name).write_text("root's other run\n")
        (victim / name).chmod(0o644)
    before = snap(victim)
    run = tmp_path / "box" / "run"
    with hold(run, create=True) as folder:
        folder.write_atomic("progress.json", "{}")
        os.rename(run, tmp_path / "box" / "moved")  # the swap: the name now leads to another folder
        run.symlink_to(victim)
        folder.write_atomic("progress.json", '{"n": 1}')
        folder.write_new("timeline.json", "[]")
        fd = folder.open("ledger.lock", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        os.write(fd, b"1")
        os.close(fd)
        tmp, fd = folder.temp("out.jsonl")
        os.close(fd)
        folder.replace(tmp, "out.jsonl")
        assert folder.lstat("progress.json") is not None and folder.via("x") == f"/proc/self/fd/{folder.fd}/x"
    assert snap(victim) == before
    moved = tmp_path / "box" / "moved"
    assert sorted(p.name for p in moved.iterdir()) == ["ledger.lock", "out.jsonl", "progress.json", "timeline.json"]
    assert (moved / "progress.json").read_text() == '{"n": 1}'


def test_a_hard_linked_file_is_refused_before_it_is_truncated(tmp_path):
    victim = tmp_path / "victim.log"
    victim.write_bytes(b"x" * 24)
    with hold(tmp_path / "run", create=True) as folder:
        os.link(victim, folder.path / "server.log")
        with pytest.raises(UnsafePathError, match="server.log: has 2 hard links"):
            folder.open("server.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    assert victim.stat().st_size == 24


def test_missing_folders_are_made_0700_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        with Folder.hold(tmp_path / "NEW" / "x", create=True, strict=False) as folder:
            folder.write_atomic("report.html", "<html>")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "NEW", tmp_path / "NEW" / "x",
                                                               tmp_path / "NEW" / "x" / "report.html")}
    assert modes == {"NEW": 0o700, "x": 0o700, "report.html": 0o600}


def test_a_parent_others_can_write_without_the_sticky_bit_is_refused_by_name(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "run").mkdir(mode=0o700)
    with pytest.raises(UnsafePathError) as exc:
        hold(shared / "run")
    assert str(exc.value).startswith(f"{shared}: is writable by group and others without the sticky bit")
    with pytest.raises(UnsafePathError, match="without the sticky bit"):
        hold(shared / "new" / "run", create=True)
    assert not (shared / "new").exists()  # refused before anything was made in it
    shared.chmod(0o1777)  # like /tmp: others cannot rename root's entries
    hold(shared / "run").close()
    hold(shared / "new" / "run", create=True).close()


def test_a_parent_another_user_owns_is_refused_by_name(tmp_path):
    require("second-user", "a folder of another user's (nobody) is made with chown, which needs root")
    theirs = tmp_path / "theirs"
    (theirs / "run").mkdir(parents=True, mode=0o700)
    theirs.chmod(0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UnsafePathError) as exc:
        hold(theirs / "run")
    assert str(exc.value).startswith(f"{theirs}: is owned by ")


def test_a_symlink_as_the_folder_is_held_where_it_points_when_the_user_owns_it(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with hold(tmp_path / "link") as folder:
        folder.write_new("a", "1")
    assert (real / "a").read_text() == "1"
    with pytest.raises(UnsafePathError, match="is not a folder"):
        (tmp_path / "file").write_text("")
        hold(tmp_path / "file")


def test_another_users_symlink_on_the_way_is_refused_though_the_folder_it_reaches_is_safe(tmp_path):
    """``/tmp/L/run`` with ``/tmp/L`` a link of nobody's: the folder reached is root's, but nobody can
    point ``L`` elsewhere at any time, and an engine's log or config is handed that name."""
    require("second-user", "a symlink of another user's (nobody) is made with lchown, which needs root")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    real = tmp_path / "real"
    (real / "run").mkdir(parents=True, mode=0o700)
    link = shared / "L"
    link.symlink_to(real)
    os.lchown(link, 65534, 65534)
    with pytest.raises(UnsafePathError) as exc:
        hold(link / "run")
    assert str(exc.value).startswith(f"{link}: is a symlink owned by nobody (uid 65534): that user can point it "
                                     f"elsewhere"), exc.value
    with pytest.raises(UnsafePathError, match="is a symlink owned by nobody"):
        hold(link / "run" / "new", create=True)
    assert not (real / "run" / "new").exists()  # refused before anything was made
    os.lchown(link, 0, 0)  # root's own link in a sticky folder: nobody can remove or re-point it
    with hold(link / "run") as folder:
        folder.write_new("a", "1")
    assert (real / "run" / "a").read_text() == "1"


def test_a_link_in_a_folder_others_can_write_is_refused_where_the_link_sits(tmp_path):
    """The folder holding a link on the way obeys the parents' rule even when it is not among the
    held folder's real parents (``..`` from the folder never passes it)."""
    loose = tmp_path / "loose"
    loose.mkdir()
    real = tmp_path / "real"
    (real / "run").mkdir(parents=True, mode=0o700)
    (loose / "L").symlink_to(real)
    loose.chmod(0o777)
    with pytest.raises(UnsafePathError) as exc:
        hold(loose / "L" / "run")
    assert str(exc.value).startswith(f"{loose}: is writable by group and others without the sticky bit"), exc.value
    loose.chmod(0o755)
    (loose / "R").symlink_to("../real/run")  # relative, resolved from where it sits
    with hold(loose / "R") as folder, hold(loose / "L" / "run") as again:
        assert os.path.samestat(os.fstat(folder.fd), os.fstat(again.fd))
