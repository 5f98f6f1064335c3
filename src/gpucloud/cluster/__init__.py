"""Facts about a cluster that both the stack and the nodes use: pure, below the stack file.

Subnet addressing, EFA interface layouts, hourly prices, the emergency-save arithmetic, autoscaling
and monitoring plans, tag keys, and the contracts the stack shares with the node agent
(``agent_contract``) and with ``gpucloud drill`` (``drill_contract``). Nothing here reads a stack file,
imports Pulumi or talks to AWS, so the stack program, ``gpucloud plan``, the agent and teardown can
all import it without importing each other.
"""
