"""The node agent (``gpucloud agent``): claims gang slots, runs attempts under the supervisor."""
