"""CrossGuard policies for gpucloud stacks.

Each policy is a plain function (``instances``, ``network_access``, ``encryption``, ``buckets``,
``iam_statements``, ``efa_security_group``, ``tagging``); ``pack.POLICIES`` lists them for the pack
entry point (``__main__.py``, used by ``pulumi preview --policy-pack src/gpucloud/policy``) and
``runner.run_policies`` applies them offline to resources recorded under Pulumi mocks.
"""
