"""A Terraform-plan-shaped export of an offline plan, for checkov's `terraform_plan` framework.

checkov has no Pulumi support, but pulumi-aws is generated from the Terraform AWS provider, so every Pulumi
AWS type has a Terraform twin with the same attributes in snake_case. The export is what `terraform show
-json` would print for a plan that creates everything: values known at plan time in `planned_values`,
values that refer to another resource (ids, ARNs) as references in `configuration`, the way Terraform
leaves them unknown until apply, so that checkov's graph checks can join bucket and public access block,
VPC and flow log, security group and its users.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from dlinfra.errors import DlinfraError

TERRAFORM_VERSION = "1.9.8"  # what the export claims to be; checkov only needs the key to be there
FORMAT_VERSION = "1.2"

# Every Pulumi type dlinfra may declare, and its Terraform twin. A type missing here is an error (not a
# silent gap in the scan): add it with the Terraform name from the provider's documentation.
TERRAFORM_TYPES: Mapping[str, str] = {
    "aws:acm/certificate:Certificate": "aws_acm_certificate",
    "aws:acm/certificateValidation:CertificateValidation": "aws_acm_certificate_validation",
    "aws:autoscaling/attachment:Attachment": "aws_autoscaling_attachment",
    "aws:autoscaling/group:Group": "aws_autoscaling_group",
    "aws:autoscaling/lifecycleHook:LifecycleHook": "aws_autoscaling_lifecycle_hook",
    "aws:autoscaling/notification:Notification": "aws_autoscaling_notification",
    "aws:autoscaling/policy:Policy": "aws_autoscaling_policy",
    "aws:autoscaling/schedule:Schedule": "aws_autoscaling_schedule",
    "aws:autoscaling/tag:Tag": "aws_autoscaling_group_tag",
    "aws:autoscaling/trafficSourceAttachment:TrafficSourceAttachment": "aws_autoscaling_traffic_source_attachment",
    "aws:backup/plan:Plan": "aws_backup_plan",
    "aws:backup/regionSettings:RegionSettings": "aws_backup_region_settings",
    "aws:backup/selection:Selection": "aws_backup_selection",
    "aws:backup/vault:Vault": "aws_backup_vault",
    "aws:backup/vaultLockConfiguration:VaultLockConfiguration": "aws_backup_vault_lock_configuration",
    "aws:backup/vaultNotifications:VaultNotifications": "aws_backup_vault_notifications",
    "aws:backup/vaultPolicy:VaultPolicy": "aws_backup_vault_policy",
    "aws:cloudwatch/eventRule:EventRule": "aws_cloudwatch_event_rule",
    "aws:cloudwatch/eventTarget:EventTarget": "aws_cloudwatch_event_target",
    "aws:cloudwatch/logGroup:LogGroup": "aws_cloudwatch_log_group",
    "aws:cloudwatch/logResourcePolicy:LogResourcePolicy": "aws_cloudwatch_log_resource_policy",
    "aws:cloudwatch/logStream:LogStream": "aws_cloudwatch_log_stream",
    "aws:cloudwatch/logSubscriptionFilter:LogSubscriptionFilter": "aws_cloudwatch_log_subscription_filter",
    "aws:codebuild/project:Project": "aws_codebuild_project",
    "aws:codebuild/webhook:Webhook": "aws_codebuild_webhook",
    "aws:cloudwatch/metricAlarm:MetricAlarm": "aws_cloudwatch_metric_alarm",
    "aws:ebs/defaultKmsKey:DefaultKmsKey": "aws_ebs_default_kms_key",
    "aws:ebs/encryptionByDefault:EncryptionByDefault": "aws_ebs_encryption_by_default",
    "aws:ebs/snapshot:Snapshot": "aws_ebs_snapshot",
    "aws:ebs/volume:Volume": "aws_ebs_volume",
    "aws:ec2/capacityReservation:CapacityReservation": "aws_ec2_capacity_reservation",
    "aws:ec2/customerGateway:CustomerGateway": "aws_customer_gateway",
    "aws:ec2/defaultNetworkAcl:DefaultNetworkAcl": "aws_default_network_acl",
    "aws:ec2/defaultRouteTable:DefaultRouteTable": "aws_default_route_table",
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup": "aws_default_security_group",
    "aws:ec2/egressOnlyInternetGateway:EgressOnlyInternetGateway": "aws_egress_only_internet_gateway",
    "aws:ec2/eip:Eip": "aws_eip",
    "aws:ec2/eipAssociation:EipAssociation": "aws_eip_association",
    "aws:ec2/flowLog:FlowLog": "aws_flow_log",
    "aws:ec2/instance:Instance": "aws_instance",
    "aws:ec2/instanceMetadataDefaults:InstanceMetadataDefaults": "aws_ec2_instance_metadata_defaults",
    "aws:ec2/internetGateway:InternetGateway": "aws_internet_gateway",
    "aws:ec2/keyPair:KeyPair": "aws_key_pair",
    "aws:ec2/launchTemplate:LaunchTemplate": "aws_launch_template",
    "aws:ec2/mainRouteTableAssociation:MainRouteTableAssociation": "aws_main_route_table_association",
    "aws:ec2/managedPrefixList:ManagedPrefixList": "aws_ec2_managed_prefix_list",
    "aws:ec2/natGateway:NatGateway": "aws_nat_gateway",
    "aws:ec2/networkAcl:NetworkAcl": "aws_network_acl",
    "aws:ec2/networkAclAssociation:NetworkAclAssociation": "aws_network_acl_association",
    "aws:ec2/networkAclRule:NetworkAclRule": "aws_network_acl_rule",
    "aws:ec2/networkInterface:NetworkInterface": "aws_network_interface",
    "aws:ec2/placementGroup:PlacementGroup": "aws_placement_group",
    "aws:ec2/route:Route": "aws_route",
    "aws:ec2/routeTable:RouteTable": "aws_route_table",
    "aws:ec2/routeTableAssociation:RouteTableAssociation": "aws_route_table_association",
    "aws:ec2/securityGroup:SecurityGroup": "aws_security_group",
    "aws:ec2/securityGroupRule:SecurityGroupRule": "aws_security_group_rule",
    "aws:ec2/subnet:Subnet": "aws_subnet",
    "aws:ec2/tag:Tag": "aws_ec2_tag",
    "aws:ec2/volumeAttachment:VolumeAttachment": "aws_volume_attachment",
    "aws:ec2/vpc:Vpc": "aws_vpc",
    "aws:ec2/vpcDhcpOptions:VpcDhcpOptions": "aws_vpc_dhcp_options",
    "aws:ec2/vpcDhcpOptionsAssociation:VpcDhcpOptionsAssociation": "aws_vpc_dhcp_options_association",
    "aws:ec2/vpcEndpoint:VpcEndpoint": "aws_vpc_endpoint",
    "aws:ec2/vpcEndpointPolicy:VpcEndpointPolicy": "aws_vpc_endpoint_policy",
    "aws:ec2/vpcEndpointRouteTableAssociation:VpcEndpointRouteTableAssociation": (
        "aws_vpc_endpoint_route_table_association"
    ),
    "aws:ec2/vpcEndpointSubnetAssociation:VpcEndpointSubnetAssociation": "aws_vpc_endpoint_subnet_association",
    "aws:ec2/vpcIpv4CidrBlockAssociation:VpcIpv4CidrBlockAssociation": "aws_vpc_ipv4_cidr_block_association",
    "aws:ec2/vpcPeeringConnection:VpcPeeringConnection": "aws_vpc_peering_connection",
    "aws:ec2/vpnConnection:VpnConnection": "aws_vpn_connection",
    "aws:ec2/vpnConnectionRoute:VpnConnectionRoute": "aws_vpn_connection_route",
    "aws:ec2/vpnGateway:VpnGateway": "aws_vpn_gateway",
    "aws:ec2clientvpn/authorizationRule:AuthorizationRule": "aws_ec2_client_vpn_authorization_rule",
    "aws:ec2clientvpn/endpoint:Endpoint": "aws_ec2_client_vpn_endpoint",
    "aws:ec2clientvpn/networkAssociation:NetworkAssociation": "aws_ec2_client_vpn_network_association",
    "aws:ec2clientvpn/route:Route": "aws_ec2_client_vpn_route",
    "aws:ec2transitgateway/connect:Connect": "aws_ec2_transit_gateway_connect",
    "aws:ec2transitgateway/connectPeer:ConnectPeer": "aws_ec2_transit_gateway_connect_peer",
    "aws:ec2transitgateway/peeringAttachment:PeeringAttachment": "aws_ec2_transit_gateway_peering_attachment",
    "aws:ec2transitgateway/peeringAttachmentAccepter:PeeringAttachmentAccepter": (
        "aws_ec2_transit_gateway_peering_attachment_accepter"
    ),
    "aws:ec2transitgateway/prefixListReference:PrefixListReference": ("aws_ec2_transit_gateway_prefix_list_reference"),
    "aws:ec2transitgateway/route:Route": "aws_ec2_transit_gateway_route",
    "aws:ec2transitgateway/routeTable:RouteTable": "aws_ec2_transit_gateway_route_table",
    "aws:ec2transitgateway/routeTableAssociation:RouteTableAssociation": (
        "aws_ec2_transit_gateway_route_table_association"
    ),
    "aws:ec2transitgateway/routeTablePropagation:RouteTablePropagation": (
        "aws_ec2_transit_gateway_route_table_propagation"
    ),
    "aws:ec2transitgateway/transitGateway:TransitGateway": "aws_ec2_transit_gateway",
    "aws:ec2transitgateway/vpcAttachment:VpcAttachment": "aws_ec2_transit_gateway_vpc_attachment",
    "aws:ec2transitgateway/vpcAttachmentAccepter:VpcAttachmentAccepter": (
        "aws_ec2_transit_gateway_vpc_attachment_accepter"
    ),
    "aws:ecr/pullThroughCacheRule:PullThroughCacheRule": "aws_ecr_pull_through_cache_rule",
    "aws:ecr/repository:Repository": "aws_ecr_repository",
    "aws:efs/accessPoint:AccessPoint": "aws_efs_access_point",
    "aws:efs/backupPolicy:BackupPolicy": "aws_efs_backup_policy",
    "aws:efs/fileSystem:FileSystem": "aws_efs_file_system",
    "aws:efs/fileSystemPolicy:FileSystemPolicy": "aws_efs_file_system_policy",
    "aws:efs/mountTarget:MountTarget": "aws_efs_mount_target",
    "aws:efs/replicationConfiguration:ReplicationConfiguration": "aws_efs_replication_configuration",
    "aws:eks/accessEntry:AccessEntry": "aws_eks_access_entry",
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation": "aws_eks_access_policy_association",
    "aws:eks/addon:Addon": "aws_eks_addon",
    "aws:eks/cluster:Cluster": "aws_eks_cluster",
    "aws:eks/fargateProfile:FargateProfile": "aws_eks_fargate_profile",
    "aws:eks/identityProviderConfig:IdentityProviderConfig": "aws_eks_identity_provider_config",
    "aws:eks/nodeGroup:NodeGroup": "aws_eks_node_group",
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": "aws_eks_pod_identity_association",
    "aws:fsx/backup:Backup": "aws_fsx_backup",
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": "aws_fsx_data_repository_association",
    "aws:fsx/lustreFileSystem:LustreFileSystem": "aws_fsx_lustre_file_system",
    "aws:fsx/ontapFileSystem:OntapFileSystem": "aws_fsx_ontap_file_system",
    "aws:fsx/openZfsFileSystem:OpenZfsFileSystem": "aws_fsx_openzfs_file_system",
    "aws:fsx/windowsFileSystem:WindowsFileSystem": "aws_fsx_windows_file_system",
    "aws:iam/instanceProfile:InstanceProfile": "aws_iam_instance_profile",
    "aws:iam/openIdConnectProvider:OpenIdConnectProvider": "aws_iam_openid_connect_provider",
    "aws:iam/policy:Policy": "aws_iam_policy",
    "aws:iam/policyAttachment:PolicyAttachment": "aws_iam_policy_attachment",
    "aws:iam/role:Role": "aws_iam_role",
    "aws:iam/rolePolicy:RolePolicy": "aws_iam_role_policy",
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": "aws_iam_role_policy_attachment",
    "aws:iam/serviceLinkedRole:ServiceLinkedRole": "aws_iam_service_linked_role",
    "aws:kms/alias:Alias": "aws_kms_alias",
    "aws:kms/grant:Grant": "aws_kms_grant",
    "aws:kms/key:Key": "aws_kms_key",
    "aws:kms/keyPolicy:KeyPolicy": "aws_kms_key_policy",
    "aws:lambda/function:Function": "aws_lambda_function",
    "aws:lambda/invocation:Invocation": "aws_lambda_invocation",
    "aws:lambda/permission:Permission": "aws_lambda_permission",
    "aws:route53/record:Record": "aws_route53_record",
    "aws:route53/resolverEndpoint:ResolverEndpoint": "aws_route53_resolver_endpoint",
    "aws:route53/resolverRule:ResolverRule": "aws_route53_resolver_rule",
    "aws:route53/resolverRuleAssociation:ResolverRuleAssociation": "aws_route53_resolver_rule_association",
    "aws:route53/zone:Zone": "aws_route53_zone",
    "aws:s3/accountPublicAccessBlock:AccountPublicAccessBlock": "aws_s3_account_public_access_block",
    "aws:s3/bucket:Bucket": "aws_s3_bucket",
    "aws:s3/bucketAcl:BucketAcl": "aws_s3_bucket_acl",
    "aws:s3/bucketAclV2:BucketAclV2": "aws_s3_bucket_acl",
    "aws:s3/bucketIntelligentTieringConfiguration:BucketIntelligentTieringConfiguration": (
        "aws_s3_bucket_intelligent_tiering_configuration"
    ),
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": "aws_s3_bucket_lifecycle_configuration",
    "aws:s3/bucketLifecycleConfigurationV2:BucketLifecycleConfigurationV2": "aws_s3_bucket_lifecycle_configuration",
    "aws:s3/bucketLogging:BucketLogging": "aws_s3_bucket_logging",
    "aws:s3/bucketLoggingV2:BucketLoggingV2": "aws_s3_bucket_logging",
    "aws:s3/bucketNotification:BucketNotification": "aws_s3_bucket_notification",
    "aws:s3/bucketObject:BucketObject": "aws_s3_object",
    "aws:s3/bucketObjectv2:BucketObjectv2": "aws_s3_object",
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": "aws_s3_bucket_ownership_controls",
    "aws:s3/bucketPolicy:BucketPolicy": "aws_s3_bucket_policy",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": "aws_s3_bucket_public_access_block",
    "aws:s3/bucketReplicationConfig:BucketReplicationConfig": "aws_s3_bucket_replication_configuration",
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": (
        "aws_s3_bucket_server_side_encryption_configuration"
    ),
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2": (
        "aws_s3_bucket_server_side_encryption_configuration"
    ),
    "aws:s3/bucketV2:BucketV2": "aws_s3_bucket",
    "aws:s3/bucketVersioning:BucketVersioning": "aws_s3_bucket_versioning",
    "aws:s3/bucketVersioningV2:BucketVersioningV2": "aws_s3_bucket_versioning",
    "aws:secretsmanager/secret:Secret": "aws_secretsmanager_secret",
    "aws:secretsmanager/secretVersion:SecretVersion": "aws_secretsmanager_secret_version",
    "aws:sns/topic:Topic": "aws_sns_topic",
    "aws:sqs/queue:Queue": "aws_sqs_queue",
    "aws:sqs/queuePolicy:QueuePolicy": "aws_sqs_queue_policy",
    "aws:ssm/activation:Activation": "aws_ssm_activation",
    "aws:ssm/parameter:Parameter": "aws_ssm_parameter",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": "aws_vpc_security_group_egress_rule",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": "aws_vpc_security_group_ingress_rule",
    "random:index/randomId:RandomId": "random_id",
    "random:index/randomInteger:RandomInteger": "random_integer",
    "random:index/randomPassword:RandomPassword": "random_password",
    "random:index/randomPet:RandomPet": "random_pet",
    "random:index/randomShuffle:RandomShuffle": "random_shuffle",
    "random:index/randomString:RandomString": "random_string",
    "random:index/randomUuid:RandomUuid": "random_uuid",
    "tls:index/certRequest:CertRequest": "tls_cert_request",
    "tls:index/locallySignedCert:LocallySignedCert": "tls_locally_signed_cert",
    "tls:index/privateKey:PrivateKey": "tls_private_key",
    "tls:index/selfSignedCert:SelfSignedCert": "tls_self_signed_cert",
}

# Where Pulumi renamed a Terraform attribute (mostly plurals of repeated blocks): Terraform type ->
# dotted camelCase path of the Pulumi input -> the Terraform name of that last segment.
RENAMES: Mapping[str, Mapping[str, str]] = {
    "aws_autoscaling_group": {
        "tags": "tag",
        "initialLifecycleHooks": "initial_lifecycle_hook",
        "mixedInstancesPolicy.launchTemplate.overrides": "override",
        "trafficSources": "traffic_source",
        "vpcZoneIdentifiers": "vpc_zone_identifier",
    },
    "aws_backup_plan": {
        "rules": "rule",
        "rules.copyActions": "copy_action",
        "advancedBackupSettings": "advanced_backup_setting",
    },
    "aws_backup_selection": {"selectionTags": "selection_tag", "conditions": "condition"},
    "aws_efs_file_system": {"lifecyclePolicies": "lifecycle_policy"},
    "aws_eks_node_group": {"taints": "taint"},
    "aws_iam_openid_connect_provider": {"clientIdLists": "client_id_list", "thumbprintLists": "thumbprint_list"},
    "aws_iam_role": {"inlinePolicies": "inline_policy"},
    "aws_launch_template": {"licenseSpecifications": "license_specification"},
    "aws_route_table": {"routes": "route"},
    "aws_s3_bucket": {
        "corsRules": "cors_rule",
        "grants": "grant",
        "lifecycleRules": "lifecycle_rule",
        "lifecycleRules.transitions": "transition",
        "lifecycleRules.noncurrentVersionTransitions": "noncurrent_version_transition",
        "loggings": "logging",
        "versionings": "versioning",
        "websites": "website",
        "serverSideEncryptionConfigurations": "server_side_encryption_configuration",
        "replicationConfigurations": "replication_configuration",
    },
    "aws_s3_bucket_server_side_encryption_configuration": {"rules": "rule"},
    "aws_s3_bucket_lifecycle_configuration": {
        "rules": "rule",
        "rules.transitions": "transition",
        "rules.noncurrentVersionTransitions": "noncurrent_version_transition",
    },
    "aws_vpc_endpoint": {"subnetConfigurations": "subnet_configuration"},
}

PROVIDER_SOURCES: Mapping[str, str] = {
    "aws": "registry.terraform.io/hashicorp/aws",
    "random": "registry.terraform.io/hashicorp/random",
    "tls": "registry.terraform.io/hashicorp/tls",
}

# Not exported: component resources, Pulumi's own (providers, stack references) and our dynamic resources
# (components/crd_wait.py: a wait, no object) have no cloud object; Kubernetes objects are scanned by checkov's
# kubernetes framework on the rendered manifests instead.
NOT_EXPORTED_PREFIXES = ("dlinfra:", "pulumi:", "pulumi-python:dynamic:")
KUBERNETES_PREFIX = "kubernetes:"

_MAP_KEYS = frozenset({"tags", "tagsAll"})  # maps even when the SDK cannot say (tags are always maps)
_MIN_REFERENCE_LEN = 8  # shorter strings ("tcp", "true") are values, not ids


class TfPlanError(DlinfraError):
    """A plan cannot be exported for checkov (for example, it declares a type with no Terraform twin)."""


@dataclass
class TerraformPlan:
    """The export of one stack's plan, and how its Terraform addresses map back to Pulumi URNs."""

    document: dict[str, Any]
    addresses: dict[str, str] = field(default_factory=dict)  # Terraform address -> URN
    kubernetes: list[str] = field(default_factory=list)  # URNs of Kubernetes objects (scanned as manifests)
    skipped: int = 0  # components, providers and stack references


def snake(name: str) -> str:
    """camelCase -> snake_case, as Terraform names the attributes pulumi-aws camel-cases."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _resource_name(name: str) -> str:
    """A Terraform resource name (letters, digits, '_' and '-', not starting with a digit)."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    return clean if re.match(r"[A-Za-z_]", clean) else f"_{clean}"


def _scalar(value: Any) -> Any:
    """Numbers come from the engine as floats; Terraform (and checkov's comparisons) want integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class _Shapes:
    """Input shapes from the provider SDKs: they tell a map attribute from a nested block."""

    def __init__(self) -> None:
        from dlinfra.offline import schema  # imports pulumi; loads provider SDKs lazily

        self._schema = schema

    def of(self, type_token: str) -> Any:
        package = type_token.split(":", 1)[0]
        try:
            __import__(f"pulumi_{package}")
        except ImportError:
            return None
        return self._schema.resource_shape(type_token)

    def field(self, shape: Any, key: str) -> Any:
        if shape is None or shape.kind != "object":
            return None
        found = (shape.fields or {}).get(key)
        return self.resolve(found)

    def item(self, shape: Any) -> Any:
        return None if shape is None else self.resolve(shape.item)

    def resolve(self, shape: Any) -> Any:
        if shape is None or isinstance(shape, self._schema.Shape):
            return shape
        return cast(Any, shape).shape  # the SDK's nested shapes resolve on first use


class _Converter:
    """Turns one resource's camelCase inputs into Terraform values and reference expressions."""

    def __init__(self, tf_type: str, shapes: _Shapes, references: Mapping[str, str]) -> None:
        self.renames = RENAMES.get(tf_type, {})
        self.shapes = shapes
        self.references = references  # value -> "type.name.attr"
        self.unknown: list[str] = []

    def key(self, path: str, key: str) -> str:
        return self.renames.get(path, snake(key))

    def obj(self, value: Mapping[str, Any], shape: Any, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """An object's Terraform values and its configuration expressions (references only)."""
        values: dict[str, Any] = {}
        exprs: dict[str, Any] = {}
        for key, item in sorted(value.items()):
            if item is None or key.startswith("__"):
                continue
            dotted = f"{path}.{key}" if path else key
            tf_key = self.key(dotted, key)
            refs = self._refs(item)
            if refs:
                # Terraform knows a reference only after apply: leave the value out, keep the reference.
                exprs[tf_key] = {"references": refs}
                if path == "":
                    self.unknown.append(tf_key)
                continue
            field_shape = self.shapes.field(shape, key)
            converted, nested = self.value(item, field_shape, dotted, key)
            values[tf_key] = converted
            if nested:
                exprs[tf_key] = nested
        return values, exprs

    def value(self, item: Any, shape: Any, path: str, key: str) -> tuple[Any, Any]:
        if isinstance(item, Mapping):
            is_map = (shape is not None and shape.kind == "map") or (shape is None and key in _MAP_KEYS)
            if is_map:
                return {str(k): _scalar(v) for k, v in sorted(item.items())}, None
            values, exprs = self.obj(item, shape, path)
            return [values], ([exprs] if exprs else None)  # a nested block is a one-element list
        if isinstance(item, list):
            item_shape = self.shapes.item(shape) if shape is not None and shape.kind == "list" else None
            if any(isinstance(x, Mapping) for x in item):
                pairs = [self.obj(x, item_shape, path) for x in item if isinstance(x, Mapping)]
                blocks = [v for v, _ in pairs]
                block_exprs = [e for _, e in pairs]
                return blocks, (block_exprs if any(block_exprs) else None)
            return [_scalar(x) for x in item], None
        return _scalar(item), None

    def _refs(self, item: Any) -> list[str]:
        """Terraform references for a value that is (or lists) other resources' ids or ARNs."""
        found = [x for x in (item if isinstance(item, list) else [item]) if isinstance(x, str) and x in self.references]
        out: list[str] = []
        for value in found:
            attribute = self.references[value]
            out += [attribute, attribute.rsplit(".", 1)[0]]
        return out


def _reference_index(resources: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, str]:
    """Unique computed values (ids, ARNs) -> the Terraform attribute that holds them."""
    seen: Counter[str] = Counter()
    where: dict[str, str] = {}
    for address, resource in resources:
        mine: dict[str, str] = {}  # a value under two attributes (an EIP's id and allocationId) counts once
        computed = [("id", resource.get("id")), *sorted((resource.get("outputs") or {}).items())]
        for key, value in computed:
            if isinstance(value, str) and len(value) >= _MIN_REFERENCE_LEN and value != "[secret]":
                mine.setdefault(value, f"{address}.{snake(key)}")
        seen.update(mine.keys())
        where |= mine
    return {value: attr for value, attr in where.items() if seen[value] == 1}


def unknown_types(plan: Mapping[str, Any]) -> list[str]:
    """Custom resource types in a plan that have no Terraform twin in TERRAFORM_TYPES."""
    return sorted(
        {
            r["type"]
            for r in plan.get("resources", [])
            if r.get("custom")
            and not r["type"].startswith((*NOT_EXPORTED_PREFIXES, KUBERNETES_PREFIX))
            and r["type"] not in TERRAFORM_TYPES
        }
    )


def export(plan: Mapping[str, Any], *, source: str = "plan") -> TerraformPlan:
    """The Terraform-plan JSON of one offline plan (schema dlinfra.plan/v1); TfPlanError on unknown types."""
    missing = unknown_types(plan)
    if missing:
        raise TfPlanError(
            f"no Terraform type known for {', '.join(missing)}; add each to TERRAFORM_TYPES in "
            "dlinfra/checks/tfplan.py so checkov can scan it",
            file=source,
        )
    out = TerraformPlan(document={})
    exported: list[tuple[str, str, Mapping[str, Any]]] = []  # (address, tf type, resource)
    providers: dict[str, str] = {}  # provider URN -> provider config key
    taken: set[str] = set()
    for resource in plan.get("resources", []):
        type_token = resource["type"]
        if type_token.startswith("pulumi:providers:"):
            providers[_provider_ref(resource)] = f"{type_token.rsplit(':', 1)[1]}.{_resource_name(resource['name'])}"
        if type_token.startswith(KUBERNETES_PREFIX):
            out.kubernetes.append(resource["urn"])
            continue
        tf_type = TERRAFORM_TYPES.get(type_token)
        if tf_type is None or not resource.get("custom"):
            out.skipped += 1
            continue
        name = _resource_name(resource["name"])
        address = f"{tf_type}.{name}"
        if address in taken:  # same type and name under two parents: keep both, told apart by the URN
            name = f"{name}_{hashlib.sha256(resource['urn'].encode()).hexdigest()[:8]}"
            address = f"{tf_type}.{name}"
        taken.add(address)
        out.addresses[address] = resource["urn"]
        exported.append((address, tf_type, resource))
    references = _reference_index((address, r) for address, _, r in exported)
    shapes = _Shapes()
    planned, changes, config = [], [], []
    for address, tf_type, resource in exported:
        converter = _Converter(
            tf_type, shapes, {k: v for k, v in references.items() if not v.startswith(address + ".")}
        )
        values, exprs = converter.obj(resource.get("inputs") or {}, shapes.of(resource["type"]), "")
        package = resource["type"].split(":", 1)[0]
        provider_name = PROVIDER_SOURCES.get(package, f"registry.terraform.io/hashicorp/{package}")
        name = address.split(".", 1)[1]
        head = {"address": address, "mode": "managed", "type": tf_type, "name": name, "provider_name": provider_name}
        planned.append({**head, "schema_version": 0, "values": values, "sensitive_values": {}})
        changes.append(
            {
                **head,
                "change": {
                    "actions": ["create"],
                    "before": None,
                    "after": values,
                    "after_unknown": {k: True for k in converter.unknown},
                    "before_sensitive": False,
                    "after_sensitive": {},
                },
            }
        )
        provider_key = providers.get(resource.get("provider") or "", package)
        config.append(
            {
                "address": address,
                "mode": "managed",
                "type": tf_type,
                "name": name,
                "provider_config_key": provider_key,
                "expressions": exprs,
                "schema_version": 0,
            }
        )
    out.document = {
        "format_version": FORMAT_VERSION,
        "terraform_version": TERRAFORM_VERSION,
        "planned_values": {"root_module": {"resources": planned}},
        "resource_changes": changes,
        "configuration": {
            "provider_config": _provider_config(plan),
            "root_module": {"resources": config},
        },
    }
    return out


def _provider_ref(resource: Mapping[str, Any]) -> str:
    """How resources name a provider: `<provider URN>::<provider id>`."""
    return f"{resource['urn']}::{resource.get('id', '')}"


def _provider_config(plan: Mapping[str, Any]) -> dict[str, Any]:
    """Terraform provider configurations: the stack's default AWS provider and every explicit provider."""
    region = (plan.get("role") or {}).get("region")
    config: dict[str, Any] = {}
    for package in sorted({r["type"].split(":", 1)[0] for r in plan.get("resources", []) if r.get("custom")}):
        if package in PROVIDER_SOURCES:
            entry: dict[str, Any] = {"name": package, "full_name": PROVIDER_SOURCES[package]}
            if package == "aws" and region:
                entry["expressions"] = {"region": {"constant_value": region}}
            config[package] = entry
    for resource in plan.get("resources", []):
        if resource["type"].startswith("pulumi:providers:"):
            package = resource["type"].rsplit(":", 1)[1]
            alias = _resource_name(resource["name"])
            entry = {"name": package, "full_name": PROVIDER_SOURCES.get(package, package), "alias": alias}
            provider_region = (resource.get("inputs") or {}).get("region")
            if provider_region:
                entry["expressions"] = {"region": {"constant_value": provider_region}}
            config[f"{package}.{alias}"] = entry
    return config
