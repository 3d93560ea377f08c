"""Remember the last result of loading a file, by the file's path and text.

A preview of every stack reads the same fleet and lock once per stack program, as each `pulumi preview` would;
in one process the second read of unchanged text then costs a file read instead of a YAML parse and a
validation. Only for loaders whose results are frozen, so sharing one is safe. A failed load is not remembered.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def last_by_text(load: Callable[..., T]) -> Callable[..., T]:
    """Wrap `load(path, *extra)` so that a path whose text is the same as at the last call, with the same extra
    (hashable) arguments, gives the same result."""
    last: list[tuple[tuple[Any, ...], Any]] = []

    @functools.wraps(load)
    def cached(path: Path, *extra: Any) -> T:
        try:
            key = (path.resolve(), path.read_text(), *extra)
        except OSError:
            return load(path, *extra)  # the loader reports an unreadable file in its own words
        if last and last[0][0] == key:
            result: T = last[0][1]
            return result
        result = load(path, *extra)
        last[:] = [(key, result)]
        return result

    return cached
