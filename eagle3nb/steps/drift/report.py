"""05_drift's reading of the train x serve matrix: seed means and spreads, the diagonal check, and
the recommendation computed from it (no model here: numbers in, numbers and sentences out)."""

from __future__ import annotations

__all__ = ["matrix_block", "recommend"]


def _mean(xs):
    return sum(xs) / len(xs)


def matrix_block(cells: dict, cols: list[str], offset_row: str) -> dict:
    """The matrix as metrics.json keeps it.

    Args:
        cells: ``{(train source, serve source): [AcceptanceStats.summary() per seed]}``; the
            row ``offset_row`` is the reference's drafters fed the layer-offset boundaries.
        cols: source keys in order (rows: the same, then ``offset_row`` when present).

    Returns:
        ``{"rows", "cols", "tau", "tau_spread", "a1", "a1_spread", "tau_seeds"}`` (lists of rows;
        spread = half the range over seeds, the noise bar), and ``"diagonal"``: per serve source
        whether train = serve is at least as high as every other trained row within the noise
        (``lines``: one sentence each, naming where it does not hold).
    """
    rows = [r for r in cols] + ([offset_row] if any(k[0] == offset_row for k in cells) else [])

    def grid(f):
        return [[f(cells[(r, c)]) if (r, c) in cells else None for c in cols] for r in rows]

    def tau(s):
        return [x["tau"] for x in s]

    def a1(s):
        return [x["per_position_acceptance"][0] for x in s]

    def spread(v):
        return (max(v) - min(v)) / 2

    out = {
        "rows": rows,
        "cols": cols,
        "tau": grid(lambda s: round(_mean(tau(s)), 4)),
        "tau_spread": grid(lambda s: round(spread(tau(s)), 4)),
        "tau_seeds": grid(lambda s: [round(x, 4) for x in tau(s)]),
        "a1": grid(lambda s: round(_mean(a1(s)), 4)),
        "a1_spread": grid(lambda s: round(spread(a1(s)), 4)),
    }
    out["diagonal"] = _diagonal(out)
    return out


def _diagonal(m: dict) -> dict:
    """For each serve column: is the diagonal (trained on that source) >= every other trained
    row, allowing the two cells' noise bars?"""
    lines, holds = [], {}
    for j, col in enumerate(m["cols"]):
        i = m["rows"].index(col)
        d, dn = m["tau"][i][j], m["tau_spread"][i][j]
        worse = []
        for r, row in enumerate(m["cols"]):  # trained rows only (the offset row is a baseline)
            if row != col and m["tau"][r][j] > d + dn + m["tau_spread"][r][j]:
                worse.append(f"{row} {m['tau'][r][j]:.3f}")
        holds[col] = not worse
        if worse:
            lines.append(
                f"served on {col}: the diagonal ({d:.3f} +- {dn:.3f}) is below {', '.join(worse)} "
                "beyond the seed noise bars: training on this source's own states did not help "
                "here (short training on a few samples; read with the noise bars)"
            )
        else:
            lines.append(
                f"served on {col}: the diagonal ({d:.3f} +- {dn:.3f}) is at least as high as "
                "every other trained row within the seed noise bars"
            )
    return {"holds": holds, "lines": lines}


def recommend(m: dict, reference: str, offset_row: str) -> dict:
    """What the matrix says, per serve source: the drift drop (reference-trained drafter served
    there vs on the reference: other greedy outputs too, so read it with care; the within-column
    numbers compare the same sequences), the offset drop (reference-trained drafter fed the offset
    boundaries vs the right ones, same source), and the gain of training on that source's own
    states; ``lines`` turns them into advice, the noise bar deciding.

    Returns:
        ``{"per_source": {col: {drift_drop, offset_drop, train_on_serving_gain, noise}},
        "lines": [str]}`` (tau units).
    """
    rows, cols = m["rows"], m["cols"]
    ri, rj = rows.index(reference), cols.index(reference)
    per, lines = {}, []
    for j, col in enumerate(cols):
        if col == reference:
            continue
        i = rows.index(col)
        ref_here, noise = m["tau"][ri][j], max(m["tau_spread"][ri][j], m["tau_spread"][i][j])
        rec = {
            "drift_drop": round(m["tau"][ri][rj] - ref_here, 4),
            "train_on_serving_gain": round(m["tau"][i][j] - ref_here, 4),
            "noise": round(noise, 4),
        }
        if offset_row in rows:
            rec["offset_drop"] = round(ref_here - m["tau"][rows.index(offset_row)][j], 4)
        per[col] = rec
        gain = rec["train_on_serving_gain"]
        off = (
            f"; the layer offset would cost {rec['offset_drop']:+.3f}"
            if "offset_drop" in rec
            else ""
        )
        if gain > noise:
            lines.append(
                f"serving on {col}: train on its own states: {gain:+.3f} tau over the float32 "
                f"reference drafter (noise +-{noise:.3f}){off}"
            )
        else:
            lines.append(
                f"serving on {col}: the float32 reference drafter serves as well (training on "
                f"its own states: {gain:+.3f}, within noise +-{noise:.3f}){off}: fix the "
                "layer ids first"
            )
    return {"per_source": per, "lines": lines}
