"""Run a process with its wall clock shifted and its monotonic clock and sleeps left alone.

Debian's ``faketime`` package (libfaketime 0.9.10) shifts the wall clock of a
process it is preloaded into (``FAKETIME=+600``). Alone, it breaks Python
3.11: ``time.sleep`` waits with an absolute ``clock_nanosleep`` on the
monotonic clock, which libfaketime rewrites into a time the kernel refuses
(EINVAL); faking the monotonic clock too makes threading waits hang
(wolfcw/libfaketime#426). So ``shifted_env`` preloads, before libfaketime,
``monosleep.c`` (built here with gcc, into ``var/``), which sends every
sleep on a clock other than the wall clock straight to the kernel, and sets
``FAKETIME_DONT_FAKE_MONOTONIC=1``. The process then sees the wall clock
(``time.time``, ``datetime.now``) moved by the offset, and ``time.monotonic``,
sleeps, locks, queue and socket timeouts as they are.

    env = shifted_env(600, build_shim(Path("var/faketime")))
    subprocess.run([...], env={**os.environ, **env})

``missing()`` says why it cannot work on this machine (no gcc, no
libfaketime; ``apt-get install faketime`` provides the latter).
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("monosleep.c")
"""The shim's C source."""

LIBFAKETIME_ENV = "LIBFAKETIME"
"""Set to the path of ``libfaketimeMT.so.1`` to use another build than Debian's."""

_LIBRARY = "faketime/libfaketimeMT.so.1"
# The multithreaded build: the services run threads (gunicorn's gthread workers).


class FaketimeError(RuntimeError):
    """The shim could not be built, or libfaketime is not installed."""


def libfaketime() -> Path | None:
    """Where libfaketime's multithreaded library is (``LIBFAKETIME``, else Debian's), or None."""
    given = os.environ.get(LIBFAKETIME_ENV)
    if given:
        return Path(given) if Path(given).is_file() else None
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    candidates = [f"/usr/lib/{multiarch}/{_LIBRARY}"] if multiarch else []
    # An interpreter built outside Debian (pyenv) may not know the multiarch triplet.
    candidates += [*sorted(glob.glob(f"/usr/lib/*/{_LIBRARY}")), f"/usr/lib/{_LIBRARY}"]
    for candidate in candidates:
        if Path(candidate).is_file():
            return Path(candidate)
    return None


def missing() -> str | None:
    """Why a shifted process cannot be started here, or None when it can."""
    if shutil.which("gcc") is None:
        return "gcc is not on PATH (it builds the monosleep shim; apt-get install gcc)"
    if libfaketime() is None:
        return (f"libfaketime is not installed (no {_LIBRARY} under /usr/lib; "
                "apt-get install faketime)")
    return None


def build_shim(directory: Path) -> Path:
    """Compile ``monosleep.c`` into ``directory`` (once per source text); return the library.

    The file is named after a hash of the source, and written under a
    temporary name then renamed, so processes that build at the same time
    (pytest-xdist workers) never load a half-written library, and an edited
    source is built again.
    """
    source = SOURCE.read_bytes()
    target = directory / f"monosleep-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".monosleep-", suffix=".so", dir=directory)
    os.close(fd)
    command = ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
               "-o", partial, str(SOURCE), "-ldl"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60,
                                check=False)
        if result.returncode != 0:
            raise FaketimeError(f"{' '.join(command)} exited {result.returncode}:\n"
                                f"{result.stdout}{result.stderr}")
        os.replace(partial, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FaketimeError(f"could not build {SOURCE.name}: {exc}") from exc
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def faketime_offset(seconds: int) -> str:
    """libfaketime's relative offset for whole ``seconds``: ``+600``, ``-600``."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        # A float would print as "+1e+06", which libfaketime does not read as an offset.
        raise TypeError(f"a shift is whole seconds, not {seconds!r}")
    return f"{seconds:+d}"


def shifted_env(seconds: int, shim: Path, library: Path | None = None) -> dict[str, str]:
    """The variables that start a process with its wall clock ``seconds`` ahead (or behind).

    ``shim`` is ``build_shim``'s library; ``library`` is libfaketime
    (default: ``libfaketime()``). The shim comes first in ``LD_PRELOAD``, so
    its ``clock_nanosleep`` is the one the process calls. Merge the result
    into the child's environment; an ``LD_PRELOAD`` of this process is kept
    after the two.
    """
    library = library or libfaketime()
    if library is None:
        raise FaketimeError(missing() or "libfaketime is not installed")
    preload = [str(shim), str(library)]
    if os.environ.get("LD_PRELOAD"):
        preload.append(os.environ["LD_PRELOAD"])
    return {
        "LD_PRELOAD": " ".join(preload),
        "FAKETIME": faketime_offset(seconds),
        # The monotonic clock stays the kernel's: it times leases' renewals,
        # deadlines and every wait, which must keep their length.
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
