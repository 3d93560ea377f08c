"""A deterministic fake AWS (and Kubernetes) for the offline engine.

Ids and ARNs are derived from the resource's URN, so two runs of the same program give identical plans.
Invokes are served from data (dlinfra/data/regions.yaml); an invoke we do not serve is an error, as is an
input key the provider does not have.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import string
from collections.abc import Callable, Mapping
from typing import Any

from pulumi import _types

from dlinfra.model.regions import known_regions
from dlinfra.offline import schema

ACCOUNT_ID = "123456789012"  # AWS's documentation account
PARTITION = "aws"

# Id prefixes AWS uses, so ids in plans read like the real thing.
_ID_PREFIX = {
    "aws:ec2/vpc:Vpc": "vpc-",
    "aws:ec2/subnet:Subnet": "subnet-",
    "aws:ec2/instance:Instance": "i-",
    "aws:ec2/internetGateway:InternetGateway": "igw-",
    "aws:ec2/natGateway:NatGateway": "nat-",
    "aws:ec2/eip:Eip": "eipalloc-",
    "aws:ec2/routeTable:RouteTable": "rtb-",
    "aws:ec2/securityGroup:SecurityGroup": "sg-",
    "aws:ec2/vpcEndpoint:VpcEndpoint": "vpce-",
    "aws:ec2/flowLog:FlowLog": "fl-",
    "aws:ec2/launchTemplate:LaunchTemplate": "lt-",
    "aws:ec2/placementGroup:PlacementGroup": "pg-",
    "aws:ec2transitgateway/transitGateway:TransitGateway": "tgw-",
    "aws:ec2transitgateway/vpcAttachment:VpcAttachment": "tgw-attach-",
    "aws:ec2transitgateway/peeringAttachment:PeeringAttachment": "tgw-attach-",
    "aws:ec2transitgateway/routeTable:RouteTable": "tgw-rtb-",
    "aws:ec2/customerGateway:CustomerGateway": "cgw-",
    "aws:ec2/vpnConnection:VpnConnection": "vpn-",
    "aws:ec2clientvpn/endpoint:Endpoint": "cvpn-endpoint-",
    "aws:efs/fileSystem:FileSystem": "fs-",
    "aws:efs/mountTarget:MountTarget": "fsmt-",
    "aws:efs/accessPoint:AccessPoint": "fsap-",
    "aws:fsx/lustreFileSystem:LustreFileSystem": "fs-",
    "aws:kms/key:Key": "",
}


def digest(text: str, length: int = 17) -> str:
    """Stable hex digest used for every fake identifier."""
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def fake_ip(seed: str, net: str = "203.0.113.0/24") -> str:
    """A deterministic address inside a documentation range (never routable)."""
    block = ipaddress.IPv4Network(net)
    offset = int(digest(seed, 8), 16) % (block.num_addresses - 2) + 1
    return str(block.network_address + offset)


def _service(type_token: str) -> str:
    module = type_token.split(":")[1].split("/")[0]
    return {"ec2transitgateway": "ec2", "ec2clientvpn": "ec2", "eks": "eks", "iam": "iam"}.get(module, module)


def _plain(value: Any) -> Any:
    return value.get("value") if schema.is_secret(value) else value


class FakeCloud:
    """Answers resource registrations and invokes for one stack, in one default region."""

    def __init__(self, *, region: str | None, stack_exports: Mapping[str, Mapping[str, Any]]) -> None:
        self.default_region = region
        self.stack_exports = stack_exports  # stack name -> {"outputs": ..., "secret": [...]}
        self.provider_regions: dict[str, str] = {}  # provider reference "urn::id" -> region
        self.subnet_cidrs: dict[str, str] = {}  # subnet id -> its block, for the addresses of instances in it

    # Regions -----------------------------------------------------------------------------------------
    def region_for(self, provider_ref: str | None) -> str:
        if provider_ref and provider_ref in self.provider_regions:
            return self.provider_regions[provider_ref]
        if self.default_region is None:
            raise schema.InputError(
                "no region: this stack has no default region, so every AWS resource needs an explicit provider"
            )
        return self.default_region

    # Resources ---------------------------------------------------------------------------------------
    def new_resource(
        self, type_token: str, name: str, urn: str, inputs: dict[str, Any], provider: str | None, custom: bool
    ) -> tuple[str, dict[str, Any]]:
        """Validate inputs and return (id, outputs) for a resource."""
        if not custom:
            return "", {}
        if type_token == "pulumi:pulumi:StackReference":
            return self._stack_reference(inputs)
        schema.check_inputs(type_token, inputs)
        if type_token.startswith("pulumi:providers:"):
            rid = digest(urn, 12)
            if type_token == "pulumi:providers:aws" and inputs.get("region"):
                self.provider_regions[f"{urn}::{rid}"] = inputs["region"]
            return rid, dict(inputs)
        region = self.region_for(provider) if type_token.startswith("aws:") else None
        rid = _ID_PREFIX.get(type_token, "") + digest(urn) if type_token in _ID_PREFIX else digest(urn)
        if type_token.startswith("aws:") and "name" in inputs and type_token.split("/")[0] in ("aws:iam", "aws:s3"):
            rid = _plain(inputs["name"]) or rid
        outputs: dict[str, Any] = dict(inputs)
        computed = self._computed(type_token, name, urn, rid, inputs, region)
        for key, value in computed.items():
            outputs.setdefault(key, value)
        special = _SPECIAL.get(type_token)
        if special is not None:
            outputs |= special(self, urn, rid, inputs, region)
        return rid, outputs

    def _computed(
        self, type_token: str, name: str, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None
    ) -> dict[str, Any]:
        cls = schema.resource_class(type_token)
        names = {p[1] for p in _types._py_properties(cls)} if cls else set()  # noqa: SLF001
        out: dict[str, Any] = {}
        if "name" in names and "name" not in inputs:
            out["name"] = f"{name}-{digest(urn, 7)}"  # what provider auto-naming does
        resource_name = _plain(inputs.get("name")) or out.get("name") or rid
        if "arn" in names:
            service = _service(type_token)
            kind = type_token.rsplit(":", 1)[1].lower()
            if service == "iam":
                out["arn"] = f"arn:{PARTITION}:iam::{ACCOUNT_ID}:{kind}/{resource_name}"
            elif service == "s3":
                out["arn"] = f"arn:{PARTITION}:s3:::{_plain(inputs.get('bucket')) or resource_name}"
            else:
                out["arn"] = f"arn:{PARTITION}:{service}:{region or ''}:{ACCOUNT_ID}:{kind}/{rid}"
        if "ownerId" in names:
            out["ownerId"] = ACCOUNT_ID
        if "tagsAll" in names:
            out["tagsAll"] = inputs.get("tags") or {}
        return out

    def _stack_reference(self, inputs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        full = str(inputs.get("name", ""))
        stack = full.rsplit("/", 1)[-1]
        if stack not in self.stack_exports:
            raise schema.InputError(
                f"StackReference {full!r}: stack {stack!r} has not been previewed in this run; "
                "the offline engine previews stacks in dependency order (regional before global)"
            )
        ref = self.stack_exports[stack]
        return full, {"name": full, "outputs": dict(ref["outputs"]), "secretOutputNames": list(ref["secret"])}

    # Invokes -----------------------------------------------------------------------------------------
    def call(self, token: str, args: Mapping[str, Any], provider: str | None) -> dict[str, Any]:
        handler = _INVOKES.get(token)
        if handler is None:
            raise schema.InputError(
                f"invoke {token} is not served by the offline engine; add it to dlinfra/offline/cloud.py "
                "with data, or avoid the lookup"
            )
        return handler(self, args, self.region_for(provider) if token.startswith("aws:") else "")


def _azs(cloud: FakeCloud, args: Mapping[str, Any], region: str) -> dict[str, Any]:
    info = known_regions().get(region)
    if info is None:
        raise schema.InputError(f"aws:index/getAvailabilityZones: region {region!r} is not in regions.yaml")
    return {
        "id": region,
        "names": list(info.azs),
        "zoneIds": [info.zone_ids[a] for a in info.azs],
        "state": args.get("state", "available"),
        "groupNames": [region],
    }


def _region(cloud: FakeCloud, args: Mapping[str, Any], region: str) -> dict[str, Any]:
    return {"id": region, "name": region, "region": region, "endpoint": f"ec2.{region}.amazonaws.com"}


def _caller(cloud: FakeCloud, args: Mapping[str, Any], region: str) -> dict[str, Any]:
    return {
        "id": ACCOUNT_ID,
        "accountId": ACCOUNT_ID,
        "arn": f"arn:{PARTITION}:iam::{ACCOUNT_ID}:user/offline",
        "userId": "AIDAOFFLINEPREVIEW",
    }


def _partition(cloud: FakeCloud, args: Mapping[str, Any], region: str) -> dict[str, Any]:
    return {"id": PARTITION, "partition": PARTITION, "dnsSuffix": "amazonaws.com", "reverseDnsPrefix": "com.amazonaws"}


_INVOKES: dict[str, Callable[[FakeCloud, Mapping[str, Any], str], dict[str, Any]]] = {
    "aws:index/getAvailabilityZones:getAvailabilityZones": _azs,
    "aws:index/getRegion:getRegion": _region,
    "aws:index/getCallerIdentity:getCallerIdentity": _caller,
    "aws:index/getPartition:getPartition": _partition,
}

# Type-specific computed outputs: what the real provider returns that later resources read.
_Special = Callable[[FakeCloud, str, str, Mapping[str, Any], "str | None"], dict[str, Any]]
_SPECIAL: dict[str, _Special] = {}


def special(type_token: str) -> Callable[[_Special], _Special]:
    """Register computed outputs for a resource type."""

    def register(fn: _Special) -> _Special:
        _SPECIAL[type_token] = fn
        return fn

    return register


@special("aws:ec2/vpc:Vpc")
def _vpc(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    return {
        "defaultRouteTableId": "rtb-" + digest(urn + "/rtb"),
        "defaultSecurityGroupId": "sg-" + digest(urn + "/sg"),
        "mainRouteTableId": "rtb-" + digest(urn + "/rtb"),
    }


@special("aws:efs/fileSystem:FileSystem")
@special("aws:efs/accessPoint:AccessPoint")
def _efs_arn(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    # EFS ARNs name the service elasticfilesystem (IAM conditions such as elasticfilesystem:AccessPointArn compare
    # them): EFS API reference, "FileSystemDescription" and "AccessPointDescription".
    kind = "file-system" if rid.startswith("fs-") else "access-point"
    return {"arn": f"arn:{PARTITION}:elasticfilesystem:{region or ''}:{ACCOUNT_ID}:{kind}/{rid}"}


@special("aws:ec2/vpnConnection:VpnConnection")
def _vpn(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in (1, 2):
        inside = ipaddress.IPv4Network(str(_plain(inputs.get(f"tunnel{n}InsideCidr")) or "169.254.255.0/30"))
        hosts = list(inside.hosts())
        out[f"tunnel{n}Address"] = fake_ip(f"{urn}/tunnel{n}")
        out[f"tunnel{n}VgwInsideAddress"] = str(hosts[0])
        out[f"tunnel{n}CgwInsideAddress"] = str(hosts[1])
        out[f"tunnel{n}BgpAsn"] = str(inputs.get("amazonSideAsn", "64512"))
    if inputs.get("transitGatewayId"):
        # A VPN connection on a transit gateway gets its own TGW attachment.
        out["transitGatewayAttachmentId"] = "tgw-attach-" + digest(urn + "/attachment")
    return out


@special("aws:eks/cluster:Cluster")
def _eks(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    host = digest(urn, 32).upper()
    return {
        "endpoint": f"https://{host}.gr7.{region}.eks.amazonaws.com",
        "certificateAuthority": {"data": "TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2s5R1JreEpUa1U9"},
        "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.{region}.amazonaws.com/id/{host}"}]}],
        "status": "ACTIVE",
        "platformVersion": "eks.1",
        "clusterId": digest(urn, 32),
        # EKS creates the cluster security group (on the control-plane ENIs and managed nodes) and returns
        # it in vpcConfig; nodes admit the control plane by this group.
        "vpcConfig": {
            **dict(inputs.get("vpcConfig") or {}),
            "clusterSecurityGroupId": "sg-" + digest(urn + "/cluster-security-group"),
        },
    }


def _secret(value: Any) -> dict[str, Any]:
    """A value wrapped as a secret on the wire, as the real engine returns outputs the schema marks secret."""
    return {schema.SIG_KEY: schema.SECRET_SIG, "value": value}


def _pem(label: str, seed: str) -> str:
    """A deterministic PEM-shaped block; clearly fake (it decodes to a digest, not DER)."""
    body = base64.b64encode(hashlib.sha256(seed.encode()).digest() * 6).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----"]) + "\n"


_VALIDITY_START = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
# random provider's default special characters.
_RANDOM_SPECIAL = "!@#$%&*()-_=+[]{}<>:?"


@special("kubernetes:core/v1:Secret")
def _k8s_secret(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    """A service-account-token Secret as the token controller fills it (the provider waits for that)."""
    if inputs.get("type") != "kubernetes.io/service-account-token":
        return {}
    token = base64.b64encode(f"fake-token-{digest(urn, 32)}".encode()).decode()
    namespace = str((inputs.get("metadata") or {}).get("namespace") or "default")
    return {"data": _secret({"token": token, "namespace": base64.b64encode(namespace.encode()).decode()})}


@special("aws:ec2/eip:Eip")
def _eip(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    return {"allocationId": rid, "publicIp": fake_ip(urn, "198.51.100.0/24")}


@special("aws:kms/key:Key")
def _kms_key(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    return {"keyId": rid}


@special("aws:cloudwatch/logGroup:LogGroup")
def _log_group(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    name = _plain(inputs.get("name")) or rid
    return {"arn": f"arn:{PARTITION}:logs:{region}:{ACCOUNT_ID}:log-group:{name}"}


@special("aws:ec2/subnet:Subnet")
def _subnet(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    if isinstance(inputs.get("cidrBlock"), str):
        cloud.subnet_cidrs[rid] = inputs["cidrBlock"]
    return {}


@special("aws:ec2/instance:Instance")
def _instance(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    """A private address in the instance's subnet (past the four AWS keeps at its start), and EC2's private DNS name
    for it (EC2 user guide, "Amazon EC2 instance hostname types": ip-<address>.<region>.compute.internal, and
    ec2.internal in us-east-1)."""
    cidr = cloud.subnet_cidrs.get(str(inputs.get("subnetId")))
    if cidr is None:
        return {}
    block = ipaddress.IPv4Network(cidr)
    address = block.network_address + 4 + int(digest(urn, 8), 16) % (block.num_addresses - 5)
    domain = "ec2.internal" if region == "us-east-1" else f"{region}.compute.internal"
    return {"privateIp": str(address), "privateDns": f"ip-{str(address).replace('.', '-')}.{domain}"}


@special("aws:ec2clientvpn/endpoint:Endpoint")
def _client_vpn(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    return {"dnsName": f"*.{rid}.prod.clientvpn.{region}.amazonaws.com"}


def _random_text(urn: str, inputs: Mapping[str, Any]) -> str:
    """A deterministic string obeying the random provider's character-class and minimum options."""
    classes = {
        "lower": ("minLower", string.ascii_lowercase),
        "upper": ("minUpper", string.ascii_uppercase),
        "numeric": ("minNumeric", string.digits),
        "special": ("minSpecial", str(inputs.get("overrideSpecial") or _RANDOM_SPECIAL)),
    }
    enabled = {k: v for k, v in classes.items() if inputs.get(k, True) is not False}
    if inputs.get("number") is False:
        enabled.pop("numeric", None)
    charset = "".join(chars for _, chars in enabled.values())
    length = int(inputs.get("length", 16))
    stream = hashlib.shake_256(urn.encode()).digest(4 * length + 64)
    out: list[str] = []
    for key, chars in enabled.values():
        out += [chars[stream[len(out)] % len(chars)] for _ in range(int(inputs.get(key, 0) or 0))]
    out += [charset[b % len(charset)] for b in stream[len(out) : length]]
    return "".join(out[:length])


@special("random:index/randomPassword:RandomPassword")
def _random_password(
    cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None
) -> dict[str, Any]:
    return {"result": _secret(_random_text(urn, inputs)), "bcryptHash": _secret("$2a$10$" + digest(urn, 53))}


@special("random:index/randomString:RandomString")
def _random_string(
    cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None
) -> dict[str, Any]:
    return {"result": _random_text(urn, inputs)}


@special("tls:index/privateKey:PrivateKey")
def _tls_key(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    algorithm = str(inputs.get("algorithm", "RSA"))
    legacy = {"RSA": "RSA PRIVATE KEY", "ECDSA": "EC PRIVATE KEY"}.get(algorithm, "PRIVATE KEY")
    return {
        "privateKeyPem": _secret(_pem(legacy, urn + "/private")),
        "privateKeyPemPkcs8": _secret(_pem("PRIVATE KEY", urn + "/private")),
        "privateKeyOpenssh": _secret(_pem("OPENSSH PRIVATE KEY", urn + "/private")),
        "publicKeyPem": _pem("PUBLIC KEY", urn + "/public"),
        "publicKeyOpenssh": f"ssh-{algorithm.lower()} {digest(urn + '/ssh', 40)}\n",
        "publicKeyFingerprintSha256": "SHA256:" + digest(urn + "/fp", 43),
    }


def _cert(urn: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
    hours = int(inputs.get("validityPeriodHours", 0))
    end = _VALIDITY_START + datetime.timedelta(hours=hours)
    return {
        "certPem": _pem("CERTIFICATE", urn),
        "validityStartTime": _VALIDITY_START.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "validityEndTime": end.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "readyForRenewal": False,
    }


@special("tls:index/selfSignedCert:SelfSignedCert")
def _tls_self_signed(
    cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None
) -> dict[str, Any]:
    return _cert(urn, inputs)


@special("tls:index/locallySignedCert:LocallySignedCert")
def _tls_signed(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    return _cert(urn, inputs)


@special("tls:index/certRequest:CertRequest")
def _tls_request(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    return {"certRequestPem": _pem("CERTIFICATE REQUEST", urn)}


@special("aws:ec2/launchTemplate:LaunchTemplate")
def _launch_template(
    cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None
) -> dict[str, Any]:
    return {"latestVersion": 1, "defaultVersion": 1}


@special("aws:ssm/activation:Activation")
def _ssm_activation(
    cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None
) -> dict[str, Any]:
    # The real activation code is a 20-character secret; the fake one is deterministic and obviously fake.
    return {"activationCode": "offline" + digest(urn + "/code", 13), "expired": False}


@special("aws:sqs/queue:Queue")
def _sqs_queue(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    name = _plain(inputs.get("name")) or rid
    return {
        "arn": f"arn:{PARTITION}:sqs:{region}:{ACCOUNT_ID}:{name}",
        "url": f"https://sqs.{region}.amazonaws.com/{ACCOUNT_ID}/{name}",
    }


@special("aws:cloudwatch/eventRule:EventRule")
def _event_rule(cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None) -> dict[str, Any]:
    name = _plain(inputs.get("name")) or rid
    return {"arn": f"arn:{PARTITION}:events:{region}:{ACCOUNT_ID}:rule/{name}"}


@special("aws:eks/podIdentityAssociation:PodIdentityAssociation")
def _pod_identity(
    cloud: FakeCloud, urn: str, rid: str, inputs: Mapping[str, Any], region: str | None
) -> dict[str, Any]:
    association = "a-" + digest(urn, 17)
    cluster = _plain(inputs.get("clusterName")) or "cluster"
    return {
        "associationId": association,
        "associationArn": f"arn:{PARTITION}:eks:{region}:{ACCOUNT_ID}:podidentityassociation/{cluster}/{association}",
    }
