"""A node pool's models: its taints, the reservation or Capacity Block it targets, its spot mix, and the pool
itself, each field checked on its own (cross-entry checks are in fleet.checks)."""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import AwareDatetime, Field, ValidationInfo, field_validator, model_validator

from dlinfra.model.fleet.base import Strict
from dlinfra.model.fleet.labels import (
    DRAIN_TAINT_KEYS,
    DRAIN_TAINT_PREFIX,
    GPU_HEALTH_TAINT_KEYS,
    label_key_problem,
    label_value_problem,
    own_label_problem,
)
from dlinfra.model.regions import ZONE_ID


class Taint(Strict):
    """A Kubernetes taint put on a pool's nodes."""

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @field_validator("key")
    @classmethod
    def _not_a_drain_taint(cls, v: str) -> str:
        problem = label_key_problem(v)
        if problem:
            raise ValueError(f"not a Kubernetes taint key: {problem}")
        # Kueue makes a pool's taints ones its jobs must tolerate: jobs would then ignore the handler's taint.
        if v.startswith(DRAIN_TAINT_PREFIX) or v in DRAIN_TAINT_KEYS:
            raise ValueError(
                f"{v!r} is the termination handler's or the cordon's taint: jobs on the pool would have to tolerate "
                "it, and would then start on nodes about to go into maintenance; choose another key"
            )
        if v in GPU_HEALTH_TAINT_KEYS:
            raise ValueError(
                f"{v!r} is dlinfra's GPU health taint: jobs on the pool would have to tolerate it, and would then "
                "start on GPUs that have not passed, or have failed, their check; choose another key"
            )
        return v

    @field_validator("value")
    @classmethod
    def _value(cls, v: str) -> str:
        problem = label_value_problem(v)
        if problem:
            raise ValueError(problem.replace("label value", "taint value"))
        return v


# A job's checkpoint grace per pool, in seconds (fleet: node_pools.<pool>.checkpoint_grace): the default, and the
# bounds the fleet may give. Every disruption waits this long plus DRAIN_MARGIN_SECONDS before the node goes.
DEFAULT_CHECKPOINT_GRACE = 900
MIN_CHECKPOINT_GRACE = 30
MAX_CHECKPOINT_GRACE = 3600
# Time on top of a pod's grace to evict it, detach its volumes and answer the lifecycle hook.
DRAIN_MARGIN_SECONDS = 300
# Where the rendered plan records a pool's grace, for rule `drain-outlasts-checkpoint-grace`: a tag on its Auto
# Scaling group, and an annotation (JSON: pool -> seconds) on the admission policy that caps pods by it.
CHECKPOINT_GRACE_TAG = "dlinfra:checkpoint-grace"
CHECKPOINT_GRACE_ANNOTATION = "dlinfra.io/checkpoint-grace-caps"

# The launch template tag that says which cluster placement group its reservation was created in: the rule
# `reserved-capacity-no-placement-group` admits a placement group on reserved capacity only when it matches.
RESERVATION_GROUP_TAG = "reservation-placement-group"

# "All Capacity Blocks end at 11:30AM UTC" (EC2 guide, "Find and purchase Capacity Blocks"); a block bought for the
# same day starts when it is bought, so only the end is pinned (DescribeCapacityBlockOfferings: a block that starts
# at 04:55 and ends at 11:30 lasts 6 h 35 min).
BLOCK_END_TIME = datetime.time(11, 30)
# Durations EC2 sells: 1-day steps up to 14 days, 7-day steps up to 182 days, extensions included ("Find and purchase
# Capacity Blocks"; "Extend Capacity Blocks": 26 weeks in total).
BLOCK_MAX_DAYS = 182


class CapacityReservation(Strict):
    """An EC2 capacity reservation or capacity block a pool targets in one region."""

    id: str = Field(pattern=r"^cr-[0-9a-f]{8,17}$")  # capacity reservation id
    # The zone the reservation lives in, by zone id (AvailabilityZoneId in describe-capacity-reservations):
    # an AZ name means another zone in another account (dlinfra/data/regions.yaml). Must be one of the pool's.
    zone_id: str = Field(pattern=ZONE_ID.pattern)
    type: Literal["reservation", "capacity_block"] = "reservation"
    # The name of the cluster placement group the reservation was created in (its PlacementGroupArn), when it was:
    # AWS's way to reserve EFA capacity close together (EC2 guide, "Capacity Reservations in cluster placement
    # groups"), and the pool's instances must then launch into that group ("Launch instances into an existing
    # Capacity Reservation"). None: a reservation made outside any group, whose pool names no group. A placement
    # group name is up to 255 ASCII characters (EC2 API reference, CreatePlacementGroup).
    placement_group: str | None = Field(None, pattern=r"^[!-~]{1,255}$")
    # A Capacity Block's window, in UTC (StartDate and EndDate in describe-capacity-reservations): required for a
    # capacity_block, whose instances exist only inside it; EC2 terminates them 30 minutes before the end ("Work
    # with Capacity Blocks"). An extension keeps the reservation id and moves the end ("Extend Capacity Blocks"):
    # give the new end here. Never read against the clock in what is declared: `validate` warns about near ends.
    start: AwareDatetime | None = None
    end: AwareDatetime | None = None

    @model_validator(mode="before")
    @classmethod
    def _zone_by_id(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "az" in data:
            raise ValueError(
                f"az: give the reservation's zone by its zone id (zone_id: e.g. usw2-az2, the reservation's "
                f"AvailabilityZoneId), not by the name {data['az']!r}: AZ names map to different zones in different "
                "accounts"
            )
        return data

    @field_validator("placement_group")
    @classmethod
    def _block_in_no_group(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("type") == "capacity_block":
            # A Capacity Block's instances are placed together already, and a placement constraint outside it can
            # fail with insufficient capacity while the block sits free (EC2 guide, "Capacity Blocks for ML").
            raise ValueError(
                f"a capacity_block takes no placement group (got {v!r}): its instances are placed close together "
                "already"
            )
        return v

    @field_validator("start", "end", mode="before")
    @classmethod
    def _ruamel_offset(cls, v: Any) -> Any:
        # ruamel's TimeStamp keeps the written offset in `_yaml` and loses its tzinfo when deep-copied (an edited
        # copy of a parsed fleet): restore it, so the same text gives the same instant.
        extra = getattr(v, "_yaml", None)
        if isinstance(v, datetime.datetime) and v.tzinfo is None and isinstance(extra, dict) and extra.get("tz"):
            offset = extra.get("delta") or datetime.timedelta(0)
            return datetime.datetime(*v.timetuple()[:6], v.microsecond, tzinfo=datetime.timezone(offset))
        return v

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, v: datetime.datetime | None) -> datetime.datetime | None:
        # The same instant in UTC, whatever offset the file wrote (ruamel keeps it): one spelling in the plan.
        return None if v is None else datetime.datetime.fromtimestamp(v.timestamp(), datetime.UTC)

    def block_window(self) -> tuple[datetime.datetime, datetime.datetime] | None:
        """(start, end) of a Capacity Block, in UTC; None for an on-demand reservation (the validator below makes a
        block give both)."""
        if self.type != "capacity_block" or self.start is None or self.end is None:
            return None
        return self.start, self.end

    @model_validator(mode="after")
    def _window(self) -> CapacityReservation:
        if self.type != "capacity_block":
            if self.start is not None or self.end is not None:
                raise ValueError(
                    "start, end: only a capacity_block has a window; an on-demand reservation holds its capacity "
                    "until it is cancelled or its end date, and the pool may launch into it at any time"
                )
            return self
        if self.start is None or self.end is None:
            raise ValueError(
                "start, end: a capacity_block needs its window in UTC (StartDate and EndDate in `aws ec2 "
                "describe-capacity-reservations --capacity-reservation-ids ID`), e.g. start: 2027-01-04T11:30:00Z"
            )
        if self.end <= self.start:
            raise ValueError(f"end {self.end:%Y-%m-%dT%H:%M:%SZ} is not after start {self.start:%Y-%m-%dT%H:%M:%SZ}")
        if self.end.timetz().replace(tzinfo=None) != BLOCK_END_TIME:
            raise ValueError(
                f'end {self.end:%Y-%m-%dT%H:%M:%SZ}: every Capacity Block ends at 11:30 UTC (EC2 guide, "Find and '
                'purchase Capacity Blocks"); copy EndDate from describe-capacity-reservations'
            )
        if self.end - self.start > datetime.timedelta(days=BLOCK_MAX_DAYS):
            raise ValueError(
                f"the window lasts {(self.end - self.start).days} days; EC2 sells Capacity Blocks (with their "
                f"extensions) of at most {BLOCK_MAX_DAYS} days"
            )
        return self


class SpotSpec(Strict):
    """Mixed-instances split: an on-demand base, the rest spot."""

    on_demand_base: int = Field(0, ge=0)  # instances always on demand
    on_demand_percentage_above_base: int = Field(0, ge=0, le=100)  # percent on demand above the base
    allocation_strategy: Literal["price-capacity-optimized", "capacity-optimized", "lowest-price"] = (
        "price-capacity-optimized"
    )


# The DCGM diagnostic a burn-in may run (`dcgmi diag -r LEVEL`; DCGM "dcgmi diag" reference: level 1 takes seconds,
# 2 about two minutes, 3 about fifteen, 4 longer). A burn-in must end well inside the cluster-autoscaler's 15 minutes
# for a new node to become ready (cluster-autoscaler 1.33 clusterstate.go MaxNodeStartupTime, a constant): a node
# still tainted after that counts as unready, and enough of them stop the autoscaler (IsClusterHealthy), so levels 3
# and 4 are for a hand-run check on a drained node.
BURN_IN_MAX_DCGM_LEVEL = 2


class GpuCheck(Strict):
    """What a GPU node's burn-in runs besides the checks every GPU node gets (dlinfra.model.gpu_health)."""

    dcgm_level: int = Field(2, ge=0, le=BURN_IN_MAX_DCGM_LEVEL)  # 0: no DCGM diagnostic
    throughput: bool = True  # judge the model's matrix-multiply and memory-copy floors
    # The circuit breaker of the repair: at most this share of the pool's (or site's) nodes in repair at once, and
    # always one (a pool of two repairs one at a time). A quarter: a pool keeps three quarters of its nodes through a
    # bad batch of GPUs or a fault the check mistakes, while single failures are repaired at once.
    repair_share: float = Field(0.25, gt=0, le=1)


# Time-slicing: how many pods may share one GPU (the device plugin's `replicas`). One is no sharing. Replicas share
# the GPU's memory with no isolation and take turns on its compute, so beyond 16 (an 80 GB GPU at 5 GB each, a 24 GB
# L4 at 1.5 GB) a notebook would fail for memory before it got a useful turn; use MIG for finer, isolated shares.
MIN_TIME_SLICES = 2
MAX_TIME_SLICES = 16


class TimeSlicing(Strict):
    """Pods share each GPU in turn (NVIDIA device plugin, sharing.timeSlicing): no memory or fault isolation."""

    replicas: int  # pods per GPU: each node offers gpus x replicas of nvidia.com/gpu.shared

    @field_validator("replicas")
    @classmethod
    def _range(cls, v: int) -> int:
        if not MIN_TIME_SLICES <= v <= MAX_TIME_SLICES:
            raise ValueError(
                f"{v} is outside {MIN_TIME_SLICES}..{MAX_TIME_SLICES}: pods per GPU, which share its memory with no "
                "isolation (1 is no sharing; for more, smaller and isolated shares use mig)"
            )
        return v


class GpuSharing(Strict):
    """How a GPU pool shares its GPUs: MIG instances (isolated slices) or time-slicing; exactly one."""

    # MIG profile -> instances of it on every GPU (profiles of the pool's GPU in dlinfra/data/mig_profiles.yaml;
    # validation places them on the GPU's slices). A mapping: its order in the file changes nothing.
    mig: Mapping[str, int] | None = None
    time_slicing: TimeSlicing | None = None

    @field_validator("mig")
    @classmethod
    def _layout(cls, v: Mapping[str, int] | None) -> Mapping[str, int] | None:
        if v is None:
            return None
        if not v:
            raise ValueError("name at least one MIG profile and how many of it each GPU holds, e.g. {1g.10gb: 7}")
        for profile, count in v.items():
            if not re.fullmatch(r"[1-7]g\.[0-9]+gb", profile):
                raise ValueError(f"{profile!r} is not a MIG profile name (e.g. 1g.10gb, 3g.40gb)")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{profile}: {count!r} instances per GPU; give a whole number of at least 1")
        return dict(sorted(v.items()))

    @model_validator(mode="after")
    def _one(self) -> GpuSharing:
        if (self.mig is None) == (self.time_slicing is None):
            raise ValueError(
                "give exactly one of mig (MIG profile -> instances per GPU) or time_slicing ({replicas: N})"
            )
        return self


class NodePool(Strict):
    """An Auto Scaling group of GPU or CPU nodes, present in some or all regions of its environment."""

    kind: Literal["gpu", "cpu"]
    instance_types: tuple[str, ...] = Field(min_length=1)  # first is preferred; GPU pools: GPU types only
    min_size: int = Field(0, ge=0)  # per region
    max_size: int = Field(ge=0)  # per region
    regions: tuple[str, ...] | None = None  # default: every region of the environment
    zones: Mapping[str, tuple[str, ...]] = Field(default_factory=dict)  # region -> AZ names; EFA pools: one
    efa: bool = False  # EFA interfaces + single AZ + a cluster placement group unless on reserved capacity
    capacity_reservations: Mapping[str, CapacityReservation] = Field(default_factory=dict)  # region -> target
    spot: SpotSpec | None = None  # CPU pools: mixed instances with spot
    labels: Mapping[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    pod_imds_access: bool = False  # hop limit 2 lets pods reach IMDS; default 1 keeps it node-only
    root_volume_gib: int = Field(200, ge=20, le=16384)
    # Seconds a job's pods on this pool may ask to checkpoint before they are killed: the cap on their
    # terminationGracePeriodSeconds (admission policy, components/charts/checkpoint_grace.py), and what every
    # voluntary disruption waits for (termination hook, handler drain, autoscaler scale-down). GPU pools are what it
    # is for; CPU pools carry it too, and their hook waits for it. 30 is the Kubernetes default grace; 3600 keeps
    # the hook (grace + DRAIN_MARGIN_SECONDS) well under EC2 Auto Scaling's 7200 s heartbeat limit.
    checkpoint_grace: int = DEFAULT_CHECKPOINT_GRACE
    # GPU pools: the burn-in each new node runs before it takes work; absent: GpuCheck's defaults.
    gpu_check: GpuCheck | None = None
    # GPU pools: share each GPU by MIG instances or time-slicing (docs/shared-gpus.md); None: whole GPUs.
    gpu_sharing: GpuSharing | None = None

    # regions, zones and taints are sets, unlike instance_types: their order in the file changes nothing declared.
    @field_validator("regions")
    @classmethod
    def _region_set(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else tuple(sorted(v))

    @field_validator("zones")
    @classmethod
    def _zone_sets(cls, v: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        return {region: tuple(sorted(zones)) for region, zones in v.items()}

    @field_validator("taints")
    @classmethod
    def _taint_set(cls, v: tuple[Taint, ...]) -> tuple[Taint, ...]:
        return tuple(sorted(v, key=lambda t: (t.key, t.value, t.effect)))

    @field_validator("checkpoint_grace")
    @classmethod
    def _grace(cls, v: int) -> int:
        if not MIN_CHECKPOINT_GRACE <= v <= MAX_CHECKPOINT_GRACE:
            raise ValueError(
                f"{v} s is outside {MIN_CHECKPOINT_GRACE}..{MAX_CHECKPOINT_GRACE}: seconds a job's pods on this pool "
                f"may take to checkpoint after SIGTERM (their terminationGracePeriodSeconds cap; default "
                f"{DEFAULT_CHECKPOINT_GRACE})"
            )
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: Mapping[str, str]) -> Mapping[str, str]:
        for key, value in v.items():
            problem = label_key_problem(key) or own_label_problem(key) or label_value_problem(value)
            if problem:
                raise ValueError(f"node label {problem}")
        return v

    @model_validator(mode="after")
    def _sizes(self) -> NodePool:
        if self.min_size > self.max_size:
            raise ValueError(f"min_size {self.min_size} is greater than max_size {self.max_size}")
        if self.spot is not None and self.kind == "gpu":
            raise ValueError("spot: GPU pools run on demand or on reserved capacity; spot is for CPU pools")
        if self.gpu_check is not None and self.kind != "gpu":
            raise ValueError("gpu_check: the GPU burn-in is for GPU pools; this pool is a CPU pool")
        if self.gpu_sharing is not None and self.kind != "gpu":
            raise ValueError("gpu_sharing: only a GPU pool has GPUs to share; this pool is a CPU pool")
        if self.mig and self.gpu_check is not None and (self.gpu_check.throughput or self.gpu_check.dcgm_level):
            # CUDA sees one MIG instance of a GPU at a time (MIG User Guide, "CUDA Device Enumeration"), so the
            # throughput floors, which are whole-GPU figures, cannot be judged; DCGM's diagnostics exercise whole
            # GPUs, with NVLink off in MIG mode (DCGM 2.0.15 release notes). The layout itself is checked instead.
            raise ValueError(
                "gpu_check: on a MIG pool the burn-in checks the GPUs, their MIG instances and their errors, not "
                "throughput (its floors are whole-GPU figures) or a DCGM diagnostic (it tests whole GPUs): set "
                "throughput: false and dcgm_level: 0, or leave gpu_check out"
            )
        return self

    @property
    def mig(self) -> bool:
        """Does the pool split its GPUs into MIG instances?"""
        return self.gpu_sharing is not None and self.gpu_sharing.mig is not None

    @property
    def burn_in(self) -> GpuCheck:
        """The burn-in its GPU nodes run: the fleet's, or the defaults (on a MIG pool: no throughput floors and no
        DCGM diagnostic, which judge whole GPUs)."""
        if self.gpu_check is not None:
            return self.gpu_check
        return GpuCheck(dcgm_level=0, throughput=False) if self.mig else GpuCheck()
