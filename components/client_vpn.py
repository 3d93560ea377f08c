"""ClientVpn: laptop VPN (AWS Client VPN, OpenVPN compatible) for people, with logs and routes.

Two ways in, never a key shared by every laptop: federated sign-in (SAML, e.g. IAM Identity Center) with
authorization rules per team group, or one client certificate per person whose common name a client connect
handler checks against the fleet's list, so removing a person refuses their next connection; the same apply ends
their open sessions (a sweep Lambda invoked once per change of the list), and every session ends at the session
timeout, which for federated sign-in is when the IdP decides again.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pulumi
import pulumi_aws as aws
import pulumi_tls as tls

from components import lambda_function
from components.network import LOG_RETENTION_DAYS
from dlinfra.model.naming import Names

# Client VPN accepts RSA 1024/2048 server and client keys only; 2048 is the strong choice it allows.
_RSA_BITS = 2048
_HOURS_PER_DAY = 24
_EARLY_RENEWAL_DAYS = 30
# ACM only lets Client VPN use an imported server certificate that names a domain ("Certificate ... does not
# have a domain" otherwise): the server certificate carries a DNS SAN under this private suffix. Nothing
# resolves it; laptops check the certificate's common name (verify-x509-name), which stays as it was.
SERVER_DOMAIN_SUFFIX = "clientvpn.internal"
CONNECT_HANDLER = Path(__file__).parent / "lambdas" / "client_vpn_connect.py"
SWEEP = Path(__file__).parent / "lambdas" / "client_vpn_sweep.py"


@dataclass(frozen=True, kw_only=True)
class ClientVpnArgs:
    names: Names  # naming and tags of this (regional) stack
    vpc_id: pulumi.Input[str]  # the region's VPC
    vpc_cidr: str  # planned VPC block; its resolver (base + 2) is the clients' DNS server
    client_cidr: str  # planned laptop address pool (client-vpn/<env>/<region>), /12 to /22
    subnet_ids: Mapping[str, pulumi.Input[str]]  # AZ -> private subnet the endpoint is associated with
    remote_cidrs: Mapping[str, str]  # stable key -> CIDR beyond the VPC (other regions, sites), via the VPC
    log_kms_key_arn: pulumi.Input[str]  # KMS key for the connection log group (Network.log_key_arn)
    log_retention_days: int = 365  # days connection logs are kept; a value CloudWatch Logs accepts
    # Hours after which every session ends and the person signs in again: the IdP (federated sign-in) or the
    # connect handler (certificates) decides anew. 8 is the shortest AWS allows (8, 10, 12 or 24; EC2 API
    # reference, CreateClientVpnEndpoint SessionTimeoutHours): someone removed in the IdP is out within a workday.
    session_timeout_hours: Literal[8, 10, 12, 24] = 8
    ca_validity_days: int = 3650  # the endpoint's private CA
    cert_validity_days: int = 730  # server and client certificates; re-issued 30 days before expiry
    saml_provider_arn: str | None = None  # federated sign-in through this IAM SAML provider; or:
    users: Sequence[str] = ()  # one client certificate per person (certificate sign-in); exactly one of the two
    self_service_saml_provider_arn: str | None = None  # SAML provider of the self-service portal (saml only)
    access_groups: Mapping[str, str] = field(default_factory=dict)  # key -> IdP group allowed in (saml only)

    def __post_init__(self) -> None:
        if (self.saml_provider_arn is None) == (not self.users):
            raise ValueError("saml_provider_arn, users: give exactly one (federated or per-person sign-in)")
        if self.saml_provider_arn is not None and not self.access_groups:
            raise ValueError("access_groups: federated sign-in authorizes by group; name at least one")
        if self.users and (self.access_groups or self.self_service_saml_provider_arn):
            raise ValueError("access_groups, self_service_saml_provider_arn: only with federated sign-in")
        if len(set(self.users)) != len(self.users):
            raise ValueError("users: a person is listed twice")
        vpc = ipaddress.IPv4Network(self.vpc_cidr)
        client = ipaddress.IPv4Network(self.client_cidr)
        if not 12 <= client.prefixlen <= 22:
            raise ValueError(f"client_cidr: {client} is a /{client.prefixlen}; Client VPN needs /12 to /22")
        if client.overlaps(vpc):
            raise ValueError(f"client_cidr: {client} overlaps vpc_cidr {vpc}")
        for key, cidr in self.remote_cidrs.items():
            net = ipaddress.IPv4Network(cidr)
            if net.overlaps(vpc) or net.overlaps(client):
                raise ValueError(f"remote_cidrs.{key}: {net} overlaps the VPC or the client pool")
        if not self.subnet_ids:
            raise ValueError("subnet_ids: the endpoint needs at least one subnet to associate with")
        if self.log_retention_days not in LOG_RETENTION_DAYS:
            raise ValueError(f"log_retention_days: {self.log_retention_days} is not a CloudWatch Logs retention")
        if self.session_timeout_hours not in (8, 10, 12, 24):
            raise ValueError(f"session_timeout_hours: must be 8, 10, 12 or 24, got {self.session_timeout_hours}")
        if not 0 < self.cert_validity_days < self.ca_validity_days:
            raise ValueError("cert_validity_days: must be positive and shorter than ca_validity_days")
        if self.cert_validity_days <= _EARLY_RENEWAL_DAYS:
            raise ValueError(f"cert_validity_days: must exceed the {_EARLY_RENEWAL_DAYS}-day early-renewal window")

    @property
    def resolver(self) -> str:
        """The VPC's Amazon-provided DNS resolver: the VPC base address plus two."""
        return str(ipaddress.IPv4Network(self.vpc_cidr).network_address + 2)


class ClientVpn(pulumi.ComponentResource):
    """Private CA, server and client certificates, ACM import, Client VPN endpoint, associations and rules."""

    endpoint_id: pulumi.Output[str]
    dns_name: pulumi.Output[str]
    server_name: pulumi.Output[str]  # server certificate CN, for the profile's verify-x509-name
    ca_cert_pem: pulumi.Output[str]
    authentication: str  # "saml" or "certificate"
    user_credentials: pulumi.Output[dict[str, dict[str, str]]]  # person -> {cert_pem, key_pem}; secret; {} for saml

    def __init__(self, name: str, args: ClientVpnArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:vpn:ClientVpn", name, None, opts)
        names = args.names
        child = pulumi.ResourceOptions(parent=self)
        endpoint_name = names.physical("client-vpn")
        server_cn = names.physical("client-vpn", "server")
        cert_hours = args.cert_validity_days * _HOURS_PER_DAY

        # A private CA per endpoint: trust stops at this endpoint, and rotating it touches nothing else.
        ca_key = tls.PrivateKey(f"{name}-ca-key", algorithm="RSA", rsa_bits=_RSA_BITS, opts=child)
        ca = tls.SelfSignedCert(
            f"{name}-ca",
            private_key_pem=ca_key.private_key_pem,
            is_ca_certificate=True,
            subject=tls.SelfSignedCertSubjectArgs(
                common_name=names.physical("client-vpn", "ca"), organization=names.project
            ),
            validity_period_hours=args.ca_validity_days * _HOURS_PER_DAY,
            allowed_uses=["cert_signing", "crl_signing", "digital_signature"],
            opts=child,
        )
        server_key, server_cert = _leaf(
            f"{name}-server",
            tls.CertRequestSubjectArgs(common_name=server_cn, organization=names.project),
            "server_auth",
            ca_key,
            ca,
            cert_hours,
            child,
            dns_names=[f"{server_cn}.{SERVER_DOMAIN_SUFFIX}"],
        )
        credentials: dict[str, pulumi.Output[dict[str, str]]] = {}
        for user in sorted(args.users):
            user_key, user_cert = _leaf(
                f"{name}-user-{user}",
                tls.CertRequestSubjectArgs(common_name=user, organization=names.project),
                "client_auth",
                ca_key,
                ca,
                cert_hours,
                child,
            )
            credentials[user] = pulumi.Output.all(user_cert.cert_pem, user_key.private_key_pem).apply(
                lambda pems: {"cert_pem": pems[0], "key_pem": pems[1]}
            )
        # Client and server certificates share the CA, so the imported server certificate also serves as the
        # client root chain (AWS documents this), and no CA private key ever reaches ACM.
        server_private_key: pulumi.Output[str] = pulumi.Output.secret(server_key.private_key_pem)
        acm_cert = aws.acm.Certificate(
            f"{name}-server-acm",
            private_key=server_private_key,
            certificate_body=server_cert.cert_pem,
            certificate_chain=ca.cert_pem,
            tags=names.tags("vpn", server_cn),
            opts=child,
        )

        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=f"/client-vpn/{endpoint_name}",
            retention_in_days=args.log_retention_days,
            kms_key_id=args.log_kms_key_arn,
            tags=names.tags("vpn", endpoint_name),
            opts=child,
        )
        log_stream = aws.cloudwatch.LogStream(
            f"{name}-log-stream", log_group_name=log_group.name, name="connections", opts=child
        )

        destinations = {"vpc": args.vpc_cidr, **dict(sorted(args.remote_cidrs.items()))}
        security_group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            name=endpoint_name,
            description="Client VPN endpoint: laptops reach the VPC, the other regions and the sites",
            vpc_id=args.vpc_id,
            tags=names.tags("vpn", endpoint_name),
            opts=child,
        )
        for key, cidr in destinations.items():
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-sg-to-{key}",
                security_group_id=security_group.id,
                description=f"laptops to {key}",
                ip_protocol="-1",
                cidr_ipv4=cidr,
                tags=names.tags("vpn", names.physical("client-vpn", "to", key)),
                opts=child,
            )

        federated = args.saml_provider_arn is not None
        if federated:
            authentication = aws.ec2clientvpn.EndpointAuthenticationOptionArgs(
                type="federated-authentication",
                saml_provider_arn=args.saml_provider_arn,
                self_service_saml_provider_arn=args.self_service_saml_provider_arn,
            )
            connect = None
        else:
            authentication = aws.ec2clientvpn.EndpointAuthenticationOptionArgs(
                type="certificate-authentication", root_certificate_chain_arn=acm_cert.arn
            )
            handler = self._connect_handler(name, args, endpoint_name)
            connect = aws.ec2clientvpn.EndpointClientConnectOptionsArgs(enabled=True, lambda_function_arn=handler.arn)
        endpoint = aws.ec2clientvpn.Endpoint(
            f"{name}-endpoint",
            description=f"{endpoint_name}: laptops into {names.prefix}",
            server_certificate_arn=acm_cert.arn,
            client_cidr_block=args.client_cidr,
            authentication_options=[authentication],
            client_connect_options=connect,
            connection_log_options=aws.ec2clientvpn.EndpointConnectionLogOptionsArgs(
                enabled=True, cloudwatch_log_group=log_group.name, cloudwatch_log_stream=log_stream.name
            ),
            dns_servers=[args.resolver],
            split_tunnel=True,
            transport_protocol="udp",
            vpn_port=443,
            session_timeout_hours=args.session_timeout_hours,
            # At the timeout the session ends and the client asks the person to connect again, which signs them in
            # anew. Explicit: AWS documents true as the default (EC2 API reference, CreateClientVpnEndpoint
            # DisconnectOnSessionTimeout), the provider's docstring says false.
            disconnect_on_session_timeout=True,
            self_service_portal="enabled" if args.self_service_saml_provider_arn else "disabled",
            security_group_ids=[security_group.id],
            vpc_id=args.vpc_id,
            tags=names.tags("vpn", endpoint_name),
            opts=child,
        )
        associations: dict[str, aws.ec2clientvpn.NetworkAssociation] = {}
        for az, subnet_id in sorted(args.subnet_ids.items()):
            associations[az] = aws.ec2clientvpn.NetworkAssociation(
                f"{name}-association-{az}",
                client_vpn_endpoint_id=endpoint.id,
                subnet_id=subnet_id,
                opts=child,
            )
        # Federated sign-in carries the person's IdP groups: each allowed group gets its own rules. Certificates
        # carry no group, so AWS only honours rules for all groups there; who may connect at all is then the
        # connect handler's list of people.
        groups: Mapping[str, str | None] = dict(sorted(args.access_groups.items())) if federated else {"all": None}
        for key, cidr in destinations.items():
            for group_key, group in groups.items():
                aws.ec2clientvpn.AuthorizationRule(
                    f"{name}-authorize-{key}" if group is None else f"{name}-authorize-{group_key}-{key}",
                    client_vpn_endpoint_id=endpoint.id,
                    target_network_cidr=cidr,
                    authorize_all_groups=True if group is None else None,
                    access_group_id=group,
                    description=f"{'every listed person' if group is None else group_key} to {key}",
                    opts=child,
                )
        # The VPC route comes with each association; the rest go through every associated subnet, so losing an
        # AZ keeps the routes alive in the others.
        for key, cidr in sorted(args.remote_cidrs.items()):
            for az, association in associations.items():
                aws.ec2clientvpn.Route(
                    f"{name}-route-{key}-{az}",
                    client_vpn_endpoint_id=endpoint.id,
                    destination_cidr_block=cidr,
                    target_vpc_subnet_id=association.subnet_id,
                    description=f"{key} through the VPC ({az})",
                    opts=child,
                )

        if not federated:
            self._sweep(name, args, endpoint_name, endpoint, handler)

        self.endpoint_id = endpoint.id
        self.security_group_id = security_group.id
        self.dns_name = endpoint.dns_name
        self.server_name = pulumi.Output.from_input(server_cn)
        self.ca_cert_pem = ca.cert_pem
        self.authentication = "saml" if federated else "certificate"
        self.user_credentials = pulumi.Output.secret(pulumi.Output.all(**credentials).apply(dict))
        self.register_outputs(
            {
                "security_group_id": self.security_group_id,
                "endpoint_id": self.endpoint_id,
                "dns_name": self.dns_name,
                "server_name": self.server_name,
                "ca_cert_pem": self.ca_cert_pem,
                "authentication": self.authentication,
                "user_credentials": self.user_credentials,
            }
        )

    def _connect_handler(self, name: str, args: ClientVpnArgs, endpoint_name: str) -> aws.lambda_.Function:
        """The Lambda that admits only the listed people's certificates (its name must start AWSClientVPN-)."""
        names = args.names
        function_name = f"AWSClientVPN-{endpoint_name}"[:64]
        tags = names.tags("vpn", function_name)
        return lambda_function.declare(
            f"{name}-connect",
            parent=self,
            resource_name=f"{name}-connect",
            function_name=function_name,
            role_name=names.physical("client-vpn", "connect", max_len=64),
            description=f"Admits the listed people's certificates to {endpoint_name}",
            source=CONNECT_HANDLER,
            policy_name="connect-handler",
            tags=tags,
            log_kms_key_arn=args.log_kms_key_arn,
            log_retention_days=args.log_retention_days,
            timeout=10,  # Client VPN waits at most 30 s
            # The list of people is not secret; a customer key would add a key-policy dependency for nothing.
            environment={"ALLOWED_COMMON_NAMES": json.dumps(sorted(args.users))},
            reserved_concurrency=10,  # bounds what a flood of connection attempts can cost
        )

    def _sweep(
        self,
        name: str,
        args: ClientVpnArgs,
        endpoint_name: str,
        endpoint: aws.ec2clientvpn.Endpoint,
        handler: aws.lambda_.Function,
    ) -> aws.lambda_.Invocation:
        """End the open sessions of people no longer listed, on the apply that removes them.

        The connect handler only judges new connections; AWS leaves existing ones alone when it changes (AWS
        Client VPN administrator guide, "Connection authorization"). The invocation's input holds the list, and a
        change of input replaces a CREATE_ONLY invocation, which invokes the function again
        (terraform-provider-aws lambda/invocation.go, customizeDiffInputChangeWithCreateOnlyScope).
        """
        names = args.names
        function_name = names.physical("client-vpn", "sweep", max_len=64)
        tags = names.tags("vpn", function_name)
        function = lambda_function.declare(
            f"{name}-sweep",
            parent=self,
            resource_name=f"{name}-sweep",
            function_name=function_name,
            role_name=function_name,
            description=f"Ends the open sessions of people no longer listed for {endpoint_name}",
            source=SWEEP,
            policy_name="end-removed-sessions",
            tags=tags,
            log_kms_key_arn=args.log_kms_key_arn,
            log_retention_days=args.log_retention_days,
            timeout=60,  # a page of connections and one terminate call each
            statements=[
                {
                    # Both take the client-vpn-endpoint resource type (Service Authorization Reference, Amazon
                    # EC2): the function sees and ends this endpoint's connections, no other's.
                    "Sid": "EndConnections",
                    "Effect": "Allow",
                    "Action": ["ec2:DescribeClientVpnConnections", "ec2:TerminateClientVpnConnections"],
                    "Resource": endpoint.arn,
                }
            ],
            # No reserved concurrency: new accounts start below 1,000 ("Lambda quotas": reduced concurrency), so
            # even 1 can break the apply. One apply at a time invokes it anyway. `dlinfra check` counts
            # reservations (limit-lambda-concurrent-...).
        )
        return aws.lambda_.Invocation(
            f"{name}-sweep-run",
            function_name=function.name,
            input=pulumi.Output.json_dumps({"endpoint_id": endpoint.id, "allowed": sorted(args.users)}),
            lifecycle_scope="CREATE_ONLY",
            # After the handler holds the new list: a client that reconnects at once is refused.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[handler]),
        )


def _leaf(
    name: str,
    subject: tls.CertRequestSubjectArgs,
    usage: Literal["server_auth", "client_auth"],
    ca_key: tls.PrivateKey,
    ca: tls.SelfSignedCert,
    validity_hours: int,
    opts: pulumi.ResourceOptions,
    dns_names: list[str] | None = None,
) -> tuple[tls.PrivateKey, tls.LocallySignedCert]:
    """A key and a certificate signed by the endpoint's CA, for one TLS role (with DNS SANs when given)."""
    key = tls.PrivateKey(f"{name}-key", algorithm="RSA", rsa_bits=_RSA_BITS, opts=opts)
    request = tls.CertRequest(
        f"{name}-csr", private_key_pem=key.private_key_pem, subject=subject, dns_names=dns_names, opts=opts
    )
    cert = tls.LocallySignedCert(
        f"{name}-cert",
        cert_request_pem=request.cert_request_pem,
        ca_private_key_pem=ca_key.private_key_pem,
        ca_cert_pem=ca.cert_pem,
        validity_period_hours=validity_hours,
        # `pulumi up` within the last 30 days of a certificate's life re-issues it.
        early_renewal_hours=_EARLY_RENEWAL_DAYS * _HOURS_PER_DAY,
        allowed_uses=["digital_signature", "key_encipherment", usage],
        opts=opts,
    )
    return key, cert
