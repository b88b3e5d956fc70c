"""The adaptive rate: learn the rate at which a domain starts answering 429 (or
sending ban signals), settle a margin below it, and probe upward slowly and rarely.

Pure: no database, no clock (callers pass ``now``), no Scrapy. The state is a few
numbers meant to live in the domain's row, so every worker shares it and it
survives restarts; the functions return a new state and never mutate one.

The algorithm, after TCP CUBIC (RFC 9438) as the AWS SDKs' adaptive retry mode
applies it to request rates (``ClientRateLimiter``: the rate at the last throttle is
remembered, the decrease is multiplicative, growth is concave up to that rate and
convex beyond it), changed where a crawler's politeness differs from a client
maximising its throughput:

* **Remembered limit.** A throttle sets ``limit`` to the rate the domain was
  running at: the rate at which 429s begin.
* **Settle below it.** After a throttle the rate goes to ``margin`` times the limit
  (0.9) when the throttle ended a probe (the limit is confirmed: a small decrease),
  or to ``backoff`` times it (0.7, CUBIC's beta) when the limit was unknown or the
  throttle came at or below the settled rate (the site lowered its limit: back off
  harder). CUBIC returns to the old maximum within seconds and probes past it at
  once; here the rate *holds* at the settled rate for ``probe_interval`` seconds.
* **Probe slowly and rarely.** When the hold ends the rate climbs again, per
  success: ``probe_step`` of the limit per success far from the limit, ten times
  less within a few percent of it (concave below, convex above, as CUBIC). A probe
  that fails (a throttle above the settled rate) doubles the hold, up to
  ``probe_max_interval``; a probe that passes the old limit by the margin without a
  throttle found a higher limit: the hold resets to ``probe_min_interval`` and the
  rate keeps climbing until the next throttle or the configured rate (where the
  learned limit is forgotten).
* **One decrease per event.** Several workers, and the requests already in flight,
  report one overload many times and out of order: a throttle counts only if its
  request was sent after the last decrease (``sent_at``, as TCP reduces once per
  window) and at least ``cooldown`` seconds after it.
* **Growth per success, in batches.** Successes arrive as counts;
  ``on_success(s, now, p, ceiling=c, count=n)`` equals ``n`` single successes at
  ``now``, and a domain that sends nothing does not climb.

The rate always stays within ``[min_fraction * ceiling, ceiling]``, the ceiling
being the domain's configured rate. See docs/adaptive-rate.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

#: Relative tolerance when comparing a rate with the settled rate (floats).
_EPS = 1e-9


@dataclass(frozen=True)
class AdaptiveParams:
    """How the adaptive rate learns; the defaults are what the simulation in
    tests/test_adaptive_rate.py measures."""

    #: Settle at this fraction of the learned limit after a probe fails.
    margin: float = 0.9
    #: Multiplicative decrease when the limit is unknown or turns out lower than
    #: learned (a throttle at or below the settled rate).
    backoff: float = 0.7
    #: While below the settled rate: each success closes this fraction of the gap.
    recover_gain: float = 0.05
    #: While probing: a success adds this fraction of the learned limit...
    probe_step: float = 0.01
    #: ... times this (at least) within a few percent of the limit.
    probe_slow: float = 0.1
    #: Seconds of hold at the settled rate before the first probe...
    probe_min_interval: float = 30.0
    #: ... doubled after each failed probe, up to this.
    probe_max_interval: float = 180.0
    #: Throttles within this many seconds of the last decrease are the same event.
    cooldown: float = 2.0
    #: The rate never goes below this fraction of the configured rate.
    min_fraction: float = 0.05
    #: A lone throttle at the settled rate (none for ``probe_min_interval`` before
    #: it: a request the network or the site bunched with another, or a limit a
    #: little lower than learned) lowers the learned limit by this factor only.
    nudge: float = 0.95

    def __post_init__(self) -> None:
        for name in ("margin", "backoff", "recover_gain", "probe_step", "probe_slow", "nudge"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be within (0, 1), not {value!r}")
        if not 0.0 < self.min_fraction <= 1.0:
            raise ValueError(f"min_fraction must be within (0, 1], not {self.min_fraction!r}")
        if not 0.0 < self.probe_min_interval <= self.probe_max_interval < math.inf:
            raise ValueError(
                "need 0 < probe_min_interval <= probe_max_interval < inf, not "
                f"{self.probe_min_interval!r}, {self.probe_max_interval!r}"
            )
        if not 0.0 <= self.cooldown < math.inf:
            raise ValueError(f"cooldown must be >= 0 and finite, not {self.cooldown!r}")


@dataclass(frozen=True)
class AdaptiveState:
    """What a domain has learned; all zero for a domain never throttled (it runs
    at its configured rate). Floats only: one column each in the domain row."""

    #: Requests per second the domain runs at (meaningful when ``limit > 0``).
    rate: float = 0.0
    #: The rate at which the last counted throttle came; 0: none, or forgotten.
    limit: float = 0.0
    #: When the rate last decreased (throttles before it, or within the cooldown
    #: after it, are the same event).
    last_decrease_at: float = 0.0
    #: Seconds of hold between a decrease and the next probe; 0: not yet set.
    probe_interval: float = 0.0
    #: When the rate may climb above the settled rate again.
    next_probe_at: float = 0.0

    def as_dict(self) -> dict[str, float]:
        """The fields by name (JSON-able): the domain row's columns."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdaptiveState:
        """A state from :meth:`as_dict`; ValueError when a field is missing, not a
        number, negative or not finite (a stored state is never trusted blindly)."""
        values: dict[str, float] = {}
        for f in fields(cls):
            raw = data.get(f.name)
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise ValueError(f"adaptive state: {f.name} must be a number, not {raw!r}")
            value = float(raw)
            if not 0.0 <= value < math.inf:
                raise ValueError(f"adaptive state: {f.name} must be >= 0 and finite: {raw!r}")
            values[f.name] = value
        return cls(**values)


def _check_ceiling(ceiling: float) -> None:
    if not 0.0 < ceiling < math.inf:
        raise ValueError(f"the configured rate must be > 0 and finite, not {ceiling!r}")


def current_rate(state: AdaptiveState, ceiling: float, params: AdaptiveParams) -> float:
    """Requests per second the domain may run at now, ``ceiling`` being its
    configured rate. A function of the state only: a claim only reads it."""
    _check_ceiling(ceiling)
    if state.limit <= 0.0:
        return ceiling
    floor = params.min_fraction * ceiling
    return min(ceiling, max(floor, state.rate))


def current_burst(state: AdaptiveState, burst: int) -> int:
    """The token bucket's burst: the configured one until the domain has throttled
    us, then 1 (a site that meters requests may not accept several at once, and
    each quiet spell, a Retry-After pause among them, would let a burst through)."""
    return max(1, burst) if state.limit <= 0.0 else 1


def _grown(
    rate: float, count: int, *, limit: float, ceiling: float, probing: bool, p: AdaptiveParams
) -> float:
    """``rate`` after ``count`` successes, one at a time (a bounded loop: the
    far-from-limit part, where the step is constant, is added in one go)."""
    settle = p.margin * limit
    n = count
    while n > 0 and rate < ceiling:
        if rate < settle * (1 - _EPS):
            step = max(p.recover_gain * (settle - rate), p.probe_step * p.probe_slow * limit)
            rate = min(settle, rate + step)
            n -= 1
            continue
        if not probing:
            break
        distance = (rate / limit - 1.0) / (1.0 - p.margin)
        if distance >= 1.0:
            rate += p.probe_step * limit * n
            break
        rate += p.probe_step * limit * max(p.probe_slow, min(1.0, distance * distance))
        n -= 1
    return min(rate, ceiling)


def on_success(
    state: AdaptiveState,
    now: float,
    params: AdaptiveParams,
    *,
    ceiling: float,
    count: int = 1,
) -> AdaptiveState:
    """``count`` requests of the domain succeeded (reported together at ``now``):
    recover towards the settled rate, or probe above it once the hold has ended."""
    _check_ceiling(ceiling)
    if count <= 0 or state.limit <= 0.0:
        return state
    rate = current_rate(state, ceiling, params)
    probing = now >= state.next_probe_at
    grown = _grown(rate, count, limit=state.limit, ceiling=ceiling, probing=probing, p=params)
    if grown >= ceiling:
        # No limit below the configured rate any more: back to a fresh domain
        # (the last decrease stays, so late reports of that event stay ignored).
        return AdaptiveState(last_decrease_at=state.last_decrease_at)
    interval = state.probe_interval
    if grown * params.margin >= state.limit:
        interval = params.probe_min_interval  # the probe passed the old limit
    if grown == state.rate and interval == state.probe_interval:
        return state
    return AdaptiveState(
        rate=grown,
        limit=state.limit,
        last_decrease_at=state.last_decrease_at,
        probe_interval=interval,
        next_probe_at=state.next_probe_at,
    )


def on_throttle(
    state: AdaptiveState,
    now: float,
    params: AdaptiveParams,
    *,
    ceiling: float,
    sent_at: float | None = None,
) -> AdaptiveState:
    """A 429 or a ban signal from the domain, reported at ``now`` for a request
    sent (claimed) at ``sent_at`` when known: learn the limit and decrease, once
    per overload event."""
    _check_ceiling(ceiling)
    if state.limit > 0.0 or state.last_decrease_at > 0.0:
        if sent_at is not None and sent_at < state.last_decrease_at:
            return state  # sent at the old rate: this event was already counted
        if now - state.last_decrease_at < params.cooldown:
            return state
    observed = current_rate(state, ceiling, params)
    interval = state.probe_interval or params.probe_min_interval
    probing = state.limit > 0.0 and observed > params.margin * state.limit * (1 + _EPS)
    limit = observed
    if probing:
        # Above the settled rate: a probe found the limit. A small decrease,
        # and a longer hold before the next probe.
        rate = params.margin * observed
        interval = min(params.probe_max_interval, 2.0 * interval)
    elif state.limit > 0.0 and now - state.last_decrease_at >= params.probe_min_interval:
        # A lone throttle at (or below) the settled rate: jitter bunched two
        # requests, or the limit is a little lower than learned. Lower the limit a
        # little; a second throttle soon after backs off harder (below).
        limit = params.nudge * state.limit
        rate = min(params.margin * limit, params.nudge * observed)
    else:
        # First throttle, or another soon after a decrease at (or below) the
        # settled rate: the limit is lower than learned. Back off harder.
        rate = params.backoff * observed
    return AdaptiveState(
        rate=max(rate, params.min_fraction * ceiling),
        limit=limit,
        last_decrease_at=now,
        probe_interval=interval,
        next_probe_at=now + interval,
    )


def resume(state: AdaptiveState, now: float) -> AdaptiveState:
    """The state a new run of the job starts from: what was learned, held for one
    probe interval from ``now`` before the first probe."""
    if state.limit <= 0.0:
        return AdaptiveState()
    return AdaptiveState(
        rate=state.rate,
        limit=state.limit,
        last_decrease_at=0.0,
        probe_interval=state.probe_interval,
        next_probe_at=now + state.probe_interval,
    )


def phase(state: AdaptiveState, ceiling: float, now: float, params: AdaptiveParams) -> str:
    """One word for reports: ``configured`` (nothing learned), ``recovering``
    (below the settled rate), ``holding`` (at it, until ``next_probe_at``) or
    ``probing`` (above it, or free to climb)."""
    if state.limit <= 0.0:
        return "configured"
    rate = current_rate(state, ceiling, params)
    settle = params.margin * state.limit
    if rate < settle * (1 - _EPS):
        return "recovering"
    if now < state.next_probe_at and rate <= settle * (1 + _EPS):
        return "holding"
    return "probing"
