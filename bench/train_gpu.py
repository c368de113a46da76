"""Training speed of the code 03 runs, :func:`eagle3nb.training.loop.train_drafter`, on one GPU.

Shapes: a drafter for Llama-3.1-8B (H 4096, 32 heads / 8 kv heads of 128, MLP 14336, target vocab
128256, draft vocab 32000, 3 aux boundaries), TTT k = 7, batch 4 x 2048, flex attention. The
target is head-only (embed_tokens, final norm, lm_head with random bf16 weights, written to a
safetensors file at bench time and read back by :func:`eagle3nb.target.head.load_target_head`, as
03 offline does); nothing is downloaded. Data: a batch source on the GPU made from a seed
(float32 aux/final states, as the offline loader yields them; the loader itself is left out): a
state s_t that changes slowly along t (a moving sum of noise), aux = [s, s A, s B], final = s, so the
next state is predictable and the loss falls; input ids uniform over the first 32000 target ids
and the target head's other rows scaled down, so the draft vocabulary covers the target's argmax
(as on real data) and nearly every position carries loss.

``all`` starts, at once, separate processes that share the GPU (their compiles overlap); each
takes a file lock after its first (compiling) step and holds it to its end, so no two of them run
steps side by side after that:
  main     train_drafter, precision bf16-mixed, torch_compile on (the 03 default on CUDA), lr 1e-4,
           ``--steps`` steps; timed: the median step after ``--warmup`` steps (compile included
           there); one later step is profiled (CUDA kernel table) and left out of the timing.
  ceiling  bench/mfu.py's best variant (bf16 weights and bf16 AdamW, flex + compiled layer), the
           in-bench ceiling the issue compares with, same shapes, same job.
  float32  train_drafter, precision float32, torch_compile off (TF32 matmuls allowed, as in
           bench/mfu.py), the same data, seed and steps: the loss curve the bf16-mixed one is
           compared with (tolerance below) and the speed of the float32 path.

FLOPs per token: bench/mfu.py's ``flops_per_token`` (multiply-add = 2 FLOPs, forward):
    fc 2*n_aux*Ht*H once; per TTT step j: qkvo 2*(2H*(nh+2nkv)*hd + nh*hd*H), attention
    4*nh*hd*((T+1)/2 + j), MLP 2*3*H*I, lm_head 2*H*V_draft; training = 3 x forward = 16.38 GFLOP
    per token at these shapes (labels, the target head 2*Ht*V_target, 1.05 GFLOP, reported apart).
MFU = training FLOPs per token x tokens/s / bf16 matmul peak measured in the same job (median of an
8192^3 product loop). tokens/s counts every position of the batch (B x T / step time, as
bench/mfu.py); loss-bearing tokens/s counts the positions scored at TTT step 0.

Loss curves: per logged step, |bf16-mixed - float32| / float32 must stay within ``CURVE_RTOL``
(and the mean over the last 10 steps within ``CURVE_MEAN_RTOL``).

Usage (GPU): ``python bench/train_gpu.py all --out-dir DIR`` (about 7 minutes, mostly compile);
``python bench/train_gpu.py run ...`` is one process of it. ``--tiny`` shrinks the shapes for a
CPU dry run of the plumbing (float32 only, no ceiling).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

CURVE_RTOL, CURVE_MEAN_RTOL = 0.03, 0.01
TINY = dict(hidden_size=64, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=512, draft_vocab=128, batch=2, seq=64)  # fmt: skip


def shapes(tiny: bool) -> dict:
    from mfu import LLAMA_31_8B

    if tiny:
        return dict(LLAMA_31_8B, **TINY, num_hidden_layers=4)
    return dict(LLAMA_31_8B, draft_vocab=32000, batch=4, seq=2048)


def write_head_target(d: Path, s: dict, seed: int = 0) -> Path:
    """A head-only target folder: config.json (Llama, the shapes ``s``) and model.safetensors with
    model.embed_tokens.weight, model.norm.weight, lm_head.weight (random bf16)."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    keys += (
        "head_dim",
        "vocab_size",
        "num_hidden_layers",
        "rms_norm_eps",
        "max_position_embeddings",
    )
    cfg = LlamaConfig(**{k: s[k] for k in keys}, rope_theta=s["rope_theta"])
    cfg.tie_word_embeddings = False
    d.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(d)
    g = torch.Generator().manual_seed(seed)
    V, H = s["vocab_size"], s["hidden_size"]
    head = torch.randn(V, H, generator=g) * 0.02
    head[s["draft_vocab"] :] *= 0.1  # the target's argmax falls in the draft vocab
    t = {
        "model.embed_tokens.weight": (torch.randn(V, H, generator=g) * 0.02).bfloat16(),
        "model.norm.weight": (1 + 0.1 * torch.randn(H, generator=g)).bfloat16(),
        "lm_head.weight": head.bfloat16(),
    }
    save_file(t, str(d / "model.safetensors"))
    return d


class SmoothSource:
    """BatchSource on ``device``: ``n`` distinct batches made from a seed, cycled."""

    n_aux = 3

    def __init__(self, s: dict, device, seed: int = 1, n: int = 2):
        B, T, H = s["batch"], s["seq"], s["hidden_size"]
        g = torch.Generator(device=device).manual_seed(seed)
        A = torch.randn(2, H, H, device=device, generator=g) / H**0.5
        self.batches_ = []
        for _ in range(n):
            noise = torch.randn(B, T + 3, H, device=device, generator=g)
            c = noise.cumsum(1)
            st = (c[:, 3:] - torch.cat([torch.zeros_like(c[:, :1]), c[:, :-4]], 1)) / 2
            aux = torch.cat([st, st @ A[0], st @ A[1]], dim=-1)
            ids = torch.randint(0, s["draft_vocab"], (B, T), device=device, generator=g)
            ones = torch.ones(B, T, dtype=torch.long, device=device)
            b = {"input_ids": ids, "aux": aux, "final": st.contiguous(), "loss_mask": ones}
            self.batches_.append(b | {"attn_mask": ones, "sample_index": torch.arange(B)})
        self.seed, self.draft_vocab = seed, s["draft_vocab"]

    def fingerprint(self) -> str:
        return f"smooth-{self.seed}-{len(self.batches_)}"

    def token_masks(self):
        ids = torch.arange(self.draft_vocab)  # every id of the draft vocab counted once more:
        yield ids, torch.ones_like(ids)  # the draft vocab is exactly ids 0..draft_vocab-1
        for b in self.batches_:
            for x in b["input_ids"].cpu():
                yield x, torch.ones_like(x)

    def batches(self, start, stop, rank=0, world=1, pin_memory=False):
        for step in range(start, stop):
            yield dict(self.batches_[step % len(self.batches_)])


class Gate:
    """Progress stand-in: after the first (compiling) step takes the GPU lock and holds it to
    the end (no other process's steps run beside this one's later steps), resets the peak
    memory counter after ``warmup`` steps, and steps a profiler."""

    def __init__(self, lock: str | None, warmup: int, prof=None):
        self.lock, self.warmup, self.prof, self.i, self.fh = lock, warmup, prof, 0, None

    def __call__(self, total, initial):
        self.i = initial
        return self

    def update(self, k):
        self.i += k
        if self.i == 1 and self.lock:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.fh = open(self.lock, "a")
            fcntl.flock(self.fh, fcntl.LOCK_EX)
        if self.i == self.warmup and torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        if self.prof is not None:
            self.prof.step()

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass

    def release(self):
        if self.fh is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()


def run_one(a) -> dict:
    """One train_drafter run (``run`` mode)."""
    from mfu import flops_per_token

    from eagle3nb.drafter.model import DrafterConfig
    from eagle3nb.target.head import load_target_head
    from eagle3nb.training.loop import TrainConfig, train_drafter

    s = shapes(a.tiny)
    dev = torch.device(a.device)
    bf16 = a.precision == "bf16-mixed"
    target = load_target_head(a.head, torch.bfloat16 if bf16 else torch.float32, dev)
    src = SmoothSource(s, dev)
    cfg = TrainConfig(
        draft_vocab_size=s["draft_vocab"], draft_num_heads=0, draft_num_kv_heads=0,
        batch_size=s["batch"], max_steps=a.steps, lr=1e-4, warmup_steps=5, ttt_steps=7,
        attention="flex", precision=a.precision, torch_compile=a.compile,
        log_every=1, checkpoint_every=10**6, eval_every=0, seed=0,
    )  # fmt: skip
    prof = None
    if a.profile and dev.type == "cuda":
        from torch.profiler import ProfilerActivity, profile, schedule

        w = a.steps - 2  # record step steps-1 (0-based steps-2): after the timed window
        prof = profile(
            activities=[ProfilerActivity.CUDA], schedule=schedule(wait=w, warmup=0, active=1)
        )
        prof.start()
    gate = Gate(a.lock, a.warmup, prof)
    out = Path(tempfile.mkdtemp(prefix="train_gpu_"))  # checkpoints of the run (deleted after)
    t0 = time.time()
    try:
        d, rep = train_drafter(src, target, cfg, out, progress=gate, tracking=(), stream=None)
        if dev.type == "cuda":
            torch.cuda.synchronize()
    finally:
        gate.release()
    wall = time.time() - t0
    shutil.rmtree(out, ignore_errors=True)
    if prof is not None:
        prof.stop()
        Path(a.profile).write_text(
            prof.key_averages().table(
                sort_by="cuda_time_total", row_limit=40, max_name_column_width=80
            )
        )
    secs = rep["step_seconds"]
    first = a.warmup  # compile, lock wait and warm-up left out
    last = len(secs) - (2 if prof is not None else 0)  # the profiled step and the next left out
    timed = secs[first:last] or secs
    step_s = statistics.median(timed)
    B, T, k = s["batch"], s["seq"], cfg.ttt_steps
    tok_s = B * T / step_s
    h = rep["history"]
    c = DrafterConfig.for_target(target.config, s["draft_vocab"], 3)  # what train_drafter builds
    fl = flops_per_token(c, T, k)
    loss_bearing = statistics.median(rep["step_token_steps"][first:last] or rep["step_token_steps"])
    res = {
        "precision": a.precision,
        "torch_compile": a.compile,
        "fast_path": rep["fast_path"],
        "steps": a.steps,
        "warmup_steps_left_out": first,
        "step_s_median": step_s,
        "step_s_all": secs,
        "tokens_per_s": tok_s,
        "loss_token_steps_per_step": loss_bearing,
        "loss_bearing_tokens_per_s": loss_bearing / k / step_s,
        "loss_bearing_is": "scored positions summed over the 7 TTT steps / 7, per second",
        "flops_per_token": fl,
        "wall_s": wall,
        "loss": [x["loss"] for x in h],
        "step_loss_last": h[-1]["step_loss"],
        "step_acc_last": h[-1]["step_acc"],
        "vocab": rep["vocab"],
    }
    if dev.type == "cuda":
        res["max_mem_gib_timed"] = torch.cuda.max_memory_allocated() / 2**30
        res["max_reserved_gib_timed"] = torch.cuda.max_memory_reserved() / 2**30
        res["data_resident_gib"] = (
            sum(v.numel() * v.element_size() for b in src.batches_ for v in b.values()) / 2**30
        )
    if a.peak:
        res["peak_tflops"] = a.peak
        res["mfu"] = fl["drafter_train"] * tok_s / (a.peak * 1e12)
        res["mfu_incl_labels"] = (fl["drafter_train"] + fl["labels"]) * tok_s / (a.peak * 1e12)
    return res


def curve_check(a: list[float], b: list[float]) -> dict:
    """bf16-mixed curve ``a`` against the float32 curve ``b`` (same steps)."""
    n = min(len(a), len(b))
    rel = [abs(x - y) / abs(y) for x, y in zip(a[:n], b[:n])]
    ma, mb = statistics.mean(a[n - 10 : n]), statistics.mean(b[n - 10 : n])
    mean_rel = abs(ma - mb) / abs(mb)
    return {
        "steps": n,
        "max_rel_diff": max(rel),
        "rel_diff": rel,
        "last10_mean_bf16_mixed": ma,
        "last10_mean_float32": mb,
        "last10_mean_rel_diff": mean_rel,
        "tolerance": {"per_step_rel": CURVE_RTOL, "last10_mean_rel": CURVE_MEAN_RTOL},
        "within_tolerance": max(rel) <= CURVE_RTOL and mean_rel <= CURVE_MEAN_RTOL,
        "first_last_float32": [b[0], b[n - 1]],
    }


def run_all(a) -> dict:
    from mfu import gpu_info, matmul_peak

    od = Path(a.out_dir)
    od.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not a.tiny
    res = {"info": gpu_info() if cuda else {"device": "cpu"}, "started": time.time()}
    if cuda:
        res["peak"] = matmul_peak()
        torch.cuda.empty_cache()
    peak = res.get("peak", {}).get("tflops_median", 0.0)
    t = time.time()
    head = write_head_target(Path(tempfile.mkdtemp(prefix="head_")), shapes(a.tiny))
    res["head_write_s"] = time.time() - t
    lock = str(Path(tempfile.mkdtemp(prefix="gpu_lock_")) / "gpu.lock")
    py, me = sys.executable, str(Path(__file__).resolve())
    dev = "cuda" if cuda else "cpu"
    common = ["--head", str(head), "--lock", lock, "--peak", str(peak), "--device", dev]
    common += ["--steps", str(a.steps)] + (["--tiny"] if a.tiny else [])
    logs = {}

    def start(name, cmd):
        logs[name] = open(od / f"{name}.log", "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        return subprocess.Popen(cmd, stdout=logs[name], stderr=subprocess.STDOUT, env=env)

    procs = {}
    if cuda:
        procs["main"] = start("main", [py, me, "run", *common, "--precision", "bf16-mixed",
            "--compile", "on", "--warmup", str(a.warmup), "--profile", str(od / "profile_main.txt"),
            "--out", str(od / "main.json")])  # fmt: skip
        if not a.no_ceiling:
            procs["ceiling"] = start("ceiling", [py, str(ROOT / "bench" / "mfu.py"), "offline",
                "--attn", "flex", "--compile-layer", "--steps", "10", "--warmup", "3",
                "--peak", str(peak), "--lock", lock, "--out", str(od / "ceiling.json")])  # fmt: skip
    procs["float32"] = start("float32", [py, me, "run", *common, "--precision", "float32",
        "--compile", "off", "--warmup", "3",
        "--out", str(od / "float32.json")])  # fmt: skip
    for name, p in procs.items():
        left = max(1.0, a.budget - (time.time() - res["started"]))
        try:
            p.wait(timeout=left)
        except subprocess.TimeoutExpired:
            p.kill()
            res.setdefault("timed_out", []).append(name)
    for name in procs:
        f = od / f"{name}.json"
        if f.exists():
            r = json.loads(f.read_text())
            r.pop("flops_per_token", None) if name != "main" else None
            res[name] = r
        else:
            res[name] = {"error": (od / f"{name}.log").read_text()[-3000:]}
    m, f32, ce = res.get("main", {}), res.get("float32", {}), res.get("ceiling", {})
    if "loss" in m and "loss" in f32:
        res["curve"] = curve_check(m["loss"], f32["loss"])
    if "tokens_per_s" in m and "tokens_per_s" in ce:
        res["ratio_to_ceiling"] = m["tokens_per_s"] / ce["tokens_per_s"]
    if "tokens_per_s" in m and "tokens_per_s" in f32:
        res["speedup_vs_float32_path"] = m["tokens_per_s"] / f32["tokens_per_s"]
    res["targets"] = {"tokens_per_s": 32500, "max_mem_gib": 36}
    res["wall_s"] = time.time() - res["started"]
    res["git_commit"] = os.environ.get("EAGLE3NB_COMMIT") or subprocess.run(["git", "rev-parse",
        "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # fmt: skip
    return res


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("mode", choices=["all", "run"])
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results" / "train_gpu"))
    ap.add_argument("--out", default="")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--precision", default="bf16-mixed")
    ap.add_argument("--compile", default="on")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--head", default="")
    ap.add_argument("--lock", default="")
    ap.add_argument("--peak", type=float, default=0.0)
    ap.add_argument("--profile", default="")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--no-ceiling", action="store_true")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for all runs together")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True  # as bench/mfu.py (float32 path: TF32 matmuls)
    res = run_all(a) if a.mode == "all" else run_one(a)
    out = Path(a.out) if a.out else Path(a.out_dir) / f"{a.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    short = {k: v for k, v in res.items() if k not in ("step_s_all", "loss", "flops_per_token")}
    print(json.dumps(short, indent=1, default=str)[:6000], flush=True)


if __name__ == "__main__":
    main()
