"""The fleet on AWS: the pieces an agent wires into the interruption flow and into autoscaling.

- ``asg``: the Auto Scaling calls (lifecycle completion and heartbeats, scale-in protection,
  replacement at the notice, idle scale-in), each a thin, validated wrapper with one-line errors.
- ``event_messages``: pure parsing of events-queue bodies (EventBridge, direct ASG notifications,
  SNS-wrapped) into ``Notice``s; ``events_queue``: the SQS poller that acks after the action.
- ``scaling``: pure decisions (desired capacity from queue state, idle scale-in, capacity-block window).
"""
