"""Finding and deleting what a gpucloud stack left behind (``gpucloud sweep``, docs/teardown.md).

``plan.py`` decides (pure: what to delete, in which order, what to skip and why); ``discover.py``
lists tagged resources with boto3; ``delete.py`` deletes one resource per call and retries what AWS
still calls in use.
"""
