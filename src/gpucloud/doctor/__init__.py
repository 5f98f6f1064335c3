"""``gpucloud doctor``: is this node what the stack promised? Checks are pure functions over
captured command outputs (``checks.py``); ``collect.py`` is the thin part that runs the commands."""
