"""Ends the open AWS Client VPN connections of people the fleet no longer lists.

The client connect handler (client_vpn_connect.py) only decides when a connection starts: "If you update the
Lambda function, existing connections to the Client VPN endpoint are not affected. You can terminate existing
connections" (AWS Client VPN administrator guide, "Connection authorization"). So the `pulumi up` that removes a
person from `environments.<env>.client_vpn.users` invokes this function once, after the handler holds the new
list (components/client_vpn.py declares the invocation, replaced whenever the list changes): the person's open
sessions end, and their client's attempt to reconnect meets the handler's refusal.

It runs with the Lambda runtime's boto3 and no configuration: the event carries the endpoint and the list.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

# Connection states still carrying traffic (ClientVpnConnectionStatus, EC2 API reference): "active", and
# "failed-to-terminate", a connection an earlier terminate did not end.
OPEN_STATES = frozenset({"active", "failed-to-terminate"})
# What TerminateClientVpnConnections may answer for a connection it is ending (TerminateConnectionStatus).
ENDING_STATES = frozenset({"terminating", "terminated"})
# The apply creates the function's role and inline policy just before it invokes the function, and IAM changes take
# a while to be seen everywhere (IAM user guide, "Troubleshoot IAM": changes that I make are not always immediately
# visible), so the first calls can be refused. EC2 refuses with UnauthorizedOperation (EC2 API reference, "Error
# codes"); AccessDenied and AccessDeniedException are the other services' spelling of it. Those are retried.
DENIED = frozenset({"UnauthorizedOperation", "AccessDenied", "AccessDeniedException"})
# Seconds between tries: about 30 s in all, inside the function's 60 s timeout (components/client_vpn.py).
BACKOFF = (1.0, 2.0, 4.0, 8.0, 15.0)

T = TypeVar("T")


class Ec2(Protocol):
    """The two EC2 calls the sweep makes (a boto3 EC2 client, or a stub of one in tests)."""

    def describe_client_vpn_connections(self, **kwargs: Any) -> Mapping[str, Any]: ...

    def terminate_client_vpn_connections(self, **kwargs: Any) -> Mapping[str, Any]: ...


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ClientError (its `response`), or "" for any other exception."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, Mapping) else ""


def until_authorized(call: Callable[[], T], *, sleep: Callable[[float], None] = time.sleep) -> T:
    """`call()`, tried again after each pause of BACKOFF while AWS refuses it as unauthorized; any other error, or
    a refusal after the last pause, is raised."""
    for pause in BACKOFF:
        try:
            return call()
        except Exception as exc:
            if error_code(exc) not in DENIED:
                raise
            sleep(pause)
    return call()


def stale(connections: Iterable[Mapping[str, Any]], allowed: frozenset[str]) -> list[Mapping[str, Any]]:
    """The open connections whose certificate's common name is not on the list."""
    return [
        c
        for c in connections
        if c.get("Status", {}).get("Code") in OPEN_STATES and c.get("CommonName", "") not in allowed
    ]


def sweep(
    ec2: Ec2, endpoint_id: str, allowed: frozenset[str], *, sleep: Callable[[float], None] = time.sleep
) -> list[dict[str, str]]:
    """Terminate every open connection of a person not on the list; returns what was ended.

    Terminates by connection id: with certificate sign-in a connection carries the certificate's common name and
    no user name, and TerminateClientVpnConnections' Username form only ends up to five of a user's connections.
    Each call is retried for a while when refused as unauthorized (the role's policy may not be visible yet).
    Raises when AWS does not report a connection as ending, so the apply that ran it fails where people see it.
    """
    connections: list[Mapping[str, Any]] = []
    request: dict[str, Any] = {"ClientVpnEndpointId": endpoint_id}
    while True:  # DescribeClientVpnConnections pages its answer (NextToken)
        page = until_authorized(functools.partial(ec2.describe_client_vpn_connections, **request), sleep=sleep)
        connections += page.get("Connections", [])
        if not page.get("NextToken"):
            break
        request["NextToken"] = page["NextToken"]
    ended = []
    for connection in stale(connections, allowed):
        cid = connection["ConnectionId"]
        terminate = functools.partial(
            ec2.terminate_client_vpn_connections, ClientVpnEndpointId=endpoint_id, ConnectionId=cid
        )
        answer = until_authorized(terminate, sleep=sleep)
        for status in answer.get("ConnectionStatuses", []):
            state = status.get("CurrentStatus", {}).get("Code")
            if state not in ENDING_STATES:
                raise RuntimeError(
                    f"{endpoint_id}: connection {status.get('ConnectionId')} of {connection.get('CommonName')!r} "
                    f"is {state}, not ending; terminate it by hand (aws ec2 terminate-client-vpn-connections)"
                )
        ended.append({"connection_id": cid, "common_name": connection.get("CommonName", "")})
    return ended


def handler(event: Mapping[str, Any], context: object) -> dict[str, Any]:
    """Lambda entry point; the event is {"endpoint_id": ..., "allowed": [common names]}."""
    import boto3  # the Lambda runtime's; imported on a call, so tests that only read this module skip it

    ended = sweep(boto3.client("ec2"), str(event["endpoint_id"]), frozenset(event["allowed"]))
    return {"endpoint_id": event["endpoint_id"], "terminated": ended}
