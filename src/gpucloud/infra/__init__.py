"""The cluster as Pulumi code.

Pure planning (no Pulumi import): ``efa_layout`` (network interfaces per instance type),
``addressing`` (subnets), ``cost``, ``planning`` (the whole plan of a spec).
Components, one concern each: ``network``, ``security``, ``storage``, ``compute``, ``jobplane``,
``iam``; ``ami`` and ``userdata`` feed the launch templates; ``tags`` is shared. Monitoring per
stack: ``monitoring`` (which mode builds what), ``monitoring_selfhosted``, ``monitoring_managed``,
``monitoring_iam`` and the pure ``monitoring_plan`` (series, TSDB size, hourly cost).
``program.build_cluster`` wires them from a ``ClusterSpec``; ``__main__`` is the Pulumi entry
point and ``preview`` runs the same program offline under mocks (``gpucloud plan``).
"""
