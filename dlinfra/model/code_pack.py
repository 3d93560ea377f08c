"""A researcher's working directory as the archive `dlinfra run` uploads: the files its .gitignore files leave, packed
as a deterministic tar.gz (the same tree gives the same bytes, so the same sha256), refused above a size limit.

Only the folder's own .gitignore files count, not git's state: .git/info/exclude and core.excludesFile are not read,
and a file git tracks although a .gitignore matches it is left out. So the archive depends on the folder alone (the
same on a laptop and a dev box, in a git work tree or not, with or without git), and a person's global excludes do
not change what a lab job runs.

What git ignores (gitignore(5)): each directory's `.gitignore` applies to the paths below it, a deeper file's patterns
win over a shallower one's, and within a file the last matching pattern wins; a directory that is ignored is not
entered, so nothing under it can be included again. `pathspec`'s GitIgnoreSpec keeps git's reading of each pattern
(its documented purpose: "replicates .gitignore behavior"). `.git` itself is never packed. Symbolic links are packed
as links, never followed; anything else that is not a file or a directory (sockets, fifos) is left out.
Pure (no cloud): reads the directory only.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pathspec import GitIgnoreSpec

from dlinfra.errors import DlinfraError

IGNORE_FILE = ".gitignore"
ALWAYS_LEFT_OUT = ".git"
MIB = 1024 * 1024


class CodeError(DlinfraError):
    """The working directory cannot be packed: unreadable, or over the limit."""


@dataclass(frozen=True)
class Entry:
    """One path of the archive, relative to the working directory, in POSIX form."""

    path: str
    kind: str  # "dir", "file" or "link"
    size: int = 0  # bytes, files only
    executable: bool = False  # files: any execute bit set
    target: str = ""  # links: where it points, as written


@dataclass(frozen=True)
class Packed:
    """The archive and what is in it."""

    data: bytes  # tar.gz
    sha256: str  # hex digest of data
    entries: tuple[Entry, ...]  # sorted by path

    @property
    def files(self) -> int:
        return sum(1 for e in self.entries if e.kind == "file")

    @property
    def size(self) -> int:
        """Bytes of the files packed, before compression."""
        return sum(e.size for e in self.entries)


def _spec(directory: Path) -> GitIgnoreSpec | None:
    ignore = directory / IGNORE_FILE
    try:
        text = ignore.read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CodeError(f"cannot read: {exc.strerror}", file=str(ignore)) from None
    return GitIgnoreSpec.from_lines(text.splitlines())


def _ignored(specs: list[tuple[PurePosixPath, GitIgnoreSpec]], path: PurePosixPath, is_dir: bool) -> bool:
    """Whether git ignores `path`: the deepest .gitignore with a matching pattern decides."""
    for base, spec in reversed(specs):
        relative = path.relative_to(base).as_posix() + ("/" if is_dir else "")
        result = spec.check_file(relative)
        if result.include is not None:
            return bool(result.include)
    return False


def select(root: Path) -> tuple[Entry, ...]:
    """Every path under `root` its .gitignore files do not ignore, sorted, without following links."""
    if not root.is_dir():
        raise CodeError("is not a directory", file=str(root))
    entries: list[Entry] = []

    def walk(directory: Path, rel: PurePosixPath, specs: list[tuple[PurePosixPath, GitIgnoreSpec]]) -> None:
        spec = _spec(directory)
        here = [*specs, (rel, spec)] if spec is not None else specs
        try:
            children = sorted(os.scandir(directory), key=lambda d: d.name)
        except OSError as exc:
            raise CodeError(f"cannot list: {exc.strerror}", file=str(directory)) from None
        for child in children:
            path = rel / child.name
            if child.name == ALWAYS_LEFT_OUT:
                continue
            info = child.stat(follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                if not _ignored(here, path, is_dir=False):
                    entries.append(Entry(path.as_posix(), "link", target=os.readlink(child.path)))
            elif stat.S_ISDIR(info.st_mode):
                if not _ignored(here, path, is_dir=True):
                    entries.append(Entry(path.as_posix(), "dir"))
                    walk(Path(child.path), path, here)
            elif stat.S_ISREG(info.st_mode) and not _ignored(here, path, is_dir=False):
                executable = bool(info.st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH))
                entries.append(Entry(path.as_posix(), "file", info.st_size, executable))

    walk(root, PurePosixPath("."), [])
    return tuple(sorted(entries, key=lambda e: e.path))


def _too_large(root: Path, entries: tuple[Entry, ...], limit_mib: int) -> CodeError:
    """The refusal, naming the top-level entries that weigh most, so the reader knows what to ignore."""
    weights: dict[str, int] = {}
    for e in entries:
        top = PurePosixPath(e.path).parts[0]
        weights[top] = weights.get(top, 0) + e.size
    heaviest = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    listed = ", ".join(f"{name} {size / MIB:.1f} MiB" for name, size in heaviest)
    total = sum(e.size for e in entries) / MIB
    return CodeError(
        f"{total:.1f} MiB of files to upload, over the {limit_mib} MiB limit (largest: {listed}): add data, "
        "checkpoints and outputs to .gitignore (keep them on EFS or S3), or raise the limit with --max-code-mib",
        file=str(root),
    )


def _info(entry: Entry) -> tarfile.TarInfo:
    """A tar header that depends on the entry alone: no owner, time or umask of this machine."""
    info = tarfile.TarInfo(entry.path)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if entry.kind == "dir":
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif entry.kind == "link":
        info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, entry.target
    else:
        info.type, info.mode, info.size = tarfile.REGTYPE, 0o755 if entry.executable else 0o644, entry.size
    return info


def pack(root: Path, limit_mib: int) -> Packed:
    """The working directory's archive; CodeError when its files weigh more than `limit_mib` MiB."""
    entries = select(root)
    if sum(e.size for e in entries) > limit_mib * MIB:
        raise _too_large(root, entries, limit_mib)
    raw = io.BytesIO()
    # mtime 0 and no file name in the gzip header: the bytes depend on the tree alone (RFC 1952 MTIME, FNAME).
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for entry in entries:
            info = _info(entry)
            if entry.kind != "file":
                tar.addfile(info)
                continue
            source = root / entry.path
            try:
                with source.open("rb") as handle:
                    content = handle.read()
            except OSError as exc:
                raise CodeError(f"cannot read: {exc.strerror}", file=str(source)) from None
            if len(content) != entry.size:
                raise CodeError("changed while it was packed: run again", file=str(source))
            tar.addfile(info, io.BytesIO(content))
    data = raw.getvalue()
    return Packed(data, hashlib.sha256(data).hexdigest(), entries)
