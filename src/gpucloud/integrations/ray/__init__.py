"""Ray Train on AWS spot (docs/ray.md): gpucloud reads the EC2 notice, Ray's preemption API acts on it.

* ``gpucloud.integrations.ray.drain``: on each Ray node, a spot warning, rebalance, ASG or
  maintenance notice (IMDS, SIGTERM, or a queue-mode event handed to ``publish``) becomes a drain
  of that node with reason PREEMPTION and the notice's own deadline (``GcsClient.drain_node``).
* ``gpucloud.integrations.ray.train.RaySpotSession``: in the training function, when
  ``ray.train.get_preemption_info()`` reports the drain, every worker saves the same step through
  ``TrainingSession`` (manifest, LATEST, durable), reports it to Ray as the checkpoint and waits
  for Ray to restart the worker group, which resumes from it.
* ``python -m gpucloud.integrations.ray.driver -- python driver.py``: when the whole Ray cluster
  is lost, the wrapper around the driver exits 75 so ``gpucloud spot-train`` requeues the run; the
  next attempt resumes from the same committed checkpoint.

Tested with the Ray pinned in the ``ray`` extra (``pip install 'gpucloud[ray]'``).
"""
