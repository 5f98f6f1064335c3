"""gpucloud: AWS GPU training clusters as code, and spot-safe training on them."""

__version__ = "0.1.0"
