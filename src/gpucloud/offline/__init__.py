"""Everything that lets gpucloud run offline on one machine, as a product feature.

The IMDS emulator (``gpucloud imds-emulator``: a node's metadata service that announces spot
notices on demand), the demo (``gpucloud demo``: a training job noticed, saved, requeued and
resumed), and the local fleet (``gpucloud drill --local``: agents sharing one queue, a gang job
noticed on one of them). Tests and benchmarks use these through this package.
"""
