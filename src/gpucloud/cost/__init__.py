"""What jobs cost, in steps, seconds and dollars.

``timeline``: what one job's records say (attempts, interruptions, steps and time lost; ``job show``);
``job_cost``: a job's dollars per attempt and node; ``report*``: the daily training-efficiency report
(``gpucloud report``); ``estimate`` and ``goodput``: the pre-deploy estimate (``gpucloud estimate``).
"""
