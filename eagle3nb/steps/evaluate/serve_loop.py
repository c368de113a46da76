"""04's serving loop: each drafter served per category, k and batch size through one engine
worker, and the same engine without the drafter on a second worker, call by call turn about, so
the speedup is a measurement (:mod:`eagle3nb.timing`): several rounds, their median and spread,
never above its bound (tau of that serving; k + 1), else printed as disturbed with why.

Why two workers: a vLLM or SGLang worker runs one engine at a time (a switch between the plain
and the EAGLE-3 engine rebuilds it), so with and without the drafter can alternate call by call
only on two workers. Every setting pairs the calls of ``speed_prompts`` prompts spread over the
set (all of them when the set is smaller), and says so: why not every call is 04's time (issue 43:
no longer than before the rounds). The plain outputs of those prompts are the engine's own greedy
check (served output == plain output); every prompt's served output is also compared with HF's
greedy output where the simulator ran (``mismatches_vs_hf_greedy``).
"""

from __future__ import annotations

import math
import time

from eagle3nb import timing
from eagle3nb.training.progress import fmt_seconds

__all__ = ["ALL", "ENGINE_COUNTERS", "SPEED_ROUNDS", "SPEED_PROMPTS", "speed_bound", "serve_engine"]

ALL = "all"  # the category of every prompt served (the speed rows of the table)
SPEED_ROUNDS = 5  # defaults of the parameters speed_rounds and speed_prompts (params/schema.py)
SPEED_PROMPTS = 16
# SGLang's own counters, summed over requests (eagle3nb/engines/sglang_serve.py sum_counters)
ENGINE_COUNTERS = (
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "completion_tokens",
    "spec_correct_drafts_histogram",
)


def _chunks(idx: list[int], b: int) -> list[list[int]]:
    return [idx[i : i + b] for i in range(0, len(idx), b)]


def _add(acc: dict, r: dict, secs: float, n_out: int) -> None:
    """Sum one engine call's counters into ``acc`` (per category)."""
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        acc[key] = acc.get(key, 0) + int(r[key])
    per = acc.setdefault("accepted_per_pos", [0] * len(r["accepted_per_pos"]))
    for i, a in enumerate(r["accepted_per_pos"]):
        per[i] += int(a)
    ec = acc.setdefault("engine_counters", {})
    for key in ENGINE_COUNTERS:  # SGLang's own per-request meta_info sums (vLLM has none)
        v = r.get(key)
        if isinstance(v, list):
            ec[key] = [x + int(y) for x, y in zip(ec.get(key, [0] * len(v)), v)]
        elif v is not None:
            ec[key] = ec.get(key, 0) + int(v)
    _add_time(acc, secs, n_out)


def _add_time(acc: dict, secs: float, n_out: int) -> None:
    acc["seconds"] = acc.get("seconds", 0.0) + secs
    acc["calls"] = acc.get("calls", 0) + 1
    acc["tokens"] = acc.get("tokens", 0) + n_out


def _merged(accs) -> dict:
    """Counters of several categories summed (the ``all`` row)."""
    out: dict = {}
    for a in list(accs):
        for key, v in a.items():
            if isinstance(v, list):
                out[key] = [x + y for x, y in zip(out.get(key, [0] * len(v)), v)]
            elif isinstance(v, dict):
                d = out.setdefault(key, {})
                for kk, vv in v.items():
                    if isinstance(vv, list):
                        d[kk] = [x + y for x, y in zip(d.get(kk, [0] * len(vv)), vv)]
                    else:
                        d[kk] = d.get(kk, 0) + vv
            else:
                out[key] = out.get(key, 0) + v
    return out


def _summary(acc: dict, k: int) -> dict:
    """tau, per-position acceptance and speed of summed counters (vLLM's and SGLang's own)."""
    nd = max(acc["num_drafts"], 1)
    out = {
        "tau": round(1 + acc["num_accepted_tokens"] / nd, 4),
        "per_position_acceptance": [round(a / nd, 4) for a in acc["accepted_per_pos"][:k]],
        "cycles": acc["num_drafts"],
        "emitted_tokens": acc["tokens"],
        "tokens_per_s": round(acc["tokens"] / acc["seconds"], 2) if acc["seconds"] else None,
        "latency_s": round(acc["seconds"] / acc["calls"], 4),
        "counters": {
            key: acc[key]
            for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos")
        },
    }
    ec = acc.get("engine_counters")
    if ec:
        out["engine_counters"] = ec
        if ec.get("spec_verify_ct"):  # SGLang's own accept length, its definition
            out["engine_accept_length"] = round(ec["completion_tokens"] / ec["spec_verify_ct"], 4)
    return out


def speed_bound(tau: float, k: int) -> tuple[float, str]:
    """The largest speedup greedy chain decoding can give at this tau and k, and why: each cycle
    emits tau tokens on average for at least one target forward, and never more than k + 1."""
    if tau <= k + 1:
        return tau, f"tau {tau:.3f} of this serving: at most tau tokens per target forward"
    return float(k + 1), f"k + 1 = {k + 1}"


def _spaced(n: int, m: int) -> set[int]:
    """``m`` indices of ``range(n)`` spread evenly (all when m >= n)."""
    if m >= n:
        return set(range(n))
    return {int(j * n / m) for j in range(m)}


def _speed(pairs: list, rounds: int, tau: float, k: int, how: str, note: str | None) -> dict:
    """The speed block of an ``all`` row: speedup and each side's tokens/s over rounds."""
    with_, without = timing.round_rates(pairs, rounds)
    bound, bound_is = speed_bound(tau, k)
    sp = timing.summarize(
        timing.paired_ratios(pairs, rounds),
        "speedup (tokens/s with / without the drafter)",
        bound=bound,
        bound_is=bound_is,
        neutral=1.0,
        note=note,
    )
    rate = dict(unit="tokens/s", max_rel_spread=0.5, note=note)
    return {
        "speedup": sp.as_dict(),
        "tokens_per_s": timing.summarize(with_, "with the drafter", **rate).as_dict(),
        "plain_tokens_per_s": timing.summarize(without, "without the drafter", **rate).as_dict(),
        "pairs": len(pairs),
        "timed_on": how,
    }  # fmt: skip


def _plain_pass(plain, prompts, order, max_new, eos) -> tuple[list, dict]:
    """The plain engine over ``order``'s chunks, timed per call: ``(outputs, {cat: acc})``."""
    outs, acc = [None] * len(prompts), {}
    for cat, ch in order:
        t0 = time.perf_counter()
        got = plain.generate([list(prompts[i]) for i in ch], max_new, eos, 0.0, 1.0, 0)
        _add_time(acc.setdefault(cat, {}), time.perf_counter() - t0, sum(len(o) for o in got))
        for i, o in zip(ch, got):
            outs[i] = list(o)
    return outs, acc


def serve_engine(
    client,
    engine: str,
    drafters: dict,
    prompts,
    cats,
    batch_sizes,
    max_new,
    eos,
    plain=None,
    rounds: int = SPEED_ROUNDS,
    speed_prompts: int = SPEED_PROMPTS,
    log=None,
    note: str | None = timing.CPU_NOTE,
):
    """Serve each drafter of ``drafters`` (``{label: (folder, [k, ...], [batch size, ...])}``)
    through ``client``'s engine for each of its k and batch sizes, per category; the same prompts
    without a drafter through ``plain`` (a second worker of the same engine), call by call turn
    about (module docstring).

    Args:
        prompts: token id lists; ``cats``: the category of each (``"heldout"`` for 01's prompts).
        plain: the plain worker; None: ``client`` serves the plain pass after the drafters (one
            worker: with and without at different moments, so each speedup is one pass, never
            a measurement).
        rounds: the paired calls split into this many rounds (pair i in round i % rounds).
        speed_prompts: prompts paired (timed turn about, and greedy-checked against the plain
            worker) per setting, spread over the set; all of them when fewer.
        log: ``log(text)`` for progress lines (engine, drafter, k, batch size, prompts done, ETA).
        note: what the figures are worth here (:data:`eagle3nb.timing.CPU_NOTE` on CPU).

    Returns:
        ``(runs, outputs)``: ``runs`` a list of dicts (engine, engine_version, drafter, k,
        batch_size, category, tau, per_position_acceptance, cycles, counters, tokens_per_s,
        plain_tokens_per_s, speedup (the median of the rounds when measured, else None),
        latency_s, plain_latency_s, greedy_mismatches; the ``all`` rows also ``speed``:
        :func:`eagle3nb.timing.Measured.as_dict` of the speedup and of each side's tokens/s);
        ``outputs[(label, k, b)]`` the served outputs per prompt, ``outputs["plain", b]`` the
        plain ones.
    """
    info = client.info()
    runs, outputs, plain_acc, pairs_of = [], {}, {}, {}
    settings = [(lb, d[0], k, b) for lb, d in drafters.items() for k in d[1] for b in d[2]]
    if plain is not None:
        plain.generate([list(prompts[0])], 2, eos, 0.0, 1.0, 0)  # warm-up (engine start untimed)
    prog = _Progress(log, f"{engine} {info['engine_version']}", len(settings) * len(prompts))
    warm = None
    for label, folder, k, b in settings:
        if warm != (label, k):
            w0 = time.perf_counter()
            client.serve_acceptance(folder, [list(prompts[0])], k, 2, eos)  # warm-up
            warm, prog.t0 = (label, k), prog.t0 + time.perf_counter() - w0  # ETA: serving only
        order = _order(cats, b)
        full = plain is not None and ("plain", b) not in outputs  # the first setting at b
        paired = set() if plain is None else _spaced(len(order), math.ceil(speed_prompts / b))
        call = (client, plain, folder, k, max_new, eos)
        outs, pouts, by_cat, pacc, pairs = _serve_setting(call, prompts, order, paired, prog,
                                                          f"{label}, k={k}, batch size {b}")  # fmt: skip
        if full:
            outputs["plain", b], plain_acc[b] = pouts, {**pacc, ALL: _merged(pacc.values())}
        by_cat[ALL] = _merged(by_cat.values())
        outputs[label, k, b] = outs
        pairs_of[label, k, b] = (pairs, sum(len(order[j][1]) for j in paired))
        for cat, acc in by_cat.items():
            runs.append(dict(engine=engine, engine_version=info["engine_version"], drafter=label,
                             k=k, batch_size=b, category=cat, **_summary(acc, k)))  # fmt: skip
    if plain is None:  # one worker: the plain pass after the drafters, at another moment
        for b in batch_sizes:
            client.generate([list(prompts[0])], 2, eos, 0.0, 1.0, 0)  # warm-up
            outputs["plain", b], acc = _plain_pass(client, prompts, _order(cats, b), max_new, eos)
            plain_acc[b] = {**acc, ALL: _merged(acc.values())}
    _finish(runs, outputs, plain_acc, pairs_of, cats, rounds, speed_prompts, note)
    return runs, outputs


def _order(cats, b: int) -> list[tuple[str, list[int]]]:
    """``(category, prompt indices)`` per engine call: chunks of ``b`` within each category."""
    return [(c, ch) for c in dict.fromkeys(cats)
            for ch in _chunks([i for i, x in enumerate(cats) if x == c], b)]  # fmt: skip


class _Progress:
    """``log`` lines: prompts served of all settings, elapsed, ETA (every 10 s and per setting)."""

    def __init__(self, log, name: str, total: int):
        self.log, self.name, self.total, self.done = log, name, total, 0
        self.t0 = self.last = time.perf_counter()

    def add(self, n: int, what: str, end: bool) -> None:
        self.done += n
        now = time.perf_counter()
        if self.log and (now - self.last > 10 or end):
            el, self.last = now - self.t0, now
            eta = el * (self.total - self.done) / max(self.done, 1)
            self.log(f"{self.name}: {what}: {self.done}/{self.total} prompts served, "
                     f"{fmt_seconds(el)} elapsed, ETA {fmt_seconds(eta)}")  # fmt: skip


def _serve_setting(call, prompts, order, paired: set, prog: _Progress, what: str):
    """One drafter at one k and batch size over ``order``'s calls, the ``paired`` ones timed
    turn about with the plain worker. Returns ``(outputs, plain outputs, {cat: counters},
    {cat: plain timing}, pairs)``."""
    client, plain, folder, k, max_new, eos = call
    outs, pouts, by_cat, pacc, pairs = [None] * len(prompts), [None] * len(prompts), {}, {}, []
    for j, (cat, ch) in enumerate(order):
        qs, box = [list(prompts[i]) for i in ch], {}

        def serve(qs=qs, box=box):
            box["r"] = client.serve_acceptance(folder, qs, k, max_new, eos)
            return sum(len(o) for o in box["r"]["outputs"])

        def plain_call(qs=qs, box=box):
            box["p"] = plain.generate(qs, max_new, eos, 0.0, 1.0, 0)
            return sum(len(o) for o in box["p"])

        if j in paired:
            pr = timing.timed_pair(serve, plain_call, len(pairs) % 2 == 0)
            pairs.append(pr)
            _add_time(pacc.setdefault(cat, {}), pr[3], int(pr[2]))
            for i, o in zip(ch, box["p"]):
                pouts[i] = list(o)
        else:
            t0 = time.perf_counter()
            pr = (serve(), time.perf_counter() - t0)
        _add(by_cat.setdefault(cat, {}), box["r"], pr[1], int(pr[0]))
        for i, o in zip(ch, box["r"]["outputs"]):
            outs[i] = list(o)
        prog.add(len(ch), what, j == len(order) - 1)
    return outs, pouts, by_cat, pacc, pairs


def _finish(runs, outputs, plain_acc, pairs_of, cats, rounds, speed_prompts, note) -> None:
    """Plain speed, the speed block of the ``all`` rows and greedy mismatches, per run."""
    for r in runs:
        b = r["batch_size"]
        pa = plain_acc[b].get(r["category"])  # None: no prompt of it was paired
        ptps = pa["tokens"] / pa["seconds"] if pa and pa["seconds"] else None
        r["plain_tokens_per_s"] = round(ptps, 2) if ptps else None
        r["plain_latency_s"] = round(pa["seconds"] / max(pa["calls"], 1), 4) if pa else None
        r["speedup"] = None  # measured over the whole set only, below
        if r["category"] == ALL:
            pairs, n = pairs_of[r["drafter"], r["k"], b]
            if pairs:
                how = ("every call of the whole set" if n >= len(cats) else
                       f"the calls of {n} prompts spread over the set (a subset)")  # fmt: skip
                r["speed"] = _speed(pairs, rounds, r["tau"], r["k"], how, note)
            else:  # one worker: one pass each, at different moments
                one = r["tokens_per_s"] / ptps if r["tokens_per_s"] and ptps else None
                m = timing.summarize([one] if one else [], "speedup (tokens/s with / without "
                                     "the drafter, separate passes)", note=note)  # fmt: skip
                r["speed"] = {"speedup": m.as_dict(), "pairs": 0,
                              "timed_on": "one pass each, at different moments (one worker)"}  # fmt: skip
            sp = r["speed"]["speedup"]
            r["speedup"] = round(sp["median"], 3) if sp["verdict"] == timing.MEASURED else None
            for key in ("tokens_per_s", "plain_tokens_per_s"):
                if key in r["speed"] and r["speed"][key]["median"] is not None:
                    r[key] = round(r["speed"][key]["median"], 2)
        served = outputs[r["drafter"], r["k"], b]
        plain_out = outputs["plain", b]
        idx = [i for i, c in enumerate(cats) if r["category"] in (c, ALL)]
        idx = [i for i in idx if plain_out[i] is not None]  # the paired prompts (two workers)
        r["greedy_mismatches"] = sum(served[i] != plain_out[i] for i in idx)
        r["greedy_compared"] = len(idx)
