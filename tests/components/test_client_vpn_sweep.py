"""Removing a person from the laptop VPN ends their open sessions too (issue 21, item 10).

The connect handler only judges new connections (AWS Client VPN administrator guide, "Connection authorization":
updating it leaves existing connections alone), so the apply that removes a person invokes a sweep Lambda that
terminates their open connections, after the handler holds the new list. The sweep's EC2 calls run against a
stubbed boto3 client (botocore's Stubber answers before anything is sent; moto has no Client VPN).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from components.lambdas import client_vpn_sweep as sweep
from dlinfra.model import replacement
from tests.reference import named, of_type, runs

ENDPOINT = "cvpn-endpoint-0123456789abcdef0"
INVOCATION = "aws:lambda/invocation:Invocation"


def connection(cid: str, common_name: str, state: str = "active") -> dict[str, Any]:
    return {"ConnectionId": cid, "CommonName": common_name, "Status": {"Code": state}}


def ending(cid: str, state: str = "terminating") -> dict[str, Any]:
    return {
        "ClientVpnEndpointId": ENDPOINT,
        "ConnectionStatuses": [
            {"ConnectionId": cid, "PreviousStatus": {"Code": "active"}, "CurrentStatus": {"Code": state}}
        ],
    }


@pytest.fixture
def ec2() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("ec2", region_name="us-west-2", aws_access_key_id="testing", aws_secret_access_key="testing")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def test_only_the_open_connections_of_people_no_longer_listed_are_ended(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    stubber.add_response(
        "describe_client_vpn_connections",
        {"Connections": [connection("c-1", "alice"), connection("c-2", "bob")], "NextToken": "page-2"},
        {"ClientVpnEndpointId": ENDPOINT},
    )
    stubber.add_response(
        "describe_client_vpn_connections",
        {
            "Connections": [
                connection("c-3", "bob"),  # a second laptop
                connection("c-4", "carol", "failed-to-terminate"),  # an earlier terminate did not end it
                connection("c-5", "dave", "terminated"),  # gone already: described for 60 minutes after
            ]
        },
        {"ClientVpnEndpointId": ENDPOINT, "NextToken": "page-2"},
    )
    for cid in ("c-2", "c-3", "c-4"):
        stubber.add_response(
            "terminate_client_vpn_connections", ending(cid), {"ClientVpnEndpointId": ENDPOINT, "ConnectionId": cid}
        )
    ended = sweep.sweep(client, ENDPOINT, frozenset({"alice"}))
    assert ended == [
        {"connection_id": "c-2", "common_name": "bob"},
        {"connection_id": "c-3", "common_name": "bob"},
        {"connection_id": "c-4", "common_name": "carol"},
    ]


def test_a_connection_aws_does_not_end_fails_the_apply(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    stubber.add_response("describe_client_vpn_connections", {"Connections": [connection("c-2", "bob")]})
    stubber.add_response("terminate_client_vpn_connections", ending("c-2", "failed-to-terminate"))
    with pytest.raises(RuntimeError, match=r"connection c-2 of 'bob' is failed-to-terminate, not ending"):
        sweep.sweep(client, ENDPOINT, frozenset({"alice"}))


def test_a_refusal_while_the_roles_policy_propagates_is_retried_for_a_while(ec2: tuple[Any, Stubber]) -> None:
    # The apply creates the role's inline policy just before the invocation; IAM shows it everywhere only after a
    # while (IAM user guide, "Troubleshoot IAM"), and EC2 meanwhile answers UnauthorizedOperation.
    client, stubber = ec2
    for _ in range(2):
        stubber.add_client_error("describe_client_vpn_connections", "UnauthorizedOperation", http_status_code=403)
    stubber.add_response("describe_client_vpn_connections", {"Connections": [connection("c-2", "bob")]})
    stubber.add_client_error("terminate_client_vpn_connections", "AccessDenied", http_status_code=403)
    stubber.add_response("terminate_client_vpn_connections", ending("c-2"))
    pauses: list[float] = []
    ended = sweep.sweep(client, ENDPOINT, frozenset({"alice"}), sleep=pauses.append)
    assert ended == [{"connection_id": "c-2", "common_name": "bob"}]
    assert pauses == [1.0, 2.0, 1.0]  # each call starts its own short backoff


def test_the_retries_are_bounded_and_other_errors_are_not_retried(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    for _ in range(len(sweep.BACKOFF) + 1):
        stubber.add_client_error("describe_client_vpn_connections", "UnauthorizedOperation", http_status_code=403)
    pauses: list[float] = []
    with pytest.raises(ClientError, match="UnauthorizedOperation"):
        sweep.sweep(client, ENDPOINT, frozenset({"alice"}), sleep=pauses.append)
    assert pauses == list(sweep.BACKOFF) and sum(pauses) < 60  # within the function's timeout
    stubber.add_client_error("describe_client_vpn_connections", "InvalidClientVpnEndpointId.NotFound")
    with pytest.raises(ClientError, match="NotFound"):
        sweep.sweep(client, ENDPOINT, frozenset({"alice"}), sleep=pauses.append)
    assert len(pauses) == len(sweep.BACKOFF)


def test_the_handler_takes_the_endpoint_and_the_list_from_its_event(
    ec2: tuple[Any, Stubber], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, stubber = ec2
    stubber.add_response("describe_client_vpn_connections", {"Connections": [connection("c-1", "alice")]})
    monkeypatch.setattr(boto3, "client", lambda service, **_: client)
    answer = sweep.handler({"endpoint_id": ENDPOINT, "allowed": ["alice"]}, None)
    assert answer == {"endpoint_id": ENDPOINT, "terminated": []}


def test_the_apply_that_changes_the_list_ends_the_removed_peoples_sessions() -> None:
    result = runs()["staging-us-west-2"]  # certificate sign-in: alice and bob
    endpoint = named(result, "client-vpn-endpoint")
    handler, function = named(result, "client-vpn-connect"), named(result, "client-vpn-sweep")
    (run,) = of_type(result, INVOCATION)
    assert run.inputs["functionName"] == function.inputs["name"]
    assert json.loads(run.inputs["input"]) == {"endpoint_id": endpoint.id, "allowed": ["alice", "bob"]}
    # It runs once the handler refuses the removed people, so a client that reconnects at once is refused.
    assert handler.urn in run.dependencies
    # Removing a person changes the input, which replaces a CREATE_ONLY invocation: the function runs again.
    assert run.inputs["lifecycleScope"] == "CREATE_ONLY"
    after = {**run.inputs, "input": json.dumps({"endpoint_id": endpoint.id, "allowed": ["alice"]})}
    assert replacement.table().forced(INVOCATION, run.inputs, after)[0] == ["input"]
    # No reserved concurrency: reserving even 1 fails on an account whose concurrency quota leaves fewer than 100
    # unreserved (Lambda developer guide, "Configuring reserved concurrency for a function").
    assert function.inputs.get("reservedConcurrentExecutions", -1) == -1
    # It may see and end this endpoint's connections, and no other's.
    policy = json.loads(named(result, "client-vpn-sweep-policy").inputs["policy"])
    (ec2,) = [s for s in policy["Statement"] if "ec2:TerminateClientVpnConnections" in s["Action"]]
    assert ec2["Action"] == ["ec2:DescribeClientVpnConnections", "ec2:TerminateClientVpnConnections"]
    assert ec2["Resource"] == endpoint.outputs["arn"]


def test_federated_sign_in_has_no_sweep_and_every_session_ends_within_a_workday() -> None:
    # People leave a federated VPN in the IdP, which the fleet does not list: the session timeout bounds them.
    for stack, sweeps in (("prod-us-west-2", 0), ("staging-us-west-2", 1)):
        result = runs()[stack]
        assert len(of_type(result, INVOCATION)) == sweeps, stack
        endpoint = named(result, "client-vpn-endpoint").inputs
        assert endpoint["sessionTimeoutHours"] == 8 and endpoint["disconnectOnSessionTimeout"] is True, stack
