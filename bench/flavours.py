"""Quality of the drafter flavours at the same budget: tau of each variant against the plain head.

    .venv/bin/python bench/flavours.py                      # both targets, two seeds (a few minutes)
    .venv/bin/python bench/flavours.py --targets stories    # the default target only
    .venv/bin/python bench/flavours.py --steps 40 --seeds 0  # plumbing check

Per target, 01 (the target's own continuations) and 02b (aux states captured with HF) run once;
then every variant and seed trains on that same dataset with the same TrainConfig (the run's
settings, only the flags and the seed changed) and the simulator measures tau on the same held-out
prompts (k and tokens of the run). Variants: ``plain`` (EAGLE-3), ``fc_norm+norm_output``
(EAGLE-3.1 as the EAGLE authors/SGLang/SpecForge mean it), ``norm_before_fc+norm_output``
(speculators' 3.1). Targets: ``stories`` (the default target, stories260K-hd32: params/smoke.yaml
with 96 prompts x 48 tokens and 150 steps) and ``deepseek`` (the tiny random DeepSeek-V3 twin of
params/kimi_case.yaml), where the MLA head (``drafter_head: mla``, eagle3nb/drafter/mla.py) is
measured too, plain and with fc_norm + norm_output (what both engines' MLA drafter classes read).
The JSON is written after each target.

Writes bench/results/flavours.json: per target and variant the taus per seed, their mean, and the
difference to the plain head per seed (the seed spread is the noise to read it against), the
budget (prompts, tokens, steps, batch) and the seconds each part took, versions and git commit.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from eagle3nb.dataset.read import AuxDataset  # noqa: E402
from eagle3nb.drafter.acceptance import evaluate_acceptance  # noqa: E402
from eagle3nb.drafter.model import flavour_of  # noqa: E402
from eagle3nb.manifest import atomic_write_json  # noqa: E402
from eagle3nb.params import load_params  # noqa: E402
from eagle3nb.rundir import RunDir  # noqa: E402
from eagle3nb.steps.extract.from_sglang import extract_sglang_step  # noqa: E402
from eagle3nb.steps.generate.step import generate_step  # noqa: E402
from eagle3nb.steps.train.step import _train_config  # noqa: E402
from eagle3nb.target import models  # noqa: E402
from eagle3nb.text.generation import read_jsonl  # noqa: E402
from eagle3nb.training.loop import train_drafter  # noqa: E402

VARIANTS = {
    "plain": {},
    "fc_norm+norm_output": {"fc_norm": True, "norm_output": True},
    "norm_before_fc+norm_output": {"norm_before_fc": True, "norm_output": True},
}
MLA_VARIANTS = {
    "mla": {"drafter_head": "mla"},
    "mla fc_norm+norm_output": {"drafter_head": "mla", "fc_norm": True, "norm_output": True},
}
TARGETS = {
    "stories": (
        "params/smoke.yaml",
        dict(max_train_prompts=96, max_new_tokens=48, max_steps=150, batch_size=16,
             warmup_steps=10, eval_max_new_tokens=48, max_eval_prompts=12),
    ),
    "deepseek": ("params/kimi_case.yaml", {}),
}  # fmt: skip
COMMON = dict(extract_engine="hf", vllm_extract=False, eval_every=0, interactive=False)


def prepare(name: str, out: Path, steps: int | None):
    """01 and 02b once for target ``name``: ``(params, target model, held-out prompt ids,
    trained boundaries, eos, seconds)``."""
    file, over = TARGETS[name]
    over = {**over, **COMMON, "outputs_dir": str(out), "run_name": f"flavours-{name}"}
    if steps:
        over["max_steps"] = steps
    p = load_params(ROOT / file, **over)
    t0 = time.time()
    generate_step(p, progress=False)
    extract_sglang_step(p, progress=False)
    rd = RunDir(p)
    held = [r["prompt_ids"] for r in read_jsonl(rd.generated) if r["split"] == "heldout"]
    held = held[: p.max_eval_prompts or None]
    model, tok = models.load_target(models.resolve_model(p.model), "float32")[:2]
    eos = models.stop_token_ids(model, tok)
    bnds = list(AuxDataset(rd.dataset).manifest["aux_boundaries"])
    return p, model, held, bnds, eos, time.time() - t0


def run_target(name: str, out: Path, seeds: list[int], steps: int | None) -> dict:
    p, model, held, bnds, eos, prep_s = prepare(name, out, steps)
    rd, base = RunDir(p), _train_config(p)
    ds = AuxDataset(rd.dataset)
    rows = {}
    variants = {**VARIANTS, **(MLA_VARIANTS if name == "deepseek" else {})}
    for variant, flags in variants.items():
        rows[variant] = {"taus": {}, "seconds": {}}
        for seed in seeds:
            off = {"fc_norm": False, "norm_before_fc": False, "norm_output": False}
            cfg = replace(base, seed=seed, **{**off, "drafter_head": "llama", **flags})
            t0 = time.time()
            torch.manual_seed(seed)
            d, _ = train_drafter(ds, model, cfg, rd.root / f"train-{variant}-{seed}", stream=None)
            r = evaluate_acceptance(
                model, d.eval(), held, bnds, p.k, p.eval_max_new_tokens, eos, check_greedy=False
            )
            rows[variant]["flavour"] = flavour_of(d.config)
            rows[variant]["taus"][str(seed)] = round(r["tau"], 4)
            rows[variant]["seconds"][str(seed)] = round(time.time() - t0, 1)
            print(f"{name} {variant} seed {seed}: tau {r['tau']:.4f}", flush=True)
    for v in rows.values():
        v["mean_tau"] = round(sum(v["taus"].values()) / len(v["taus"]), 4)
        v["minus_plain"] = {s: round(t - rows["plain"]["taus"][s], 4) for s, t in v["taus"].items()}
    return {
        "target": p.model,
        "boundaries": bnds,
        "k": p.k,
        "heldout_prompts": len(held),
        "budget": {
            key: getattr(p, key)
            for key in (
                "max_train_prompts",
                "max_new_tokens",
                "max_steps",
                "batch_size",
                "lr",
                "ttt_steps",
                "draft_vocab_size",
                "eval_max_new_tokens",
            )
        },  # fmt: skip
        "prepare_seconds": round(prep_s, 1),
        "variants": rows,
    }


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--steps", type=int, default=0, help="override max_steps (0: the run's)")
    ap.add_argument("--outputs", default="/tmp/eagle3nb-bench-flavours")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "flavours.json"))
    a = ap.parse_args()
    t0 = time.time()
    res = {"benchmark": "flavours", "seeds": a.seeds, "targets": {}}
    for t in a.targets:  # written after each target
        res["targets"][t] = run_target(t, Path(a.outputs), a.seeds, a.steps or None)
        res["seconds"] = round(time.time() - t0, 1)
        _write(res, Path(a.out))
    print(json.dumps({t: {v: r["taus"] for v, r in x["variants"].items()} for t, x in res["targets"].items()}))  # fmt: skip


def _write(res: dict, out: Path) -> None:
    res["torch"] = torch.__version__
    res["threads"] = torch.get_num_threads()
    res["machine"] = platform.processor() or platform.machine()
    res["git_commit"] = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, res)


if __name__ == "__main__":
    main()
