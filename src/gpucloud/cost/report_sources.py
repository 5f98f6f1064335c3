"""Where ``gpucloud report``'s inputs come from: the window, the queue's records, Prometheus, prices.

The I/O half of the report (``cost/report.py`` is the pure half).
"""

from __future__ import annotations

import datetime
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

from gpucloud.cost.report import IDLE_BELOW_PCT, SECONDS_PER_HOUR, CostFunction, JobCostTotals, JobHistory, Utilisation
from gpucloud.errors import UserError
from gpucloud.lifecycle.model import JobState, NodeRecord
from gpucloud.payload import parse_json, preview

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
SINCE_RULE = "a duration back from now (30m, 24h, 7d, 2w) or an ISO 8601 time (2026-11-23T08:00:00Z)"


def parse_since(text: str, *, now: float) -> float:
    """``--since``: the window's start, as epoch seconds, or a one-line ``UserError``."""
    value = text.strip()
    match = _DURATION.fullmatch(value)
    if match:
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
        if seconds <= 0:
            raise UserError(f"--since {text!r} is an empty window; give {SINCE_RULE}")
        return now - seconds
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"--since {text[:60]!r} is not {SINCE_RULE}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)  # a time without a zone is read as UTC
    start = moment.timestamp()
    if start >= now:
        raise UserError(f"--since {text[:60]!r} is in the future; give {SINCE_RULE}")
    return start


def read_histories(queue: Any, since: float) -> Iterator[JobHistory]:
    """Every job possibly active since ``since`` with its attempts and timeline, one at a time.

    The embedded queue reads them in chunks of jobs, three queries a chunk
    (``SqliteQueue.histories_since``). Other backends list the jobs and read each job that was not
    over before ``since``: a terminal job not updated since then ended before the window (its
    ``updated_at`` is at least its last attempt's end). On the AWS queue that is a GetItem and a
    Query for each of attempts and events: DynamoDB has no join across the jobs' partitions."""
    bulk = getattr(queue, "histories_since", None)
    if bulk is not None:
        for job, attempts, events in bulk(since):
            yield JobHistory(job, attempts, events)
        return
    for job in queue.list_jobs():
        if job.state in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED) and job.updated_at < since:
            continue
        yield JobHistory(job, queue.attempts(job.id), queue.events(job.id))


def job_cost_function(*, now: float) -> CostFunction:
    """The per-job cost: ``cost/job_cost.py``'s ``job_cost`` (each attempt's nodes priced at the
    price in force, spot history where known, else the estimate; ``job show`` prints the same), over
    the catalog's prices. None where it knows no price (reported as unknown, never a guess)."""
    from gpucloud.cost.job_cost import catalog_prices, job_cost

    prices = catalog_prices()

    def cost_of(history: JobHistory, nodes: Mapping[str, NodeRecord]) -> JobCostTotals | None:
        figure = job_cost(history.job, history.attempts, history.events, prices, now=now)
        if figure.cost_usd is None:
            return None
        return JobCostTotals(
            cost_usd=figure.cost_usd,
            cost_lost_usd=figure.cost_lost_usd,
            on_demand_equivalent_usd=figure.on_demand_equivalent_usd,
            price_source=", ".join(figure.price_sources) or None,
        )

    return cost_of


# --------------------------------------------------------------------------------- Prometheus

# Each GPU's utilisation averaged over each step, kept only while an attempt of a job runs on its
# instance, labelled with that job: the agent's gpucloud_attempt_running{job_id, instance_id} joined
# on instance_id (the label every node series carries, monitoring/names.py), as the job dashboard does.
UTIL_QUERY = (
    "avg_over_time(DCGM_FI_DEV_GPU_UTIL[{step}s])\n"
    "* on (instance_id) group_left (job_id)\n"
    "(max by (instance_id, job_id) (gpucloud_attempt_running) == 1)"
)
# Prometheus refuses a range query of more than 11,000 points per series
# (https://prometheus.io/docs/prometheus/latest/querying/api/#range-queries); stay well under.
MAX_POINTS = 5000
MAX_ANSWER_BYTES = 256 << 20  # a query_range answer: 5000 points per GPU series
MIN_STEP_S = 60


def range_step(since: float, until: float) -> int:
    return max(MIN_STEP_S, int(-(-(until - since) // MAX_POINTS)))


def read_utilisation(url: str, *, since: float, until: float, timeout_s: float = 60.0) -> Utilisation:
    """GPU utilisation per job over the window, from Prometheus's HTTP API (``/api/v1/query_range``,
    https://prometheus.io/docs/prometheus/latest/querying/api/#range-queries), or a one-line ``UserError``."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise UserError(f"--prometheus {url[:80]!r} is not an http(s):// URL (e.g. http://localhost:9090)")
    step = range_step(since, until)
    params = urllib.parse.urlencode(
        {"query": UTIL_QUERY.format(step=step), "start": f"{since:.3f}", "end": f"{until:.3f}", "step": str(step)}
    )
    request = urllib.request.Request(f"{base}/api/v1/query_range?{params}", headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # the scheme is checked above
            raw = response.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as err:
        raise UserError(f"Prometheus at {base} refused the utilisation query: HTTP {err.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise UserError(f"cannot read GPU utilisation from Prometheus at {base}: {err}") from None
    if len(raw) > MAX_ANSWER_BYTES:
        raise UserError(f"Prometheus at {base} answered with more than {MAX_ANSWER_BYTES} bytes; narrow --since")
    body = parse_json(raw, f"the answer of Prometheus at {base}", UserError)  # deep nesting, huge numbers: one line
    return utilisation_from_matrix(body, source=base, step_s=step, since=since, until=until)


def utilisation_from_matrix(
    body: Any, *, source: str, step_s: float, since: float | None = None, until: float | None = None
) -> Utilisation:
    """Per-job mean utilisation and idle GPU-hours (samples below ``IDLE_BELOW_PCT`` × step), and the
    mean over every GPU at each step, from a query_range answer (one series per GPU and job).

    The answer is checked as it is read: a document that is not a matrix is one ``UserError``; a
    series or sample that is not the documented shape (``[<unix time>, "<value>"]``), a value that
    is not a finite number (a string, ``+Inf``, JSON's ``Infinity``), or a time that is not finite
    or lies outside the window asked for (by more than a step) is left out, so one bad sample
    neither crashes the report nor skews it."""
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise UserError(f"Prometheus at {source} answered the utilisation query with an error: {_short(error or body)}")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise UserError(f"Prometheus at {source} answered with a {_short(kind)}, not a matrix")
    result = data.get("result")
    if not isinstance(result, list):
        raise UserError(f"Prometheus at {source} answered a matrix whose result is not a list")
    low = -math.inf if since is None else since - step_s
    high = math.inf if until is None else until + step_s
    sums: dict[str, list[float]] = {}  # job -> [sum of samples, samples, idle samples]
    at_time: dict[float, list[float]] = {}
    for series in result:
        metric = series.get("metric") if isinstance(series, dict) else None
        job_id = metric.get("job_id") if isinstance(metric, dict) else None
        values = series.get("values") if isinstance(series, dict) else None
        if not isinstance(job_id, str) or not isinstance(values, list):
            continue
        acc = sums.setdefault(job_id, [0.0, 0.0, 0.0])
        for sample in values:
            point_at, value = _sample(sample)
            if point_at is None or value is None or not low <= point_at <= high:
                continue
            acc[0] += value
            acc[1] += 1
            acc[2] += 1 if value < IDLE_BELOW_PCT else 0
            point = at_time.setdefault(point_at, [0.0, 0.0])
            point[0] += value
            point[1] += 1
    per_job = {job: (s / n, idle * step_s / SECONDS_PER_HOUR) for job, (s, n, idle) in sums.items() if n}
    series_out = [(at, s / n) for at, (s, n) in sorted(at_time.items())]
    return Utilisation(source=source, per_job=per_job, series=series_out)


def _sample(sample: Any) -> tuple[float | None, float | None]:
    """(time, value) of one ``[<unix time>, "<value>"]`` pair; None for a part that is not one."""
    if not isinstance(sample, (list, tuple)) or len(sample) != 2:
        return None, None
    return _finite(sample[0]), _finite(sample[1])


def _finite(raw: Any) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        return None
    try:
        value = float(raw)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _short(value: Any) -> str:
    """One line of at most 200 characters: text as it is, anything else as JSON."""
    return " ".join((value if isinstance(value, str) else preview(value)).split())[:200]
