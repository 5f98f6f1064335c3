"""``gpucloud estimate``: the goodput model (``cost/goodput.py``) applied to each node group of a stack.

Pure: the stack spec and the catalog in, one ``GroupEstimate`` per node group out. Every input the
model needs comes from what ``gpucloud plan`` already computes, so the two never disagree:

* the save time ``C``: the emergency-save model (``cluster/emergency_save.py`` through
  ``planning/cluster_plan.plan_emergency_save``) for the group's fastest durable tier, the whole checkpoint
  written by all ``maxNodes`` nodes at once; whether it fits in the notice comes from there too;
* the price: the group's hourly price as ``plan`` shows it ("as configured": spot groups pay spot for
  their spot nodes and on-demand for ``onDemandBase``; other capacity types as ``cluster/hourly_cost.py`` says),
  at ``maxNodes``;
* the interruption rate: ``--interruptions-per-hour``, else a default per capacity type (below).

Figures marked [assumption] or [estimate] are not measured on AWS: change them (or pass the flags)
when a drill or your jobs say otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from gpucloud.catalog import Catalog
from gpucloud.checkpoint.policy import SavePolicy
from gpucloud.cluster.emergency_save import SaveEstimate
from gpucloud.cluster.hourly_cost import GroupCost
from gpucloud.cost.goodput import JobModel, Rates, StrategyEstimate, notice_driven, periodic_only
from gpucloud.errors import UserError
from gpucloud.planning.cluster_plan import GroupPlan, plan_cluster, plan_emergency_save
from gpucloud.spec.model import ClusterSpec

# Spot interruptions of a job per hour when none is given [assumption]. AWS publishes no per-hour
# rate: the Spot Instance Advisor gives only a band of how much capacity Spot reclaimed over the
# trailing month (<5%, 5-10%, 10-15%, 15-20%, >20%; https://aws.amazon.com/ec2/spot/instance-advisor/,
# data https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json), and P4d/P5 sit in its upper
# bands. A monthly band does not become a rate for one job without knowing how long instances live,
# so the default is the mean time between interruptions TrainingSession(auto=True) already assumes
# (checkpoint/policy.py: 6 h), for the whole gang. Pass the rate your jobs saw.
DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR = 3600.0 / SavePolicy().mtbi_seconds
SPOT_RATE_SOURCE = "default for spot: one every 6 h, TrainingSession's auto MTBI [assumption]"
# EC2 does not reclaim on-demand, capacity-block or reservation instances (a block ends at its end
# time, which the group scales down ahead of: blockEnd); failures are counted below.
OTHER_RATE_SOURCE = "default for {capacity}: not reclaimed by EC2"

# Failures without a notice, per node-hour [estimate]: Llama 3's pre-training saw 419 unexpected
# interruptions in 54 days on 16,384 H100s (2,048 nodes of 8), about one per 6,300 node-hours
# (https://arxiv.org/abs/2407.21783). Every capacity type has them; no notice precedes them.
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_NODES = 419, 54, 16_384 // 8
HARDWARE_FAILURES_PER_NODE_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_NODES)

# Replacing an interrupted node until training runs again, before the checkpoint is read back
# [estimate]: a new instance launched, booted and bootstrapped (stacks/Pulumi.p4d-spot.yaml: p4d
# nodes take ~10 min to boot; SageMaker HyperPod reports 14 min for a 16 x p5 recovery from S3),
# waiting for capacity excluded. The restore is added: the checkpoint read back at the rate the
# emergency-save model gives its tier [assumption: reads as fast as writes].
REPLACEMENT_SECONDS = 600.0

# The interruption rates of the sensitivity table, per hour (the group's own rate is added).
SENSITIVITY_RATES = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)

STRATEGIES = ("periodic", "notice")


@dataclasses.dataclass(frozen=True)
class SensitivityRow:
    interruptions_per_hour: float
    periodic: StrategyEstimate
    notice: StrategyEstimate


@dataclasses.dataclass(frozen=True)
class GroupEstimate:
    node_group: str
    instance_type: str
    capacity_type: str
    nodes: int
    gpus: int
    usd_per_hour: float | None  # the group at maxNodes, as `plan` prices it; None: not in the catalog
    save: SaveEstimate  # the fastest durable tier's, for the checkpoint given
    restart_seconds: float
    restart_source: str
    rates: Rates
    rate_source: str
    periodic: StrategyEstimate
    notice: StrategyEstimate
    sensitivity: list[SensitivityRow]

    def strategies(self) -> list[StrategyEstimate]:
        return [self.periodic, self.notice]

    def to_json(self) -> dict[str, object]:
        return {
            "node_group": self.node_group,
            "instance_type": self.instance_type,
            "capacity": self.capacity_type,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "usd_per_hour": self.usd_per_hour,
            "save": {
                "tier": self.save.tier,
                "seconds": round(self.save.seconds, 1),
                "budget_seconds": self.save.budget_seconds,
                "fits_notice": self.save.fits,
            },
            "restart_seconds": round(self.restart_seconds, 1),
            "restart_source": self.restart_source,
            "interruptions_per_hour": self.rates.noticed_per_hour,
            "interruptions_source": self.rate_source,
            "unnoticed_failures_per_hour": round(self.rates.unnoticed_per_hour, 6),
            "strategies": {s.strategy: self._strategy_json(s) for s in self.strategies()},
            "sensitivity": [
                {
                    "interruptions_per_hour": row.interruptions_per_hour,
                    **{s.strategy: self._strategy_json(s, brief=True) for s in (row.periodic, row.notice)},
                }
                for row in self.sensitivity
            ],
        }

    def _strategy_json(self, s: StrategyEstimate, *, brief: bool = False) -> dict[str, object]:
        cost = s.usd_per_useful_gpu_hour(self.usd_per_hour, self.gpus)
        out: dict[str, object] = {
            "goodput": round(s.goodput, 4),
            "usd_per_useful_gpu_hour": None if cost is None else round(cost, 4),
        }
        if not brief:
            out |= {
                "save_interval_seconds": round(s.interval_seconds, 1),
                "loss_seconds_noticed": round(s.noticed_loss_seconds, 1),
                "loss_seconds_unnoticed": round(s.unnoticed_loss_seconds, 1),
                "note": s.note,
            }
        return out


def validate_inputs(
    model_gib: float, step_seconds: float, interruptions_per_hour: float | None, restart_seconds: float | None
) -> None:
    """One line per bad value, naming the flag and what is allowed."""
    _positive("--model-gib", model_gib, "GiB of checkpoint state, the whole job's")
    _positive("--step-seconds", step_seconds, "seconds one training step takes")
    if interruptions_per_hour is not None:
        _not_negative("--interruptions-per-hour", interruptions_per_hour, "interruptions of the job per hour")
    if restart_seconds is not None:
        _not_negative("--restart-seconds", restart_seconds, "seconds from an interruption to training again")


def _positive(flag: str, value: float, meaning: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{flag} must be a finite number > 0 ({meaning}), got {value!r}")


def _not_negative(flag: str, value: float, meaning: str) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise UserError(f"{flag} must be a finite number >= 0 ({meaning}), got {value!r}")


def estimate_stack(
    spec: ClusterSpec,
    catalog: Catalog,
    *,
    model_gib: float,
    step_seconds: float,
    interruptions_per_hour: float | None = None,
    restart_seconds: float | None = None,
) -> list[GroupEstimate]:
    """Goodput and cost per useful GPU-hour of each node group, both strategies, with the sensitivity."""
    validate_inputs(model_gib, step_seconds, interruptions_per_hour, restart_seconds)
    plan = plan_cluster(spec, catalog)
    costs = {c.name: c for c in plan.cost.groups}
    return [
        estimate_group(
            spec,
            g,
            costs[g.group.name],
            model_gib=model_gib,
            step_seconds=step_seconds,
            interruptions_per_hour=interruptions_per_hour,
            restart_seconds=restart_seconds,
        )
        for g in plan.groups
    ]


def estimate_group(
    spec: ClusterSpec,
    group_plan: GroupPlan,
    cost: GroupCost,
    *,
    model_gib: float,
    step_seconds: float,
    interruptions_per_hour: float | None = None,
    restart_seconds: float | None = None,
) -> GroupEstimate:
    group, itype = group_plan.group, group_plan.instance_type
    # The emergency-save model at this checkpoint size: plan's own function, with the size given here.
    sized = group.model_copy(update={"expected_checkpoint_gib": model_gib})
    save_plan = plan_emergency_save(spec, sized, itype)
    save = save_plan.chosen
    assert save is not None  # S3 is always there, and durable
    nodes = save_plan.nodes
    if restart_seconds is None:
        restore = save.state_bytes / save.bytes_per_second if save.bytes_per_second > 0 else math.inf
        restart = REPLACEMENT_SECONDS + restore
        restart_source = (
            f"{REPLACEMENT_SECONDS:g} s replacement and bootstrap [estimate] + {restore:.0f} s restore from {save.tier}"
        )
    else:
        restart, restart_source = restart_seconds, "given"
    job = JobModel(
        step_seconds=step_seconds, save_seconds=save.seconds, save_fits_notice=save.fits, restart_seconds=restart
    )
    if interruptions_per_hour is not None:
        rate, source = interruptions_per_hour, "given"
    else:
        rate, source = default_rate(group.capacity.type)
    unnoticed = nodes * HARDWARE_FAILURES_PER_NODE_HOUR
    rates = Rates(rate, unnoticed)
    return GroupEstimate(
        node_group=group.name,
        instance_type=itype.name,
        capacity_type=group.capacity.type,
        nodes=nodes,
        gpus=itype.gpus * nodes,
        usd_per_hour=cost.as_configured.max,
        save=save,
        restart_seconds=restart,
        restart_source=restart_source,
        rates=rates,
        rate_source=source,
        periodic=periodic_only(job, rates),
        notice=notice_driven(job, rates),
        sensitivity=sensitivity(job, unnoticed, [*SENSITIVITY_RATES, rate]),
    )


def default_rate(capacity_type: str) -> tuple[float, str]:
    """Interruptions per hour a group of this capacity type sees when none is given, and why."""
    if capacity_type == "spot":
        return DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR, SPOT_RATE_SOURCE
    return 0.0, OTHER_RATE_SOURCE.format(capacity=capacity_type)


def sensitivity(job: JobModel, unnoticed_per_hour: float, rates: Iterable[float]) -> list[SensitivityRow]:
    """Both strategies at each noticed-interruption rate (sorted, each once)."""
    rows = []
    for rate in sorted(set(rates)):
        r = Rates(rate, unnoticed_per_hour)
        rows.append(SensitivityRow(rate, periodic_only(job, r), notice_driven(job, r)))
    return rows
