"""The goodput estimator: how much of the paid GPU time trains, per checkpoint strategy.

Pure arithmetic, no I/O. Two strategies are compared for a job on all of a node group's nodes:

* ``periodic``: periodic checkpoints only, at the Young/Daly interval. Every interruption loses on
  average half an interval of work plus the restart overhead; a save's time ``C`` is paid every
  interval.
* ``notice``: gpucloud's notice-driven save. An interruption that comes with a spot notice loses at
  most one step, the emergency save and the restart overhead; periodic saves remain as a safety
  net against failures that come without a notice (hardware), at the Young/Daly interval for those
  alone. When the emergency save does not fit in the notice, a noticed interruption loses what a
  periodic-only job loses (the job resumes from its last periodic checkpoint).

The interval. Young (1974, "A first order approximation to the optimum checkpoint interval",
CACM 17(9), https://doi.org/10.1145/361147.361115): ``T = sqrt(2·C·M)``. Daly (2006, "A higher order
estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3),
https://doi.org/10.1016/j.future.2004.11.016): for ``C < 2M``,
``T = sqrt(2·C·M)·[1 + (1/3)·sqrt(C/(2M)) + (1/9)·(C/(2M))] − C``, else ``T = M``. We use Daly's:
it equals Young's when ``C ≪ M`` and stays sensible where Young's does not (a large checkpoint at a
high interruption rate, where Young's interval can exceed the mean time between interruptions).

Goodput (useful step time over paid time) of a strategy saving every ``T`` seconds at ``C`` seconds
a save, with interruptions at rates ``λ_i`` (per second) losing ``L_i`` seconds each::

    goodput = max(0, 1 − Σ λ_i·L_i) · T / (T + C)

(the share of paid time not lost to interruptions, of which ``T/(T+C)`` is steps, the rest saves).
It is first order in the rates, like Young's model; at rates where ``Σ λ_i·L_i ≥ 1`` the job makes
no progress and the goodput is 0.
"""

from __future__ import annotations

import dataclasses
import math

from gpucloud.checkpoint.policy import young_daly_interval

SECONDS_PER_HOUR = 3600.0

# The longest a job goes without a periodic save, whatever the rates say [assumption]: a job also
# crashes on its own (code, NaN, OOM), which no interruption rate counts. At rate 0 the goodput is
# then limited only by this save's overhead, C / (MAX_SAVE_INTERVAL_SECONDS + C).
MAX_SAVE_INTERVAL_SECONDS = 3600.0


@dataclasses.dataclass(frozen=True)
class Rates:
    """Interruptions of the job (any node lost stops the whole gang), per hour."""

    noticed_per_hour: float  # spot reclaims: EC2 sends the two-minute notice first
    unnoticed_per_hour: float  # failures without a notice (hardware, kernel)

    @property
    def total_per_hour(self) -> float:
        return self.noticed_per_hour + self.unnoticed_per_hour


@dataclasses.dataclass(frozen=True)
class JobModel:
    """What of the job and the cluster the strategies need, in seconds."""

    step_seconds: float  # one training step
    save_seconds: float  # C: one save, notice -> durable commit (the emergency-save model)
    save_fits_notice: bool  # whether that save commits within the notice
    restart_seconds: float  # instance replacement + bootstrap + restore
    max_interval_seconds: float = MAX_SAVE_INTERVAL_SECONDS


@dataclasses.dataclass(frozen=True)
class StrategyEstimate:
    strategy: str  # "periodic" | "notice"
    interval_seconds: float  # between periodic saves
    noticed_loss_seconds: float  # paid time lost per interruption with a notice
    unnoticed_loss_seconds: float  # ... and per failure without one
    goodput: float  # useful step time / paid time, in [0, 1]
    fallback: bool = False  # notice: the save does not fit, noticed interruptions lose the periodic loss

    def usd_per_useful_gpu_hour(self, usd_per_hour: float | None, gpus: int) -> float | None:
        return usd_per_useful_gpu_hour(usd_per_hour, gpus, self.goodput)

    @property
    def note(self) -> str | None:
        if self.fallback:
            return (
                "the emergency save does not fit in the notice: a noticed interruption loses half a "
                "periodic interval plus the restart, as without the notice"
            )
        return None


def daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly's (2006) higher-order optimum interval between saves; ``inf`` when nothing interrupts."""
    if save_seconds < 0 or not mtbf_seconds > 0:
        raise ValueError(f"save time must be >= 0 and MTBF > 0, got {save_seconds}, {mtbf_seconds}")
    if math.isinf(mtbf_seconds):
        return math.inf
    if save_seconds >= 2 * mtbf_seconds:
        return mtbf_seconds
    ratio = save_seconds / (2 * mtbf_seconds)
    young = young_daly_interval(save_seconds, mtbf_seconds)  # Young's sqrt(2·C·M), the leading term
    return young * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save_seconds


def save_interval(job: JobModel, per_hour: float) -> float:
    """Seconds between periodic saves against ``per_hour`` interruptions: Daly's, at most
    ``max_interval_seconds``, at least one step (a save happens at a step boundary)."""
    mtbf = SECONDS_PER_HOUR / per_hour if per_hour > 0 else math.inf
    return max(job.step_seconds, min(daly_interval(job.save_seconds, mtbf), job.max_interval_seconds))


def goodput(interval_seconds: float, save_seconds: float, losses: list[tuple[float, float]]) -> float:
    """Useful step time over paid time; ``losses`` are (interruptions per hour, seconds lost each)."""
    lost_share = sum(per_hour / SECONDS_PER_HOUR * seconds for per_hour, seconds in losses if per_hour > 0)
    return max(0.0, 1.0 - lost_share) * interval_seconds / (interval_seconds + save_seconds)


def periodic_only(job: JobModel, rates: Rates) -> StrategyEstimate:
    """Periodic saves at Daly's interval against every interruption; each loses T/2 + restart."""
    interval = save_interval(job, rates.total_per_hour)
    loss = interval / 2 + job.restart_seconds
    value = goodput(interval, job.save_seconds, [(rates.total_per_hour, loss)])
    return StrategyEstimate("periodic", interval, loss, loss, value)


def notice_driven(job: JobModel, rates: Rates) -> StrategyEstimate:
    """gpucloud: a noticed interruption loses at most one step + the emergency save + restart; periodic
    saves cover only what comes without a notice. A save that does not fit in the notice helps no one:
    every interruption then counts as un-noticed (interval and loss alike)."""
    if not job.save_fits_notice:
        interval = save_interval(job, rates.total_per_hour)
        loss = interval / 2 + job.restart_seconds
        value = goodput(interval, job.save_seconds, [(rates.total_per_hour, loss)])
        return StrategyEstimate("notice", interval, loss, loss, value, fallback=True)
    interval = save_interval(job, rates.unnoticed_per_hour)
    noticed_loss = job.step_seconds + job.save_seconds + job.restart_seconds
    unnoticed_loss = interval / 2 + job.restart_seconds
    value = goodput(
        interval,
        job.save_seconds,
        [(rates.noticed_per_hour, noticed_loss), (rates.unnoticed_per_hour, unnoticed_loss)],
    )
    return StrategyEstimate("notice", interval, noticed_loss, unnoticed_loss, value)


def usd_per_useful_gpu_hour(usd_per_hour: float | None, gpus: int, goodput_share: float) -> float | None:
    """What one GPU-hour of useful training costs: price / (GPUs x goodput). None when the price is
    unknown or nothing useful is done (goodput 0: no finite price buys a useful hour)."""
    if usd_per_hour is None or gpus <= 0 or goodput_share <= 0:
        return None
    return usd_per_hour / (gpus * goodput_share)
