"""Code shipping: how a job's working directory and its packages reach the nodes.

``snapshot``: ``submit --workdir DIR`` turns DIR into a content-addressed, deterministic archive.
``store``: where archives are kept (``$GPUCLOUD_HOME/code`` or ``s3://BUCKET/code/``).
``unpack``: a node fetches, verifies and unpacks one into its cache, and copies it per attempt.
``setup_env``: ``submit --setup CMD`` runs in a virtualenv cached per node and requirements hash.
docs/code-shipping.md tells the user's side of it.
"""
