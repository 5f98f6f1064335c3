"""``gpucloud monitoring render``: write every monitoring file a stack deploys, offline.
``gpucloud monitoring node-config``: on a managed stack's node, its Prometheus agent's configuration."""

from __future__ import annotations

import re
from pathlib import Path

import click

from gpucloud.commands.options import chosen_stack, stack_options
from gpucloud.errors import UserError
from gpucloud.output import output_option, print_json

SNS_ARN = re.compile(r"^arn:aws(-[a-z]+)*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$")
AMP_URL = re.compile(
    r"^https://aps-workspaces\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/workspaces/ws-[A-Za-z0-9-]+/api/v1/remote_write$"
)
PLACEHOLDER_WORKSPACE = "ws-00000000-0000-0000-0000-000000000000"
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8}([0-9a-f]{9})?$")
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a cluster or node-group name


@click.group("monitoring")
def monitoring() -> None:
    """The stack's monitoring files: Prometheus, alerting rules, Alertmanager, Grafana dashboards.

    \b
    Examples:
      gpucloud monitoring render --stack p5-capacity-block --out monitoring/
      gpucloud monitoring render --stack p5-capacity-block --out monitoring/ --output json
      gpucloud monitoring node-config --instance-id i-0abc12345def67890 --out prometheus-agent.yml  # a node
    """


@monitoring.command("render")
@stack_options()
@click.option(
    "--out",
    "out_dir",
    required=True,
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write into (created; files of the same names are replaced).",
)
@click.option(
    "--sns-topic-arn",
    metavar="ARN",
    help="The alert topic's ARN (after `pulumi up`: `pulumi stack output alertTopicArn`). Default: the ARN "
    "the stack creates, with the placeholder account 000000000000.",
)
@click.option(
    "--amp-remote-write-url",
    metavar="URL",
    help="managed mode: the workspace's remote-write URL (https://aps-workspaces.REGION.amazonaws.com/workspaces/"
    "WS-ID/api/v1/remote_write). Default: a placeholder workspace id.",
)
@output_option()
def render_command(
    stack: str | None,
    stack_file: Path | None,
    out_dir: Path,
    sns_topic_arn: str | None,
    amp_remote_write_url: str | None,
    output: str,
) -> None:
    """Write the stack's monitoring files into DIR, exactly what the stack deploys.

    \b
    DIR/prometheus.yml        scrape config: EC2 discovery of the cluster's nodes (dcgm-exporter :9400,
                              node_exporter :9100, the agent), rules and Alertmanager (self-hosted) or
                              remote write with SigV4 to Amazon Managed Prometheus (managed)
    DIR/rules/*.yml           the alerting rules (GpuXidError, GpuIdleWhileJobRunning, TrainingStalled, ...)
    DIR/alertmanager.yml      routing by severity to the stack's SNS topic
    DIR/dashboards/*.json     Grafana: the cluster and one job
    DIR/dcgm-counters.csv     dcgm-exporter's counters file (the image installs it)

    Offline, the SNS topic's ARN and the managed workspace's id are not known yet: placeholders
    stand in (a note says so) unless --sns-topic-arn / --amp-remote-write-url give the real ones.
    A stack with `gpucloud:monitoring: {mode: off}` still renders what self-hosted would deploy,
    for a Prometheus of your own. See docs/monitoring.md.
    """
    from gpucloud.monitoring.names import PLACEHOLDER_ACCOUNT, placeholder_topic_arn
    from gpucloud.spec import load_stack_file

    name, path = chosen_stack(stack, stack_file)
    if sns_topic_arn is not None and not SNS_ARN.match(sns_topic_arn):
        raise UserError(
            f"--sns-topic-arn {sns_topic_arn!r} is not an SNS topic ARN; expected arn:aws:sns:REGION:ACCOUNT:NAME"
        )
    if amp_remote_write_url is not None and not AMP_URL.match(amp_remote_write_url):
        raise UserError(
            f"--amp-remote-write-url {amp_remote_write_url!r} is not a workspace remote-write URL; expected "
            "https://aps-workspaces.REGION.amazonaws.com/workspaces/WS-ID/api/v1/remote_write"
        )
    spec = load_stack_file(path)
    cluster = spec.name_for(name)
    mode = spec.monitoring.mode

    notes = []
    if mode == "off":
        notes.append(
            f"stack {name} has gpucloud:monitoring mode off: nothing deploys these files; they are what "
            "self-hosted would deploy, for a Prometheus and Grafana of your own"
        )
    if sns_topic_arn is None:
        sns_topic_arn = placeholder_topic_arn(spec.region, cluster)
        notes.append(
            f"alertmanager.yml names the alert topic with the placeholder account {PLACEHOLDER_ACCOUNT} "
            f"({sns_topic_arn}); pass --sns-topic-arn with the real ARN (pulumi stack output alertTopicArn)"
        )
    if mode == "managed" and amp_remote_write_url is None:
        amp_remote_write_url = (
            f"https://aps-workspaces.{spec.region}.amazonaws.com/workspaces/{PLACEHOLDER_WORKSPACE}/api/v1/remote_write"
        )
        notes.append(
            f"prometheus.yml remote-writes to the placeholder workspace {PLACEHOLDER_WORKSPACE}; pass "
            "--amp-remote-write-url with the workspace's URL"
        )

    _require_grafana_sdk()
    from gpucloud.monitoring import render, write_files

    files = render(spec, name, sns_topic_arn=sns_topic_arn, amp_remote_write_url=amp_remote_write_url)
    try:
        write_files(files, out_dir)
    except OSError as err:
        raise UserError(f"--out {out_dir}: cannot write the files ({err.strerror or err})") from None
    listing = [{"path": p, "bytes": len(files[p].encode("utf-8"))} for p in sorted(files)]
    if output == "json":
        print_json(
            {"stack": name, "cluster": cluster, "mode": mode, "out": str(out_dir), "files": listing, "notes": notes}
        )
    else:
        from gpucloud.output import print_table

        print_table(
            f"Monitoring files for stack {name} (cluster {cluster}, mode {mode}) in {out_dir}",
            ["file", "bytes"],
            [(f["path"], f["bytes"]) for f in listing],
        )
    for note in notes:
        click.echo(f"note: {note}", err=True)


def _require_grafana_sdk() -> None:
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ModuleNotFoundError:
        raise UserError(
            "gpucloud monitoring render builds the dashboards with grafana-foundation-sdk, in the deploy extra: "
            "pip install 'gpucloud[deploy]', or run scripts/setup.sh"
        ) from None


@monitoring.command("node-config")
@click.option(
    "--remote-write-url",
    required=True,
    metavar="URL",
    envvar="GPUCLOUD_AMP_REMOTE_WRITE_URL",
    show_envvar=True,
    help="The workspace's remote-write URL (node.env sets it on a managed stack's node).",
)
@click.option(
    "--region", required=True, metavar="REGION", envvar="GPUCLOUD_REGION", show_envvar=True, help="For SigV4."
)
@click.option("--cluster", required=True, metavar="NAME", envvar="GPUCLOUD_CLUSTER", show_envvar=True)
@click.option("--node-group", required=True, metavar="NAME", envvar="GPUCLOUD_NODE_GROUP", show_envvar=True)
@click.option(
    "--instance-id", required=True, metavar="ID", help="This instance's id (instance metadata's instance-id)."
)
@click.option(
    "--agent-port",
    type=click.IntRange(1, 65535),
    default=9401,
    show_default=True,
    envvar="GPUCLOUD_METRICS_PORT",
    show_envvar=True,
    help="The gpucloud agent's /metrics port.",
)
@click.option(
    "--out",
    "out_file",
    required=True,
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the configuration ('-': standard output).",
)
def node_config_command(
    remote_write_url: str,
    region: str,
    cluster: str,
    node_group: str,
    instance_id: str,
    agent_port: int,
    out_file: Path,
) -> None:
    """Write this node's Prometheus agent-mode configuration (managed monitoring).

    \b
    It scrapes the node's own exporters on 127.0.0.1 (dcgm-exporter :9400, node_exporter :9100, the
    agent's /metrics), with the job names of `gpucloud monitoring render`'s prometheus.yml, labels
    every sample with the node's instance_id and node_group (external_labels: what EC2 discovery
    gives in self-hosted mode), and remote-writes to the Amazon Managed Prometheus workspace signed
    with SigV4 and the instance role. scripts/node-bootstrap.sh runs it on every node of a managed
    stack and starts `prometheus --agent --config.file FILE`. Runs without the deploy extra.

    \b
    Example (the other values from node.env):
      gpucloud monitoring node-config --instance-id "$(ec2-metadata --instance-id | cut -d' ' -f2)" \\
          --out /etc/gpucloud/prometheus-agent.yml
    """
    from gpucloud.monitoring.prometheus_config import node_agent_config

    checks = (
        (
            AMP_URL,
            remote_write_url,
            "--remote-write-url",
            "https://aps-workspaces.REGION.amazonaws.com/workspaces/WS-ID/api/v1/remote_write",
        ),
        (REGION, region, "--region", "an AWS region such as us-east-1"),
        (INSTANCE_ID, instance_id, "--instance-id", "an EC2 instance id: i- and 8 or 17 hex digits"),
        (LABEL_VALUE, cluster, "--cluster", "letters, digits, '.', '_' and '-'"),
        (LABEL_VALUE, node_group, "--node-group", "letters, digits, '.', '_' and '-'"),
    )
    for pattern, value, option, expected in checks:
        if not pattern.match(value):
            raise UserError(f"{option} {value!r} is not valid; expected {expected}")
    text = node_agent_config(
        cluster=cluster,
        region=region,
        instance_id=instance_id,
        node_group=node_group,
        remote_write_url=remote_write_url,
        agent_port=agent_port,
    )
    if str(out_file) == "-":
        click.echo(text, nl=False)
        return
    try:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UserError(f"--out {out_file}: cannot write the configuration ({err.strerror or err})") from None
