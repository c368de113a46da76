"""04's served table and figure: the markdown from a hand-made list of runs equals the text written
out here, and the figure holds the expected traces and values."""

import pytest

from eagle3nb import timing
from eagle3nb.viz import plots
from eagle3nb.viz.served import column_label, main_setting, served_figure, served_table


def _run(engine, version, drafter, k, bs, category, tau, **speed):
    r = {
        "engine": engine,
        "engine_version": version,
        "drafter": drafter,
        "k": k,
        "batch_size": bs,
        "category": category,
        "tau": tau,
        "per_position_acceptance": [0.5] * k,
        "cycles": 10,
    }
    keys = ("tokens_per_s", "plain_tokens_per_s", "speedup", "latency_s", "plain_latency_s")
    return (
        r | {key: speed.get(key) for key in keys} | {k: v for k, v in speed.items() if k == "speed"}
    )


def _speed(values, tau, note=None):
    """A speed block as 04 writes it: rounds of the speedup, bound tau (eagle3nb/timing.py)."""
    m = timing.summarize(values, "speedup", bound=tau, bound_is=f"tau {tau:.3f}", neutral=1.0,
                         note=note)  # fmt: skip
    return {"speedup": m.as_dict(), "timed_on": "every call"}


SG, VL = ("sglang", "0.5.23"), ("vllm", "0.32.0")
RUNS = [
    # the simulator first: the engines' columns still come before it
    _run("simulator", None, "trained", 5, None, "story", 3.8),
    _run("simulator", None, "trained", 5, None, "all", 3.95071),
    _run(*SG, "trained", 5, 1, "story", 3.9),
    _run(*SG, "trained", 5, 1, "moral", 2.12346),
    _run(*SG, "trained", 5, 1, "all", 3.95071, tokens_per_s=100.0, plain_tokens_per_s=120.0,
         latency_s=2.0, plain_latency_s=1.5),  # speedup computed: 100 / 120
    _run(*SG, "trained", 5, 4, "all", 3.9, tokens_per_s=300.04, plain_tokens_per_s=250.0,
         speedup=1.20016, latency_s=2.5, plain_latency_s=2.0,
         speed=_speed([1.18, 1.20016, 1.25], 3.9)),  # measured
    _run(*SG, "trained", 3, 1, "all", 3.05, tokens_per_s=110.0, plain_tokens_per_s=120.0,
         speedup=3.6, speed=_speed([3.5, 3.6, 3.7], 3.05)),  # above tau: disturbed
    _run(*SG, "trained, layer offset", 5, 1, "all", 2.9666, tokens_per_s=80.0,
         plain_tokens_per_s=120.0, speedup=0.66667),
    _run(*VL, "trained", 5, 1, "all", 3.95071, tokens_per_s=90.0, plain_tokens_per_s=100.0,
         speedup=0.9, latency_s=1.0, plain_latency_s=0.9,
         speed=_speed([0.8, 0.9, 1.05], 3.95071, note="CPU: plumbing")),  # spread over effect
    _run(*VL, "trained", 5, 1, "story", 3.9),
]  # fmt: skip

EXPECTED = """\
**tau per category** (k = 5, batch size 1; tau = tokens emitted per draft-verify cycle, at most k + 1)

| category | sglang 0.5.23 (trained) | sglang 0.5.23 (trained, layer offset) | vllm 0.32.0 (trained) | simulator (trained) |
|---|---:|---:|---:|---:|
| moral | 2.1235 | - | - | - |
| story | 3.9000 | - | 3.9000 | 3.8000 |
| all | 3.9507 | 2.9666 | 3.9507 | 3.9507 |

**speedup** (category all; each engine against itself without the drafter, same prompts, same run, timed turn about; median (min-max over the rounds), or disturbed with why: a speedup is never above its bound tau, nor k + 1)

| engine | drafter | k | batch size | tokens/s without drafter | tokens/s with drafter | speedup | bound | timed on | latency without drafter (s) | latency with drafter (s) |
|---|---|---:|---:|---:|---:|---|---:|---|---:|---:|
| sglang 0.5.23 | trained | 3 | 1 | 120.0 | 110.0 | disturbed: median 3.600x is above its bound 3.050x (tau 3.050): other load landed on one side | 3.050 | every call | - | - |
| sglang 0.5.23 | trained | 5 | 1 | 120.0 | 100.0 | one pass: 0.833x (no spread; not a measurement) | - | one pass each | 1.500 | 2.000 |
| sglang 0.5.23 | trained | 5 | 4 | 250.0 | 300.0 | 1.200x (1.180-1.250 over 3 rounds) | 3.900 | every call | 2.000 | 2.500 |
| sglang 0.5.23 | trained, layer offset | 5 | 1 | 120.0 | 80.0 | one pass: 0.667x (no spread; not a measurement) | - | one pass each | - | - |
| vllm 0.32.0 | trained | 5 | 1 | 100.0 | 90.0 | disturbed: spread 0.250 (0.800-1.050 over 3 rounds) is wider than the effect abs(0.900 - 1) = 0.100 | 3.951 | every call | 0.900 | 1.000 |

(CPU: plumbing)"""


def test_table_equals_the_text_written_by_hand():
    assert main_setting(RUNS) == (5, 1)  # the first run's k, the smallest batch size at it
    assert served_table(RUNS) == EXPECTED


def test_table_at_another_setting_and_without_speed():
    sim_only = [r for r in RUNS if r["engine"] == "simulator"]
    assert served_table(sim_only) == (
        "**tau per category** (k = 5; tau = tokens emitted per draft-verify cycle, at most k + 1)"
        "\n\n| category | simulator (trained) |\n|---|---:|\n| story | 3.8000 |\n| all | 3.9507 |"
        "\n\n**speedup** (category all; each engine against itself without the drafter, same "
        "prompts, same run, timed turn about; median (min-max over the rounds), or disturbed with "
        "why: a speedup is never above its bound tau, nor k + 1)\n\nno served speed measured (the "
        "simulator measures acceptance only)"
    )
    # batch size 4: only SGLang's k=5 run over the whole set, and the simulator beside it
    part_a = served_table(RUNS, k=5, batch_size=4).split("\n\n**speedup**")[0]
    assert part_a.splitlines()[2:] == [
        "| category | sglang 0.5.23 (trained) | simulator (trained) |",
        "|---|---:|---:|",
        "| story | - | 3.8000 |",
        "| all | 3.9000 | 3.9507 |",
    ]


def test_bad_runs_are_refused_by_index_and_key():
    with pytest.raises(ValueError, match="runs is empty"):
        served_table([])
    bad = dict(RUNS[2], k=0)
    with pytest.raises(ValueError, match=r"runs\[1\]\['k'\] = 0: give int >= 1"):
        served_table([RUNS[0], bad])
    with pytest.raises(ValueError, match=r"runs\[0\]\['tokens_per_s'\] = '9': give a number"):
        served_table([dict(RUNS[0], tokens_per_s="9")])
    with pytest.raises(ValueError, match="two runs of sglang 0.5.23 \\(trained\\) for category"):
        served_table([RUNS[2], RUNS[2]])
    # batch size 4 is not the main setting (1): the speed rows find the twice-given run
    twice = [RUNS[2], RUNS[5], RUNS[5]]
    with pytest.raises(ValueError, match=r"\(trained\) over the whole set at k=5, batch size 4"):
        served_figure(twice)


def test_figure_traces_and_values(tmp_path):
    fig = served_figure(RUNS)
    bars = [t for t in fig.data if t.type == "bar"]
    lines = [t for t in fig.data if t.type == "scatter"]
    assert [t.name for t in bars] == [
        "sglang 0.5.23 (trained)",
        "sglang 0.5.23 (trained, layer offset)",
        "vllm 0.32.0 (trained)",
        "simulator (trained)",
    ]
    assert all(list(t.x) == ["moral", "story", "all"] for t in bars)
    assert [list(t.y) for t in bars] == [
        [2.12346, 3.9, 3.95071],
        [None, None, 2.9666],
        [None, 3.9, 3.95071],
        [None, 3.8, 3.95071],
    ]
    # only measured medians are plotted (with their min-max); disturbed and one-pass figures are
    # gaps, listed under the figure with why
    assert [(t.name, list(t.x), list(t.y)) for t in lines] == [
        ("sglang 0.5.23 (trained) k=3", [1], [None]),
        ("sglang 0.5.23 (trained) k=5", [1, 4], [None, 1.20016]),
        ("sglang 0.5.23 (trained, layer offset) k=5", [1], [None]),
        ("vllm 0.32.0 (trained) k=5", [1], [None]),
    ]
    k5 = lines[1].error_y
    assert list(k5.array) == [None, pytest.approx(1.25 - 1.20016)]
    assert list(k5.arrayminus) == [None, pytest.approx(1.20016 - 1.18)]
    note = fig.layout.annotations[-1].text
    assert note.startswith("not plotted:<br>sglang 0.5.23 (trained) k=3 batch size 1: disturbed: ")
    assert note.count("<br>") == 4
    # bars in the left panel, lines in the right; one colour per engine and drafter in both
    assert {t.xaxis for t in bars} == {"x"} and {t.xaxis for t in lines} == {"x2"}
    colour = {t.name: t.marker.color for t in bars}
    for t in lines:
        assert t.line.color == colour[t.name.rsplit(" k=", 1)[0]]
    assert len({t.line.dash for t in lines if "(trained) k=" in t.name}) == 2  # k=3 vs k=5
    assert [s.y0 for s in fig.layout.shapes] == [1.0]  # the no-speedup line
    assert column_label(RUNS[0]) == "simulator (trained)"
    out = plots.save_html(fig, tmp_path / "served.html")
    assert out.is_file() and (tmp_path / plots.PLOTLY_JS).is_file()
    assert 'id="served"' in out.read_text()
