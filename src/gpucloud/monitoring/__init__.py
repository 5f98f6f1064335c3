"""Monitoring as one source: the exporters' config, Prometheus' scrape config, the alerting rules,
Alertmanager's routing and the Grafana dashboards, rendered for a stack (docs/monitoring.md).

- ``render(spec, stack_name, *, sns_topic_arn, amp_remote_write_url=None)``: every file, as text;
- ``static_prometheus_config``: the offline scrape config (targets by address);
- ``all_expressions(files)``: every PromQL expression of the rendered rules and dashboards
  (``expressions_in`` says where each is, with Grafana's variables replaced).

Pure functions; ``render.write_files`` is the only writer. Dashboards need the ``deploy`` extra
(grafana-foundation-sdk), imported only when rendered.
"""

from gpucloud.monitoring.expressions import Expression, all_expressions, check_rules_file, expressions_in
from gpucloud.monitoring.prometheus_config import StaticTarget, ec2_prometheus_config, static_prometheus_config
from gpucloud.monitoring.render import render, write_files

__all__ = [
    "Expression",
    "StaticTarget",
    "all_expressions",
    "check_rules_file",
    "ec2_prometheus_config",
    "expressions_in",
    "render",
    "static_prometheus_config",
    "write_files",
]
