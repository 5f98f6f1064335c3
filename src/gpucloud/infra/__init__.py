"""The cluster as Pulumi code: the components and the program that wires them.

The pure planning these build from lives below: ``gpucloud.cluster`` (EFA layouts, addressing,
hourly cost, scaling and monitoring plans, tags, the contracts with the agent and the drill) and
``gpucloud.planning`` (the whole plan of a validated stack file).
Components, one concern each: ``network``, ``security``, ``storage``, ``compute``, ``jobplane``,
``iam``, ``scaling``, ``budget``, ``drill``, ``expiry``, ``image``; ``ami`` and ``userdata`` feed the
launch templates. Monitoring per stack: ``monitoring`` (which mode builds what),
``monitoring_selfhosted``, ``monitoring_managed`` and ``monitoring_iam``.
``program.build_cluster`` wires them from a ``ClusterSpec``; ``__main__`` is the Pulumi entry
point and ``preview`` runs the same program offline under mocks (``gpucloud plan``);
``automation`` drives a real stack (``pulumi up``/``destroy``) for teardown and the drill.
"""
