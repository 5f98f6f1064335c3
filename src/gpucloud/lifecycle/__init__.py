"""A job's life, below every place that stores or runs jobs.

`model` holds what a job is (its record, states, attempts, events); `transitions` decides what a
request (claim, heartbeat, end, cancel, resume, stop) changes. Both are pure: the SQLite and the
SQS + DynamoDB queues only store the change a transition returns, under their own atomic condition.
"""
