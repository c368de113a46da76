"""Speed figures as measurements: several rounds, their median and spread, a bound check and a
verdict (a leaf: standard library only). Every tokens/s and ratio the workbook prints goes
through :func:`summarize`.

Why: one timed pass with and without the drafter at different moments lets any other load on a
shared machine land on one side; the main job once printed a 6.55x speedup for a drafter of tau
3.67 (issue 43). A greedy chain speculative decoder cannot beat tau (each cycle emits at most tau
tokens for at least one target forward), nor k + 1 ever. So a figure is **measured** only when it
comes from at least :data:`MIN_ROUNDS` rounds, its median is within its bound, and its spread
(max - min over the rounds) is narrower than its effect (|median - 1| for a ratio); otherwise it
is **disturbed**, with why, and never printed as a result. One timed pass is **one pass**: a
number, not a measurement.

:func:`alternate` times two functions turn about (which goes first alternates too), so a change
of load hits both sides alike; a ratio per round is then the ratio of the two sides' summed rates
over the pairs of that round (:func:`paired_ratios`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

__all__ = [
    "MIN_ROUNDS",
    "MEASURED",
    "DISTURBED",
    "ONE_PASS",
    "CPU_NOTE",
    "Measured",
    "summarize",
    "round_rates",
    "paired_ratios",
    "timed_pair",
    "alternate",
]

MIN_ROUNDS = 3  # fewer rounds give no spread worth judging a figure by
MEASURED, DISTURBED, ONE_PASS = "measured", "disturbed", "one pass"
CPU_NOTE = (
    "on CPU with a tiny target these figures show the plumbing, not the gain (a 260K target costs "
    "about as much per forward as its drafter)"
)


@dataclass(frozen=True)
class Measured:
    """One speed figure over rounds.

    Attributes:
        what: what the figure is, e.g. ``"speedup (tokens/s with / without the drafter)"``.
        unit: ``"x"`` for a ratio, ``"tokens/s"`` for a rate.
        values: the figure of each round, in the order timed.
        median, low, high: median, min and max of ``values`` (None without values).
        spread: ``high - low`` (None without values).
        bound: the largest value the figure can take (None: none known), ``bound_is`` why.
        neutral: the figure of no effect (1.0 for a ratio; None for a rate).
        verdict: :data:`MEASURED`, :data:`DISTURBED` or :data:`ONE_PASS`; ``why`` says why
            (None when measured).
        note: what the figure is worth where it was taken (e.g. :data:`CPU_NOTE`), or None.
    """

    what: str
    unit: str
    values: tuple[float, ...]
    median: float | None
    low: float | None
    high: float | None
    spread: float | None
    bound: float | None
    bound_is: str | None
    neutral: float | None
    verdict: str
    why: str | None
    note: str | None = None

    @property
    def rounds(self) -> int:
        return len(self.values)

    @property
    def ok(self) -> bool:
        """True when the figure is a measurement (verdict :data:`MEASURED`)."""
        return self.verdict == MEASURED

    @property
    def figure(self) -> float | None:
        """The median when measured, else None: what a table or plot may show as a result."""
        return self.median if self.ok else None

    def text(self, digits: int = 3) -> str:
        """``"1.234x (1.201-1.260 over 5 rounds)"``, ``"disturbed: <why>"`` or ``"one pass: 1.234x
        (no spread)"``: how every table prints the figure."""
        u = "x" if self.unit == "x" else f" {self.unit}"
        if self.median is None:
            return f"{self.verdict}: {self.why}"
        m = f"{self.median:.{digits}f}{u}"
        if self.verdict == ONE_PASS:
            return f"one pass: {m} (no spread; not a measurement)"
        if self.verdict == DISTURBED:
            return f"disturbed: {self.why}"
        return f"{m} ({self.low:.{digits}f}-{self.high:.{digits}f} over {self.rounds} rounds)"

    def as_dict(self) -> dict:
        """JSON-ready (metrics.json, bench JSON): every field, ``rounds`` and ``text`` added."""
        d = asdict(self)
        d["values"] = [round(v, 6) for v in self.values]
        for key in ("median", "low", "high", "spread"):
            d[key] = None if d[key] is None else round(d[key], 6)
        return dict(d, rounds=self.rounds, text=self.text())


def summarize(
    values: Sequence[float],
    what: str,
    unit: str = "x",
    bound: float | None = None,
    bound_is: str | None = None,
    neutral: float | None = None,
    max_rel_spread: float | None = None,
    note: str | None = None,
    unpaired: str | None = None,
) -> Measured:
    """The figure of ``values`` (one per round) with its verdict.

    Verdict, first that applies: no value -> disturbed; one value -> one pass; fewer than
    :data:`MIN_ROUNDS` -> disturbed; ``unpaired`` given -> disturbed; median above ``bound`` -> disturbed ("median 6.550 is above
    its bound 3.670 (tau ...)"); ``neutral`` given and the spread wider than |median - neutral|
    -> disturbed; ``max_rel_spread`` given and spread / median above it -> disturbed; else
    measured.

    Args:
        values: the figure per round (ratios, or tokens/s), finite numbers.
        bound: the figure's largest possible value, e.g. tau (greedy chain decoding) and never
            above k + 1; ``bound_is`` names it in the message.
        neutral: the value of no effect (1.0 for a ratio of the same work with and without).
        max_rel_spread: for a rate without a neutral value: the largest spread / median allowed.
        unpaired: why the two sides of a ratio were not timed turn about (None: they were).

    Raises:
        ValueError: a value that is not a finite number.
    """
    vals = tuple(float(v) for v in values)
    if any(v != v or v in (float("inf"), float("-inf")) for v in vals):
        raise ValueError(f"values={list(vals)}: every round's figure must be a finite number")
    if not vals:
        return Measured(what, unit, (), None, None, None, None, bound, bound_is, neutral,
                        DISTURBED, "no round was timed", note)  # fmt: skip
    med, lo, hi = statistics.median(vals), min(vals), max(vals)
    spread = hi - lo
    why, verdict = None, DISTURBED
    u = "x" if unit == "x" else f" {unit}"
    if len(vals) == 1:
        verdict, why = ONE_PASS, "one timed pass: no rounds, no spread"
    elif len(vals) < MIN_ROUNDS:
        why = f"{len(vals)} rounds, fewer than {MIN_ROUNDS}: no spread to judge it by"
    elif unpaired:
        why = f"not timed turn about: {unpaired}"
    elif bound is not None and med > bound:
        why = (
            f"median {med:.3f}{u} is above its bound {bound:.3f}{u} ({bound_is or 'bound'}): "
            "other load landed on one side"
        )
    elif neutral is not None and spread > abs(med - neutral):
        why = (
            f"spread {spread:.3f} ({lo:.3f}-{hi:.3f} over {len(vals)} rounds) is wider than the "
            f"effect abs({med:.3f} - {neutral:g}) = {abs(med - neutral):.3f}"
        )
    elif max_rel_spread is not None and med > 0 and spread / med > max_rel_spread:
        why = (
            f"spread {spread:.1f}{u} ({lo:.1f}-{hi:.1f} over {len(vals)} rounds) is "
            f"{100 * spread / med:.0f}% of the median, over {100 * max_rel_spread:.0f}%"
        )
    else:
        verdict = MEASURED
    return Measured(what, unit, vals, med, lo, hi, spread, bound, bound_is, neutral, verdict,
                    why, note)  # fmt: skip


def round_rates(
    pairs: Sequence[tuple[float, float, float, float]], rounds: int
) -> tuple[list[float], list[float]]:
    """Each side's rate per round from alternated pairs: pair i belongs to round ``i % rounds``
    (so each round samples the whole set, not one stretch of it), and a side's rate in a round is
    its summed work / summed seconds over that round's pairs.

    Args:
        pairs: ``(work_a, seconds_a, work_b, seconds_b)`` per alternated pair (:func:`alternate`).
        rounds: how many rounds (fewer when there are fewer pairs).

    Returns:
        ``(rates of a, rates of b)``, one per round that has time on both sides.
    """
    n = max(1, min(int(rounds), len(pairs)))
    acc = [[0.0, 0.0, 0.0, 0.0] for _ in range(n)]
    for i, pr in enumerate(pairs):
        for j, v in enumerate(pr):
            acc[i % n][j] += float(v)
    keep = [x for x in acc if x[1] > 0 and x[3] > 0] if pairs else []
    return [ta / sa for ta, sa, _, _ in keep], [tb / sb for _, _, tb, sb in keep]


def paired_ratios(pairs: Sequence[tuple[float, float, float, float]], rounds: int) -> list[float]:
    """Per-round ratio rate_a / rate_b of :func:`round_rates` (e.g. a = with the drafter, b =
    without: the speedup of each round), for rounds where b did work."""
    ra, rb = round_rates(pairs, rounds)
    return [a / b for a, b in zip(ra, rb) if b > 0]


def timed_pair(
    a: Callable[[], float],
    b: Callable[[], float],
    a_first: bool,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float, float, float]:
    """``(work_a, seconds_a, work_b, seconds_b)`` of one call of each, back to back, ``a`` first
    when ``a_first`` (each returns the work it did, e.g. tokens)."""
    got = {}
    for side in (0, 1) if a_first else (1, 0):
        t0 = clock()
        work = (a, b)[side]()
        got[side] = (float(work), clock() - t0)
    return (*got[0], *got[1])


def alternate(
    a: Callable[[int], float],
    b: Callable[[int], float],
    n: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[tuple[float, float, float, float]]:
    """Time ``a(i)`` and ``b(i)`` turn about for i in 0..n-1, ``a`` first for even i and ``b``
    first for odd i, so a change of load hits both sides alike.

    Args:
        a, b: called with the pair index; each returns the work it did (tokens).

    Returns:
        ``(work_a, seconds_a, work_b, seconds_b)`` per pair, for :func:`paired_ratios`.
    """
    return [timed_pair(lambda: a(i), lambda: b(i), i % 2 == 0, clock) for i in range(n)]
