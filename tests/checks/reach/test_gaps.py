"""Each gap of the sampled engine, as a mutation of a copy of the reference plans that a sampled check passed and
AWS would not (or the reverse): the symbolic engine must find it, with a packet inside the part that fails."""

from __future__ import annotations

import copy
import ipaddress
from pathlib import Path
from typing import Any

import pytest

from dlinfra.checks.reach import check, evaluation, from_plans, intents, sites
from dlinfra.checks.reach.from_plans import PREFIX_LIST
from dlinfra.errors import DlinfraError
from tests.checks.reach.test_reference import Plans, evaluate, plans, stack, without
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK

N = ipaddress.IPv4Network
A = ipaddress.IPv4Address


def named(plan: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [r for r in plan["resources"] if r["name"] == name]
    return found


def add(plan: dict[str, Any], type_: str, name: str, inputs: dict[str, Any], id_: str | None = None) -> None:
    plan["resources"].append(
        {
            "type": type_,
            "name": name,
            "id": id_ or f"id-{name}",
            "custom": True,
            "inputs": inputs,
            "outputs": {},
            "urn": f"urn:pulumi:{plan['stack']}::dlinfra::{type_}::{name}",
        }
    )


def acl_rule(
    number: int, protocol: str, cidr: str, low: int = 0, high: int = 0, action: str = "allow"
) -> dict[str, Any]:
    return {
        "ruleNo": number,
        "action": action,
        "protocol": protocol,
        "cidrBlock": cidr,
        "fromPort": low,
        "toPort": high,
    }


def private_acl(mutated: Plans, ingress: list[dict[str, Any]], subnets: str = "private", azs: str = "abc") -> None:
    regional = stack(mutated, "prod-us-west-2")
    ids = [named(regional, f"network-{subnets}-us-west-2{az}")["id"] for az in azs]
    add(
        regional,
        from_plans.NACL,
        f"acl-{subnets}",
        {
            "vpcId": named(regional, "network-vpc")["id"],
            "subnetIds": ids,
            "ingress": ingress,
            "egress": [acl_rule(100, "-1", "0.0.0.0/0")],
        },
    )


def test_a_blackhole_over_half_a_site_lan_fails_for_the_addresses_it_covers() -> None:
    mutated = plans()
    regional = stack(mutated, "prod-us-west-2")
    add(
        regional,
        from_plans.TGW_ROUTE,
        "half-lan-hole",
        {
            "transitGatewayRouteTableId": named(regional, "transit-rt")["id"],
            "destinationCidrBlock": "10.200.8.0/21",
            "blackhole": True,
        },
    )
    result = evaluate(mutated, "site/sjc1->prod-us-west-2")
    assert result.failures
    first = result.failures[0]
    assert first.packet is not None and first.packet.src in N("10.200.8.0/21")
    assert "matches a blackhole route" in first.verdict.reason
    assert 0.49 < first.share < 0.51  # the other half of the LAN still gets through
    assert (
        result.coverage["site/sjc1->prod-us-west-2"].sources == 4094 + 16384
    )  # every host of the LAN, every pod address


def test_replies_to_linux_ephemeral_ports_below_49152_are_dropped_by_an_iana_only_acl() -> None:
    mutated = plans()
    private_acl(
        mutated,
        [
            acl_rule(100, "udp", "10.0.0.0/8", 53, 53),
            acl_rule(110, "tcp", "10.0.0.0/8", 53, 53),
            acl_rule(200, "udp", "0.0.0.0/0", 49152, 65535),
            acl_rule(210, "tcp", "0.0.0.0/0", 49152, 65535),
        ],
    )
    result = evaluate(mutated, "dns/prod-us-west-2/udp")
    crossing = [f for f in result.failures if "reply path: network ACL acl-private" in f.verdict.denied_at]
    assert crossing, [f.why for f in result.failures]
    packet = crossing[0].packet
    assert packet is not None and 32768 <= packet.sport < 49152  # a real Linux source port
    assert 0.5 < crossing[0].share < 0.65  # 16384 of the 28232 Linux ephemeral ports


def test_lustre_replies_go_back_to_the_reserved_ports_it_connects_from() -> None:
    mutated = plans()
    regional = stack(mutated, "prod-us-west-2")
    declared = named(regional, "storage-lustre")["inputs"]["subnetIds"]
    fsx_subnets = {declared} if isinstance(declared, str) else set(declared)
    client_azs = "".join(
        az for az in "abc" if named(regional, f"network-private-us-west-2{az}")["id"] not in fsx_subnets
    )
    assert client_azs
    # The clients' subnets admit Lustre and "return traffic" on 1024-65535: the reply to 1018-1023 is dropped.
    private_acl(
        mutated,
        [acl_rule(100, "tcp", "10.2.0.0/16", 988, 988), acl_rule(110, "tcp", "0.0.0.0/0", 1024, 65535)],
        azs=client_azs,
    )
    result = evaluate(mutated, "storage/prod-us-west-2/fsx-clients")
    replies = [f for f in result.failures if f.verdict.denied_at == "reply path: network ACL acl-private"]
    assert replies, [f.why for f in result.failures]
    packet = replies[0].packet
    assert packet is not None and 1018 <= packet.sport <= 1023


def public_interactive_pool(mutated: Plans, open_ports: tuple[int, int]) -> None:
    """The interactive pool in the public subnets, its launch template asking for a public address, its group
    open to the world on `open_ports`."""
    regional = stack(mutated, "prod-us-west-2")
    template = named(regional, "pool-interactive-lt")
    template["inputs"]["networkInterfaces"] = [
        {
            "associatePublicIpAddress": "true",
            "deviceIndex": 0,
            "securityGroups": template["inputs"].pop("vpcSecurityGroupIds"),
        }
    ]
    named(regional, "pool-interactive-asg")["inputs"]["vpcZoneIdentifiers"] = [
        named(regional, f"network-public-us-west-2{az}")["id"] for az in "abc"
    ]
    group = named(regional, "pool-interactive-sg")
    add(
        regional,
        from_plans.SG_INGRESS,
        "interactive-from-world",
        {
            "securityGroupId": group["id"],
            "ipProtocol": "tcp",
            "fromPort": open_ports[0],
            "toPort": open_ports[1],
            "cidrIpv4": "0.0.0.0/0",
        },
    )


@pytest.mark.parametrize("port", [22, 443])
def test_the_internet_hop_checks_the_exact_ports_and_reads_launch_template_addresses(port: int) -> None:
    mutated = plans()
    assert all(
        not r["inputs"].get("mapPublicIpOnLaunch")
        for r in stack(mutated, "prod-us-west-2")["resources"]
        if r["type"] == from_plans.SUBNET and "private" in r["name"]
    )
    public_interactive_pool(mutated, (port, port))
    result = evaluate(mutated, "deny-internet/prod-us-west-2/pool")
    exposed = [f for f in result.failures if "interactive" in f.destination.label]
    assert exposed and all(f.packet is not None and f.packet.dport == port for f in exposed)
    assert all(f.packet is not None and f.packet.src.is_global for f in exposed)
    assert exposed[0].share == pytest.approx(1 / 65536, rel=0.01)  # one port of every one: nothing else open
    assert not evaluate(mutated, "deny-internet/prod-us-west-2/pool/udp").failures


def test_an_elastic_ip_makes_an_instance_reachable_from_the_internet() -> None:
    mutated = plans()
    regional = stack(mutated, "prod-us-west-2")
    subnet = named(regional, "network-public-us-west-2a")
    group = named(regional, "pool-interactive-sg")
    add(
        regional,
        from_plans.INSTANCE,
        "bastion",
        {"subnetId": subnet["id"], "vpcSecurityGroupIds": [group["id"]], "associatePublicIpAddress": False},
        "i-bastion",
    )
    add(
        regional,
        from_plans.SG_INGRESS,
        "ssh-from-world",
        {"securityGroupId": group["id"], "ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": "0.0.0.0/0"},
    )
    assert not evaluate(mutated, "deny-internet/prod-us-west-2/instance").failures  # no public address yet
    add(regional, from_plans.EIP, "bastion-eip", {"instance": "i-bastion", "domain": "vpc"})
    failures = evaluate(mutated, "deny-internet/prod-us-west-2/instance").failures
    assert failures and failures[0].packet is not None and failures[0].packet.dport == 22


def test_without_remote_networks_the_control_plane_reaches_no_hybrid_kubelet_or_webhook() -> None:
    mutated = plans()
    named(stack(mutated, "prod-us-west-2"), "cluster-eks")["inputs"].pop("remoteNetworkConfig")
    for intent, where in (
        ("control-plane/prod-us-west-2/kubelet", "LAN"),
        ("control-plane/prod-us-west-2/webhooks", "pods"),
    ):
        result = evaluate(mutated, intent)
        failed = [f for f in result.failures if where in f.destination.label]
        assert failed, intent
        assert failed[0].verdict.denied_at == "EKS cluster cluster-eks"
        assert "remoteNetworkConfig" in failed[0].verdict.reason
        # The VPC's own nodes are still reached.
        assert not [f for f in result.failures if "pool" in f.destination.label]
    # Its replies are the VPC's to route (clients in other VPCs reach a private endpoint without any remote
    # network): the site's machines still reach the API, though they can no longer join as nodes.
    assert not evaluate(mutated, "control-plane/prod-us-west-2/api").failures


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        pytest.param(
            lambda k8s: k8s.update(
                resources=[r for r in k8s["resources"] if r["inputs"].get("kind") != "CiliumBGPAdvertisement"]
            ),
            "no route to hybrid pod",
            id="no-advertisement",
        ),
        pytest.param(
            lambda k8s: named(k8s, "platform-cilium-pool-sjc1")["inputs"]["spec"]["ipv4"].update(maskSize=24),
            "no route to hybrid pod",
            id="blocks-larger-than-the-gateway-accepts",
        ),
        pytest.param(
            lambda k8s: named(k8s, "platform-cilium-pool-sjc1")["inputs"]["spec"]["ipv4"].update(cidrs=["10.5.0.0/18"]),
            "10.5.",
            id="pool-outside-the-planned-range",
        ),
    ],
)
def test_hybrid_pods_are_reached_only_where_cilium_announces_and_the_gateway_accepts(edit: Any, reason: str) -> None:
    mutated = plans()
    assert not evaluate(mutated, "site/prod-us-west-2->sjc1").failures
    edit(stack(mutated, "prod-us-west-2-k8s"))
    result = evaluate(mutated, "site/prod-us-west-2->sjc1")
    pods = [f for f in result.failures if "hybrid pods" in f.destination.label]
    assert pods and reason in pods[0].why, [f.why for f in result.failures]


def test_transit_attachment_subnet_acls_filter_what_enters_and_leaves_the_transit_gateway() -> None:
    mutated = plans()
    # Inbound rules of the attachment subnets see traffic into the transit gateway by its source: the VPC's.
    private_acl(
        mutated, [acl_rule(90, "-1", "10.2.0.0/16", action="deny"), acl_rule(100, "-1", "0.0.0.0/0")], "transit"
    )
    result = evaluate(mutated, "site/prod-us-west-2->sjc1")
    assert result.failures
    assert result.failures[0].verdict.denied_at == "network ACL acl-transit"
    assert result.failures[0].verdict.reason.startswith("rule 90 denies 10.2.")


def test_transit_attachment_subnet_acls_match_the_vpc_side_address_only() -> None:
    # Denying the site's range there stops nothing: into the gateway the rules see the VPC source, out of it the
    # VPC destination (Transit Gateway guide, "Network ACLs for transit gateways").
    mutated = plans()
    private_acl(
        mutated, [acl_rule(90, "-1", "10.200.0.0/20", action="deny"), acl_rule(100, "-1", "0.0.0.0/0")], "transit"
    )
    loaded, _address_plan, topo = check.model(REFERENCE_FLEET, REFERENCE_LOCK, mutated)
    transit = [
        s
        for s in topo.subnets.values()
        if s.origin.stack == "prod-us-west-2" and s.origin.name.startswith("network-transit-")
    ]
    assert transit and all(topo.nacl_of(s.id) is not None for s in transit)  # the ACL is there, on them
    chosen = [i for i in intents.derive(loaded.fleet, topo) if i.id == "site/sjc1->prod-us-west-2"]
    result = evaluation.run(topo, chosen, explain=True)
    assert not result.failures
    hops = [h for e in result.explained for _packet, trail, _n in e.paths for h in trail]
    assert any("vpc attachment" in h for h in hops)  # and the flows do cross the transit gateway


def test_ipv6_is_refused_with_the_resource_that_declares_it() -> None:
    mutated = plans()
    regional = stack(mutated, "prod-us-west-2")
    named(regional, "network-vpc")["inputs"]["assignGeneratedIpv6CidrBlock"] = True
    add(
        regional,
        from_plans.SG_INGRESS,
        "v6-open",
        {"securityGroupId": named(regional, "pool-cpu-sg")["id"], "ipProtocol": "-1", "cidrIpv6": "::/0"},
    )
    result = evaluate(mutated, "dns/")
    assert {r.resource.name for r in result.refusals} == {"network-vpc", "v6-open"}
    summary = check.summary_json(result)
    assert summary["refused"] and "proves IPv4 only" in summary["refused"][0]["reason"]
    assert summary["failed_intents"] >= 1


def test_the_client_vpn_hop_names_the_rule_that_admits_the_group() -> None:
    loaded, _address_plan, topo = check.model(REFERENCE_FLEET, REFERENCE_LOCK, plans())
    wanted = "laptop/laptop of team vision on prod-us-west-2 VPN->prod-us-west-2/api"
    chosen = [i for i in intents.derive(loaded.fleet, topo) if i.id == wanted]
    result = evaluation.run(topo, chosen, explain=True)
    assert result.explained and all(e.allowed for e in result.explained)
    hops = result.explained[0].paths[0][1]
    assert "client VPN client-vpn-endpoint: authorized by client-vpn-authorize-vision-vpc" in hops, hops
    # and the security group rule that admits the endpoint's interface (its address is in the VPC)
    assert any(h.startswith("ingress allowed by") and "cluster-api-from-10-2-0-0-16" in h for h in hops), hops


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "flows.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        (
            "flows:\n  - name: a\n    from: {pool: cpu}\n    to: {control_plane: true}\n",
            "flows.0.ports",
            "needs its destination ports",
        ),
        (
            "flows:\n  - name: a\n    from: {site: sjc1, environment: staging}\n    to: {pool: cpu}\n    ports: [22]\n",
            "flows.0.from.environment",
            "site sjc1 is in environment 'prod'",
        ),
        (
            "flows:\n  - name: a\n    from: {pool: cpu}\n    to: {pool: cpu}\n    ports: ['30-20']\n",
            "flows.0.ports",
            "low to high",
        ),
        (
            "flows:\n  - name: a\n    from: {pool: cpu}\n    to: {pool: cpu}\n    protocol: icmp\n    ports: [1]\n",
            "flows.0.ports",
            "icmp has no ports",
        ),
    ],
)
def test_incomplete_flow_specs_are_errors(tmp_path: Path, text: str, key: str, message: str) -> None:
    with pytest.raises(DlinfraError) as caught:
        check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, plans(), write(tmp_path, text))
    assert caught.value.key == key and message in str(caught.value)


def test_port_ranges_and_source_ports_in_a_flows_file(tmp_path: Path) -> None:
    text = (
        "flows:\n  - name: lustre-range\n    from: {pool: cpu, region: us-west-2, environment: prod}\n"
        "    to: {fsx: true, region: us-west-2, environment: prod}\n    ports: [988, '1018-1023']\n"
        "    source_ports: ['1018-1023']\n"
    )
    result = check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, plans(), write(tmp_path, text), explain=True)
    coverage = result.coverage["user/lustre-range"]
    assert coverage.ports == 7 and coverage.share == 1.0
    paths = [e for e in result.explained if e.intent == "user/lustre-range"]
    assert paths and all(e.allowed and e.paths and e.paths[0][1] for e in paths)
    packet = paths[0].paths[0][0]
    assert packet is not None and 1018 <= packet.sport <= 1023


_ = copy, without, A


def test_a_public_cluster_endpoint_is_reached_from_its_public_access_cidrs_only() -> None:
    mutated = plans()
    config = named(stack(mutated, "prod-us-west-2"), "cluster-eks")["inputs"]["vpcConfig"]
    config.update(endpointPublicAccess=True, publicAccessCidrs=["203.0.113.0/24"])
    failures = evaluate(mutated, "deny-internet/prod-us-west-2/control-plane").failures
    assert failures
    packet = failures[0].packet
    assert packet is not None and packet.src in N("203.0.113.0/24") and packet.dport == 443
    assert "EKS public endpoint of cluster-eks" in failures[0].why
    assert not evaluate(mutated, "deny-internet/prod-us-west-2/control-plane/udp").failures


def test_a_laptop_keeps_its_source_port_and_reaches_where_some_port_gets_back() -> None:
    from dlinfra.checks.reach.endpoints import laptop_endpoints, place_endpoints
    from dlinfra.checks.reach.engine import evaluate as evaluate_flow

    mutated = plans()
    private_acl(mutated, [acl_rule(100, "tcp", "0.0.0.0/0", 443, 443), acl_rule(200, "tcp", "0.0.0.0/0", 49152, 65535)])
    loaded, _address_plan, topo = check.model(REFERENCE_FLEET, REFERENCE_LOCK, mutated)
    laptop = next(e for region, e in laptop_endpoints(topo, loaded.fleet, "prod") if region == "us-west-2")
    api = next(p for p in topo.places if p.kind == "control-plane" and p.region == "us-west-2")
    verdict = evaluate_flow(topo, laptop, place_endpoints(topo, api)[0], "tcp", 443)
    assert not verdict.allowed and verdict.reachable  # macOS and Windows laptops (49152-65535) get through
    assert verdict.witness is not None and verdict.witness.sport < 49152
    assert f"tcp/{verdict.witness.sport}" in verdict.reason  # the packet named is the one the hop dropped
    assert verdict.witness.src in laptop.networks[0]  # a laptop's address, not the endpoint's


def test_a_laptop_needs_the_route_through_every_associated_subnet() -> None:
    mutated = plans()
    for az in "bc":
        without("prod-us-west-2", f"client-vpn-route-vpc-us-east-1-us-west-2{az}")(mutated)
    result = evaluate(mutated, "laptop/laptop of team vision on prod-us-west-2 VPN->prod-us-east-1/api")
    assert result.failures
    assert "through the associated subnet network-private-us-west-2b" in result.failures[0].verdict.reason


def test_pods_leave_the_vpc_from_ports_the_vpc_cni_picks() -> None:
    mutated = plans()
    # Replies admitted from 32768 up: enough for Linux inside the VPC, not for SNAT's 1024-65535 outside it.
    private_acl(mutated, [acl_rule(100, "-1", "10.2.0.0/16"), acl_rule(200, "tcp", "0.0.0.0/0", 32768, 65535)])
    inside = evaluate(mutated, "pod-to-pod/prod-us-west-2").failures
    assert not [f for f in inside if "site" not in f.destination.label and "site" not in f.source.label]
    leaving = evaluate(mutated, "site/prod-us-west-2->sjc1").failures
    assert leaving and leaving[0].packet is not None and 1024 <= leaving[0].packet.sport < 32768


def test_a_declared_default_acl_filters_the_subnets_no_other_acl_has() -> None:
    mutated = plans()
    regional = stack(mutated, "prod-us-west-2")
    add(
        regional,
        from_plans.DEFAULT_NACL,
        "network-default-acl",
        {
            "defaultNetworkAclId": "acl-default",
            "ingress": [acl_rule(100, "tcp", "0.0.0.0/0", 443, 443)],
            "egress": [acl_rule(100, "-1", "0.0.0.0/0")],
        },
    )
    result = evaluate(mutated, "dns/prod-us-west-2/udp")
    assert result.failures and result.failures[0].verdict.denied_at.endswith("network ACL network-default-acl")


def test_prefix_lists_are_read_when_declared_and_refused_when_not() -> None:
    mutated = plans()
    regional = stack(mutated, "prod-us-west-2")
    group = named(regional, "pool-cpu-sg")["id"]
    add(
        regional,
        from_plans.SG_INGRESS,
        "from-aws-list",
        {"securityGroupId": group, "ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "prefixListId": "pl-63a5400a"},
    )
    refused = evaluate(mutated, "dns/").refusals
    assert [(r.resource.name, r.kind) for r in refused] == [("from-aws-list", "prefix-list")]
    mutated = plans()
    public_interactive_pool(mutated, (6006, 6006))
    without("prod-us-west-2", "interactive-from-world")(mutated)  # public, but open to no one yet
    assert not evaluate(mutated, "deny-internet/prod-us-west-2/pool").failures
    regional = stack(mutated, "prod-us-west-2")
    add(
        regional,
        PREFIX_LIST,
        "office",
        {"addressFamily": "IPv4", "entries": [{"cidr": "198.51.100.0/24"}]},
        "pl-office",
    )
    add(
        regional,
        from_plans.SG_INGRESS,
        "ssh-from-office",
        {
            "securityGroupId": named(regional, "pool-interactive-sg")["id"],
            "ipProtocol": "tcp",
            "fromPort": 22,
            "toPort": 22,
            "prefixListId": "pl-office",
        },
    )
    exposed = [
        f for f in evaluate(mutated, "deny-internet/prod-us-west-2/pool").failures if f.packet and f.packet.dport == 22
    ]
    assert exposed and exposed[0].packet is not None and exposed[0].packet.src in N("198.51.100.0/24")


def test_a_bgp_session_in_another_asn_announces_no_pods() -> None:
    mutated = plans()
    config = named(stack(mutated, "prod-us-west-2-k8s"), "platform-cilium-bgp-cluster-sjc1")["inputs"]["spec"]
    config["bgpInstances"][0]["peers"][0]["peerASN"] = 64999
    pods = [f for f in evaluate(mutated, "site/prod-us-west-2->sjc1").failures if "hybrid pods" in f.destination.label]
    assert pods and "no route to hybrid pod" in pods[0].why


def test_closed_means_no_packet_arrives_even_without_a_way_back() -> None:
    mutated = plans()
    public_interactive_pool(mutated, (5000, 5000))
    regional = stack(mutated, "prod-us-west-2")
    named(regional, "interactive-from-world")["inputs"]["ipProtocol"] = "udp"
    without("prod-us-west-2", "network-route-public-default")(mutated)  # no route back to the internet
    failures = evaluate(mutated, "deny-internet/prod-us-west-2/pool/udp").failures
    assert failures and failures[0].packet is not None and failures[0].packet.dport == 5000
    assert failures[0].why.startswith("reaches it, but must stay closed")


def test_a_flow_to_the_internet_leaves_through_the_nat_gateway(tmp_path: Path) -> None:
    text = (
        "flows:\n  - name: nodes-to-registries\n    from: {pool: cpu, environment: prod, region: us-west-2}\n"
        "    to: {internet: true}\n    ports: [443]\n"
    )
    result = check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, plans(), write(tmp_path, text))
    assert "user/nodes-to-registries" not in result.failed_intents()
    assert result.coverage["user/nodes-to-registries"].share == 1.0
    mutated = plans()
    without("prod-us-west-2", "network-route-private-us-west-2a-default")(mutated)
    broken = check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, mutated, write(tmp_path, text))
    (failure,) = [f for f in broken.failures if f.intent.id == "user/nodes-to-registries"]
    assert "no route for" in failure.verdict.reason


def laptop_to_api(mutated: Plans, region: str = "us-west-2") -> Any:
    from dlinfra.checks.reach.endpoints import laptop_endpoints, place_endpoints
    from dlinfra.checks.reach.engine import evaluate as evaluate_flow

    loaded, _address_plan, topo = check.model(REFERENCE_FLEET, REFERENCE_LOCK, mutated)
    laptop = next(
        e for r, e in laptop_endpoints(topo, loaded.fleet, "prod") if r == "us-west-2" and "vision" in e.label
    )
    api = next(p for p in topo.places if p.kind == "control-plane" and p.environment == "prod" and p.region == region)
    return [evaluate_flow(topo, laptop, end, "tcp", 443) for end in place_endpoints(topo, api)]


def test_a_laptop_must_get_through_from_every_associated_subnet_not_just_one() -> None:
    mutated = plans()
    # The Client VPN routes are all there; the VPC route tables of 2b and 2c lose their way to us-east-1.
    for az in "bc":
        without("prod-us-west-2", f"transit-route-us-west-2{az}-vpc-us-east-1")(mutated)
    verdicts = laptop_to_api(mutated, "us-east-1")
    assert verdicts and all(not v.allowed and v.reachable for v in verdicts)  # through 2a it works
    # 2b and 2c send it to their default route, the NAT gateway, and the internet gateway drops it.
    assert all("is not an internet address" in v.reason for v in verdicts), [v.reason for v in verdicts]


def test_every_address_of_the_endpoints_interface_must_be_admitted_and_one_is_enough_to_reach() -> None:
    mutated = plans()
    named(stack(mutated, "prod-us-west-2"), "cluster-api-from-10-2-0-0-16")["inputs"]["cidrIpv4"] = "10.2.0.0/19"
    verdicts = laptop_to_api(mutated)
    assert verdicts and all(not v.allowed and v.reachable for v in verdicts)
    assert all(v.witness is not None and "security group" in v.denied_at for v in verdicts)


def test_an_undocumented_choice_of_attachment_subnet_must_work_every_way_and_reaches_if_one_does(
    tmp_path: Path,
) -> None:
    mutated = plans()
    # Only 2c's transit subnet refuses to pass traffic on to the VPC; a VPN's traffic may enter by any of them.
    private_acl(mutated, [acl_rule(100, "-1", "0.0.0.0/0")], "transit", azs="c")
    acl = named(stack(mutated, "prod-us-west-2"), "acl-transit")
    acl["inputs"]["egress"] = [acl_rule(100, "-1", "10.200.0.0/16")]
    result = evaluate(mutated, "site/sjc1->prod-us-west-2")
    assert result.failures and result.failures[0].verdict.denied_at == "network ACL acl-transit"
    text = (
        "flows:\n  - name: sjc1-closed\n    from: {site: sjc1}\n"
        "    to: {pool: cpu, environment: prod, region: us-west-2}\n    ports: [8080]\n    expect: deny\n"
    )
    closed = check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, mutated, write(tmp_path, text))
    assert "user/sjc1-closed" in closed.failed_intents()  # it still arrives through 2a and 2b


def test_a_declared_default_route_table_is_the_main_table() -> None:
    mutated = plans()
    without("prod-us-west-2", "network-rta-private-us-west-2a")(mutated)  # 2a falls back to the main table
    assert evaluate(mutated, "site/prod-us-west-2->sjc1").failures  # AWS's main table: the local route only
    regional = stack(mutated, "prod-us-west-2")
    tgw = named(regional, "transit-tgw")["id"]
    add(
        regional,
        from_plans.DEFAULT_RT,
        "network-default-rt",
        {
            "defaultRouteTableId": named(regional, "network-vpc")["outputs"]["defaultRouteTableId"],
            "routes": [{"cidrBlock": c, "transitGatewayId": tgw} for c in ("10.200.0.0/20", "10.3.64.0/18")],
        },
    )
    assert not evaluate(mutated, "site/prod-us-west-2->sjc1").failures


def test_what_the_gateway_filters_out_is_not_announced(monkeypatch: pytest.MonkeyPatch) -> None:
    render = sites.render_frr

    def without_pods(view: Any) -> str | None:
        text = render(view)
        return text.replace("permit 10.3.64.0/18\n", "permit 192.0.2.0/24\n") if text else text

    monkeypatch.setattr(sites, "render_frr", without_pods)
    result = evaluate(plans(), "site/prod-us-west-2->sjc1")
    pods = [f for f in result.failures if "hybrid pods" in f.destination.label]
    assert pods and "no route for 10.3.64." in pods[0].why


def test_the_nodes_bgp_instance_must_be_in_the_sites_asn() -> None:
    mutated = plans()
    config = named(stack(mutated, "prod-us-west-2-k8s"), "platform-cilium-bgp-cluster-sjc1")["inputs"]["spec"]
    config["bgpInstances"][0]["localASN"] = 64999
    pods = [f for f in evaluate(mutated, "site/prod-us-west-2->sjc1").failures if "hybrid pods" in f.destination.label]
    assert pods and "no route to hybrid pod" in pods[0].why


TO_INTERNET = (
    "flows:\n  - name: out\n    from: {pool: POOL, environment: prod, region: us-west-2}\n"
    "    to: {internet: true}\n    ports: [443]\n"
)


def out_failure(tmp_path: Path, mutated: Plans, pool: str = "cpu") -> Any:
    result = check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, mutated, write(tmp_path, TO_INTERNET.replace("POOL", pool)))
    return next((f for f in result.failures if f.intent.id == "user/out"), None)


def test_replies_from_the_internet_meet_the_source_subnets_acl(tmp_path: Path) -> None:
    mutated = plans()
    private_acl(mutated, [acl_rule(100, "-1", "10.0.0.0/8")])
    failure = out_failure(tmp_path, mutated)
    assert failure is not None and failure.verdict.denied_at == "reply path: network ACL acl-private"


def test_no_public_address_no_internet(tmp_path: Path) -> None:
    mutated = plans()
    public_interactive_pool(mutated, (443, 443))
    template = named(stack(mutated, "prod-us-west-2"), "pool-interactive-lt")
    template["inputs"]["networkInterfaces"][0]["associatePublicIpAddress"] = "false"
    failure = out_failure(tmp_path, mutated, "interactive")
    assert failure is not None and "has no public address" in failure.verdict.reason


def test_the_nat_gateways_subnet_acl_applies_both_ways(tmp_path: Path) -> None:
    mutated = plans()
    private_acl(mutated, [acl_rule(100, "-1", "10.0.0.0/8")], "public")  # replies from the internet refused
    acl = named(stack(mutated, "prod-us-west-2"), "acl-public")
    acl["inputs"]["egress"] = [acl_rule(100, "-1", "0.0.0.0/0")]
    failure = out_failure(tmp_path, mutated)
    assert failure is not None and "of NAT gateway network-nat-us-west-2" in failure.verdict.denied_at
    assert failure.verdict.denied_at.startswith("reply path")


def test_a_default_acl_of_no_single_vpc_is_refused() -> None:
    mutated = plans()
    regional = stack(mutated, "prod-us-west-2")
    add(regional, from_plans.VPC, "second-vpc", {"cidrBlock": "10.9.0.0/16"})
    add(regional, from_plans.DEFAULT_NACL, "default-acl", {"defaultNetworkAclId": "acl-x", "ingress": []})
    refused = evaluate(mutated, "dns/").refusals
    assert [(r.resource.name, r.kind) for r in refused] == [("default-acl", "default-acl")]


def test_a_client_vpn_endpoint_without_associations_says_so() -> None:
    mutated = plans()
    for az in "abc":
        without("prod-us-west-2", f"client-vpn-association-us-west-2{az}")(mutated)
    verdicts = laptop_to_api(mutated)
    assert verdicts and all("no associated subnet" in v.reason for v in verdicts)
