"""Engine speed, notebook side, for every engine (vLLM and SGLang): an engine's own extraction
seconds (:class:`TimedCapture`) and generation, prefill and extraction tokens/s with and without
capture (:func:`measure_speed`, as 02a and 02b call it: :func:`speed_settings`)."""

from __future__ import annotations

import time
from typing import Sequence

from eagle3nb import timing

__all__ = [
    "GENERATE_PROMPTS",
    "SPEED_SAMPLES",
    "PASS_REPEATS",
    "TimedCapture",
    "measure_speed",
    "speed_settings",
]


class TimedCapture:
    """Wraps an engine client's ``capture``, adding up its seconds and tokens (the engine's own
    extraction speed: transfer included, disk writes of the dataset excluded)."""

    def __init__(self, client):
        self.client, self.seconds, self.tokens = client, 0.0, 0

    def info(self) -> dict:
        return self.client.info()

    def capture(self, samples, layer_ids):
        t0 = time.perf_counter()
        out = self.client.capture(samples, layer_ids)
        self.seconds += time.perf_counter() - t0
        self.tokens += sum(len(s) for s in samples)
        return out


GENERATE_PROMPTS = 128  # prompts timed for generation speed: a CPU engine runs ~128 at once
# samples timed for prefill and extraction speed (12 calls of 32): the measurement is a second
# and third pass over them, so it must not grow with the dataset (3 records per prompt since the
# default job's sampled continuations)
SPEED_SAMPLES = 384
# times each pass runs when the two kinds cannot alternate call by call (vLLM: one engine per kind);
# the fastest pass of each kind is kept. One pass of 384 samples is ~1.5 s here, and a shared 2-core
# machine swung vLLM's single-pass ratio from 0.95 to 1.34 between runs of the same job
# (2026-12-03); 3 passes of 128 cost what one pass of 384 did.
PASS_REPEATS = 3
ROUNDS = 4  # alternated calls (SGLang) split into this many rounds for the ratio's spread


def speed_settings(interleave: bool) -> dict:
    """:func:`measure_speed`'s ``repeats`` and ``speed_samples`` as 02a and 02b run it: alternating
    calls (SGLang) one pass over :data:`SPEED_SAMPLES`; separate engine passes (vLLM)
    :data:`PASS_REPEATS` passes over a third of them (the same number of calls)."""
    repeats = 1 if interleave else PASS_REPEATS
    return {"repeats": repeats, "speed_samples": SPEED_SAMPLES // repeats}


def measure_speed(
    client,
    prompts: Sequence[Sequence[int]],
    samples: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_token_ids,
    seed: int,
    capture,
    dataset_seconds: float = 0.0,
    dataset_tokens: int = 0,
    batch_size: int = 32,
    generate_kw: dict | None = None,
    interleave: bool = False,
    generate_prompts: int = GENERATE_PROMPTS,
    speed_samples: int = SPEED_SAMPLES,
    repeats: int = 1,
) -> dict:
    """An engine's tokens/s in this run, each engine warm (engine starts and first calls excluded).

    - generation: the first ``generate_prompts`` prompts, greedy, in one call;
    - prefill without capture: the first ``speed_samples`` samples, one generated token each, in
      calls of ``batch_size``;
    - extraction: the same calls through ``capture`` (``samples -> states``, transfer to this
      process included), timed again here rather than taken from the dataset's pass, whose first
      calls pay the engine's warm-up and whose calls alternate with shard writes.

    With ``interleave`` (one engine serves both kinds of request, as SGLang's capture engine does
    with ``generate_kw={"on_capture_engine": True}``) the two passes alternate call by call, so a
    change of machine load hits both alike. Otherwise (vLLM builds another engine for each kind)
    the capture pass runs first, on the capture engine the dataset pass left running, then the
    plain engine's pass; with ``repeats`` > 1 each of the two passes runs that many times in a row
    and the fastest of each kind is kept (best-of-n, as ``timeit`` reports: a slower pass is the
    machine's interference, not the engine), all pass times reported in ``pass_seconds``.
    ``capture_overhead_ratio`` = prefill tokens/s / extraction tokens/s.
    ``dataset_seconds`` / ``dataset_tokens`` (the dataset pass, :class:`TimedCapture`) are
    reported as ``dataset_pass_tokens_per_s``, first calls and writes' interleaving included.

    Returns:
        ``{"generate_tokens_per_s", "generated_tokens", "generate_prompts",
        "prefill_tokens_per_s_without_capture", "extract_tokens_per_s",
        "capture_overhead_ratio", "capture_overhead" (:meth:`eagle3nb.timing.Measured.as_dict`
        of the ratio per round: alternated calls in :data:`ROUNDS` rounds, or pass i of each
        kind, then disturbed: not turn about), "generate_tokens_per_s_is" (one pass),
        "speed_samples", "speed_tokens", "dataset_pass_tokens_per_s",
        "ratio_is", "plain_engine", "pass_seconds", "hidden_states_transport"?}``.

    Raises:
        ValueError: ``repeats`` < 1, or > 1 with ``interleave`` (alternating calls already pair
            the two kinds under the same load).
    """
    if repeats < 1 or (repeats > 1 and interleave):
        raise ValueError(
            f"repeats={repeats}: use 1 with interleave=True, or >= 1 for separate engine passes"
        )
    kw = dict(generate_kw or {})
    samples = samples[: max(1, speed_samples)]
    batches = [samples[i : i + batch_size] for i in range(0, len(samples), batch_size)]

    def plain(xs):
        return client.generate(xs, 1, [], 0.0, 1.0, seed, **kw)

    secs = {capture: 0.0, plain: 0.0}  # seconds per kind of request
    passes = {capture: [], plain: []}  # seconds of each whole pass (separate passes only)
    pairs = []  # (tokens, plain s, tokens, capture s) per alternated batch

    def timed(fn, xs) -> float:
        t0 = time.perf_counter()
        fn(xs)
        dt = time.perf_counter() - t0
        secs[fn] += dt
        return dt

    def fastest_pass(fn) -> None:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for xs in batches:
                fn(xs)
            passes[fn].append(time.perf_counter() - t0)
        secs[fn] = min(passes[fn])

    capture(batches[0])  # warm-up: the capture engine is running and has seen a batch
    if interleave:
        plain(batches[0])
        for i, xs in enumerate(batches):  # alternate which kind goes first
            got = {
                fn: timed(fn, xs) for fn in ((capture, plain) if i % 2 == 0 else (plain, capture))
            }
            n = sum(len(s) for s in xs)
            pairs.append((n, got[plain], n, got[capture]))
    else:
        fastest_pass(capture)
    gen = [list(x) for x in prompts[: max(1, generate_prompts)]]
    client.generate(gen[:1], 1, [], 0.0, 1.0, seed, **kw)  # warms (or starts) the plain engine
    t0 = time.perf_counter()
    outs = client.generate(gen, max_new_tokens, stop_token_ids, 0.0, 1.0, seed, **kw)
    gen_s = time.perf_counter() - t0
    if not interleave:
        fastest_pass(plain)
    n_tok = sum(len(s) for s in samples)
    n_gen = sum(len(o) for o in outs)
    pre = n_tok / secs[plain] if secs[plain] else None
    ext = n_tok / secs[capture] if secs[capture] else None
    how = client.info(live=True).get("hidden_states_transport")  # SGLang: tensor or float lists
    what = "capture overhead (prefill tokens/s without capture / with), per round"
    if interleave:
        over = timing.summarize(timing.paired_ratios(pairs, ROUNDS), what, neutral=1.0)
    else:  # pass i of each kind: one engine at a time, the kinds at different moments
        ratios = [c / q for c, q in zip(passes[capture], passes[plain]) if q]
        why = "one engine per kind, all capture passes first, then the plain ones"
        over = timing.summarize(ratios, what, neutral=1.0, unpaired=why)
    order = (
        "alternating call by call"
        if interleave
        else "capture pass, then the plain pass"
        if repeats == 1
        else f"the fastest of {repeats} capture passes, then of {repeats} plain passes"
    )
    return {
        "generate_tokens_per_s": round(n_gen / gen_s, 1) if gen_s else None,
        "generated_tokens": n_gen,
        "generate_prompts": len(gen),
        "prefill_tokens_per_s_without_capture": round(pre, 1) if pre else None,
        "extract_tokens_per_s": round(ext, 1) if ext else None,
        "capture_overhead_ratio": round(pre / ext, 3) if pre and ext else None,
        "capture_overhead": over.as_dict(),  # the ratio per round: median, spread, verdict
        "generate_tokens_per_s_is": timing.summarize(
            [n_gen / gen_s] if gen_s else [], "generation", unit="tokens/s"
        ).text(1),
        "speed_samples": len(samples),
        "speed_tokens": n_tok,
        "dataset_pass_tokens_per_s": (
            round(dataset_tokens / dataset_seconds, 1) if dataset_seconds else None
        ),
        "ratio_is": f"prefill tokens/s without capture / with aux capture returned to the notebook (the same samples in the same calls of {batch_size}, both engines warm, {order}; engine starts excluded)",
        "plain_engine": (
            "the capture engine, requests without hidden states (aux clones in its forward run)"
            if kw.get("on_capture_engine")
            else "a plain engine (no capture configured)"
        ),
        "pass_seconds": (
            None
            if interleave
            else {
                k: [round(t, 6) for t in passes[fn]]
                for k, fn in (("capture", capture), ("plain", plain))
            }
        ),
        **({"hidden_states_transport": how} if how else {}),
    }
