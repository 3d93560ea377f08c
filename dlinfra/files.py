"""Writing files so that readers see the old content or the new, never half; private when they hold keys."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds keys), atomically."""
    write_atomic(path, text, mode=0o600)


def mode_of(path: Path) -> int:
    """A file's permission bits, or 0644 for a file that does not exist yet."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o644


def write_atomic(path: Path, text: str, *, mode: int) -> None:
    """Write a file so that readers see the old or the new content, never a half; created with `mode`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
