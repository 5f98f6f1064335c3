"""The node agent (``gpucloud agent``): everything a node does for the fleet.

- ``loop``: claim a gang slot, wait for the gang, run the attempt under the supervisor, repeat;
  ``torchrun``: one member's command line; ``identity``: who this node is.
- ``table_notices``: stop requests through the job table, so a notice reaches every gang member.
- ``asg`` / ``asg_hooks``: the Auto Scaling calls (lifecycle completion and heartbeats, scale-in
  protection, replacement at the notice, idle scale-in) and when the agent makes them.
- ``events_queue`` / ``events_handler``: queue mode, consuming the cluster's events queue so a node
  whose agent died is still handled (the bodies are parsed in ``gpucloud.signals.eventbridge``).
- ``backlog_metric``, ``fleet_view``, ``scaling``: the backlog metric the stack's alarm reads, the
  fleet as the scaling decision sees it, and the pure decisions themselves.
"""
