"""04's served acceptance: the exported drafter served by the engines that serve it (vLLM, SGLang),
each reporting its own counters, over the held-out prompts and a benchmark set per category, for
every k and batch size, with tokens/s and latency with and without the drafter in the same engine
and run.

Who measures is ``eval_engines`` (:func:`eagle3nb.steps.evaluate.bench.resolve_eval_engines`); without
the simulator no target weights are loaded in 04's process: the engines load the target themselves.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from eagle3nb.boundaries import engine_read
from eagle3nb.boundaries.config_ids import set_ids
from eagle3nb.boundaries.conventions import get_convention
from eagle3nb.boundaries.export_ids import engine_ids
from eagle3nb.drafter.model import flavour_of, swap_norm_flavour
from eagle3nb.engines.vllm_eager import id0_hazard
from eagle3nb.steps.evaluate.serve_loop import ALL, ENGINE_COUNTERS, serve_engine  # noqa: F401

__all__ = [
    "SPEED_NOTE",
    "OFFSET",
    "offset_boundaries",
    "LATENCY_NOTE",
    "ENGINE_NAMES",
    "offset_drafter_dir",
    "drop_vllm_id0",
    "FLAVOUR",
    "flavour_swapped_dir",
    "serve_engine",
    "speed_of",
    "served_block",
]

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}
SPEED_NOTE = (
    "speedup = tokens/s with / without the drafter in the same engine and run, same prompts and "
    "batch size: two workers of the engine, one with the drafter and one without, called turn "
    "about call by call (which goes first alternates), the pairs split into speed_rounds rounds; "
    "the median of the rounds' ratios with its spread (min-max). A figure above its bound (tau of "
    "that serving: greedy chain decoding emits at most tau tokens per target forward; never above "
    "k + 1) or with a spread wider than its effect abs(median - 1) is printed as disturbed, with why, "
    "never as a speedup. A 260K target on CPU is not memory-bound and costs about as much per "
    "forward as its drafter, so it shows no GPU-like speedup: on CPU these numbers show the "
    "plumbing, not the gain"
)
LATENCY_NOTE = (
    "latency_s: mean wall seconds per engine call of batch_size requests (every request of a call "
    "has finished by then)"
)


# label of the layer-offset baseline in metrics.json["eval"]["tau"] (its boundaries: ["offset"])
OFFSET = "trained, layer offset"


def offset_boundaries(convention: str, bnds: list[int], n: int) -> list[int] | None:
    """The boundaries the *other* engine reads from the same numbers (the case eagle3nb exists
    for): SGLang captures id L at boundary L+1, vLLM at boundary L (``conventions.md``), so a
    drafter trained on SGLang's capture and served by vLLM with the same ids gets every boundary
    -1, one trained on vLLM's (or any boundary-named convention) and served by SGLang +1. Falls
    back to the other direction where the shift leaves [0, n]; None when neither fits.

    Args:
        convention: the training data's layer-id convention (drafter manifest ``convention``).
        bnds: trained boundaries, ascending. n: the target's decoder layer count.
    """
    first = -1 if convention == "sglang" else 1
    for shift in (first, -first):
        moved = [b + shift for b in bnds]
        if min(moved) >= 0 and max(moved) <= n:
            return moved
    return None


def offset_drafter_dir(drafter_dir, out_dir, moved: list[int], n: int, arch: str | None) -> dict:
    """A copy of the exported drafter whose ids make each engine capture ``moved`` (the layer
    offset of :func:`eagle3nb.steps.evaluate.step.offset_boundaries`): the same weights read one layer
    off, the served form of the simulator's offset baseline.

    Ids by each engine version's rule for ``arch`` (:func:`eagle3nb.boundaries.export_ids.engine_ids`);
    where the rule cannot name ``moved`` (SGLang for boundary 0), the engine's plain shift: SGLang
    0.5.23 captures the input of layer id + 1 (``models/llama.py`` ``set_eagle3_layers_to_capture``),
    so id -1 is boundary 0. Each engine's reading is checked with
    :func:`eagle3nb.boundaries.engine_read.read_as_engine`.

    Returns:
        ``{engine: boundaries it reads}`` for the engines whose reading equals ``moved``.
    """
    src, dst = Path(drafter_dir), Path(out_dir)
    cfg = json.loads((src / "config.json").read_text())
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy2(f, tmp / f.name)
    shifted = set()
    for engine in ("vllm", "sglang"):
        try:
            ids, _ = engine_ids(engine, moved, n, arch)
        except ValueError:
            ids = get_convention(engine).shift_ids(moved)  # SGLang: id -1 serves boundary 0
            shifted.add(engine)
        set_ids(cfg, engine, ids)
    cfg.setdefault("eagle3nb", {})["offset_of"] = cfg["eagle3nb"].get("aux_boundaries")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)
    reads = {}
    for engine in ("vllm", "sglang"):
        if engine in shifted:  # outside eagle3nb's convention table: the plain shift's reading
            if engine == "sglang":
                reads[engine] = list(moved)
            continue
        try:
            got = engine_read.read_as_engine(cfg, engine, n)["boundaries"]
        except ValueError:
            continue
        if got == list(moved):
            reads[engine] = got
    return reads


def drop_vllm_id0(drafters: dict, device: str, vllm_options: dict | None) -> dict:
    """Take vLLM off each drafter it would serve from aux id 0 on CUDA with CUDA graphs off (it
    reads boundary N there, :mod:`eagle3nb.engines.vllm_eager`) rather than end 04 or serve wrong.

    Args:
        drafters: 04's ``{label: (folder, ks, batch sizes, engines serving it (a set, changed in
            place), {engine: boundaries it reads})}``; device: 04's device (vLLM's);
        vllm_options: the run's (``enforce_eager``, default True).

    Returns:
        ``{"vllm: <label>": reason}`` for each drafter left out.
    """
    eager = bool((vllm_options or {}).get("enforce_eager", True))
    out = {}
    for label, d in drafters.items():
        why = id0_hazard(d[4].get("vllm", []), str(device).startswith("cuda"), eager)
        if "vllm" in d[3] and why:
            d[3].discard("vllm")
            out[f"vllm: {label}"] = why
    return out


# label of the flavour-swapped baseline: the trained weights read as the other EAGLE-3.1 flavour
FLAVOUR = "trained, flavour swapped"


def flavour_swapped_dir(drafter_dir, out_dir) -> str | None:
    """A copy of the exported drafter read as the other EAGLE-3.1 flavour (``fc_norm`` <->
    ``norm_before_fc``, :func:`eagle3nb.drafter.model.swap_norm_flavour`): the config's two flags
    swapped, the norm scales renamed (``fc_norm.{i}.weight`` concatenated = ``input_norm.weight``),
    so each engine loads it and serves the same weights with the other RMS statistics: the
    served form of the simulator's flavour-swapped baseline, the mix-up of two "3.1"s.

    Returns:
        the copy's flavour name, or None (nothing written) when the drafter sets neither or both
        norms.
    """
    from safetensors.torch import load_file, save_file

    from eagle3nb.drafter.export import load_drafter

    src, dst = Path(drafter_dir), Path(out_dir)
    d, cfg = load_drafter(src)
    got = swap_norm_flavour(load_file(str(src / "model.safetensors")), d.config)
    if got is None:
        return None
    sd, c = got
    cfg.update(fc_norm=c.fc_norm, norm_before_fc=c.norm_before_fc)
    (cfg.get("eagle_config") or {}).pop("norm_before_fc", None)
    meta = cfg.setdefault("eagle3nb", {})
    meta.update(flavour=flavour_of(c), flavour_swapped_of=flavour_of(d.config))
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copy2(f, tmp / f.name)
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)
    return meta["flavour"]


def speed_of(runs: list[dict], k: int, b: int) -> dict | None:
    """The trained drafter's speed block (``all`` row at ``k``, batch size ``b``): speedup over
    rounds with its verdict (:mod:`eagle3nb.timing`), or None where none was timed."""
    for r in runs:
        if (r["drafter"], r["k"], r["batch_size"], r["category"]) == ("trained", k, b, ALL):
            return r.get("speed")
    return None


def served_block(runs: list[dict], sim: dict | None, k: int, b: int, category: str) -> dict:
    """One engine's summary for the notebook and the model card: the trained drafter (and the
    layer offset) at ``k``, batch size ``b`` and ``category``, beside the simulator's numbers
    (``sim``: ``{label: evaluate_acceptance summary}`` on the same prompts, or None)."""
    pick = {
        r["drafter"]: r
        for r in runs
        if r["k"] == k and r["batch_size"] == b and r["category"] == category
    }
    t = pick["trained"]
    block = {
        "engine": t["engine"],
        "engine_version": t["engine_version"],
        "category": category,
        "k": k,
        "batch_size": b,
        "tau": t["tau"],
        "per_position_acceptance": t["per_position_acceptance"],
        "cycles": t["cycles"],
        "counters": t["counters"],
        "greedy_mismatches_vs_engine_plain": t["greedy_mismatches"],
        "greedy_compared_vs_engine_plain": t.get("greedy_compared"),
        "served_tokens_per_s": t["tokens_per_s"],
        "plain_tokens_per_s": t["plain_tokens_per_s"],
        "speedup_with_drafter": t["speedup"],
        "speed_note": SPEED_NOTE,
        "speed": speed_of(runs, k, b),
    }
    for key in ("engine_counters", "engine_accept_length"):
        if key in t:
            block[key] = t[key]
    if "engine_accept_length" in t:
        block["engine_accept_length_definition"] = (
            "SGLang's own: completion tokens / verify passes, summed over requests (counts the "
            "prefill token; accepted drafts cut by max_new_tokens are dropped); tau counts "
            "1 + accepted drafts per verify pass"
        )
    for label, r in pick.items():
        if label != "trained":
            block.setdefault("baselines", {})[label] = {
                "tau": r["tau"],
                "per_position_acceptance": r["per_position_acceptance"],
                "cycles": r["cycles"],
            }
    if sim:
        s = sim["trained"]
        block["simulator_tau"] = round(s["tau"], 4)
        block["simulator_cycles"] = s["cycles"]
        block["abs_diff_per_position"] = [
            round(abs(a - b2), 4)
            for a, b2 in zip(t["per_position_acceptance"], s["per_position_acceptance"])
        ]
    return block
