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
import time
from pathlib import Path

from eagle3nb.boundaries import engine_read
from eagle3nb.boundaries.config_ids import set_ids
from eagle3nb.boundaries.conventions import get_convention
from eagle3nb.boundaries.export_ids import engine_ids
from eagle3nb.drafter.model import flavour_of, swap_norm_flavour
from eagle3nb.engines.vllm_eager import id0_hazard

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
    "served_block",
]

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}
# SGLang's own counters, summed over requests (eagle3nb/engines/sglang_serve.py sum_counters)
ENGINE_COUNTERS = (
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "completion_tokens",
    "spec_correct_drafts_histogram",
)
ALL = "all"  # the category of every prompt served (the speed rows of the table)
SPEED_NOTE = (
    "tokens/s with and without the drafter in the same engine and run, same prompts and batch "
    "size, each timed around the engine call from this process after a warm-up request; a 260K "
    "target on CPU is not memory-bound and costs about as much per forward as its drafter, so it "
    "shows no GPU-like speedup: on CPU these numbers show the plumbing, not the gain"
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


def _plain(client, prompts, cats, batch_sizes, max_new, eos) -> dict:
    """The same engine without the drafter: outputs and speed per batch size and category."""
    client.generate([list(prompts[0])], 2, eos, 0.0, 1.0, 0)  # warm-up (engine start untimed)
    out = {}
    for b in batch_sizes:
        res, outs = {}, [None] * len(prompts)
        for cat in dict.fromkeys(cats):
            acc = {"seconds": 0.0, "calls": 0, "tokens": 0}
            for ch in _chunks([i for i, c in enumerate(cats) if c == cat], b):
                t0 = time.perf_counter()
                got = client.generate([list(prompts[i]) for i in ch], max_new, eos, 0.0, 1.0, 0)
                acc["seconds"] += time.perf_counter() - t0
                acc["calls"] += 1
                acc["tokens"] += sum(len(o) for o in got)
                for i, o in zip(ch, got):
                    outs[i] = list(o)
            res[cat] = acc
        res[ALL] = _merged(res.values())
        out[b] = {"by_category": res, "outputs": outs}
    return out


def serve_engine(client, engine: str, drafters: dict, prompts, cats, batch_sizes, max_new, eos):
    """Serve each drafter of ``drafters`` (``{label: (folder, [k, ...], [batch size, ...])}``)
    through ``client``'s engine for each of its k and batch sizes, per category, then the same
    prompts without a drafter at every size of ``batch_sizes``.

    Args:
        prompts: token id lists; ``cats``: the category of each (``"heldout"`` for 01's prompts).

    Returns:
        ``(runs, outputs)``: ``runs`` a list of dicts (engine, engine_version, drafter, k,
        batch_size, category, tau, per_position_acceptance, cycles, counters, tokens_per_s,
        plain_tokens_per_s, speedup, latency_s, plain_latency_s, greedy_mismatches (served output
        vs the same engine's plain greedy output, same batch size)); ``outputs[(label, k, b)]``
        the served outputs per prompt, ``outputs["plain", b]`` the plain ones.
    """
    info = client.info()
    runs, outputs = [], {}
    for label, (folder, label_ks, label_bs) in drafters.items():
        for k in label_ks:
            client.serve_acceptance(folder, [list(prompts[0])], k, 2, eos)  # warm-up
            for b in label_bs:
                outs, by_cat = [None] * len(prompts), {}
                for cat in dict.fromkeys(cats):
                    acc = {}
                    for ch in _chunks([i for i, c in enumerate(cats) if c == cat], b):
                        t0 = time.perf_counter()
                        r = client.serve_acceptance(
                            folder, [list(prompts[i]) for i in ch], k, max_new, eos
                        )
                        got = r["outputs"]
                        _add(acc, r, time.perf_counter() - t0, sum(len(o) for o in got))
                        for i, o in zip(ch, got):
                            outs[i] = list(o)
                    by_cat[cat] = acc
                by_cat[ALL] = _merged(by_cat.values())
                by_cat = {cat: _summary(acc, k) for cat, acc in by_cat.items()}
                outputs[label, k, b] = outs
                for cat, s in by_cat.items():
                    runs.append(
                        dict(
                            engine=engine,
                            engine_version=info["engine_version"],
                            drafter=label,
                            k=k,
                            batch_size=b,
                            category=cat,
                            **s,
                        )
                    )
    plain = _plain(client, prompts, cats, batch_sizes, max_new, eos)
    for b, pr in plain.items():
        outputs["plain", b] = pr["outputs"]
    for r in runs:
        pa = plain[r["batch_size"]]["by_category"][r["category"]]
        ptps = pa["tokens"] / pa["seconds"] if pa["seconds"] else None
        r["plain_tokens_per_s"] = round(ptps, 2) if ptps else None
        r["plain_latency_s"] = round(pa["seconds"] / max(pa["calls"], 1), 4)
        r["speedup"] = round(r["tokens_per_s"] / ptps, 3) if r["tokens_per_s"] and ptps else None
        served = outputs[r["drafter"], r["k"], r["batch_size"]]
        plain_out = outputs["plain", r["batch_size"]]
        idx = [i for i, c in enumerate(cats) if r["category"] in (c, ALL)]
        r["greedy_mismatches"] = sum(served[i] != plain_out[i] for i in idx)
    return runs, outputs


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
        "served_tokens_per_s": t["tokens_per_s"],
        "plain_tokens_per_s": t["plain_tokens_per_s"],
        "speedup_with_drafter": t["speedup"],
        "speed_note": SPEED_NOTE,
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
