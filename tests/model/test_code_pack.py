"""What `dlinfra run` packs: git's ignore rules (checked against git itself where it is installed), links kept as
links, the same bytes for the same tree, and a refusal over the limit that names what weighs."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from dlinfra.model import code_pack

FILES = {
    ".gitignore": "*.log\nbuild/\n/top-only.txt\ndata/**/*.npy\n!keep.log\nout*/\n",
    "a.py": "", "debug.log": "", "keep.log": "", "top-only.txt": "", "sub/top-only.txt": "",
    "build/x.o": "", "src/build/y.o": "", "data/one/a.npy": "", "data/one/a.txt": "",
    "output1/r.txt": "", "outs.txt": "",
    "sub/.gitignore": "!debug.log\nlocal/\n*.tmp\n", "sub/debug.log": "", "sub/local/z": "", "sub/t.tmp": "",
    "sub/deeper/u.tmp": "", "sub/deeper/v.py": "",
    # An ignored directory is not entered: its own .gitignore cannot bring a file back (gitignore(5)).
    "build/.gitignore": "!x.o\n", "name with space.py": "",
}  # fmt: skip


def _tree(root: Path) -> Path:
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("")
    return root


def _files(entries: tuple[code_pack.Entry, ...]) -> set[str]:
    return {e.path for e in entries if e.kind != "dir"}


EXPECTED = {
    ".gitignore", "a.py", "keep.log", "sub/top-only.txt", "data/one/a.txt", "outs.txt", "sub/.gitignore",
    "sub/debug.log", "sub/deeper/v.py", "name with space.py",
}  # fmt: skip


def test_select_follows_gitignore(tmp_path: Path) -> None:
    assert _files(code_pack.select(_tree(tmp_path))) == EXPECTED


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_select_agrees_with_git(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo")
    shutil.rmtree(root / ".git")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    listed = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard", "-z"], cwd=root, check=True, capture_output=True
    ).stdout.decode()
    assert set(filter(None, listed.split("\0"))) == _files(code_pack.select(root)) == EXPECTED


def test_links_are_packed_as_links_and_never_followed(tmp_path: Path) -> None:
    root = _tree(tmp_path / "code")
    outside = tmp_path / "secret"
    outside.write_text("not yours")
    os.symlink(outside, root / "link")
    packed = code_pack.pack(root, 1)
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        link = tar.getmember("link")
    assert link.issym() and link.linkname == str(outside)
    assert b"not yours" not in packed.data


def test_the_same_tree_gives_the_same_bytes(tmp_path: Path) -> None:
    first = code_pack.pack(_tree(tmp_path / "one"), 1)
    second_root = _tree(tmp_path / "two")
    os.utime(second_root / "a.py", (1, 1))
    (second_root / "a.py").chmod(0o600)  # only the execute bit is kept
    second = code_pack.pack(second_root, 1)
    assert first.data == second.data and first.sha256 == second.sha256
    (second_root / "a.py").write_text("changed")
    assert code_pack.pack(second_root, 1).sha256 != first.sha256


def test_over_the_limit_names_the_heaviest(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / "sub" / "weights.bin").write_bytes(b"\0" * (3 * code_pack.MIB))
    (root / "a.py").write_bytes(b"\0" * code_pack.MIB)
    with pytest.raises(code_pack.CodeError) as info:
        code_pack.pack(root, 2)
    message = str(info.value)
    assert message.startswith(
        f"{root}: 4.0 MiB of files to upload, over the 2 MiB limit (largest: sub 3.0 MiB, a.py 1.0"
    )
    assert "add data, checkpoints and outputs to .gitignore" in message


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(code_pack.CodeError, match="is not a directory"):
        code_pack.select(tmp_path / "missing")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_where_the_archive_differs_from_what_git_would_commit(tmp_path: Path) -> None:
    """What the guide says the packer does not do: read .git/info/exclude or core.excludesFile, or keep a file git
    tracks although a .gitignore matches it. The archive depends on the folder's .gitignore files alone."""
    root = tmp_path / "repo"
    root.mkdir()
    env = {**os.environ, "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig"), "GIT_CONFIG_NOSYSTEM": "1"}
    (tmp_path / "gitconfig").write_text(f"[core]\n\texcludesFile = {tmp_path / 'global-ignore'}\n")
    (tmp_path / "global-ignore").write_text("personal.txt\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "exclude").write_text("local-only.txt\n")
    for name in ("personal.txt", "local-only.txt", "tracked.log", "a.py"):
        (root / name).write_text("x")
    subprocess.run(["git", "-C", str(root), "add", "tracked.log"], check=True, env=env)
    (root / ".gitignore").write_text("*.log\n")
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard"],
        check=True, env=env, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    assert sorted(listed) == [".gitignore", "a.py", "tracked.log"]
    assert _files(code_pack.select(root)) == {".gitignore", "a.py", "personal.txt", "local-only.txt"}
