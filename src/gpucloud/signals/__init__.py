"""Interruption signals: where a spot notice is read.

- ``imds``: IMDSv2 client (token, refresh, retry on 401, short timeouts) and endpoint resolution.
- ``interpret``: pure rules turning IMDS items into ``Notice`` objects (deadlines, staleness, dedup keys).
- ``poller``: the IMDS monitor thread.
- ``eventbridge``: pure parsing of events-queue bodies (EventBridge spot warnings, rebalance
  recommendations, ASG lifecycle actions, SNS-wrapped) into the same ``Notice``; ``lifecycle_action``:
  the identity of an ASG termination lifecycle action as a ``Notice`` carries it.
- ``hub``: one deduplicated event stream from every source (IMDS, SIGTERM/SIGINT, ``publish``).
- ``imds_emulator`` / ``emulator_scenario`` / ``emulator_control``: the offline IMDS emulator.

Import the submodules directly; this package imports nothing heavy.
"""
