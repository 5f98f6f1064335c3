"""The pure plan of a stack, from its validated stack file: per node group the instance types,
launch templates, zones, EFA layout, placement and cost. The Pulumi program builds resources from
it and ``gpucloud plan`` prints it, so both always agree. No Pulumi import here.
"""
