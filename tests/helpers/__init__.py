"""Helpers that tests in several folders share: waiting on a condition, hand-fed notices, job
histories, an isolated GPUCLOUD_HOME.

Imported as ``helpers.<module>`` (pytest puts ``tests/`` on ``sys.path``, as for ``cli_run`` and ``node_env``).
"""
