"""Framework integrations: the spot-train contract for HF Trainer and Lightning (docs/integrations.md).

``gpucloud.integrations.transformers.SpotTrainerCallback`` and
``gpucloud.integrations.lightning.SpotCheckpoint``: a notice saves the agreed step through the
framework's own checkpointing, commits it (``<dir>/LATEST``), and the attempt exits 75; the next
attempt resumes from it. Install the pinned versions with ``pip install 'gpucloud[frameworks]'``.
"""
