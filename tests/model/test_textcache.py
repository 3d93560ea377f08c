"""last_by_text: a file's result is reused only while its path and text are unchanged; failures are never kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlinfra.model.planner import load_lock
from dlinfra.model.textcache import last_by_text
from tests.conftest import REFERENCE_LOCK


def test_same_text_same_result_changed_text_loaded_again(tmp_path: Path) -> None:
    calls: list[str] = []

    @last_by_text
    def load(path: Path) -> list[str]:
        text = path.read_text()
        calls.append(text)
        if text == "bad":
            raise ValueError("bad file")
        return [text]

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("one")
    b.write_text("one")
    first = load(a)
    assert load(a) is first and calls == ["one"]
    assert load(b) is not first  # another file with the same text is its own entry
    a.write_text("bad")
    for _ in range(2):
        with pytest.raises(ValueError, match="bad file"):
            load(a)
    assert calls == ["one", "one", "bad", "bad"]
    a.write_text("two")
    assert load(a) == ["two"]


def test_a_lock_read_twice_is_parsed_once_and_keeps_the_path_asked_for(tmp_path: Path) -> None:
    lock = tmp_path / "cidr-lock.yaml"
    lock.write_text(REFERENCE_LOCK.read_text())
    link = tmp_path / "link.yaml"
    link.symlink_to(lock)
    first = load_lock(lock)
    again = load_lock(link)  # the same file by another name: parsed once, reported by the name given
    assert again.allocations is first.allocations and again.path == link and first.path == lock
