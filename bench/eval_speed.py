"""04's simulator against the literal per-cycle simulator, same drafter, prompts and run.

    PYTHONPATH=. .venv/bin/python bench/eval_speed.py [outputs/default] [--n-prompts 0] \
        [--out bench/results/eval_speed.json]

Reads a finished run folder (its params.yaml, target, exported drafter and 01's held-out prompts)
and times, on this machine's CPU threads:
- ``shared``: :func:`eagle3nb.drafter.shared_eval.evaluate_shared`, the function 04 calls (one
  target forward per prompt, every state's drafts from one k-step drafter forward), for the
  trained drafter with the k sweep's every-position drafts, as 04 runs it;
- ``literal``: :func:`eagle3nb.drafter.acceptance.evaluate_acceptance` (one target forward and one
  ``draft_chain`` per cycle), the reference the tests compare with.
The baseline is the literal simulator timed in the same invocation; the JSON holds both times,
their ratio, both taus and whether every counter agrees.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from eagle3nb.drafter.acceptance import evaluate_acceptance  # noqa: E402
from eagle3nb.drafter.export import load_drafter  # noqa: E402
from eagle3nb.drafter.shared_eval import evaluate_shared  # noqa: E402
from eagle3nb.manifest import atomic_write_json  # noqa: E402
from eagle3nb.params import load_params  # noqa: E402
from eagle3nb.rundir import RunDir  # noqa: E402
from eagle3nb.steps.evaluate import chat as eval_chat  # noqa: E402
from eagle3nb.target import models  # noqa: E402

COUNTERS = ("cycles", "tau", "per_position_acceptance", "emitted_tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(REPO / "outputs" / "default"))
    ap.add_argument("--n-prompts", type=int, default=0, help="first N held-out prompts (0: all)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "eval_speed.json"))
    a = ap.parse_args()
    run = Path(a.run)
    if not (run / "params.yaml").is_file() or not (run / "drafter").is_dir():
        sys.exit(f"run={run}: no params.yaml or drafter/ there; run the main job first")
    p = load_params(run / "params.yaml")
    rd = RunDir(p)
    model, tok, _ = models.load_target(p.model, "float32", "cpu")
    emb = model.get_input_embeddings().weight.detach().float()
    drafter, cfg = load_drafter(rd.drafter, emb)
    bnds = cfg["eagle3nb"]["aux_boundaries"]
    prompts = eval_chat.heldout_prompts(p, rd, tok)[0]
    prompts = prompts[: a.n_prompts] if a.n_prompts else prompts
    eos = models.stop_token_ids(model, tok)
    k, new = p.k, p.eval_max_new_tokens
    t0 = time.perf_counter()
    runs = {"trained": (drafter, bnds)}
    shared = evaluate_shared(model, runs, prompts, k, new, eos, sweep_label="trained")
    t_shared = time.perf_counter() - t0
    t0 = time.perf_counter()
    literal = evaluate_acceptance(model, drafter, prompts, bnds, k, new, eos)
    t_literal = time.perf_counter() - t0
    s = shared["results"]["trained"]
    res = {
        "run": str(run),
        "n_prompts": len(prompts),
        "k": k,
        "max_new_tokens": new,
        "threads": torch.get_num_threads(),
        "load_average_after": list(os.getloadavg()),
        "seconds": {"shared": round(t_shared, 2), "literal": round(t_literal, 2)},
        "speedup_shared_over_literal": round(t_literal / t_shared, 2),
        "tau": {"shared": s["tau"], "literal": literal["tau"]},
        "counters_equal": all(s[c] == literal[c] for c in COUNTERS),
        "note": "shared includes HF generate's greedy reference per prompt and the k sweep's "
        "every-position drafts (04's path); literal runs one target forward per cycle",
    }
    atomic_write_json(Path(a.out), res)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
