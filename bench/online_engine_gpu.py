"""Issue 44 item 4 on one GPU: training fed by the serving engine against offline-from-disk and
HF-online, on the same samples, batch plan and steps, at the Llama-3.1-8B shape with random bf16
weights (nothing downloaded).

    python bench/online_engine_gpu.py --out OUT/results --work /tmp/e3gpu   # GPU, < 9 minutes
    python bench/online_engine_gpu.py --tiny --out /tmp/oe                  # CPU plumbing

Target: Llama-3.1-8B's config (``bench/real_shape.py``) cut to ``--layers`` of its 32 layers (8
by default: a 32-layer folder is 16 GB to write and load, and each capture costs 4x), random
weights written once as a bf16 HF folder (``real_shape.write_target``) that vLLM and HF both load.
Aux boundaries: the default picker's low/mid/high for that depth, inside the cut (vLLM ids =
boundaries), boundary N from the same forward.

Three sources of the same batches, each through :func:`eagle3nb.training.loop.train_drafter`
(the function 03 calls) with 03's CUDA defaults (bf16-mixed, compiled, flex attention, 4 loader
workers offline):
  engine   :class:`eagle3nb.training.engine_online.EngineOnlineSource` over vLLM in this process
           (``EngineClient(python="")``: ``vllm_python: ""``), its capture thread and
           :class:`eagle3nb.training.transport.ByteBoundedQueue`, as 03 online uses them.
  offline  the same samples captured once by the same engine with 02a's writer
           (:func:`eagle3nb.dataset.write.write_dataset`, bf16 shards), then read memory-mapped with
           the page cache of its shards dropped before each run.
  hf       :class:`eagle3nb.training.online.OnlineSource`: the HF copy of the target in the loop.

A warm-up run (not counted) compiles the drafter; then ``--rounds`` rounds, the three modes in a
rotated order each round. Per run: loss-token-steps/s over the steps after ``--warmup``, the median
step, each side's busy share (engine: capture seconds / training seconds; trainer: 1 - its wait for
the next batch / training seconds), the queue's waits, peak GPU memory, bytes under the run folder
and the engine's temp folder. Per round the ratios engine/offline and hf/offline, summarised with
:func:`eagle3nb.timing.summarize` (median, spread, verdict). Checkpoint writes are off in these
runs (a 5 GB optimizer state per run would time the disk; 03 writes them). A last short engine run
re-checks streamed batches against the engine's own capture every few steps (the bf16 tolerance of
``steps/train/online_engine.py`` RECHECK_TOL was unmeasured on a GPU).

Loader workers: 03's auto (4 forked workers on CUDA, none on CPU). On CPU they must stay off: a
worker forked beside vLLM 0.32.0's in-process CPU engine hung in libgomp's barrier (vLLM's CPU
worker makes ``torch.set_num_threads`` a no-op, and a forked DataLoader worker relies on setting
one thread); vLLM's GPU worker does not patch it.

Resumable: state in WORK/online_engine/state.json (the target folder and dataset in WORK too); a
second call continues the rounds the time budget cut. The JSON (``OUT/online_engine_gpu.json``)
is rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

SKIP = 8  # loss on every position after the first SKIP (as bench/online_gpu.py)
MODES = ("engine", "offline", "hf")


def target_config(a) -> dict:
    from real_shape import llama31_8b_config

    if a.tiny:  # CPU plumbing: head_dim 32 for vLLM's CPU attention (gpu_workbook's tiny shape)
        return llama31_8b_config(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=1024,
            bos_token_id=1000, eos_token_id=1001, max_position_embeddings=512)  # fmt: skip
    return llama31_8b_config(num_hidden_layers=a.layers)


def make_samples(n: int, T: int, vocab: int, seed: int = 3) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(i, torch.randint(0, vocab, (T,), generator=g).tolist(), [0] * SKIP + [1] * (T - SKIP))
        for i in range(n)]  # fmt: skip


def train_cfg(a, steps: int, log_every: int = 5):
    from eagle3nb.training.loop import TrainConfig

    return TrainConfig(
        draft_vocab_size=a.draft_vocab,
        draft_num_heads=0,
        draft_num_kv_heads=0,
        batch_size=a.batch,
        max_steps=steps,
        lr=1e-4,
        warmup_steps=5,
        ttt_steps=7,
        log_every=log_every,
        checkpoint_every=10**6,
        eval_every=0,
        seed=0,
        loader_workers=-1,  # auto: 4 on CUDA (03's default), 0 on CPU (see main's note)
        bucket_by_length=False,
        export_from="last",
    )  # fmt: skip  (attention, precision, torch_compile: auto = 03's choice for the device)


def folder_bytes(root) -> int:
    root = Path(root)
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0


def drop_page_cache(ds_dir: Path) -> None:
    for f in ds_dir.glob("*.safetensors"):  # cold page cache: the reads hit the disk
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


class Bench:
    """The target, the engine, the HF copy and the dataset of one bench call."""

    def __init__(self, a):
        self.a, self.dev = a, "cpu" if a.tiny else "cuda"
        self.dtype = "float32" if a.tiny else "bfloat16"
        self.work = Path(a.work) / ("online_engine_tiny" if a.tiny else "online_engine")
        self.work.mkdir(parents=True, exist_ok=True)
        self.state_file = self.work / "state.json"
        self.state = json.loads(self.state_file.read_text()) if self.state_file.is_file() else {}
        self.t_end = time.time() + a.time_budget_s
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.t_end - time.time()

    def save(self) -> None:
        from gpu_workbook import versions

        st = self.state
        st.setdefault("calls", [])
        st["versions"] = versions()
        st["summary"] = summary(st.get("runs", []), self.a.rounds)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=1, default=str))
        os.replace(tmp, self.state_file)
        name = "online_engine_tiny.json" if self.a.tiny else "online_engine_gpu.json"
        shutil.copy(self.state_file, self.out / name)

    # ---- set-up ------------------------------------------------------------------------------
    def target(self):
        from real_shape import write_target

        from eagle3nb.boundaries.conventions import aux_ids_and_boundaries

        cfg = target_config(self.a)
        n = cfg["num_hidden_layers"]
        self.vids, self.bnds = aux_ids_and_boundaries("vllm", None, n)  # vLLM id = boundary
        t0 = time.time()
        name = "tiny" if self.a.tiny else f"llama-3.1-8b-L{n}"
        self.folder = write_target(cfg, self.work.parent / "models" / name, "random", self.dev,
            self.dtype)  # fmt: skip
        secs = time.time() - t0
        if self.dev == "cuda":  # the GPU empty again before vLLM measures its free memory
            import gc

            gc.collect()
            torch.cuda.empty_cache()
        self.n = n
        self.state.setdefault("target", {
            "shape": "Llama-3.1-8B" + (" at tiny width (CPU plumbing)" if self.a.tiny else ""),
            "layers": f"{n} of 32" if not self.a.tiny else f"{n} (tiny)",
            "cut_why": None if self.a.tiny else "a 32-layer bf16 folder is 16 GB to write and "
            "load within one 10-minute call; the engine's work per token is about n/32 of the "
            "real 8B's (the drafter's is the real shape's)",
            "config": cfg, "weights": f"random, seeded, {self.dtype}, written once; vLLM and HF "
            "load the same folder", "folder_bytes": folder_bytes(self.folder),
            "write_seconds": round(secs, 1), "vllm_ids": self.vids, "boundaries": self.bnds,
            "final_boundary": n,
        })  # fmt: skip

    def engine(self):
        from eagle3nb.engines.adapter import EngineCaptureEngine
        from eagle3nb.engines.client import EngineClient
        from eagle3nb.steps.train.online_engine import shared_memory_dir

        a = self.a
        if a.tiny:
            opts = {"max_model_len": 512, "enforce_eager": True}
        else:  # the GPU shared with the trainer: vLLM takes gpu_memory_utilization of it
            opts = {"max_model_len": a.seq + 64, "enforce_eager": True,
                "llm_kwargs": {"gpu_memory_utilization": a.gpu_mem}}  # fmt: skip
        t0 = time.time()
        self.client = EngineClient("vllm", self.folder, self.dtype, opts, python=a.vllm_python,
            param="--vllm-python", workdir_parent=shared_memory_dir())  # fmt: skip
        self.eng = EngineCaptureEngine(self.client, self.n, a.batch)
        info = self.client.info()
        self.client.capture([[1, 2, 3, 4]], self.vids)  # builds vLLM's capture engine
        self.engine_start_s = time.time() - t0
        self.info = info
        self.state.setdefault("engine_starts", []).append({
            "seconds": round(self.engine_start_s, 1), "in_process": not a.vllm_python,
            "options": opts, "info": info})  # fmt: skip

    def manifest(self) -> dict:
        i = self.info
        return {
            "target": {"name": f"random-llama-3.1-8b-shape-L{self.n}", "sha256": None},
            "engine": {"name": i["engine_name"], "version": i["engine_version"],
                "torch": i["torch_version"], "convention": i["convention"],
                "layer_ids": self.vids, "method": "extract_hidden_states", "device": i["device"]},
            "convention": "vllm", "layer_ids": self.vids, "aux_boundaries": self.bnds,
            "final_boundary": self.n, "dtype": self.dtype, "template": None,
            "generation_sha256": "bench-online-engine-gpu", "n_layers": self.n,
        }  # fmt: skip

    def hf_model(self):
        """The HF copy: the trainer's embedding, final norm and lm_head in every mode, and the
        capture engine of ``hf``; SDPA attention (as bench/online_gpu.py's HF-online; 03's loader
        takes eager attention, slower at T = 2048)."""
        from transformers import AutoModelForCausalLM

        t0 = time.time()
        self.model = AutoModelForCausalLM.from_pretrained(str(self.folder), dtype=getattr(torch,
            self.dtype), attn_implementation="sdpa", local_files_only=True).to(self.dev)  # fmt: skip
        self.model.eval().requires_grad_(False)
        self.state["hf_load_seconds"] = round(time.time() - t0, 1)
        self.state["hf_attention"] = "sdpa"

    def dataset(self):
        from eagle3nb.dataset.write import write_dataset
        from eagle3nb.target.models import DTYPES

        self.ds_dir = self.work / "dataset_vllm"
        t0 = time.time()
        m = write_dataset(self.ds_dir, self.data, lambda xs: self.eng.capture(xs, self.vids),
            self.manifest(), shard_size=8, dtype=DTYPES[self.dtype])  # fmt: skip
        if "offline_capture" not in self.state:  # the call that wrote it (a resumed call reads it)
            secs = time.time() - t0
            self.state["offline_capture"] = {
                "seconds": round(secs, 2), "bytes": folder_bytes(self.ds_dir),
                "tokens": m["n_tokens"], "tokens_per_s": round(m["n_tokens"] / secs, 1),
                "writer": "eagle3nb.dataset.write.write_dataset (02a's), shard_size 8",
            }  # fmt: skip

    # ---- runs --------------------------------------------------------------------------------
    def source(self, mode: str, recheck_every: int = 0):
        from eagle3nb.dataset.read import AuxDataset
        from eagle3nb.steps.train.online_engine import RECHECK_TOL
        from eagle3nb.training.engine_online import EngineOnlineSource
        from eagle3nb.training.online import OnlineSource

        if mode == "engine":
            exact = self.dtype == "float32" and self.dev == "cpu"
            return EngineOnlineSource(self.data, lambda xs: self.eng.capture(xs, self.vids),
                self.manifest(), prefetch_bytes=self.a.prefetch_mib << 20,
                recheck_every=recheck_every, exact=exact,
                recheck_tol=0.0 if exact else RECHECK_TOL[self.dtype])  # fmt: skip
        if mode == "offline":
            drop_page_cache(self.ds_dir)
            return AuxDataset(self.ds_dir, mmap=True)
        return OnlineSource(self.data, self.model, self.vids, "vllm", self.manifest())

    def run(self, mode: str, steps: int, label: str, recheck_every: int = 0) -> dict:
        from eagle3nb.training.loop import train_drafter

        out = self.work / "runs" / label
        shutil.rmtree(out, ignore_errors=True)
        src = self.source(mode, recheck_every)
        if self.dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        _, rep = train_drafter(src, self.model, train_cfg(self.a, steps), out, tracking=(),
            stream=None)  # fmt: skip
        wall = time.time() - t0
        w = min(self.a.warmup, max(len(rep["step_seconds"]) - 1, 0))
        secs, waits, toks = (rep[k][w:] for k in ("step_seconds", "step_wait_seconds",
            "step_token_steps"))  # fmt: skip
        train_s = sum(secs)
        res = {
            "mode": mode, "label": label, "steps": len(rep["step_seconds"]), "timed_steps": len(secs),
            "loss_token_steps_per_s": sum(toks) / train_s, "step_s_median": statistics.median(secs),
            "tokens_per_s": self.a.batch * self.a.seq * len(secs) / train_s,
            "trainer_wait_share": sum(waits) / train_s, "trainer_busy_share": 1 - sum(waits) / train_s,
            "first_step_s": rep["step_seconds"][0], "wall_s": round(wall, 1),
            "loss": [h["loss"] for h in rep["history"]], "empty_batches": rep["empty_batches"],
            "run_folder_bytes": folder_bytes(out),
        }  # fmt: skip
        if mode == "engine":
            st = src.stats()
            # the capture thread's engine seconds over the whole run (warm-up steps included)
            res["engine_busy_share"] = st["target_capture_seconds"] / sum(rep["step_seconds"])
            res["engine_tmp_bytes"] = folder_bytes(self.client.workdir)
            res["online"] = st
        elif mode == "hf":
            res["engine_busy_share"] = src.capture_seconds / sum(rep["step_seconds"])
            res["online"] = src.stats()
        if self.dev == "cuda":
            res["max_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        shutil.rmtree(out, ignore_errors=True)
        return res

    def recheck(self, every: int) -> dict:
        """A short engine run re-checking every ``every`` steps' streamed batch against the
        engine's own capture of the same samples (RECHECK_TOL of 03 where not bit-equal)."""
        from eagle3nb.training.engine_online import RecheckError

        try:
            rc = self.run("engine", 2 * every, "recheck", every)
            recs = rc["online"]["rechecks"]
            return {"every": every, "rechecks": recs, "passed": True,
                "max_abs_diff": max((x["max_abs_diff"] for x in recs), default=None)}  # fmt: skip
        except RecheckError as e:
            return {"every": every, "passed": False, "error": str(e)}


def summary(runs: list, rounds: int) -> dict:
    from eagle3nb.timing import summarize

    by = {m: {r["round"]: r for r in runs if r["mode"] == m and "round" in r} for m in MODES}
    out = {"rounds_done": len(set(by["engine"]) & set(by["offline"]) & set(by["hf"])),
        "rounds_asked": rounds}  # fmt: skip
    for m in MODES:
        v = [by[m][r]["loss_token_steps_per_s"] for r in sorted(by[m])]
        out[f"{m}_loss_token_steps_per_s"] = summarize(
            v, f"{m}: loss-token-steps/s after warm-up", "tokens/s", max_rel_spread=0.1
        ).as_dict()
        for k in ("engine_busy_share", "trainer_busy_share"):
            xs = [by[m][r][k] for r in sorted(by[m]) if k in by[m][r]]
            if xs:
                out[f"{m}_{k}_median"] = round(statistics.median(xs), 4)
    for m in ("engine", "hf"):
        both = sorted(set(by[m]) & set(by["offline"]))
        ratios = [by[m][r]["loss_token_steps_per_s"] / by["offline"][r]["loss_token_steps_per_s"]
            for r in both]  # fmt: skip
        s = summarize(ratios, f"{m} / offline training rate, same batches and steps", "x",
            neutral=1.0)  # fmt: skip
        out[f"{m}_over_offline"] = s.as_dict()
        if m == "engine" and s.median is not None:
            out["goal_online_ge_0.9x_offline"] = {"median": round(s.median, 4),
                "met": s.median >= 0.9, "verdict": s.verdict}  # fmt: skip
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--work", default="/tmp/e3gpu")
    ap.add_argument("--layers", type=int, default=8, help="of Llama-3.1-8B's 32")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=6, help="first steps of each run not timed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefetch-mib", type=int, default=64, help="03's online_prefetch_mib default")
    ap.add_argument("--gpu-mem", type=float, default=0.3, help="vLLM gpu_memory_utilization")
    ap.add_argument("--vllm-python", default="", help='"" = vLLM in this process (03 on a GPU)')
    ap.add_argument("--recheck-every", type=int, default=5, help="the last engine run's re-checks")
    ap.add_argument("--time-budget-s", type=float, default=510)
    ap.add_argument("--compile-s", type=float, default=200, help="left needed for the warm-up")
    ap.add_argument("--tiny", action="store_true", help="CPU plumbing: tiny shapes, float32")
    a = ap.parse_args(argv)
    if a.tiny:
        a.samples, a.seq, a.batch, a.steps, a.warmup, a.draft_vocab = 8, 64, 2, 6, 2, 256
        a.compile_s = min(a.compile_s, 5)
    else:
        a.draft_vocab = 32000
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --tiny for the CPU plumbing")
    b = Bench(a)
    b.state.setdefault("what", __doc__.split("\n\n")[0].replace("\n", " "))
    b.state.setdefault("args", {k: v for k, v in vars(a).items() if k not in ("out", "work")})
    b.state.pop("stopped", None)  # an earlier call's
    b.state["calls"] = b.state.get("calls", []) + [{"started": time.strftime("%FT%TZ", time.gmtime()),
        "argv": sys.argv[1:]}]  # fmt: skip
    from gpu_workbook import device_info

    b.state["device"] = device_info(b.dev)
    b.state["checkpoints"] = (
        "off in these runs (the final 5 GB drafter+optimizer write would time the disk)"
    )
    import eagle3nb.training.loop as loop

    loop.distributed.save_checkpoint = lambda *x, **k: None  # see the note above
    runs = b.state.setdefault("runs", [])
    try:
        for step in ("target", "engine", "hf_model"):
            getattr(b, step)()
            print(f"[online_engine] {step} ready at {a.time_budget_s - b.left():.0f} s", flush=True)
            b.save()
        b.data = make_samples(a.samples, a.seq, min(32000, target_config(a)["vocab_size"]))
        b.dataset()
        b.save()
        print(f"[online_engine] dataset {b.state['offline_capture']}", flush=True)
        if b.left() < a.compile_s:  # the warm-up compiles (178 s on the H200): not in this call
            raise TimeoutError(f"time budget: {b.left():.0f} s left before the warm-up")
        import torch._inductor.config as inductor  # vLLM in this process must not set it to 1

        b.state["inductor_compile_threads"] = inductor.compile_threads
        t0 = time.time()
        warm = b.run("offline", a.warmup + 2, "warm-up")  # compiles the drafter; not counted
        b.state.setdefault("warm_up", []).append(dict(warm, seconds=round(time.time() - t0, 1)))
        b.save()
        est = 0.0
        for r in range(a.rounds):
            order = MODES[r % 3 :] + MODES[: r % 3]
            for m in order:
                if any(x.get("round") == r and x["mode"] == m for x in runs):
                    continue  # done by an earlier call
                if b.left() < 1.3 * est + 20:
                    raise TimeoutError(f"time budget: {b.left():.0f} s left before round {r} {m}")
                res = b.run(m, a.steps, f"r{r}-{m}")
                res["round"] = r
                est = max(est, res["wall_s"])
                runs.append(res)
                b.save()
                print(f"[online_engine] round {r} {m}: {res['loss_token_steps_per_s']:.0f} "
                    f"loss-token-steps/s, wall {res['wall_s']} s", flush=True)  # fmt: skip
        if a.recheck_every and "recheck" not in b.state and b.left() > 1.3 * est + 20:
            b.state["recheck"] = b.recheck(a.recheck_every)
    except TimeoutError as e:
        b.state["stopped"] = str(e)
        print(f"[online_engine] {e}; call again to continue", flush=True)
    except Exception as e:  # noqa: BLE001 (keep what is done, say what failed)
        b.state.setdefault("errors", []).append({"error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc()[-4000:]})  # fmt: skip
        print(traceback.format_exc()[-4000:], flush=True)
    finally:
        client = getattr(b, "client", None)
        if client is not None:
            client.close()
        b.save()
    print(json.dumps(b.state["summary"], indent=1), flush=True)
    return 1 if b.state.get("errors") and not runs else 0


if __name__ == "__main__":
    raise SystemExit(main())
