"""What may be written out of an untrusted tar archive, and how its folders are made.

Two stages unpack archives they did not write: the postprocess's bundle reader (``verify``,
``extract`` of a ``bundle-*.tar.zst`` someone sent) and the model loader (``verl-consistency
load``, a model tarball from a URL). Both refuse the same members and create folders the same
way, so the rule lives here once: a member is a regular file or a folder with a relative,
``..``-free name (links, devices and fifos are refused), and a folder is made one level at a time,
refusing anything planted where a folder goes. Each stage turns :class:`UnsafeMember` into its own
error (``BundleError``, ``LoadError``).
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path, PurePosixPath


class UnsafeMember(Exception):
    """An archive member that must not be written under the target folder. The message names it."""


def safe_member_name(member: tarfile.TarInfo) -> str:
    """The member's name if it may be written under a target folder; :class:`UnsafeMember` otherwise."""
    name = member.name
    if not (member.isreg() or member.isdir()):
        kinds = (
            (member.issym, "symlink"),
            (member.islnk, "hardlink"),
            (member.isfifo, "fifo"),
            (member.isdev, "device"),
        )
        kind = next((k for test, k in kinds if test()), "special file")
        raise UnsafeMember(f"member {name!r} is a {kind}; archives here hold only files and folders")
    if not name or "\x00" in name or "\\" in name:
        raise UnsafeMember(f"member {name!r} has an unsafe name")
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise UnsafeMember(f"member {name!r} would be written outside the target folder")
    return path.as_posix()


def make_dirs_below(root: Path, path: Path) -> None:
    """Create ``path``'s folders below ``root`` one by one, refusing anything that is not a plain
    folder (a link planted where a folder goes)."""
    cur = root
    for part in path.relative_to(root).parts:
        cur = cur / part
        try:
            os.mkdir(cur)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(cur).st_mode):
                raise UnsafeMember(f"{cur.relative_to(root)}: a file and a folder of the same name") from None
