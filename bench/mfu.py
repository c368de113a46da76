"""Drafter training speed against the GPU's limits: tokens/s and model FLOPs utilisation (MFU).

A drafter for Llama-3.1-8B shapes (H 4096, 32 heads / 8 kv heads of 128, intermediate 14336,
target vocab 128256, draft vocab 32000, 3 aux boundaries), TTT k = 7, sequences of T = 2048, built
and trained with eagle3nb's own :class:`~eagle3nb.drafter.model.Eagle3Drafter` and
:func:`~eagle3nb.training.objective.ttt_loss` (the code users train with), bf16 weights, fused AdamW, grad
clipping. All weights and data are random, created on the GPU from a seed (no downloads).

Modes:
    peak     the bf16 dense matmul rate of this GPU: an 8192^3 product in a loop (random data,
             median of several timed runs). Every MFU below divides by the peak measured in the
             same run (``python bench/mfu.py all`` measures it first and passes it on).
    offline  one training step = ttt_loss on stored aux/final states + backward + optimizer.
    online   the target (an 8B Llama with random bf16 weights, HF transformers, SDPA) runs inside
             the step: a no-grad forward captures the aux boundaries and boundary N, then the
             drafter step as offline.
    loader   reading a batch from a local safetensors shard (memory-mapped, page cache dropped for
             the file first) and copying it to the GPU, against the offline step time.

FLOPs counted per token (one sequence position; multiply-add = 2 FLOPs; forward):

    fc         2 * n_aux*Ht * H                       once per token (step 0 only)
    per TTT step j = 0..k-1:
    qkvo       2 * (2H * (nh + 2 nkv) * hd + nh*hd * H)    q/k/v read the 2H concat input
    attn_j     4 * nh * hd * ((T+1)/2 + j)            QK^T and PV over the causal step-0 keys
                                                      (mean (T+1)/2 per query) plus j diagonal keys
    mlp        2 * 3 * H * I
    lm_head    2 * H * V_draft
    drafter forward = fc + sum_j (qkvo + attn_j + mlp + lm_head);  training = 3 x forward
    labels     2 * Ht * V_target                      the target's lm_head on boundary N, forward
                                                      only, inside ttt_loss (both modes)
    target     2 * L * (H*(nh+2nkv)*hd + nh*hd*H + 3*H*I) + L * 4*nh*hd*(T+1)/2   (online only)

The "x3" is the usual convention (backward = 2 x forward); it slightly over-counts the fc (no input
gradient needed) and ignores elementwise work (norms, RoPE, softmax, loss). Embedding lookups are
free. MFU = counted FLOPs per second / measured peak. ``mfu`` is the drafter alone (offline) or
target forward + labels + drafter (online, "combined"); ``mfu_incl_labels`` adds the label head
offline.

Usage (on the GPU box; results as JSON under bench/results/):

    python bench/mfu.py all                     # peak, offline (eager and flex), online, loader
    python bench/mfu.py offline --attn flex --batch 4 --peak 790
    python bench/mfu.py all --variants "offline --attn flex" "offline --attn flex --nproc 2"   # 1 vs 2 GPUs (DDP)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter, RMSNorm
from eagle3nb.training.objective import ttt_loss

RESULTS = ROOT / "bench" / "results"
LLAMA_31_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    num_hidden_layers=32,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
)


def drafter_config(draft_vocab: int = 32000, n_aux: int = 3) -> DrafterConfig:
    t = LLAMA_31_8B
    return DrafterConfig(
        hidden_size=t["hidden_size"],
        target_hidden_size=t["hidden_size"],
        intermediate_size=t["intermediate_size"],
        num_attention_heads=t["num_attention_heads"],
        num_key_value_heads=t["num_key_value_heads"],
        head_dim=t["head_dim"],
        vocab_size=t["vocab_size"],
        draft_vocab_size=draft_vocab,
        n_aux=n_aux,
        rms_norm_eps=t["rms_norm_eps"],
        rope_theta=t["rope_theta"],
        max_position_embeddings=t["max_position_embeddings"],
    )


def flops_per_token(c: DrafterConfig, T: int, k: int, n_layers: int = 32) -> dict:
    """Forward FLOPs per token (see the module docstring); ``drafter_train`` = 3 x drafter forward."""
    H, Ht, mlp_w, nh, nkv, hd = (
        c.hidden_size,
        c.target_hidden_size,
        c.intermediate_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
    )
    fc = 2 * c.n_aux * Ht * H
    qkvo = 2 * (2 * H * (nh + 2 * nkv) * hd + nh * hd * H)
    mlp = 2 * 3 * H * mlp_w
    head = 2 * H * c.draft_vocab_size
    attn = [4 * nh * hd * ((T + 1) / 2 + j) for j in range(k)]
    fwd = fc + k * (qkvo + mlp + head) + sum(attn)
    labels = 2 * Ht * c.vocab_size
    target = n_layers * (
        2 * (Ht * (nh + 2 * nkv) * hd + nh * hd * Ht + 3 * Ht * mlp_w) + 4 * nh * hd * (T + 1) / 2
    )
    return {
        "fc": fc,
        "qkvo_per_step": qkvo,
        "mlp_per_step": mlp,
        "lm_head_per_step": head,
        "attn_per_step": attn,
        "drafter_fwd": fwd,
        "drafter_train": 3 * fwd,
        "labels": labels,
        "target_fwd": target,
    }


def gpu_info() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {
        "gpu": p.name,
        "sms": p.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "n_gpus": torch.cuda.device_count(),
    }


def matmul_peak(n: int = 8192, inner: int = 20, repeats: int = 15) -> dict:
    """bf16 dense matmul TFLOP/s: median over ``repeats`` timings of ``inner`` products, random data,
    after about a second of warm-up (the clocks settle under sustained load, as in training)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(60):
        torch.mm(a, b, out=out)
    rates = []
    for _ in range(repeats):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(inner):
            torch.mm(a, b, out=out)
        e1.record()
        torch.cuda.synchronize()
        rates.append(2 * n**3 * inner / (e0.elapsed_time(e1) / 1e3) / 1e12)
    return {
        "n": n,
        "tflops_median": statistics.median(rates),
        "tflops_max": max(rates),
        "tflops_all": rates,
    }


def build_drafter(c: DrafterConfig, attn: str, seed: int = 0) -> Eagle3Drafter:
    torch.manual_seed(seed)
    with torch.device("cuda"):
        d = Eagle3Drafter(c)
        ids = (
            torch.randperm(c.vocab_size)[: c.draft_vocab_size].sort().values
        )  # draft vocab: random target ids
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        d.set_vocab(ids - torch.arange(c.draft_vocab_size), t2d)
    return d.to(torch.bfloat16).set_attention(attn)


def make_batch(c: DrafterConfig, B: int, T: int, seed: int = 1) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev, bf = "cuda", torch.bfloat16
    return {
        "input_ids": torch.randint(0, c.vocab_size, (B, T), device=dev, generator=g),
        "aux": torch.randn(B, T, c.n_aux * c.target_hidden_size, device=dev, dtype=bf, generator=g),
        "final": torch.randn(B, T, c.target_hidden_size, device=dev, dtype=bf, generator=g),
        "loss_mask": torch.ones(B, T, dtype=torch.long, device=dev),
        "attn_mask": torch.ones(B, T, dtype=torch.long, device=dev),
    }


def build_target(seed: int = 0):
    """An 8B Llama (Llama-3.1-8B config) with random bf16 weights made on the GPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    t = LLAMA_31_8B
    cfg = LlamaConfig(
        hidden_size=t["hidden_size"],
        intermediate_size=t["intermediate_size"],
        num_attention_heads=t["num_attention_heads"],
        num_key_value_heads=t["num_key_value_heads"],
        head_dim=t["head_dim"],
        vocab_size=t["vocab_size"],
        num_hidden_layers=t["num_hidden_layers"],
        rms_norm_eps=t["rms_norm_eps"],
        rope_theta=t["rope_theta"],
        max_position_embeddings=t["max_position_embeddings"],
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            m = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return m.eval().requires_grad_(False)


def train_bench(args) -> dict:
    """One training configuration; under torchrun (``--nproc N`` in ``all``) data parallel through
    eagle3nb's own DDP wrapping (:mod:`eagle3nb.training.distributed`, :class:`eagle3nb.training.objective.TTTObjective`),
    ``--batch`` per rank, tokens/s over all ranks, MFU per GPU."""
    ctx = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from eagle3nb.training import distributed

        ctx = distributed.init_from_env("cuda")  # nccl; this process takes GPU LOCAL_RANK
    rank, world = (ctx.rank, ctx.world) if ctx else (0, 1)
    c = drafter_config(args.draft_vocab)
    B, T, k = args.batch, args.seq, args.ttt
    d = build_drafter(c, args.attn)
    if args.compile_layer:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        d.midlayer.compile(dynamic=False)
    params = [p for p in d.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), fused=True)
    fl = flops_per_token(c, T, k)
    target = None
    if args.mode == "online":
        from eagle3nb.target.capture import capture_boundaries
        from eagle3nb.boundaries.conventions import aux_ids_and_boundaries

        target = build_target()
        L = LLAMA_31_8B["num_hidden_layers"]
        _, bounds = aux_ids_and_boundaries("sglang", None, L)
        norm, head = target.model.norm, target.lm_head
    else:
        torch.manual_seed(2)
        with torch.device("cuda"):
            norm = RMSNorm(c.target_hidden_size, c.rms_norm_eps).to(torch.bfloat16)
            head = torch.nn.Linear(c.target_hidden_size, c.vocab_size, bias=False).to(
                torch.bfloat16
            )
    batches = [
        make_batch(c, B, T, seed=s + 100 * rank) for s in range(2)
    ]  # two, alternated: no reuse effects
    model = None
    if ctx is not None:
        from eagle3nb.training.objective import TTTObjective

        model, _ = distributed.wrap(TTTObjective(d, norm, head, k, 0.8), False, ctx)

    def step(b):
        if target is not None:
            st = capture_boundaries(target, b["input_ids"], list(bounds) + [L], b["attn_mask"])
            aux, final = torch.cat([st[x] for x in bounds], dim=-1), st[L]  # [B, T, 3H], [B, T, H]
        else:
            aux, final = b["aux"], b["final"]
        if model is not None:
            r = model(b | {"aux": aux, "final": final}, ctx.sum)
        else:
            r = ttt_loss(
                d, b["input_ids"], aux, final, b["loss_mask"], b["attn_mask"], norm, head, k
            )
        r.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return r

    t0 = time.time()
    lock = None
    for i in range(args.warmup):
        r = step(batches[i % 2])
        if i == 0 and args.lock:  # after the compiling step, the GPU to this process alone
            import fcntl  # (bench/train_gpu.py runs several processes)

            torch.cuda.synchronize()
            lock = open(args.lock, "a")
            fcntl.flock(lock, fcntl.LOCK_EX)
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.steps):
        t1 = time.perf_counter()
        r = step(batches[i % 2])
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t1)
    if lock is not None:
        lock.close()  # releases the lock
    step_s = statistics.median(times)
    tok_s = B * T * world / step_s  # all ranks
    peak = (args.peak or matmul_peak()["tflops_median"]) * world  # MFU per GPU = over world x peak
    out = {
        "mode": args.mode,
        "attn": args.attn,
        "compile_layer": args.compile_layer,
        "world_size": world,
        "batch_per_rank": B,
        "batch": B * world,
        "seq": T,
        "ttt": k,
        "draft_vocab": c.draft_vocab_size,
        "step_s_median": step_s,
        "step_s_all": times,
        "warmup_s": warm_s,
        "tokens_per_s": tok_s,
        "peak_tflops": peak / world,
        "max_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "loss_last": float(r.loss.detach()),
        "flops_per_token": fl,
    }
    if args.mode == "online":
        combined = fl["target_fwd"] + fl["labels"] + fl["drafter_train"]
        out["mfu"] = combined * tok_s / (peak * 1e12)
        out["mfu_drafter_only"] = fl["drafter_train"] * tok_s / (peak * 1e12)
    else:
        out["mfu"] = fl["drafter_train"] * tok_s / (peak * 1e12)
        out["mfu_incl_labels"] = (fl["drafter_train"] + fl["labels"]) * tok_s / (peak * 1e12)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(batches[0])
            torch.cuda.synchronize()
        table = prof.key_averages().table(
            sort_by="cuda_time_total", row_limit=25, max_name_column_width=70
        )
        (Path(args.profile)).write_text(table)
    if ctx is not None:
        torch.distributed.destroy_process_group()
        if rank != 0:
            sys.exit(0)  # rank 0 writes the result
    return out


def loader_bench(args) -> dict:
    """Time reading B samples of T tokens from a local shard (mmap, cold page cache) onto the GPU."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    c = drafter_config(args.draft_vocab)
    B, T, S = args.batch, args.seq, args.shard_samples
    A, H = c.n_aux * c.target_hidden_size, c.target_hidden_size
    d = Path(args.shard_dir)
    d.mkdir(parents=True, exist_ok=True)
    f = d / "shard-00000.safetensors"
    g = torch.Generator().manual_seed(0)
    N = S * T
    t = {
        "input_ids": torch.randint(0, c.vocab_size, (N,), generator=g),
        "loss_mask": torch.ones(N, dtype=torch.uint8),
        "aux": torch.randn(N, A, generator=g).to(torch.bfloat16),
        "final": torch.randn(N, H, generator=g).to(torch.bfloat16),
        "offsets": torch.arange(S + 1) * T,
        "sample_ids": torch.arange(S),
    }
    if (
        not f.exists() or f.stat().st_size < N * (A + H) * 2
    ):  # reuse the shard of an earlier loader run
        save_file(t, str(f))
    del t
    fd = os.open(f, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(
        fd, 0, 0, os.POSIX_FADV_DONTNEED
    )  # drop this file's pages: the reads below hit the disk
    os.close(fd)
    order = torch.randperm(S, generator=g).tolist()
    handles = [safe_open(str(f), framework="pt") for _ in range(args.read_threads)]

    def read(i):  # one sample's rows, through the thread's own handle
        sf, a = handles[i % len(handles)], order[i] * T
        return {
            key: sf.get_slice(key)[a : a + T] for key in ("input_ids", "loss_mask", "aux", "final")
        }

    times, nbytes = [], 0
    with ThreadPoolExecutor(args.read_threads) as pool:
        for i in range(0, S - B + 1, B):
            t1 = time.perf_counter()
            samples = list(pool.map(read, range(i, i + B)))
            batch = {
                key: torch.stack([x[key] for x in samples])
                .pin_memory()
                .to("cuda", non_blocking=True)
                for key in samples[0]
            }
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t1)
            nbytes += sum(x.numel() * x.element_size() for x in batch.values())
    return {
        "mode": "loader",
        "shard_gib": f.stat().st_size / 2**30,
        "batch": B,
        "seq": T,
        "batch_read_s_median": statistics.median(times),
        "batch_read_s_all": times,
        "read_gib_per_s": nbytes / sum(times) / 2**30,
        "read_threads": args.read_threads,
        "note": "cold page cache (posix_fadvise DONTNEED), random sample order, mmap slices -> pinned -> GPU",
    }


def run_all(args) -> dict:
    """Peak first, then each variant in its own process (an OOM or compile failure stays local)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {"info": gpu_info(), "peak": matmul_peak(), "runs": []}
    peak = summary["peak"]["tflops_median"]
    print(
        f"peak bf16 matmul: median {peak:.0f}, max {summary['peak']['tflops_max']:.0f} TFLOP/s",
        flush=True,
    )
    variants = [v.split() for v in args.variants]
    for v in variants:
        name = "_".join(x.strip("-") for x in v if "/" not in x)  # before --nproc is taken out
        outf = RESULTS / f"{name}.json"
        launch = [sys.executable]
        if "--nproc" in v:  # data parallel: torchrun, one process per GPU
            i = v.index("--nproc")
            launch = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                v[i + 1],
            ]
            v = v[:i] + v[i + 2 :]
        cmd = [*launch, __file__, *v, "--peak", str(peak), "--out", str(outf)]
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.variant_timeout)
        if p.returncode != 0 or not outf.exists():
            res = {"variant": v, "error": (p.stderr or p.stdout)[-3000:]}
        else:
            res = json.loads(outf.read_text()) | {"variant": v}
        res["wall_s"] = time.time() - t0
        for key in ("mfu", "mfu_incl_labels"):  # the same against the best timing of the peak loop
            if res.get(key) is not None:
                res[key + "_vs_max_peak"] = res[key] * peak / summary["peak"]["tflops_max"]
        summary["runs"].append(res)
        short = {
            x: res.get(x)
            for x in (
                "tokens_per_s",
                "mfu",
                "mfu_incl_labels",
                "step_s_median",
                "max_mem_gib",
                "batch_read_s_median",
                "read_gib_per_s",
            )
        }
        print(
            " ".join(v),
            json.dumps(short) if "error" not in res else "ERROR " + res["error"][-1500:],
            flush=True,
        )
    return summary


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("mode", choices=["peak", "offline", "online", "loader", "all"])
    ap.add_argument("--attn", default="flex", choices=["eager", "flex"])
    ap.add_argument(
        "--compile-layer",
        action="store_true",
        help="torch.compile the decoder layer (norms, RoPE, MLP fused)",
    )
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--ttt", type=int, default=7)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument(
        "--peak",
        type=float,
        default=0.0,
        help="TFLOP/s measured earlier in the same run (0: measure now)",
    )
    ap.add_argument(
        "--profile", default="", help="write a CUDA kernel table of one step to this file"
    )
    ap.add_argument("--shard-dir", default="/tmp/eagle3nb_shards")
    ap.add_argument("--shard-samples", type=int, default=32)
    ap.add_argument("--read-threads", type=int, default=1, help="loader: samples read in parallel")
    ap.add_argument(
        "--variants",
        nargs="*",
        default=["offline --attn eager", "offline --attn flex", "online --attn flex", "loader"],
    )
    ap.add_argument("--variant-timeout", type=int, default=400)
    ap.add_argument("--out", default="")
    ap.add_argument("--lock", default="", help="file locked while timing (shared GPU)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if a.mode == "peak":
        res = {"info": gpu_info(), "peak": matmul_peak()}
    elif a.mode == "all":
        res = run_all(a)
    elif a.mode == "loader":
        res = loader_bench(a)
    else:
        res = train_bench(a)
    res["git_commit"] = (
        os.environ.get("EAGLE3NB_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        or None
    )
    out = Path(a.out) if a.out else RESULTS / f"{a.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    if a.mode != "all":
        print(
            json.dumps(
                {
                    k: v
                    for k, v in res.items()
                    if k not in ("flops_per_token", "step_s_all", "batch_read_s_all")
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
