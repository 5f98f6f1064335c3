"""Dollars per job: what each attempt cost on the nodes it ran on, what the interruptions wasted,
and what the same hours would have cost on demand.

Pure: the job's attempts and timeline (``queue.attempts``/``queue.events``) and a price lookup in,
a ``JobCost`` out; no clock (``now`` prices a running attempt), no file, no network.

What is priced: each gang member's ``started`` and ``exit`` events carry the node it ran on
(``node``: instance type, AZ, region, life cycle from IMDS; ``jobs/runner.py``), and the time
between them is that node's *wall time* on the attempt. A member with no ``exit`` (its agent died,
or it is still running) ends with the attempt (``ended_at``), or at ``now`` while it runs.

Definitions (docs/cost.md, "Dollars per job"):

* *price in force*: the lookup's hourly price for the node's instance type, region, AZ and life
  cycle at the time the node started the attempt, with its source (spot price history where
  known, else the estimate, else on-demand), as the catalog says. Where the spot price history
  changes the price during the node's wall time (the lookup's ``changes``), each part of that time
  is priced at the price then in force (``price_periods``); ``usd_per_hour`` is then their
  time-weighted mean.
* ``cost_usd`` = Σ over the attempt's nodes of price × wall time (of each part, price by price).
* ``on_demand_equivalent_usd`` = Σ over the same nodes of the on-demand price × wall time;
  ``savings_usd`` = on-demand equivalent − cost, ``savings_pct`` = savings / on-demand equivalent.
* ``cost_lost_usd`` of an interrupted attempt k (one that was requeued, crashed, lost its lease,
  or that ``job resume`` continued) = *lost steps' share* + *restart overhead*:

  - the *interruption* is the first stop notice attempt k saw (a ``notice`` with a deadline), or
    else the end of attempt k (a crash, a lost lease);
  - *lost steps' share* = the dollars of k's nodes from k's training start (its ``resume`` event,
    else its start) to the interruption × (steps lost / steps k completed), steps lost being k's
    furthest step − the step k+1 resumed from (``cost/timeline.py``; all of it while k+1 has not
    resumed: nothing is known to be kept);
  - *restart overhead* time = k+1's ``resume`` event − the interruption; its dollars are the part
    of that interval the job paid for: k's nodes after the interruption (the save, the stop) plus
    k+1's nodes from their start to k+1's resume (boot of the command, the restore). The wait in
    between, with no node on the job, costs the job nothing and is reported in seconds only.

  So ``cost_lost_usd`` is a part of ``cost_usd`` (of attempts k and k+1), never more than it.

Unknown instance type, region or price: that node's, attempt's and job's dollars are None with a
reason, never a guess (a job that ran before nodes were recorded says so).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from pydantic import BaseModel

from gpucloud.catalog import Catalog
from gpucloud.lifecycle.model import Attempt, AttemptState, Event, Job, steps_lost

SECONDS_PER_HOUR = 3600.0
ON_DEMAND = "on-demand"
_INTERRUPTED = (AttemptState.REQUEUED, AttemptState.CRASHED, AttemptState.LOST)
_ENDED = (AttemptState.FAILED, AttemptState.CANCELLED)  # interrupted only when `job resume` continued it


class PriceLike(Protocol):
    """What ``catalog.hourly_price`` returns: the hourly price, where it came from, and its date."""

    @property
    def usd_per_hour(self) -> float: ...

    @property
    def source(self) -> str: ...

    @property
    def as_of(self) -> Any: ...


# hourly_price(instance_type, region, lifecycle, az=None, at=None) -> Price; None or an exception
# when the catalog has no price (both reported as the reason, never a crash).
PriceLookup = Callable[..., PriceLike | None]


class PricePeriod(BaseModel):
    """A price in force from ``from_at`` until the next period (or the node's end)."""

    from_at: float
    usd_per_hour: float


class NodeCost(BaseModel):
    """One node's share of one attempt."""

    node: str  # the agent's worker id, else the instance id, else "unknown"
    instance_id: str | None = None
    instance_type: str | None = None
    lifecycle: str | None = None
    availability_zone: str | None = None
    region: str | None = None
    started_at: float
    ended_at: float
    wall_s: float
    usd_per_hour: float | None = None  # the price in force (its time-weighted mean when it changed)
    price_periods: list[PricePeriod] = []  # the spot prices in force, where the history changed it meanwhile
    price_source: str | None = None
    price_as_of: str | None = None
    cost_usd: float | None = None
    on_demand_usd_per_hour: float | None = None
    on_demand_equivalent_usd: float | None = None
    unknown_reason: str | None = None  # why it has no cost


class AttemptCost(BaseModel):
    attempt: int
    nodes: list[NodeCost]
    cost_usd: float | None
    on_demand_equivalent_usd: float | None
    savings_usd: float | None
    savings_pct: float | None
    cost_lost_usd: float | None  # lost steps' share + restart overhead (0 when not interrupted)
    lost_steps_usd: float | None = None
    restart_overhead_s: float | None = None  # interruption -> attempt k+1's resume (None: not resumed yet)
    restart_overhead_usd: float | None = None
    price_sources: list[str]
    unknown_reason: str | None = None


class JobCost(BaseModel):
    job_id: str
    cost_usd: float | None
    cost_lost_usd: float | None
    on_demand_equivalent_usd: float | None
    savings_usd: float | None
    savings_pct: float | None
    price_sources: list[str]  # every source a priced node used, e.g. ["spot-history"] or ["estimate", "on-demand"]
    attempts: list[AttemptCost]
    unknown_reasons: list[str] = []  # why the totals are None


# ----------------------------------------------------------------------------------- node spans


class _Span:
    __slots__ = ("end", "key", "node", "start")

    def __init__(self, key: str, node: dict[str, Any], start: float, end: float) -> None:
        self.key, self.node, self.start, self.end = key, node, start, max(start, end)

    def overlap(self, lo: float, hi: float) -> float:
        return max(0.0, min(self.end, hi) - max(self.start, lo))


def _node_key(node: dict[str, Any]) -> str:
    for name in ("worker", "instance_id"):
        value = node.get(name)
        if isinstance(value, str) and value:
            return value
    return "unknown"


def _spans(attempt: Attempt, events: list[Event], now: float) -> list[_Span]:
    """Each node's wall time on ``attempt``: its ``started`` event to its ``exit`` event."""
    default_end = attempt.ended_at if attempt.ended_at is not None else now
    if attempt.state is not AttemptState.RUNNING and attempt.ended_at is None:
        default_end = attempt.started_at if attempt.started_at is not None else now
    starts: dict[str, tuple[float, dict[str, Any]]] = {}
    exits: dict[str, float] = {}
    for event in events:
        node = event.data.get("node")
        if not isinstance(node, dict):
            continue
        key = _node_key(node)
        if event.kind == "started" and key not in starts:
            starts[key] = (event.at, node)
        elif event.kind == "exit" and key not in exits:
            exits[key] = event.at
    if starts:
        return [_Span(key, node, at, exits.get(key, default_end)) for key, (at, node) in starts.items()]
    # Recorded before nodes were (or off EC2): the attempt's own times, on nodes nobody named.
    if attempt.started_at is None:
        return []
    return [_Span("unknown", {}, attempt.started_at, default_end)]


# ---------------------------------------------------------------------------------------- prices


def _lookup(prices: PriceLookup, node: dict[str, Any], lifecycle: str, at: float) -> tuple[PriceLike | None, str]:
    instance_type, az = node.get("instance_type"), node.get("availability_zone")
    region = node.get("region") or (az[:-1] if isinstance(az, str) and len(az) > 1 else None)
    if not instance_type:
        return None, "no instance type recorded (it ran before gpucloud recorded nodes, or off EC2)"
    if not region:
        return None, f"no region recorded for its {instance_type}"
    try:
        price = prices(str(instance_type), str(region), lifecycle, az=az, at=at)
    except Exception as err:  # noqa: BLE001 - an unknown type or region is an unknown price, never a crash
        return None, f"no {lifecycle} price for {instance_type} in {region}: {' '.join(str(err).split())[:200]}"
    if price is None:
        return None, f"no {lifecycle} price for {instance_type} in {region}"
    usd = price.usd_per_hour
    if not isinstance(usd, (int, float)) or usd != usd or usd < 0 or usd == float("inf"):
        return None, f"the catalog's {lifecycle} price for {instance_type} in {region} is not a price ({usd!r})"
    return price, ""


def _as_of(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return str(value)


def _node_cost(span: _Span, prices: PriceLookup) -> NodeCost:
    node = span.node
    lifecycle = node.get("lifecycle")
    az = node.get("availability_zone")
    hours = (span.end - span.start) / SECONDS_PER_HOUR
    facts = NodeCost(
        node=span.key,
        instance_id=node.get("instance_id"),
        instance_type=node.get("instance_type"),
        lifecycle=lifecycle,
        availability_zone=az,
        region=node.get("region") or (az[:-1] if isinstance(az, str) and len(az) > 1 else None),
        started_at=span.start,
        ended_at=span.end,
        wall_s=span.end - span.start,
    )
    if not lifecycle and node.get("instance_type"):
        return facts.model_copy(update={"unknown_reason": "no life cycle (spot or on-demand) recorded"})
    price, why = _lookup(prices, node, str(lifecycle or ON_DEMAND), span.start)
    if price is None:
        return facts.model_copy(update={"unknown_reason": why})
    periods = [PricePeriod(from_at=span.start, usd_per_hour=float(price.usd_per_hour))]
    for at in _changes(prices, node, str(lifecycle), span.start, span.end):
        later, why = _lookup(prices, node, str(lifecycle), at)
        if later is None:
            return facts.model_copy(update={"unknown_reason": why})
        periods.append(PricePeriod(from_at=at, usd_per_hour=float(later.usd_per_hour)))
    cost = _integral(periods, span.start, span.end)
    od_price, _ = (price, "") if lifecycle == ON_DEMAND else _lookup(prices, node, ON_DEMAND, span.start)
    return facts.model_copy(
        update={
            "usd_per_hour": float(price.usd_per_hour) if len(periods) == 1 else cost / hours,
            "price_periods": periods if len(periods) > 1 else [],
            "price_source": str(price.source),
            "price_as_of": _as_of(price.as_of),
            "cost_usd": cost,
            "on_demand_usd_per_hour": None if od_price is None else float(od_price.usd_per_hour),
            "on_demand_equivalent_usd": None if od_price is None else float(od_price.usd_per_hour) * hours,
        }
    )


def _changes(prices: PriceLookup, node: dict[str, Any], lifecycle: str, lo: float, hi: float) -> list[float]:
    """When the lookup's price changes inside (lo, hi): its ``changes`` where it has one (the
    catalog's spot history), else never (one price per node, the one in force at its start)."""
    changes = getattr(prices, "changes", None)
    instance_type, az = node.get("instance_type"), node.get("availability_zone")
    region = node.get("region") or (az[:-1] if isinstance(az, str) and len(az) > 1 else None)
    if changes is None or lifecycle != "spot" or not instance_type or not region or hi <= lo:
        return []
    try:
        return sorted(at for at in changes(str(instance_type), str(region), az, lo, hi) if lo < at < hi)
    except Exception:  # noqa: BLE001 - no history to follow: the price at the start holds
        return []


def _integral(periods: list[PricePeriod], lo: float, hi: float) -> float:
    """The dollars of ``periods`` (sorted, the first in force from before ``lo``) over [lo, hi]."""
    total = 0.0
    for period, following in zip(periods, [*periods[1:], None], strict=True):
        start = max(lo, period.from_at)
        end = min(hi, following.from_at if following is not None else hi)
        if end > start:
            total += period.usd_per_hour * (end - start) / SECONDS_PER_HOUR
    return total


# ------------------------------------------------------------------------------------------ cost


def _sum(values: Iterable[float | None]) -> float | None:
    total = 0.0
    for value in values:
        if value is None:
            return None
        total += value
    return total


def _savings(cost: float | None, on_demand: float | None) -> tuple[float | None, float | None]:
    if cost is None or on_demand is None:
        return None, None
    saved = on_demand - cost
    return saved, (100.0 * saved / on_demand if on_demand > 0 else None)


def _priced(spans: list[_Span], costs: list[NodeCost], lo: float, hi: float) -> float | None:
    """The dollars of these nodes inside [lo, hi]; None when one that ran there has no price."""
    total = 0.0
    for span, cost in zip(spans, costs, strict=True):
        seconds = span.overlap(lo, hi)
        if seconds <= 0:
            continue
        if cost.usd_per_hour is None:
            return None
        periods = cost.price_periods or [PricePeriod(from_at=span.start, usd_per_hour=cost.usd_per_hour)]
        total += _integral(periods, max(lo, span.start), min(hi, span.end))
    return total


def _first(events: Iterable[Event], kind: str) -> Event | None:
    return next((e for e in events if e.kind == kind), None)


def job_cost(job: Job, attempts: list[Attempt], events: list[Event], prices: PriceLookup, *, now: float) -> JobCost:
    """Price every attempt of ``job`` on the nodes it ran on (module docstring: the definitions)."""
    by_attempt: dict[int, list[Event]] = {}
    for event in events:
        by_attempt.setdefault(event.attempt, []).append(event)
    numbers = {a.number: a for a in attempts}
    spans = {a.number: _spans(a, by_attempt.get(a.number, []), now) for a in attempts}
    node_costs = {n: [_node_cost(s, prices) for s in ss] for n, ss in spans.items()}

    rows: list[AttemptCost] = []
    for attempt in attempts:
        evs, nodes = by_attempt.get(attempt.number, []), node_costs[attempt.number]
        cost = _sum(n.cost_usd for n in nodes)
        on_demand = _sum(n.on_demand_equivalent_usd for n in nodes)
        saved, pct = _savings(cost, on_demand)
        unknown = next((f"attempt {attempt.number}: {n.unknown_reason}" for n in nodes if n.unknown_reason), None)
        following = numbers.get(attempt.number + 1)
        interrupted = attempt.state in _INTERRUPTED or (attempt.state in _ENDED and following is not None)
        lost: tuple[float | None, float | None, float | None] = (0.0, None, 0.0)
        if interrupted and following is not None:
            lost = _lost(attempt, evs, spans, node_costs, following, by_attempt.get(following.number, []))
        elif interrupted:  # no k+1 (out of attempts, or not resumed): everything it did is lost
            lost = (_priced(spans[attempt.number], nodes, float("-inf"), float("inf")), None, 0.0)
        lost_steps_usd, overhead_s, overhead_usd = lost
        rows.append(
            AttemptCost(
                attempt=attempt.number,
                nodes=nodes,
                cost_usd=cost,
                on_demand_equivalent_usd=on_demand,
                savings_usd=saved,
                savings_pct=pct,
                cost_lost_usd=_sum((lost_steps_usd, overhead_usd)),
                lost_steps_usd=lost_steps_usd,
                restart_overhead_s=overhead_s,
                restart_overhead_usd=overhead_usd,
                price_sources=sorted({n.price_source for n in nodes if n.price_source}),
                unknown_reason=unknown,
            )
        )
    total = _sum(r.cost_usd for r in rows)
    total_od = _sum(r.on_demand_equivalent_usd for r in rows)
    saved, pct = _savings(total, total_od)
    reasons = [r.unknown_reason for r in rows if r.unknown_reason]
    reasons += [
        f"attempt {r.attempt}: no on-demand price to compare with"
        for r in rows
        if r.cost_usd is not None and r.on_demand_equivalent_usd is None
    ]
    return JobCost(
        job_id=job.id,
        cost_usd=total,
        cost_lost_usd=_sum(r.cost_lost_usd for r in rows),
        on_demand_equivalent_usd=total_od,
        savings_usd=saved,
        savings_pct=pct,
        price_sources=sorted({s for r in rows for s in r.price_sources}),
        attempts=rows,
        unknown_reasons=reasons,
    )


def _lost(
    attempt: Attempt,
    evs: list[Event],
    spans: dict[int, list[_Span]],
    node_costs: dict[int, list[NodeCost]],
    following: Attempt,
    next_events: list[Event],
) -> tuple[float | None, float | None, float | None]:
    """(lost steps' share, restart overhead seconds, restart overhead dollars) of interrupted ``attempt``."""
    notice = next((e for e in evs if e.kind == "notice" and e.data.get("deadline") is not None), None)
    end = attempt.ended_at if attempt.ended_at is not None else following.created_at
    interrupted_at = notice.at if notice is not None else end
    resume = _first(evs, "resume")
    train_start = resume.at if resume is not None else attempt.started_at
    next_resume = _first(next_events, "resume")
    own, own_costs = spans[attempt.number], node_costs[attempt.number]

    lost_share = 1.0  # nothing known to be kept until k+1 resumes
    if next_resume is not None and attempt.last_step is not None:
        lost = steps_lost(attempt.last_step, following.resumed_step)
        done = attempt.last_step - (attempt.resumed_step or 0)
        lost_share = 0.0 if not lost else (min(1.0, lost / done) if done > 0 else 1.0)
    trained = _priced(own, own_costs, train_start, interrupted_at) if train_start is not None else 0.0
    lost_steps_usd = None if trained is None else trained * lost_share

    horizon = next_resume.at if next_resume is not None else float("inf")
    after = _priced(own, own_costs, interrupted_at, float("inf"))
    restarting = _priced(spans[following.number], node_costs[following.number], float("-inf"), horizon)
    overhead_s = max(0.0, next_resume.at - interrupted_at) if next_resume is not None else None
    return lost_steps_usd, overhead_s, _sum((after, restarting))


# ------------------------------------------------------------------------------- the price lookup


class CatalogPrices:
    """The price lookup ``job show`` and ``jobs`` use: the catalog's ``hourly_price`` (by region;
    spot from the AZ's price history in force at a time where ``catalog refresh`` stored one, else
    the estimate labelled ``spot-estimate``; on-demand; capacity-block), and ``changes``: when that
    history changes the spot price over a node's time (``spot_price_changes``). Epoch times, as
    this module works in, turned into the UTC datetimes the catalog takes."""

    def __init__(self, catalog: Catalog | None = None) -> None:
        self.catalog = catalog

    def __call__(
        self, instance_type: str, region: str, lifecycle: str, az: str | None = None, at: float | None = None
    ) -> PriceLike:
        from gpucloud.catalog.pricing import hourly_price

        return hourly_price(instance_type, region, lifecycle, az=az, at=_utc(at), catalog=self.catalog)

    def changes(self, instance_type: str, region: str, az: str | None, lo: float, hi: float) -> list[float]:
        from gpucloud.catalog.pricing import spot_price_changes

        found = spot_price_changes(instance_type, region, az, _utc(lo), _utc(hi), catalog=self.catalog)  # type: ignore[arg-type]
        return [at.timestamp() for at in found]


def _utc(at: float | None) -> datetime.datetime | None:
    return None if at is None else datetime.datetime.fromtimestamp(at, tz=datetime.timezone.utc)


def catalog_prices(catalog: Catalog | None = None) -> PriceLookup:
    """``CatalogPrices`` over ``catalog`` (the bundled one by default)."""
    return CatalogPrices(catalog)
