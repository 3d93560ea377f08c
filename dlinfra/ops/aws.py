"""AWS calls as errors for people: a refused call, an unreachable endpoint or a reply of an unexpected shape becomes
one DlinfraError naming the call and the problem, never a traceback (every command that calls AWS goes through
these, and dlinfra.cli.main turns any botocore error that slips past into the same one line)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from dlinfra.errors import DlinfraError


class AwsError(DlinfraError):
    """An AWS call failed, or answered in a shape dlinfra does not know."""


def describe(exc: BaseException) -> str:
    """`Code: Message` of a botocore ClientError; the text of any other error."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error") or {}
        return f"{error.get('Code', 'error')}: {error.get('Message', '')}".rstrip(": ")
    return str(exc)


def call(what: str, request: Callable[[], Any]) -> dict[str, Any]:
    """One AWS call (`what` names it: DescribeInstanceRefreshes); its reply, which must be a JSON object."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        reply = request()
    except (ClientError, BotoCoreError) as exc:
        raise AwsError(f"{what}: {describe(exc)}") from None
    if not isinstance(reply, dict):
        raise AwsError(f"{what}: unexpected reply: a {type(reply).__name__}, not an object")
    return reply


@contextlib.contextmanager
def reading(what: str) -> Iterator[None]:
    """Read a reply of `what`: a key it lacks or a value of another shape becomes one AwsError."""
    try:
        yield
    except KeyError as exc:
        raise AwsError(f"{what}: unexpected reply: no {exc.args[0]!r}") from None
    except (TypeError, AttributeError, ValueError, IndexError) as exc:
        raise AwsError(f"{what}: unexpected reply: {exc}") from None
