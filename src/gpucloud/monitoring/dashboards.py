"""The two Grafana dashboards, built with grafana-foundation-sdk (Grafana's own dashboards-as-code
library: https://grafana.github.io/grafana-foundation-sdk/), never hand-written JSON.

- ``cluster``: per node and per GPU utilisation, profiling activity, memory, temperature, power,
  clocks and throttling, XID, ECC and row remapping, EFA throughput and errors, the agents.
- ``job``: one job (the ``job_id`` variable): steps per second, step time, checkpoint stalls and their
  share of time, save times, notices, notice-to-commit, steps lost, requeues, the GPUs it holds and
  how busy they are.

Every panel reads raw series (no recording rule has to run first) through a ``datasource`` variable,
so the same JSON works against the self-hosted Prometheus or an Amazon Managed Prometheus data source.
Job panels join node series to the job on ``instance_id``: ``gpucloud_attempt_running`` says which
node runs which job. Queries avoid filters that leave a healthy cluster with no series at all
(a panel with nothing to draw looks broken): XID panels fall back to 0 per GPU.

The SDK is in the ``deploy`` extra: import this module only where that is installed.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import common as gcommon
from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders import stat as gstat
from grafana_foundation_sdk.builders import table as gtable
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cmodel
from grafana_foundation_sdk.models import dashboard as dmodel
from grafana_foundation_sdk.models import prometheus as pmodel

DATASOURCE = dmodel.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"

# The nodes the cluster dashboard shows (both variables allow "All").
NODES = 'node_group=~"$node_group", instance_id=~"$instance_id"'
EFA = NODES + ', device=~"rdmap.*"'  # EFA devices in node_exporter's infiniband collector (state only)
# One series per node that runs the chosen job, valued 1: multiply a node series by it to keep the
# job's nodes and give them the job_id label.
ON_JOB = (
    "* on (instance_id) group_left (job_id)\n"
    '(max by (instance_id, job_id) (gpucloud_attempt_running{job_id=~"$job_id"}) == 1)'
)


def _query(expr: str, legend: str, ref: str) -> gprom.Dataquery:
    return gprom.Dataquery().expr(expr).legend_format(legend).ref_id(ref)


def _timeseries(
    title: str, queries: list[tuple[str, str]], *, unit: str = "short", description: str = "", width: int = 12
) -> gts.Panel:
    panel = (
        gts.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(8)
        .span(width)
        .legend(
            gcommon.VizLegendOptions()
            .show_legend(True)
            .display_mode(cmodel.LegendDisplayMode.LIST)
            .placement(cmodel.LegendPlacement.BOTTOM)
        )
        .tooltip(gcommon.VizTooltipOptions().mode(cmodel.TooltipDisplayMode.MULTI).sort(cmodel.SortOrder.DESCENDING))
    )
    if description:
        panel = panel.description(description)
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + i)))
    return panel


def _stat(title: str, expr: str, legend: str, *, unit: str = "short", description: str = "") -> gstat.Panel:
    panel = (
        gstat.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(5)
        .span(6)
        .reduce_options(gcommon.ReduceDataOptions().calcs(["lastNotNull"]))
    )
    if description:
        panel = panel.description(description)
    return panel.with_target(_query(expr, legend, "A"))


def _label_variable(name: str, label: str, query: str) -> gdash.QueryVariable:
    return (
        gdash.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": f"{name}-variable"})
        .refresh(dmodel.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dmodel.VariableSort.ALPHABETICAL_ASC)
    )


def _datasource_variable() -> gdash.DatasourceVariable:
    return gdash.DatasourceVariable("datasource").label("Data source").type("prometheus")


def cluster_dashboard(cluster: str) -> dmodel.Dashboard:
    gpu = "{{instance_id}} GPU {{gpu}}"
    board = (
        gdash.Dashboard(f"gpucloud {cluster}: cluster")
        .uid(f"gpucloud-{cluster}-cluster"[:40])
        .tags(["gpucloud", cluster])
        .description("Every node and GPU of the cluster: utilisation, memory, heat, power, errors, EFA.")
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(_datasource_variable())
        .with_variable(
            _label_variable("node_group", "Node group", "label_values(DCGM_FI_DEV_GPU_UTIL, node_group)")
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        .with_variable(
            _label_variable(
                "instance_id", "Node", 'label_values(DCGM_FI_DEV_GPU_UTIL{node_group=~"$node_group"}, instance_id)'
            )
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        .with_row(gdash.Row("GPUs"))
        .with_panel(
            _timeseries(
                "GPU utilisation per GPU",
                [(f"DCGM_FI_DEV_GPU_UTIL{{{NODES}}}", gpu)],
                unit="percent",
                description="DCGM_FI_DEV_GPU_UTIL: share of time a kernel ran. Below 10% for 15 min while a "
                "job runs raises GpuIdleWhileJobRunning.",
            )
        )
        .with_panel(
            _timeseries(
                "Tensor core activity per GPU",
                [(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{NODES}}}", gpu)],
                unit="percentunit",
                description="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: share of cycles the tensor pipes were busy, "
                "what a training job should keep high.",
            )
        )
        .with_panel(
            _timeseries(
                "Graphics engine and memory bandwidth activity",
                [
                    (f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{NODES}}}", gpu + " engine"),
                    (f"DCGM_FI_PROF_DRAM_ACTIVE{{{NODES}}}", gpu + " DRAM"),
                ],
                unit="percentunit",
            )
        )
        .with_panel(
            _timeseries(
                "GPU memory used",
                [
                    (
                        f"DCGM_FI_DEV_FB_USED{{{NODES}}}\n/ (DCGM_FI_DEV_FB_USED{{{NODES}}} + DCGM_FI_DEV_FB_FREE{{{NODES}}})",
                        gpu,
                    )
                ],
                unit="percentunit",
                description="Above 85% for 10 min raises GpuMemoryHigh.",
            )
        )
        .with_panel(
            _timeseries(
                "Temperature",
                [
                    (f"DCGM_FI_DEV_GPU_TEMP{{{NODES}}}", gpu),
                    (f"DCGM_FI_DEV_MEMORY_TEMP{{{NODES}}}", gpu + " memory"),
                ],
                unit="celsius",
            )
        )
        .with_panel(_timeseries("Power draw", [(f"DCGM_FI_DEV_POWER_USAGE{{{NODES}}}", gpu)], unit="watt"))
        .with_panel(_timeseries("SM clock", [(f"DCGM_FI_DEV_SM_CLOCK{{{NODES}}}", gpu)], unit="rotmhz"))
        .with_panel(
            _timeseries(
                "Share of time throttled",
                [
                    (f"rate(DCGM_FI_DEV_POWER_VIOLATION{{{NODES}}}[{RATE}]) / 1e9", gpu + " power"),
                    (f"rate(DCGM_FI_DEV_THERMAL_VIOLATION{{{NODES}}}[{RATE}]) / 1e9", gpu + " thermal"),
                ],
                unit="percentunit",
                description="DCGM's violation counters (ns of held-down clocks) per second of wall time.",
            )
        )
        .with_row(gdash.Row("GPU errors"))
        .with_panel(
            _timeseries(
                "XID events within dcgm-exporter's window",
                [
                    (
                        f"sum by (instance_id, gpu, xid) (DCGM_EXP_XID_ERRORS_COUNT{{{NODES}}})\n"
                        f"or sum by (instance_id, gpu) (DCGM_FI_DEV_XID_ERRORS{{{NODES}}}) * 0",
                        gpu + " XID {{xid}}",
                    )
                ],
                description="DCGM_EXP_XID_ERRORS_COUNT counts every XID event per code (0 where none); "
                "critical codes raise GpuXidError (critical).",
            )
        )
        .with_panel(
            _timeseries(
                "Last XID per GPU",
                [(f"DCGM_FI_DEV_XID_ERRORS{{{NODES}}}", gpu)],
                description="DCGM_FI_DEV_XID_ERRORS holds the last XID code (0: none since the driver loaded).",
            )
        )
        .with_panel(
            _timeseries(
                "ECC errors since the driver loaded",
                [
                    (f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{NODES}}}", gpu + " single-bit"),
                    (f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{NODES}}}", gpu + " double-bit"),
                ],
            )
        )
        .with_panel(
            _timeseries(
                "Remapped rows and remap failures",
                [
                    (f"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{NODES}}}", gpu + " correctable"),
                    (f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{NODES}}}", gpu + " uncorrectable"),
                    (f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{NODES}}}", gpu + " failure"),
                ],
            )
        )
        .with_row(gdash.Row("EFA"))
        .with_panel(
            _timeseries(
                "EFA throughput per node",
                [
                    (
                        f"sum by (instance_id) (rate(gpucloud_efa_rx_bytes_total{{{NODES}}}[{RATE}]))",
                        "{{instance_id}} received",
                    ),
                    (
                        f"sum by (instance_id) (rate(gpucloud_efa_tx_bytes_total{{{NODES}}}[{RATE}]))",
                        "{{instance_id}} sent",
                    ),
                    (
                        f"sum by (instance_id) (rate(gpucloud_efa_rdma_read_bytes_total{{{NODES}}}[{RATE}]))",
                        "{{instance_id}} RDMA read",
                    ),
                    (
                        f"sum by (instance_id) (rate(gpucloud_efa_rdma_write_bytes_total{{{NODES}}}[{RATE}]))",
                        "{{instance_id}} RDMA write",
                    ),
                ],
                unit="Bps",
                description="The EFA driver's port counters (hw_counters), exported by the gpucloud agent: "
                "node_exporter's infiniband collector has no traffic counters for EFA devices.",
            )
        )
        .with_panel(
            _timeseries(
                "EFA errors and retransmissions per node",
                [
                    (
                        f"sum by (instance_id) (rate(gpucloud_efa_rx_drops_total{{{NODES}}}[{RATE}]))",
                        "{{instance_id}} receive drops",
                    ),
                    (
                        f"sum by (instance_id) (rate(gpucloud_efa_rdma_read_wr_err_total{{{NODES}}}[{RATE}])"
                        f" + rate(gpucloud_efa_rdma_write_wr_err_total{{{NODES}}}[{RATE}]))",
                        "{{instance_id}} RDMA work request errors",
                    ),
                    (
                        f"sum by (instance_id) (rate(gpucloud_efa_retrans_pkts_total{{{NODES}}}[{RATE}]))",
                        "{{instance_id}} retransmitted packets",
                    ),
                    (
                        f"sum by (instance_id) (increase(gpucloud_efa_retrans_timeout_events_total{{{NODES}}}[{RATE}]))",
                        "{{instance_id}} retransmit timeouts",
                    ),
                    (
                        f"sum by (instance_id) (increase(gpucloud_efa_unresponsive_remote_events_total{{{NODES}}}[{RATE}]))",
                        "{{instance_id}} unresponsive peers",
                    ),
                    (
                        f"sum by (instance_id) (increase(gpucloud_efa_impaired_remote_conn_events_total{{{NODES}}}[{RATE}]))",
                        "{{instance_id}} impaired connections",
                    ),
                ],
                description="Per second (drops, errors, retransmissions) or per interval (events), summed over the node's EFA devices.",
            )
        )
        .with_panel(
            _timeseries(
                "EFA ports not active per node",
                [(f"sum by (instance_id) (node_infiniband_state_id{{{EFA}}} != bool 4)", "{{instance_id}}")],
                description="Ports whose state is not 4 (active).",
            )
        )
        .with_row(gdash.Row("Nodes"))
        .with_panel(
            _timeseries(
                "Agent state per node",
                [(f"max by (instance_id, state) (gpucloud_agent_state{{{NODES}}})", "{{instance_id}} {{state}}")],
            )
        )
        .with_panel(_timeseries("Exporters up", [(f"up{{{NODES}}}", "{{instance_id}} {{job}}")]))
    )
    return board.build()


def job_dashboard(cluster: str) -> dmodel.Dashboard:
    gpu = "{{instance_id}} GPU {{gpu}}"
    board = (
        gdash.Dashboard(f"gpucloud {cluster}: job")
        .uid(f"gpucloud-{cluster}-job"[:40])
        .tags(["gpucloud", cluster])
        .description("One training job: progress, checkpoints, interruptions, and the GPUs it holds.")
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(_datasource_variable())
        .with_variable(_label_variable("job_id", "Job", "label_values(gpucloud_attempt_running, job_id)"))
        .with_row(gdash.Row("Progress"))
        .with_panel(
            _timeseries(
                "Steps per second",
                [(f"avg by (job_id) (\n  rate(gpucloud_step_seconds_count[{RATE}])\n  {ON_JOB}\n)", "{{job_id}}")],
                description="Completed steps per second, averaged over the job's nodes.",
            )
        )
        .with_panel(
            _timeseries(
                "Training step",
                [('max by (job_id) (gpucloud_training_step{job_id=~"$job_id"})', "{{job_id}}")],
            )
        )
        .with_panel(
            _timeseries(
                "Mean step time per node",
                [
                    (
                        f"(rate(gpucloud_step_seconds_sum[{RATE}]) / rate(gpucloud_step_seconds_count[{RATE}]))\n{ON_JOB}",
                        "{{instance_id}}",
                    )
                ],
                unit="s",
                description="A node slower than the others holds the whole job back.",
            )
        )
        .with_row(gdash.Row("Checkpoints"))
        .with_panel(
            _timeseries(
                "Share of time stalled by checkpoints",
                [
                    (
                        f"avg by (job_id) (\n  rate(gpucloud_checkpoint_stall_seconds_sum[{RATE}])\n  {ON_JOB}\n)",
                        "{{job_id}}",
                    )
                ],
                unit="percentunit",
                description="Seconds the training loop waited on saves, per second of wall time.",
            )
        )
        .with_panel(
            _timeseries(
                "Checkpoint stalls",
                [
                    (
                        f"sum by (job_id) (increase(gpucloud_checkpoint_stall_seconds_count[{RATE}])\n{ON_JOB})",
                        "{{job_id}} stalls",
                    ),
                    (
                        f"max by (job_id) (\n  (rate(gpucloud_checkpoint_stall_seconds_sum[{RATE}]) / rate(gpucloud_checkpoint_stall_seconds_count[{RATE}]))\n  {ON_JOB}\n)",
                        "{{job_id}} mean stall (s)",
                    ),
                ],
            )
        )
        .with_panel(
            _timeseries(
                "Checkpoint save time by kind",
                [
                    (
                        f"max by (job_id, kind) (\n  (rate(gpucloud_checkpoint_save_seconds_sum[{RATE}]) / rate(gpucloud_checkpoint_save_seconds_count[{RATE}]))\n  {ON_JOB}\n)",
                        "{{kind}}",
                    )
                ],
                unit="s",
                description="From the start of a save to its durable commit; an emergency save must commit "
                "within the notice.",
            )
        )
        .with_panel(
            _stat(
                "Checkpoint failures (1 h)",
                f"sum by (job_id) (increase(gpucloud_checkpoint_failures_total[1h])\n{ON_JOB})",
                "{{job_id}}",
            )
        )
        .with_row(gdash.Row("Interruptions"))
        .with_panel(
            _timeseries(
                "Interruption notices (1 h)",
                [(f"sum by (job_id, kind) (increase(gpucloud_notices_total[1h])\n{ON_JOB})", "{{kind}}")],
            )
        )
        .with_panel(
            _timeseries(
                "Notice to durable commit",
                [
                    (
                        "max by (job_id) (\n  (rate(gpucloud_notice_to_commit_seconds_sum[1h]) / rate(gpucloud_notice_to_commit_seconds_count[1h]))\n"
                        f"  {ON_JOB}\n)",
                        "{{job_id}}",
                    )
                ],
                unit="s",
            )
        )
        .with_panel(
            _stat(
                "Steps lost (1 h)",
                f"sum by (job_id) (increase(gpucloud_steps_lost_total[1h])\n{ON_JOB})",
                "{{job_id}}",
            )
        )
        .with_panel(
            _stat(
                "Requeues (1 h)",
                f"sum by (job_id) (increase(gpucloud_requeues_total[1h])\n{ON_JOB})",
                "{{job_id}}",
            )
        )
        .with_row(gdash.Row("GPUs held"))
        .with_panel(
            _stat(
                "GPUs held",
                f"count by (job_id) (DCGM_FI_DEV_GPU_UTIL\n{ON_JOB})",
                "{{job_id}}",
            )
        )
        .with_panel(
            gtable.Panel()
            .title("The job's GPUs")
            .datasource(DATASOURCE)
            .height(8)
            .span(18)
            .show_header(True)
            .with_target(
                _query(f"DCGM_FI_DEV_GPU_UTIL\n{ON_JOB}", gpu, "A").instant().format(pmodel.PromQueryFormat.TABLE)
            )
        )
        .with_panel(
            _timeseries("Utilisation of the job's GPUs", [(f"DCGM_FI_DEV_GPU_UTIL\n{ON_JOB}", gpu)], unit="percent")
        )
        .with_panel(
            _timeseries(
                "Tensor core activity of the job's GPUs",
                [(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE\n{ON_JOB}", gpu)],
                unit="percentunit",
            )
        )
        .with_panel(
            _timeseries(
                "Memory used on the job's GPUs",
                [
                    (
                        f"(DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE))\n{ON_JOB}",
                        gpu,
                    )
                ],
                unit="percentunit",
            )
        )
    )
    return board.build()


def dashboard_json(board: dmodel.Dashboard) -> str:
    return json.dumps(board, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def render_dashboards(cluster: str) -> dict[str, str]:
    """``{"dashboards/<name>.json": text}``."""
    return {
        "dashboards/cluster.json": dashboard_json(cluster_dashboard(cluster)),
        "dashboards/job.json": dashboard_json(job_dashboard(cluster)),
    }


def panels(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel of a dashboard's JSON, rows' nested panels included (rows themselves left out)."""
    out: list[dict[str, Any]] = []
    for panel in document.get("panels", []):
        if panel.get("type") == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out
