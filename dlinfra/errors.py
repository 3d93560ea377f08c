"""Errors meant for people: each names the file, the key and what is wrong."""

from __future__ import annotations


class DlinfraError(Exception):
    """A problem with user input, reported as `file: key: message` without a traceback."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None) -> None:
        self.file = file
        self.key = key
        self.detail = message
        where = ": ".join(part for part in (file, key) if part)
        super().__init__(f"{where}: {message}" if where else message)


class FleetError(DlinfraError):
    """The fleet file is malformed or inconsistent."""


class LockError(DlinfraError):
    """The address-plan lock file is missing entries, malformed or inconsistent."""


class StackNameError(DlinfraError):
    """A stack name matches no fleet entry."""
