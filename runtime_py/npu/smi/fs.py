"""Where ``npu-smi`` reads from, and reading it with errors that say which file.

Every reader of :mod:`npu.smi` takes a :class:`Roots`: the directories that
stand for ``/sys``, ``/proc``, debugfs and ``/dev``. The defaults are the
real ones; :meth:`Roots.under` puts all of them below one directory, which
is how the host tests point the tool at a fake tree (and what
``npu-smi --root DIR`` does).

A file that cannot be read raises :class:`SmiError`, which names the file
and the errno, never a bare ``OSError`` with a traceback.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path


class SmiError(Exception):
    """A file ``npu-smi`` needs could not be read (or written).

    ``path`` is the file, ``errno`` the error number (0 when the content,
    not the read, was wrong) and ``hint`` what the user can do about it.
    ``str(err)`` is one line for the user: ``"<path>: <what> (<hint>)"``.
    """

    def __init__(self, path: Path | str, err: int, what: str, hint: str = "") -> None:
        self.path = Path(path)
        self.errno = err
        self.what = what
        self.hint = hint
        text = f"{self.path}: {what}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)

    @classmethod
    def from_oserror(cls, path: Path | str, exc: OSError, hint: str = "") -> SmiError:
        """Wrap ``exc`` (raised on ``path``), keeping its errno and text."""
        code = exc.errno or 0
        what = f"[Errno {code}] {exc.strerror or os.strerror(code)}"
        if not hint and code in (errno.EACCES, errno.EPERM):
            hint = "run as root"
        return cls(path, code, what, hint)


@dataclass(frozen=True)
class Roots:
    """The directories standing for ``/sys``, ``/proc``, debugfs and ``/dev``."""

    sys: Path = Path("/sys")
    proc: Path = Path("/proc")
    debugfs: Path = Path("/sys/kernel/debug")
    dev: Path = Path("/dev")

    @classmethod
    def under(cls, root: Path | str) -> Roots:
        """All four below ``root`` (``root/sys``, ``root/proc``, ``root/sys/kernel/debug``,
        ``root/dev``): a fake tree for tests."""
        r = Path(root)
        return cls(sys=r / "sys", proc=r / "proc", debugfs=r / "sys/kernel/debug", dev=r / "dev")

    @property
    def accel_class(self) -> Path:
        """``/sys/class/accel``."""
        return self.sys / "class" / "accel"

    @property
    def devcoredump(self) -> Path:
        """``/sys/class/devcoredump``."""
        return self.sys / "class" / "devcoredump"

    @property
    def npu_debugfs(self) -> Path:
        """``/sys/kernel/debug/npu``: one ``npuN`` directory per device."""
        return self.debugfs / "npu"


def read_text(path: Path, hint: str = "") -> str:
    """The text of ``path``; :class:`SmiError` if it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise SmiError.from_oserror(path, e, hint) from None


def read_optional(path: Path) -> str | None:
    """The stripped text of ``path``, or None when it cannot be read (an
    attribute an older driver lacks, a process that went away)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    """The integer in ``path`` (decimal or ``0x`` hex; the first word), or None."""
    text = read_optional(path)
    if not text:
        return None
    try:
        return int(text.split()[0], 0)
    except ValueError:
        return None


def write_text(path: Path, text: str, hint: str = "") -> None:
    """Write ``text`` to ``path`` (a debugfs or sysfs control); :class:`SmiError` on failure."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise SmiError.from_oserror(path, e, hint) from None
