"""``measure_speed``'s arithmetic and call order, on a fake engine client and a fake clock: every
request advances the clock by a known number of seconds per token, so each tokens/s it reports is
known by hand."""

from __future__ import annotations

import pytest

from eagle3nb.engines import speed

PLAIN_S, CAPTURE_S, GEN_S = 1e-3, 3e-3, 1e-2  # fake seconds per token


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeClient:
    """Records every request; ``generate`` with 1 new token is a prefill, else a generation."""

    def __init__(self, clock: FakeClock):
        self.clock, self.calls = clock, []

    def generate(self, prompts, max_new, stops, temperature, top_p, seed, **kw):
        kind = "plain" if max_new == 1 else "gen"
        self.calls.append((kind, len(prompts), kw))
        if kind == "plain":
            self.clock.now += PLAIN_S * sum(len(p) for p in prompts)
            return [[7] for _ in prompts]
        self.clock.now += GEN_S * max_new * len(prompts)
        return [[7] * max_new for _ in prompts]

    def capture(self, samples):
        self.calls.append(("capture", len(samples), {}))
        self.clock.now += CAPTURE_S * sum(len(s) for s in samples)

    def info(self, live=False):
        return {"hidden_states_transport": "tensor"}


@pytest.mark.parametrize("interleave", [True, False])
def test_speeds_from_warm_calls_and_order(monkeypatch, interleave):
    clock = FakeClock()
    monkeypatch.setattr(speed.time, "perf_counter", clock)
    client = FakeClient(clock)
    samples = [[1] * (10 + i % 5) for i in range(70)]  # 3 calls of 32, 32, 6
    prompts = [[1, 2]] * 200
    kw = {"on_capture_engine": True} if interleave else {}
    r = speed.measure_speed(
        client, prompts, samples, 4, [0], 0, client.capture, 2.0, 500, 32, kw, interleave, 128
    )
    assert r["prefill_tokens_per_s_without_capture"] == pytest.approx(1 / PLAIN_S, abs=0.05)
    assert r["extract_tokens_per_s"] == pytest.approx(1 / CAPTURE_S, abs=0.05)
    assert r["capture_overhead_ratio"] == pytest.approx(CAPTURE_S / PLAIN_S, rel=1e-3)
    assert r["generate_tokens_per_s"] == pytest.approx(1 / GEN_S, abs=0.05)
    assert r["generated_tokens"] == 128 * 4 and r["generate_prompts"] == 128
    assert r["dataset_pass_tokens_per_s"] == 250.0
    kinds = [(k, n) for k, n, _ in client.calls]
    warm = [("capture", 32)]
    if interleave:  # one warm-up each, then capture/plain alternating which goes first
        timed = [("capture", 32), ("plain", 32), ("plain", 32), ("capture", 32)]
        timed += [("capture", 6), ("plain", 6)]
        assert kinds == warm + [("plain", 32)] + timed + [("plain", 1), ("gen", 128)]
        assert all(kw == {"on_capture_engine": True} for k, _, kw in client.calls if k != "capture")
    else:  # the capture engine's pass, then the plain engine (warm-up, generation, prefill)
        caps = [("capture", 32), ("capture", 32), ("capture", 6)]
        plains = [("plain", 32), ("plain", 32), ("plain", 6)]
        assert kinds == warm + caps + [("plain", 1), ("gen", 128)] + plains


def test_speed_passes_time_the_first_speed_samples_only(monkeypatch):
    """The timed prefill and extraction passes read the first ``speed_samples`` samples, whatever
    the dataset's size: 70 samples capped at 40 are the calls of 32 and 8, and the tokens/s are
    those of these 40 (their token count by hand)."""
    clock = FakeClock()
    monkeypatch.setattr(speed.time, "perf_counter", clock)
    client = FakeClient(clock)
    samples = [[1] * (10 + i % 5) for i in range(70)]
    r = speed.measure_speed(
        client, [[1, 2]] * 4, samples, 4, [0], 0, client.capture, 2.0, 500, 32, {}, False,
        speed_samples=40,
    )  # fmt: skip
    assert r["speed_samples"] == 40
    assert r["speed_tokens"] == sum(10 + i % 5 for i in range(40))
    assert r["capture_overhead_ratio"] == pytest.approx(CAPTURE_S / PLAIN_S, rel=1e-3)
    sizes = [n for k, n, _ in client.calls if k in ("capture", "plain")]
    assert sizes == [32, 32, 8, 1, 32, 8]  # warm-up, capture pass, plain warm-up, plain pass


def test_separate_passes_keep_the_fastest_of_repeats(monkeypatch):
    """vLLM's two kinds run on separate engines, so each pass runs ``repeats`` times in a row and
    the fastest is kept: a neighbour's load that slows one capture pass 2x and one plain pass 3x
    leaves the ratio at the engine's own CAPTURE_S / PLAIN_S; every pass time is reported."""
    clock = FakeClock()
    monkeypatch.setattr(speed.time, "perf_counter", clock)
    client = FakeClient(clock)
    slow = {("capture", 1): 2.0, ("plain", 2): 3.0}  # (kind, pass index) -> slowdown
    seen = {"capture": 0, "plain": 0}
    inner_cap, inner_gen = client.capture, client.generate

    def capture(xs):  # one call per pass (the samples fit one call of 32)
        t0 = clock.now
        inner_cap(xs)
        k = seen["capture"] = seen["capture"] + 1
        clock.now = t0 + (clock.now - t0) * slow.get(("capture", k - 2), 1.0)  # k=1: warm-up

    def generate(prompts, max_new, *a, **kw):
        t0 = clock.now
        out = inner_gen(prompts, max_new, *a, **kw)
        if max_new == 1 and len(prompts) > 1:  # a timed prefill pass (warm-up has 1 prompt)
            k = seen["plain"] = seen["plain"] + 1
            clock.now = t0 + (clock.now - t0) * slow.get(("plain", k - 1), 1.0)
        return out

    client.generate = generate
    samples = [[1] * 10 for _ in range(20)]  # 200 tokens per pass
    r = speed.measure_speed(
        client, [[1, 2]] * 4, samples, 4, [0], 0, capture, 2.0, 500, 32, {}, False, repeats=3
    )
    assert r["pass_seconds"]["capture"] == pytest.approx([0.6, 1.2, 0.6])  # 200 x 3e-3 s
    assert r["pass_seconds"]["plain"] == pytest.approx([0.2, 0.2, 0.6])  # 200 x 1e-3 s
    assert r["capture_overhead_ratio"] == pytest.approx(3.0, rel=1e-3)
    assert r["extract_tokens_per_s"] == pytest.approx(200 / 0.6, abs=0.05)
    assert "fastest of 3" in r["ratio_is"]
    # pass i of each kind: 0.6/0.2, 1.2/0.2, 0.6/0.6 -> median 3; never a measurement (the kinds
    # ran at different moments)
    over = r["capture_overhead"]
    assert over["values"] == pytest.approx([3.0, 6.0, 1.0]) and over["median"] == pytest.approx(3)
    assert over["text"] == (
        "disturbed: not timed turn about: one engine per kind, all capture passes first, then "
        "the plain ones"
    )


def test_alternated_calls_give_the_ratio_per_round(monkeypatch):
    """SGLang's alternated calls: 8 batches in 4 rounds (batch i in round i % 4), each round's
    ratio the engine's own CAPTURE_S / PLAIN_S: measured, spread 0."""
    clock = FakeClock()
    monkeypatch.setattr(speed.time, "perf_counter", clock)
    client = FakeClient(clock)
    samples = [[1] * 10 for _ in range(8 * 4)]  # 8 calls of 4
    r = speed.measure_speed(client, [[1, 2]] * 4, samples, 4, [0], 0, client.capture, 2.0, 500,
                            4, {"on_capture_engine": True}, True)  # fmt: skip
    over = r["capture_overhead"]
    assert over["rounds"] == 4 and over["values"] == pytest.approx([CAPTURE_S / PLAIN_S] * 4)
    assert over["verdict"] == "measured" and over["spread"] == pytest.approx(0, abs=1e-6)
    assert r["generate_tokens_per_s_is"].startswith("one pass: ")


def test_repeats_with_interleave_refused():
    """Alternating calls already pair both kinds under one load; repeats there is refused by name."""
    with pytest.raises(ValueError, match="repeats=3"):
        speed.measure_speed(None, [[1]], [[1]], 1, [0], 0, None, interleave=True, repeats=3)
