"""Platform: the objects inside a region's EKS cluster, declared by its in-cluster stack (`<env>-<region>-k8s`).

Add-ons from pinned Helm charts (NVIDIA device plugin, DCGM exporter, cluster-autoscaler, node termination
handler, Kueue, NodeLocal DNSCache, and Cilium for hybrid nodes) and our own objects: team namespaces with RBAC
and the admission policy that sends their GPU pods through Kueue, Kueue flavors and queues with the teams' GPU
quotas, and the teams' EFS volumes and volume policy (declared by components/team_volumes.py). Their AWS side (Pod
Identity roles, the interruption queue and its EventBridge rules) is components/platform_aws.py, in the regional
stack: only this part needs the private EKS endpoint. The charts' values are components/charts/.
One component and its checked arguments: one concern that reads best whole.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import pulumi
import pulumi_kubernetes as k8s

from components import admission, block_flavors, gpu_burn_in, gpu_repair, overflow, team_volumes
from components.charts import (
    autoscaler,
    checkpoint_grace,
    cilium,
    efa,
    node_local_dns,
    nvidia,
    pinned,
    termination_handler,
)
from components.charts import kueue as kueue_chart
from components.charts.nodes import SITE_LABEL, Taint
from components.crd_wait import CrdWait
from dlinfra.model import hybrid_routing, job_operators, kueue, team_storage
from dlinfra.model.fleet.pools import GpuSharing
from dlinfra.model.fleet.schema import RESERVED_NAMESPACES
from dlinfra.model.naming import Names
from dlinfra.render.nodeadm import site_pool

KUEUE_USER_ROLE = "kueue-batch-user-role"  # ClusterRole the Kueue chart creates (release name "kueue")
_K8S_VERSION = re.compile(r"^1\.\d{2}$")


@dataclass(frozen=True, kw_only=True)
class PoolView:
    """What the platform needs to know about one node pool of this region."""

    kind: Literal["gpu", "cpu"]
    instance_type: str  # the pool's primary (first) instance type
    gpus_per_node: int  # GPUs of the primary type; 0 for CPU pools
    gpu_model: str | None  # short GPU name (dlinfra.io/gpu-model); None for CPU pools
    # The nodes' GPU model labels (dlinfra.model.gpu_health.gpu_labels, as the pool's launch template gives them);
    # empty for CPU pools.
    gpu_labels: Mapping[str, str] = field(default_factory=dict)
    repair_share: float = 0.25  # the GPU repair's circuit breaker (fleet gpu_check.repair_share)
    gpu_sharing: GpuSharing | None = None  # MIG instances or time-slicing (fleet gpu_sharing); None: whole GPUs
    efa: bool  # EFA interfaces: the EFA device plugin runs on this pool's nodes
    capacity_class: kueue.PoolCapacityClass  # orders the autoscaler's expander: reserved > on-demand > spot
    max_size: int  # instances in this region
    taints: Sequence[Taint] = ()  # (key, value, effect) on the pool's nodes
    checkpoint_grace: int = 900  # seconds its pods may take to checkpoint (fleet checkpoint_grace): their grace cap
    # When the flavor of the pool's Capacity Block in this region admits work (block_flavors.flavor_window), aware
    # UTC; None for any other pool.
    block_window: tuple[datetime.datetime, datetime.datetime] | None = None
    asg_name: pulumi.Input[str]  # Auto Scaling group name (NodePool.group_name, read from the regional stack)

    def __post_init__(self) -> None:
        if self.max_size < 0:
            raise ValueError(f"max_size: must be >= 0, got {self.max_size}")
        if self.kind == "gpu" and (self.gpus_per_node <= 0 or not self.gpu_model):
            raise ValueError(f"{self.instance_type}: a GPU pool needs gpus_per_node > 0 and a gpu_model")
        if self.kind == "cpu" and (self.gpus_per_node or self.gpu_model):
            raise ValueError(f"{self.instance_type}: a CPU pool has no GPUs")
        if self.block_window is not None:
            opens, closes = self.block_window
            if opens.utcoffset() is None or closes.utcoffset() is None:
                raise ValueError(f"block_window: give aware UTC datetimes, got {opens} and {closes}")
            if closes <= opens:
                raise ValueError(f"block_window: the block closes ({closes}) before it opens ({opens})")
        if self.capacity_class not in autoscaler.CLASS_PRIORITY:
            raise ValueError(
                f"capacity_class: {self.capacity_class!r} is not one of {', '.join(autoscaler.CLASS_PRIORITY)}"
            )

    @property
    def gpus(self) -> int:
        """GPU capacity of the pool in this region."""
        return self.max_size * self.gpus_per_node


@dataclass(frozen=True, kw_only=True)
class TeamView:
    """A team as the cluster sees it."""

    namespace: str  # the team's namespace (fleet: teams.<team>.namespace, default team-<team>)
    group: str  # Kubernetes group its IAM role maps to (cluster.team_group), bound to `edit` in the namespace


@dataclass(frozen=True, kw_only=True)
class SiteView:
    """A physical GPU site homed on this region (its machines join as EKS hybrid nodes)."""

    gpu_nodes: int
    gpus_per_node: int
    gpu_model: str
    pod_cidr: str  # the site's pod CIDR: a remote pod network of the cluster and the site's Cilium IP pool
    asn: int  # the site's BGP ASN (fleet sites.<site>.asn): its nodes peer with the gateway over iBGP in it
    gateway_ip: str  # the site gateway's LAN address, the nodes' BGP peer (hybrid_routing.gateway_lan_ip)
    taints: Sequence[Taint] = ()  # taints the machines register with (nodeadm); GPU jobs must tolerate them
    # The machines' GPU model labels (as their NodeConfig gives them); empty: no GPUs.
    gpu_labels: Mapping[str, str] = field(default_factory=dict)
    repair_share: float = 0.25  # the GPU repair's circuit breaker (fleet gpu_check.repair_share)

    def __post_init__(self) -> None:
        try:
            net = ipaddress.IPv4Network(self.pod_cidr)
        except ValueError:
            raise ValueError(f"pod_cidr: {self.pod_cidr!r} is not an IPv4 network") from None
        if net.prefixlen > hybrid_routing.NODE_POD_PREFIX:
            raise ValueError(
                f"pod_cidr: {self.pod_cidr} is smaller than one node's /{hybrid_routing.NODE_POD_PREFIX} pod block"
            )
        if isinstance(self.asn, bool) or not 1 <= self.asn <= 4294967295:
            raise ValueError(f"asn: {self.asn!r} is not a BGP ASN")
        try:
            gateway = ipaddress.IPv4Address(self.gateway_ip)
        except ValueError:
            raise ValueError(f"gateway_ip: {self.gateway_ip!r} is not an IPv4 address") from None
        if gateway in net:
            raise ValueError(f"gateway_ip: {gateway} lies in the pod range {net}; it belongs on the site LAN")


@dataclass(frozen=True, kw_only=True)
class PlatformArgs:
    names: Names  # naming and tags of this (regional) stack
    region: str  # AWS region of the cluster
    cluster_name: pulumi.Input[str]  # EKS cluster name (autoscaler discovery, Pod Identity)
    kubernetes_version: str  # cluster minor version, e.g. "1.33": picks the autoscaler image, validates manifests
    provider: pulumi.ProviderResource  # pulumi_kubernetes Provider of this cluster: every Kubernetes child uses it
    pools: Mapping[str, PoolView]  # pool name -> view, every pool of this region
    teams: Mapping[str, TeamView]  # team name -> view
    sites: Mapping[str, SiteView] = field(default_factory=dict)  # sites homed on this region; none: no Cilium
    quotas: kueue.RegionQuotas  # this region's flavors and nominal GPU quotas (kueue.plan(...).region(region))
    efs_file_system_id: pulumi.Input[str]  # shared EFS file system (storage class and the teams' volumes)
    efs_access_point_ids: pulumi.Input[Mapping[str, str]]  # access point key -> id (regional efs_access_points)
    efs_volumes: Sequence[team_storage.Volume] = ()  # static volumes per team (team_storage.plan(...).volumes)
    termination_queue_url: pulumi.Input[str]  # SQS queue the termination handler reads (PlatformAws)
    kube_dns_ip: str  # the kube-dns service address (dlinfra.model.dns.kube_dns_ip of the cluster's service range)
    overflow: kueue.OverflowPlan | None = None  # MultiKueue of the environment; None: every job stays local
    # The manager's kubeconfig of each worker region (secret outputs of the workers' in-cluster stacks).
    multikueue_kubeconfigs: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    # This cluster's kubeconfig, as its provider has it: waits for the CRDs Cilium's operator registers (CrdWait).
    # Required where sites are homed.
    kubeconfig: pulumi.Input[str] | None = None
    # Job operators the lab installed, name -> namespace (fleet kubernetes.job_operators): Kueue queues their kinds,
    # the admission policies trust their service accounts. Empty: batch Jobs only.
    job_operators: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        job_operators.frameworks(self.job_operators)  # refuses an unknown operator
        try:
            ipaddress.IPv4Address(self.kube_dns_ip)
        except ValueError:
            raise ValueError(f"kube_dns_ip: {self.kube_dns_ip!r} is not an IPv4 address") from None
        if not _K8S_VERSION.fullmatch(self.kubernetes_version):
            raise ValueError(
                f"kubernetes_version: expected a minor version like '1.33', got {self.kubernetes_version!r}"
            )
        autoscaler.autoscaler_image_tag(self.kubernetes_version)  # fails early when no image is pinned for it
        if self.quotas.region != self.region:
            raise ValueError(f"quotas: planned for {self.quotas.region}, but this platform is in {self.region}")
        if set(self.quotas.nominal) != set(self.teams):
            raise ValueError(
                f"quotas: teams {sorted(self.quotas.nominal)} do not match teams {sorted(self.teams)}; "
                "plan quotas from the same fleet"
            )
        namespaces = [t.namespace for t in self.teams.values()]
        if len(set(namespaces)) != len(namespaces):
            raise ValueError(f"teams: two teams share a namespace ({', '.join(sorted(namespaces))})")
        for team, view in self.teams.items():
            if view.namespace in RESERVED_NAMESPACES:
                raise ValueError(f"teams.{team}.namespace: {view.namespace!r} belongs to the cluster; choose another")
        claims = [(v.team, v.claim) for v in self.efs_volumes]
        if len(set(claims)) != len(claims) or not {t for t, _ in claims} <= set(self.teams):
            raise ValueError("efs_volumes: one volume per claim, for teams of this platform only")
        for flavor in self.quotas.flavors:
            self._check_flavor(flavor)
        manager = self.overflow is not None and self.overflow.manager == self.region
        wanted = set(self.overflow.workers) if self.overflow is not None and manager else set()
        if set(self.multikueue_kubeconfigs) != wanted:
            raise ValueError(
                f"multikueue_kubeconfigs: regions {sorted(self.multikueue_kubeconfigs)}, but this cluster's workers "
                f"are {sorted(wanted)}"
            )
        if self.sites and self.kubeconfig is None:
            raise ValueError("kubeconfig: sites are homed here, and Cilium's objects wait for its CRDs through it")
        if self.overflow is not None and self.overflow.teams_of(self.region) and not self.quotas.flavors:
            raise ValueError("overflow: this region takes overflowing jobs but has no GPU queues")
        planned = {f.source_name for f in self.quotas.flavors if f.source == "pool"}
        for name, pool in self.pools.items():
            if pool.kind == "gpu" and pool.gpus and name not in planned:
                raise ValueError(f"pools.{name}: a GPU pool with no Kueue flavor; plan quotas from the same fleet")

    def _check_flavor(self, flavor: kueue.Flavor) -> None:
        where = f"quotas: flavor {flavor.name}"
        if flavor.source == "pool":
            pool = self.pools.get(flavor.source_name)
            if pool is None or pool.kind != "gpu":
                raise ValueError(f"{where}: no GPU pool {flavor.source_name!r} in pools ({', '.join(self.pools)})")
            if (pool.gpus, pool.gpu_model) != (flavor.gpus, flavor.gpu_model):
                raise ValueError(
                    f"{where}: {flavor.gpus} x {flavor.gpu_model} planned, pool has {pool.gpus} x {pool.gpu_model}"
                )
        else:
            site = self.sites.get(flavor.source_name)
            if site is None:
                raise ValueError(f"{where}: no site {flavor.source_name!r} in sites ({', '.join(self.sites)})")
            if (site.gpu_nodes * site.gpus_per_node, site.gpu_model) != (flavor.gpus, flavor.gpu_model):
                raise ValueError(f"{where}: planned capacity does not match site {flavor.source_name}")


class Platform(pulumi.ComponentResource):
    """GPU add-ons, autoscaling, interruption handling, team namespaces, Kueue quotas and shared storage."""

    namespaces: dict[str, pulumi.Output[str]]
    releases: dict[str, pulumi.Output[str]]  # add-on -> Helm release name
    storage_class_name: pulumi.Output[str]
    # A worker's token for the MultiKueue manager (secret); None where no team overflows to this region.
    multikueue_token: pulumi.Output[str] | None

    def __init__(self, name: str, args: PlatformArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:platform:Platform", name, None, opts)
        self._name, self._args = name, args
        self.releases = {}

        for addon, values in (
            (
                "nvidia-device-plugin",
                nvidia.device_plugin_values({n: p.gpu_sharing for n, p in args.pools.items() if p.gpu_sharing}),
            ),
            ("dcgm-exporter", nvidia.dcgm_exporter_values()),
        ):
            self._release(addon, values)
        efa_pools = [pool for pool in args.pools.values() if pool.efa]
        if efa_pools:  # advertises vpc.amazonaws.com/efa, which the EFA pools' scale-from-zero tags promise
            self._release(
                "aws-efa-k8s-device-plugin",
                efa.efa_device_plugin_values(
                    args.region, [p.instance_type for p in efa_pools], [t for p in efa_pools for t in p.taints]
                ),
            )
        # Neither chart ships the ProvisioningRequest CRD, and Kueue starts its provisioning controller only if the
        # API server serves it at Kueue's start: both releases wait for it (autoscaler.provisioning_request_crd).
        provreq_crd = k8s.apiextensions.v1.CustomResourceDefinition(
            f"{name}-provisioning-request-crd",
            metadata=self._meta(autoscaler.PROVREQ_CRD),
            # The SDK's TypedDict, whose keys (x_kubernetes_* included) the dict uses.
            spec=cast(
                "k8s.apiextensions.v1.CustomResourceDefinitionSpecArgsDict", autoscaler.provisioning_request_crd()
            ),
            opts=self._k8s(),
        )
        # The provider does not wait for a CRD to be Established, and a Kueue that starts before would skip its
        # provisioning controller until restarted (cmd/kueue/main.go, v0.19.2): Kueue waits until it is served.
        provreq_served: pulumi.Resource = provreq_crd
        if args.kubeconfig is not None:
            provreq_served = CrdWait(
                f"{name}-provisioning-request-crd-wait",
                args.kubeconfig,
                [autoscaler.PROVREQ_CRD],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[provreq_crd]),
            )
        self._autoscaler(provreq_served)
        self._release(
            "aws-node-termination-handler",
            termination_handler.termination_handler_values(
                args.termination_queue_url,
                args.region,
                termination_handler.largest_grace(p.checkpoint_grace for p in args.pools.values()),
                sum(p.max_size for p in args.pools.values()),
            ),
        )
        # Every node, cloud and hybrid: kubelets list its address first (dlinfra.model.dns.node_dns_servers).
        self._release("node-local-dns", node_local_dns.node_local_dns_values(args.kube_dns_ip))
        self._frameworks = job_operators.frameworks(args.job_operators)
        kueue_release = self._release("kueue", kueue_chart.kueue_values(self._frameworks), depends_on=[provreq_served])
        namespaces = self._teams()
        gpu_pools = [pool_name for pool_name, pool in args.pools.items() if pool.kind == "gpu"]
        # No GPU pod in a team namespace starts without Kueue's admission, and no job hides under another's. Trusted
        # controllers: the cluster's, the add-ons' and the job operators the fleet names.
        addons = {pinned.SYSTEM_NAMESPACE} | {s.namespace for s in pinned.load_addons().values()}
        admission.declare(
            name,
            controller_namespaces=sorted(addons | set(args.job_operators.values())),
            frameworks=self._frameworks,
            opts=self._k8s,
            meta=self._meta,
            grace_caps=self._grace_caps(gpu_pools),
            gpu_pools=gpu_pools,
        )
        # Every GPU node, cloud and site, takes work only once its GPUs have passed their check.
        # It also relabels nodes that joined before their pool's GPU labels changed (a registration label is never
        # updated), so a label change needs no node replaced.
        gpu_burn_in.declare(name, gpu_labels=self._gpu_labels(), opts=self._k8s, meta=self._meta)
        # A node off work for a failed check or a fault is repaired (replaced, or a site machine rebooted), a share
        # of its pool at a time.
        shares = {pool: view.repair_share for pool, view in args.pools.items() if view.gpu_labels}
        shares |= {site_pool(site): view.repair_share for site, view in args.sites.items() if view.gpu_labels}
        gpu_repair.declare(name, shares=shares, opts=self._k8s, meta=self._meta)
        queues = self._queues(kueue_release, namespaces)
        self.multikueue_token = None
        if args.overflow is not None:
            if args.overflow.manager == args.region and args.overflow.teams:
                overflow.declare_manager(
                    name,
                    args.overflow,
                    release=kueue_release,
                    namespaces=namespaces,
                    team_namespaces={team: view.namespace for team, view in args.teams.items()},
                    kubeconfigs=args.multikueue_kubeconfigs,
                    custom=self._custom,
                    opts=self._k8s,
                    meta=self._meta,
                )
            if args.overflow.teams_of(args.region):
                self.multikueue_token = overflow.declare_worker(
                    name,
                    args.overflow,
                    args.region,
                    release=kueue_release,
                    namespaces=namespaces,
                    team_namespaces={team: view.namespace for team, view in args.teams.items()},
                    queues=queues,
                    frameworks=self._frameworks,
                    custom=self._custom,
                    opts=self._k8s,
                    meta=self._meta,
                )
        storage_class = team_volumes.declare(
            name,
            file_system_id=args.efs_file_system_id,
            access_point_ids=args.efs_access_point_ids,
            volumes=args.efs_volumes,
            namespaces={team: (args.teams[team].namespace, ns) for team, ns in namespaces.items()},
            opts=self._k8s,
            meta=self._meta,
        )
        if args.sites:
            self._cilium()

        self.namespaces = {team: ns.metadata.name for team, ns in namespaces.items()}
        self.storage_class_name = storage_class.metadata.name
        self.register_outputs(
            {
                "namespaces": self.namespaces,
                "releases": self.releases,
                "storage_class_name": self.storage_class_name,
            }
        )

    def _grace_caps(self, gpu_pools: Sequence[str]) -> dict[str, int]:
        """Pool label value -> the longest checkpoint grace its pods may ask: each pool's own, and on a site's
        machines (pool label site-<site>) what a GPU pod that names no pool gets, the smallest GPU pool's: a site's
        machines were taken that way before they carried a pool label, and nothing there is sized from a grace."""
        caps = {pool_name: pool.checkpoint_grace for pool_name, pool in self._args.pools.items()}
        smallest = checkpoint_grace.gpu_cap(caps, gpu_pools)
        if smallest is not None:
            caps |= {site_pool(site): smallest for site in self._args.sites}
        return caps

    # Options ------------------------------------------------------------------------------------------------
    def _k8s(
        self,
        *,
        depends_on: Sequence[pulumi.Resource] = (),
        retain_on_delete: bool = False,
        ignore_changes: Sequence[str] = (),
    ) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(
            parent=self,
            provider=self._args.provider,
            depends_on=list(depends_on),
            retain_on_delete=retain_on_delete,
            ignore_changes=list(ignore_changes) or None,
        )

    def _meta(
        self,
        name: str,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> k8s.meta.v1.ObjectMetaArgs:
        return k8s.meta.v1.ObjectMetaArgs(
            name=name,
            namespace=namespace,
            labels={"app.kubernetes.io/managed-by": "pulumi-dlinfra", **(labels or {})},
            annotations=dict(annotations) if annotations else None,
        )

    # Helm ---------------------------------------------------------------------------------------------------
    def _release(
        self, addon: str, values: Mapping[str, object], depends_on: Sequence[pulumi.Resource] = ()
    ) -> k8s.helm.v3.Release:
        """One pinned chart as a Helm release named after the add-on."""
        spec = pinned.load_addons()[addon]
        release = k8s.helm.v3.Release(
            f"{self._name}-{addon}",
            name=addon,
            chart=spec.chart,
            version=spec.version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=spec.repository) if spec.repository else None,
            namespace=spec.namespace,
            create_namespace=spec.namespace != pinned.SYSTEM_NAMESPACE,
            values=dict(values),
            # A failed upgrade rolls back instead of leaving a half-applied add-on.
            atomic=True,
            cleanup_on_fail=True,
            max_history=10,
            timeout=900,
            opts=self._k8s(depends_on=depends_on),
        )
        self.releases[addon] = release.name.apply(lambda n: n or addon)
        return release

    # Cilium -------------------------------------------------------------------------------------------------
    def _cilium(self) -> None:
        """Cilium on hybrid nodes: one IP pool per site, its nodes pinned to it, announcing it to the gateway."""
        release = self._release("cilium", cilium.cilium_values())
        if self._args.kubeconfig is None:
            raise ValueError("kubeconfig: sites are homed here, and Cilium's objects wait for its CRDs through it")
        # The chart ships no CRDs: the operator registers them once elected leader, after Helm's wait may be over.
        crds = CrdWait(
            f"{self._name}-cilium-crds",
            self._args.kubeconfig,
            [cilium.crd_name(kind) for kind in cilium.CILIUM_KINDS],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[release]),
        )
        for site, view in self._args.sites.items():
            name = hybrid_routing.pool_name(site)
            labels = {SITE_LABEL: site}  # what the advertisement and the peer config select on
            objects: list[tuple[str, str, str, dict[str, object], str | None]] = [
                ("pool", cilium.CILIUM_POOL_API, "CiliumPodIPPool", cilium.cilium_pool_spec(view.pod_cidr), None),
                # Namespaced: Cilium reads node configs from its own namespace only.
                ("node-config", cilium.CILIUM_API, "CiliumNodeConfig", cilium.cilium_node_config_spec(site),
                 pinned.SYSTEM_NAMESPACE),
                ("bgp-cluster", cilium.CILIUM_API, "CiliumBGPClusterConfig",
                 cilium.cilium_bgp_cluster_config_spec(site, view.asn, view.gateway_ip), None),
                ("bgp-peer", cilium.CILIUM_API, "CiliumBGPPeerConfig", cilium.cilium_bgp_peer_config_spec(site), None),
                ("bgp-advertisement", cilium.CILIUM_API, "CiliumBGPAdvertisement",
                 cilium.cilium_bgp_advertisement_spec(site), None),
            ]  # fmt: skip
            for key, api, kind, spec, namespace in objects:
                k8s.apiextensions.CustomResource(
                    f"{self._name}-cilium-{key}-{site}",
                    api_version=api,
                    kind=kind,
                    metadata=self._meta(name, namespace, labels),
                    spec=spec,
                    opts=self._k8s(depends_on=[release, crds]),
                )

    # cluster-autoscaler -------------------------------------------------------------------------------------
    def _autoscaler(self, provreq_crd: pulumi.Resource) -> None:
        """The autoscaler with its priority expander, serving ProvisioningRequests of the CRD `provreq_crd`; its IAM
        role comes from the regional stack (PlatformAws)."""
        args = self._args
        by_class: dict[str, list[pulumi.Input[str]]] = {}
        for pool in args.pools.values():
            by_class.setdefault(pool.capacity_class, []).append(pool.asg_name)
        classes = sorted(by_class)
        priorities = pulumi.Output.all(*[pulumi.Output.all(*by_class[c]) for c in classes]).apply(
            lambda groups: autoscaler.render_priorities(
                {c: [str(n) for n in names] for c, names in zip(classes, groups, strict=True)}
            )
        )
        priority_map = k8s.core.v1.ConfigMap(
            f"{self._name}-autoscaler-priorities",
            metadata=self._meta(autoscaler.PRIORITY_CONFIGMAP, pinned.SYSTEM_NAMESPACE),
            data={"priorities": priorities},
            opts=self._k8s(),
        )
        self._release(
            "cluster-autoscaler",
            autoscaler.autoscaler_values(
                args.cluster_name, args.region, args.kubernetes_version, node_labels=self._gpu_labels()
            ),
            # Without its priorities the autoscaler falls back to random expansion.
            depends_on=[priority_map, provreq_crd],
        )

    # Teams --------------------------------------------------------------------------------------------------
    def _teams(self) -> dict[str, k8s.core.v1.Namespace]:
        namespaces: dict[str, k8s.core.v1.Namespace] = {}
        for team, view in self._args.teams.items():
            ns = k8s.core.v1.Namespace(
                f"{self._name}-ns-{team}",
                metadata=self._meta(
                    view.namespace,
                    labels={
                        kueue_chart.TEAM_LABEL: team,
                        # Baseline stops privileged pods and host access; restricted is only warned about.
                        "pod-security.kubernetes.io/enforce": "baseline",
                        "pod-security.kubernetes.io/warn": "restricted",
                    },
                ),
                # Dropping a team from the fleet must not delete its running work and claims with it.
                opts=self._k8s(retain_on_delete=True),
            )
            namespaces[team] = ns
            for key, role in (("edit", "edit"), ("kueue", KUEUE_USER_ROLE)):
                k8s.rbac.v1.RoleBinding(
                    f"{self._name}-{key}-{team}",
                    metadata=self._meta(f"team-{key}", view.namespace),
                    role_ref=k8s.rbac.v1.RoleRefArgs(
                        api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role
                    ),
                    subjects=[
                        k8s.rbac.v1.SubjectArgs(api_group="rbac.authorization.k8s.io", kind="Group", name=view.group)
                    ],
                    opts=self._k8s(depends_on=[ns]),
                )
        return namespaces

    # Kueue --------------------------------------------------------------------------------------------------
    def _custom(
        self, key: str, kind: str, name: str, spec: dict[str, object], depends_on: Sequence[pulumi.Resource],
        namespace: str | None = None, annotations: Mapping[str, str] | None = None,
        ignore_changes: Sequence[str] = (),
    ) -> k8s.apiextensions.CustomResource:  # fmt: skip
        return k8s.apiextensions.CustomResource(
            f"{self._name}-{key}",
            api_version=kueue_chart.KUEUE_API,
            kind=kind,
            metadata=self._meta(name, namespace, annotations=annotations),
            spec=spec,
            opts=self._k8s(depends_on=depends_on, ignore_changes=ignore_changes),
        )

    def _gpu_labels(self) -> dict[str, dict[str, str]]:
        """The GPU model labels of each GPU pool's and site's nodes, by their dlinfra.io/pool value."""
        args = self._args
        labels = {pool: dict(view.gpu_labels) for pool, view in args.pools.items() if view.gpu_labels}
        return labels | {site_pool(site): dict(view.gpu_labels) for site, view in args.sites.items() if view.gpu_labels}

    def _queues(
        self, release: k8s.helm.v3.Release, namespaces: Mapping[str, k8s.core.v1.Namespace]
    ) -> dict[str, k8s.apiextensions.CustomResource]:
        """Flavors, the cohort and every team's ClusterQueue and LocalQueue; the ClusterQueues by team. A region
        without GPU capacity still queues its teams' pods (kueue_chart.NO_GPU_FLAVOR says why)."""
        args, quotas = self._args, self._args.quotas
        queues: dict[str, k8s.apiextensions.CustomResource] = {}
        flavors, blocks, block_flavor_objects = [], [], []
        for flavor in quotas.flavors:
            source = args.pools[flavor.source_name] if flavor.source == "pool" else args.sites[flavor.source_name]
            taints = source.taints
            window = source.block_window if isinstance(source, PoolView) else None
            block = None
            if window is not None:
                block = block_flavors.BlockFlavor(
                    flavor=flavor.name, opens_at=window[0], closes_at=window[1], taints=taints
                )
                blocks.append(block)
            resource_flavor = self._custom(
                f"flavor-{flavor.name}",
                "ResourceFlavor",
                flavor.name,
                kueue_chart.resource_flavor_spec(
                    flavor, block.created_taints() if block else taints, source.gpu_labels
                ),
                [release],
                # A block's keeper owns the taints once it has run (block_flavors.py says how the two never contend);
                # a pool's flavor takes them back when its block leaves the fleet.
                annotations=(
                    {**block_flavors.FLAVOR_ANNOTATIONS, **kueue_chart.shares_annotation(flavor)}
                    if flavor.source == "pool"
                    else None
                ),
                ignore_changes=block_flavors.KEEPER_FIELDS if block else (),
            )
            flavors.append(resource_flavor)
            if block is not None:
                block_flavor_objects.append(resource_flavor)
        block_flavors.declare(
            self._name,
            blocks,
            namespace=pinned.load_addons()["kueue"].namespace,
            depends_on=[release, *block_flavor_objects],
            opts=self._k8s,
            meta=self._meta,
        )
        if flavors:
            above = [self._custom("cohort", "Cohort", kueue.COHORT, kueue_chart.cohort_spec(quotas), flavors)]
            if kueue_chart.provisioned_flavors(quotas):
                above.append(self._provisioning_check(release))
        else:
            above = [self._custom("flavor-no-gpus", "ResourceFlavor", kueue_chart.NO_GPU_FLAVOR, {}, [release])]
        for team, view in args.teams.items():
            queue = self._custom(
                f"queue-{team}",
                "ClusterQueue",
                team,
                kueue_chart.cluster_queue_spec(team, view.namespace, quotas),
                above,
            )
            queues[team] = queue
            self._custom(
                f"local-queue-{team}",
                "LocalQueue",
                kueue_chart.LOCAL_QUEUE,
                kueue_chart.local_queue_spec(team),
                [queue, namespaces[team]],
                namespace=view.namespace,
            )
        return queues

    def _provisioning_check(self, release: k8s.helm.v3.Release) -> k8s.apiextensions.CustomResource:
        """The AdmissionCheck that has the autoscaler provision a job's nodes together before Kueue admits it, and
        the ProvisioningRequestConfig it names (kueue_chart.PROVISIONING_CHECK)."""
        config = self._custom(
            "provisioning-config",
            "ProvisioningRequestConfig",
            kueue_chart.PROVISIONING_CHECK,
            kueue_chart.provisioning_request_config_spec(kueue.shared_resources(self._args.quotas)),
            [release],
        )
        return self._custom(
            "provisioning-check",
            "AdmissionCheck",
            kueue_chart.PROVISIONING_CHECK,
            kueue_chart.provisioning_admission_check_spec(),
            [config],
        )
