"""Where a job is queued: the queue protocol and its backends.

- ``protocol``: ``JobQueue`` and ``GangStore``, what every backend implements (the contract suite
  in ``tests/jobqueue`` runs against each).
- ``sqlite``: the embedded backend, one SQLite file; ``aws``: SQS slot messages + a DynamoDB table.
- ``gang``: the gang-slot decisions, once for every backend.
- ``connect``: the default queue, and how a queue URI becomes a queue.
"""
