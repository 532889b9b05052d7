"""The Debian sid chroot: its mounts, its users, and running commands inside it."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from localdb.errors import LocalDBError

# /dev for /dev/null, /dev/urandom and friends; /proc for apt, dpkg and postgres.
MOUNTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("dev", ("mount", "--bind", "/dev")),
    ("proc", ("mount", "-t", "proc", "proc")),
)
_OCTAL = re.compile(r"\\([0-7]{3})")
# A clean environment: nothing from the host's shell leaks into the chroot.
CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "HOME": "/root",
    "DEBIAN_FRONTEND": "noninteractive",
}


def mount_points() -> set[str]:
    """Every mount point of this mount namespace, from /proc/self/mountinfo."""
    points = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Field 5 is the mount point, with spaces etc. escaped as octal (\040).
        points.add(_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), line.split()[4]))
    return points


def mounts_under(root: Path) -> list[str]:
    """Mount points inside `root` (never delete a tree that still has some)."""
    prefix = str(root.resolve()) + "/"
    return sorted(p for p in mount_points() if p.startswith(prefix))


def ensure_mounts(root: Path) -> list[str]:
    """Mount /dev and /proc into the chroot unless already there; the ones we mounted."""
    mounted = []
    present = mount_points()
    for name, cmd in MOUNTS:
        target = str((root / name).resolve())
        if target in present:
            continue
        _run([*cmd, target], f"mounting {target}")
        mounted.append(target)
    return mounted


def unmount(targets: Sequence[str]) -> list[str]:
    """Unmount `targets` that are still mounted, in reverse order; those that failed."""
    failed = []
    for target in reversed(targets):
        if target not in mount_points():
            continue
        try:
            _run(["umount", target], f"unmounting {target}")
        except LocalDBError:
            failed.append(target)
    return failed


def processes_inside(root: Path) -> list[int]:
    """Pids of processes whose root directory is `root` (e.g. PostgreSQL)."""
    want = str(root.resolve())
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and root_of(int(entry.name)) == want:
            pids.append(int(entry.name))
    return pids


def root_of(pid: int) -> str:
    """The root directory of a process, or "" if it is gone or unreadable."""
    try:
        return os.readlink(f"/proc/{pid}/root")
    except OSError:
        return ""


def user_ids(root: Path, user: str) -> tuple[int, int]:
    """(uid, gid) of `user` in the chroot's /etc/passwd (the host's may differ)."""
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise LocalDBError(f"user {user!r} is missing from {root}/etc/passwd; re-run provisioning")


def command(root: Path, argv: Sequence[str], user: str | None = None) -> list[str]:
    """The host command line that runs `argv` inside the chroot, as `user` if given."""
    if user is None:
        return ["chroot", str(root), *argv]
    uid, gid = user_ids(root, user)
    return ["chroot", f"--userspec={uid}:{gid}", f"--groups={gid}", str(root), *argv]


def _run(cmd: Sequence[str], what: str) -> None:
    """Run a quick host command (mount/umount) with a timeout; LocalDBError on failure."""
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LocalDBError(f"{what} failed ({exc}); run as root") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        reason = detail[-1] if detail else f"exit {done.returncode}"
        raise LocalDBError(f"{what} failed ({reason}); run as root")
