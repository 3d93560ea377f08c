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

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

# Connection states still carrying traffic (ClientVpnConnectionStatus, EC2 API reference): "active", and
# "failed-to-terminate", a connection an earlier terminate did not end.
OPEN_STATES = frozenset({"active", "failed-to-terminate"})
# What TerminateClientVpnConnections may answer for a connection it is ending (TerminateConnectionStatus).
ENDING_STATES = frozenset({"terminating", "terminated"})


class Ec2(Protocol):
    """The two EC2 calls the sweep makes (a boto3 EC2 client, or a stub of one in tests)."""

    def describe_client_vpn_connections(self, **kwargs: Any) -> Mapping[str, Any]: ...

    def terminate_client_vpn_connections(self, **kwargs: Any) -> Mapping[str, Any]: ...


def stale(connections: Iterable[Mapping[str, Any]], allowed: frozenset[str]) -> list[Mapping[str, Any]]:
    """The open connections whose certificate's common name is not on the list."""
    return [
        c
        for c in connections
        if c.get("Status", {}).get("Code") in OPEN_STATES and c.get("CommonName", "") not in allowed
    ]


def sweep(ec2: Ec2, endpoint_id: str, allowed: frozenset[str]) -> list[dict[str, str]]:
    """Terminate every open connection of a person not on the list; returns what was ended.

    Terminates by connection id: with certificate sign-in a connection carries the certificate's common name and
    no user name, and TerminateClientVpnConnections' Username form only ends up to five of a user's connections.
    Raises when AWS does not report a connection as ending, so the apply that ran it fails where people see it.
    """
    connections: list[Mapping[str, Any]] = []
    request: dict[str, Any] = {"ClientVpnEndpointId": endpoint_id}
    while True:  # DescribeClientVpnConnections pages its answer (NextToken)
        page = ec2.describe_client_vpn_connections(**request)
        connections += page.get("Connections", [])
        if not page.get("NextToken"):
            break
        request["NextToken"] = page["NextToken"]
    ended = []
    for connection in stale(connections, allowed):
        answer = ec2.terminate_client_vpn_connections(
            ClientVpnEndpointId=endpoint_id, ConnectionId=connection["ConnectionId"]
        )
        for status in answer.get("ConnectionStatuses", []):
            state = status.get("CurrentStatus", {}).get("Code")
            if state not in ENDING_STATES:
                raise RuntimeError(
                    f"{endpoint_id}: connection {status.get('ConnectionId')} of {connection.get('CommonName')!r} "
                    f"is {state}, not ending; terminate it by hand (aws ec2 terminate-client-vpn-connections)"
                )
        ended.append({"connection_id": connection["ConnectionId"], "common_name": connection.get("CommonName", "")})
    return ended


def handler(event: Mapping[str, Any], context: object) -> dict[str, Any]:
    """Lambda entry point; the event is {"endpoint_id": ..., "allowed": [common names]}."""
    import boto3  # the Lambda runtime's; imported on a call, so tests that only read this module skip it

    ended = sweep(boto3.client("ec2"), str(event["endpoint_id"]), frozenset(event["allowed"]))
    return {"endpoint_id": event["endpoint_id"], "terminated": ended}
