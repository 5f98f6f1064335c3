"""The alerting rules: one list, rendered into ``rules/<group>.yml`` for Prometheus (self-hosted) or
the Amazon Managed Service for Prometheus rule groups namespace (managed).

Every alert carries a ``severity`` label (``critical`` pages, ``warning`` and ``info`` do not; the
Alertmanager routes on it) and three annotations: ``summary`` naming the node (``instance_id``) and
the GPU, ``description``, and ``runbook``, one line saying what to do. The names are a contract
(docs/monitoring.md lists them): users silence and route on them.

Metric facts the expressions rely on:

- dcgm-exporter serves one series per GPU with the labels ``gpu``, ``UUID``, ``modelName``,
  ``Hostname``, ``device`` and ``pci_bus_id``; ``instance_id`` and ``node_group`` come from discovery.
- ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the *last* XID code: a second XID of the same code
  leaves it unchanged, so neither its value nor ``changes()`` can count events. dcgm-exporter's own
  ``DCGM_EXP_XID_ERRORS_COUNT{xid}`` counts every XID event within its window
  (``--xid-count-window-size``, 5 min by default), per code: the alerts read that.
  https://github.com/NVIDIA/dcgm-exporter/blob/main/internal/pkg/collector/xid_collector.go
- ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` is NVML's clocks-event bitmask: 0x20 SW thermal slowdown,
  0x40 HW thermal slowdown. PromQL has no bit operators: ``floor(mask / 32) % 4 > 0`` tests the two.
  https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html
- A counter with labels (``gpucloud_notices_total{kind}``) appears at its first increment, already
  at 1, and ``increase()`` needs two samples to see a rise: ``counter_rose`` also fires for a series
  that is new within the window and above 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from gpucloud.monitoring.names import AGENT_JOB, CRITICAL_XIDS
from gpucloud.monitoring.yamltext import dump

SEVERITIES = ("critical", "warning", "info")
DOCS = "docs/monitoring.md"

_GPU = "GPU {{ $labels.gpu }} ({{ $labels.modelName }}, {{ $labels.UUID }}) on node {{ $labels.instance_id }} ({{ $labels.node_group }})"
_NODE = "node {{ $labels.instance_id }} ({{ $labels.node_group }}), all GPUs"
# The job a node runs now, looked up when the alert fires (Prometheus' template `query`).
_JOB_ON_NODE = (
    "{{ with printf \"max by (job_id) (gpucloud_attempt_running{instance_id='%s'} == 1)\" $labels.instance_id"
    " | query }}{{ range . }}{{ .Labels.job_id }} {{ end }}{{ end }}"
)
_CRITICAL_XID_RE = "|".join(str(x) for x in CRITICAL_XIDS)


def counter_rose(metric: str, window: str) -> str:
    """A counter went up within ``window``: ``increase()``, or a series that did not exist
    ``window`` ago and is above 0 (its first samples were already counted). ``sum without ()`` drops
    the metric name so both sides have the same label sets."""
    return f"increase({metric}[{window}]) > 0\nor\nsum without () ({metric} unless {metric} offset {window}) > 0"


@dataclasses.dataclass(frozen=True)
class Alert:
    name: str
    group: str  # the rules file (rules/<group>.yml)
    severity: str
    expr: str
    summary: str
    description: str
    runbook: str
    for_: str | None = None

    def to_rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_:
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook": self.runbook,
            "runbook_url": f"{DOCS}#{self.name.lower()}",
        }
        return rule


ALERTS: tuple[Alert, ...] = (
    # --- GPU health: dcgm-exporter ------------------------------------------------------------------
    Alert(
        name="GpuXidError",
        group="gpu-health",
        severity="critical",
        expr=f'max_over_time(DCGM_EXP_XID_ERRORS_COUNT{{xid=~"{_CRITICAL_XID_RE}"}}[10m]) > 0',
        summary=f"XID {{{{ $labels.xid }}}} on {_GPU}",
        description=(
            "{{ $value }} XID {{ $labels.xid }} event(s) within dcgm-exporter's window: an XID that means "
            "lost memory, a fallen-off GPU or a broken NVLink. The node's jobs will fail or hang."
        ),
        runbook=(
            "Stop the node's agent (SIGTERM: its job checkpoints and requeues elsewhere), run `gpucloud doctor` "
            "on the node, then terminate the instance so the group replaces it; report the GPU's UUID to AWS."
        ),
    ),
    Alert(
        name="GpuXidError",
        group="gpu-health",
        severity="warning",
        expr=f'max_over_time(DCGM_EXP_XID_ERRORS_COUNT{{xid!~"{_CRITICAL_XID_RE}"}}[10m]) > 0',
        summary=f"XID {{{{ $labels.xid }}}} on {_GPU}",
        description=(
            "{{ $value }} XID {{ $labels.xid }} event(s) within dcgm-exporter's window. Most such XIDs come from "
            "the application (13, 31, 43: a bad kernel or memory access); repeated ones can mean a failing GPU."
        ),
        runbook=(
            "Look the XID up in NVIDIA's catalogue (https://docs.nvidia.com/deploy/xid-errors/); if the job keeps "
            "failing on this node only, drain the node as for a critical XID."
        ),
    ),
    Alert(
        name="GpuEccDoubleBit",
        group="gpu-health",
        severity="critical",
        # volatile count: since the driver loaded; it stays above 0 until the GPU is reset, as the alert should
        expr="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0",
        summary=f"Uncorrectable (double-bit) ECC errors on {_GPU}",
        description="{{ $value }} double-bit ECC error(s) since the driver loaded: the GPU lost data.",
        runbook=(
            "Stop the node's agent (its job checkpoints and requeues), then terminate the instance; a GPU reset "
            "(nvidia-smi -r) clears the count only if row remapping succeeded."
        ),
    ),
    Alert(
        name="GpuRowRemapFailure",
        group="gpu-health",
        severity="critical",
        expr="DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
        summary=f"Row remapping failed on {_GPU}",
        description="The GPU could not remap a failing memory row: its memory can no longer be repaired.",
        runbook=(
            "Terminate the instance so the group replaces it and report the GPU's UUID to AWS; do not reset and reuse it."
        ),
    ),
    Alert(
        name="GpuThermalThrottling",
        group="gpu-health",
        severity="warning",
        expr="floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS / 32) % 4 > 0",
        for_="5m",
        summary=f"Thermal throttling on {_GPU}",
        description=(
            "The GPU's clocks have been held down for thermal reasons (SW or HW thermal slowdown) for 5 min; "
            "the whole job runs at the speed of its slowest GPU."
        ),
        runbook=(
            "Check DCGM_FI_DEV_GPU_TEMP on the cluster dashboard; if only this GPU is hot, the instance's cooling is "
            "at fault: drain and terminate it."
        ),
    ),
    Alert(
        name="GpuMemoryHigh",
        group="gpu-health",
        severity="warning",
        expr="DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) > 0.85",
        for_="10m",
        summary=f"GPU memory {{{{ $value | humanizePercentage }}}} used on {_GPU}",
        description=(
            "Above 85% of the GPU's memory for 10 min: an out-of-memory failure is near. More nodes would not help "
            "(each rank keeps its own share of the model): see docs/monitoring.md."
        ),
        runbook=(
            "Lower the per-GPU batch size, or shard more (FSDP/ZeRO stage, activation checkpointing); the job "
            "resumes from its last checkpoint."
        ),
    ),
    # --- Training: the agent's exporter joined with the GPUs --------------------------------------------
    Alert(
        name="GpuIdleWhileJobRunning",
        group="training",
        severity="warning",
        # `for` makes it "for the last 15 min": both halves held at every evaluation. A GPU idle while no
        # attempt runs matches nothing on the right and is not an alert (idle nodes scale in on their own).
        expr="DCGM_FI_DEV_GPU_UTIL < 10\nand on (instance_id)\ngpucloud_attempt_running == 1",
        for_="15m",
        summary=f"{_GPU} idle while job {_JOB_ON_NODE}runs",
        description=(
            "The node runs an attempt, but this GPU has been below 10% utilisation for 15 min: rented GPUs "
            "are idle (a data-loader stall, a rank waiting on another, or a job that uses fewer GPUs than it holds)."
        ),
        runbook=(
            "Open the job dashboard for the job: if every GPU is idle, the job is stuck (see TrainingStalled); "
            "if only some are, the job uses fewer GPUs than the node has."
        ),
    ),
    Alert(
        name="TrainingStalled",
        group="training",
        severity="critical",
        # changes over 2m with `for: 10m`: the step has not moved in any 2-min window for 10 min. A step
        # series must have existed for the whole 10 min, so a job that just started is not stalled.
        expr=(
            "gpucloud_training_step\n"
            "and on (instance_id, job_id) (changes(gpucloud_training_step[2m]) == 0)\n"
            "and on (instance_id, job_id) (gpucloud_attempt_running == 1)"
        ),
        for_="10m",
        summary="Job {{ $labels.job_id }} stalled at step {{ $value }} on " + _NODE,
        description=(
            "An attempt is running but its training step has not moved for 10 min: typically an NCCL hang "
            "(a rank died or a link failed) or a dead-locked data loader."
        ),
        runbook=(
            "Check the job's logs (`gpucloud job logs JOB`) and the GPUs' XID/ECC alerts; cancel the attempt "
            "(`gpucloud job cancel JOB`) and `gpucloud job resume JOB` to restart from its last checkpoint."
        ),
    ),
    # The same alert before the first step: gpucloud_training_step appears only once the session restored
    # (or started fresh) and reported a step, so a hang in the rendezvous, NCCL's init or the restore never
    # has a step that could stop moving. `unless on (...)` keeps the running attempts with no step series
    # at all (absent() cannot: it returns one label-less series, nothing to join on instance_id). A warning,
    # not a page: a long --setup, or a script that does not use gpucloud's session (it never reports a
    # step), looks the same from here.
    Alert(
        name="TrainingStalled",
        group="training",
        severity="warning",
        expr=("gpucloud_attempt_running == 1\nunless on (instance_id, job_id) gpucloud_training_step"),
        for_="10m",
        summary="Job {{ $labels.job_id }} attempt {{ $labels.attempt }} has reported no step for 10 min on " + _NODE,
        description=(
            "The attempt has run for 10 min without reporting a training step: it hangs before its first step "
            "(rendezvous, NCCL initialisation, the checkpoint restore), its setup is still running, or its script "
            "does not use gpucloud's session (which reports the step)."
        ),
        runbook=(
            "Read the job's logs (`gpucloud job logs JOB`): a hang at init or restore -> `gpucloud job cancel JOB` "
            "and `gpucloud job resume JOB`; a script without the session -> silence this alert for the job."
        ),
    ),
    Alert(
        name="CheckpointFailing",
        group="training",
        severity="critical",
        expr=counter_rose("gpucloud_checkpoint_failures_total", "30m"),
        summary="Checkpoints failing on " + _NODE,
        description=(
            "{{ $value }} checkpoint save(s) failed in 30 min: a spot interruption now would lose every step "
            "since the last good checkpoint."
        ),
        runbook=(
            "Read the job's logs for the save error (full disk, S3 permissions or throttling, FSx unreachable); "
            "fix the target, then the next periodic save proves it."
        ),
    ),
    Alert(
        name="SpotInterruptionNotice",
        group="training",
        severity="info",
        expr=counter_rose("gpucloud_notices_total", "5m"),
        summary="Interruption notice ({{ $labels.kind }}) on " + _NODE,
        description=(
            "The node received an interruption notice: its job saves an emergency checkpoint and is requeued; "
            "the node goes away."
        ),
        runbook=(
            "Nothing to do if the job resumes (`gpucloud job show JOB`: steps lost); many notices in one pool mean "
            "its spot capacity is scarce: add instance types or zones to the group."
        ),
    ),
    # --- The node agent ----------------------------------------------------------------------------------
    Alert(
        name="NodeAgentDown",
        group="nodes",
        severity="critical",
        expr=f'up{{job="{AGENT_JOB}"}} == 0',
        for_="5m",
        summary="gpucloud agent down on " + _NODE,
        description=(
            "The node's agent has not answered a scrape for 5 min: the node claims no jobs, and an interruption "
            "notice would not be handled (its job would lose the steps since its last checkpoint)."
        ),
        runbook=(
            "On the node (SSM session): `systemctl status gpucloud-agent` and `journalctl -u gpucloud-agent`; "
            "restart it, or terminate the instance so the group replaces it."
        ),
    ),
)


def alert_names() -> list[str]:
    return sorted({a.name for a in ALERTS})


def rule_groups(alerts: Iterable[Alert] = ALERTS) -> dict[str, dict[str, Any]]:
    """``{group name: the rules file's document}``, groups in first-seen order."""
    files: dict[str, list[Alert]] = {}
    for alert in alerts:
        if alert.severity not in SEVERITIES:
            raise ValueError(f"{alert.name}: severity {alert.severity!r} is not one of {', '.join(SEVERITIES)}")
        files.setdefault(alert.group, []).append(alert)
    return {
        group: {"groups": [{"name": f"gpucloud-{group}", "rules": [a.to_rule() for a in members]}]}
        for group, members in files.items()
    }


RULES_HEADER = """Alerting rules for gpucloud clusters, rendered by `gpucloud monitoring render`; do not edit here.
Severity: critical pages, warning and info do not (alertmanager.yml routes on it).
XIDs: DCGM_FI_DEV_XID_ERRORS keeps only the last XID code, so a second XID of the same code does not change
it and changes() cannot see it. These rules read dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT{xid}: the number
of XID events of each code within the exporter's window (5 min by default). max_over_time(...[10m]) > 0
keeps the alert firing while any event is in the window, and a second XID raises the count, so the
alert keeps firing (a new code is a new alert)."""


def render_rules() -> dict[str, str]:
    """``{"rules/<group>.yml": text}``."""
    return {f"rules/{group}.yml": dump(doc, header=RULES_HEADER) for group, doc in rule_groups().items()}
