"""What the stack's FIS experiment template (infra/drill.py) and ``gpucloud drill`` agree on.

The template selects spot instances by tag: the cluster tag *and* ``TARGET_TAG``. ``gpucloud drill``
puts ``TARGET_TAG`` on exactly the instance it wants interrupted (a node of its own job's gang) just
before it starts the experiment, and removes it afterwards, so the experiment can never hit another
job's node. The FIS role may only act on instances that carry the cluster tag.
"""

from __future__ import annotations

# The FIS action the template runs and the command reads back (the notice's lead is its parameter).
SPOT_ACTION_ID = "aws:ec2:send-spot-instance-interruptions"
LEAD_PARAMETER = "durationBeforeInterruption"

TARGET_TAG = "gpucloud:drill-target"
TARGET_VALUE = "true"

# Stack output (a dict) the command reads: {"experimentTemplateId": ..., "roleArn": ..., "stopAlarmName": ...}
STACK_OUTPUT = "drill"
