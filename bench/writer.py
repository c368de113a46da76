"""02a's dataset writer against the disk it writes to, in one run.

    PYTHONPATH=. .venv/bin/python bench/writer.py [--hidden 4096 --sample-len 512 ...] \
        [--dir /tmp/eagle3nb-writer] [--out bench/results/writer.json]

The writer is :func:`eagle3nb.dataset.write.write_dataset`, the function 02a calls. Its capture
callable replays states made once before the timing (random bfloat16 tensors of the target's
shape: the writer only checks them for NaN/inf, concatenates and stores them), so the rate is the
writer's own and not an engine's; the GPU bench (bench/gpu_engines.py, ``dataset_write``)
measures it behind vLLM's capture. The baseline, measured in the same run alternating with the
writer: the same number of bytes written to the same folder as one file per shard from a ready
buffer, fsynced (what a writer with no work of its own would take). The JSON holds both rates,
their ratio (1.0 = the writer writes as fast as the disk takes), and each repeat.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from eagle3nb.dataset.write import write_dataset  # noqa: E402
from eagle3nb.manifest import atomic_write_json, git_commit  # noqa: E402
from eagle3nb.target.capture import Captured  # noqa: E402


def disk_write_seconds(folder: Path, n_files: int, file_bytes: int) -> float:
    """Seconds to write ``n_files`` files of ``file_bytes`` from a ready random buffer of up to
    64 MiB, each fsynced, then removed (also gpu_workbook.py's env stage's disk probe)."""
    buf = os.urandom(min(file_bytes, 64 << 20))
    t0 = time.perf_counter()
    for i in range(n_files):
        with open(folder / f"probe-{i}.bin", "wb") as f:
            left = file_bytes
            while left > 0:
                f.write(buf[: min(left, len(buf))])
                left -= len(buf)
            f.flush()
            os.fsync(f.fileno())
    secs = time.perf_counter() - t0
    for i in range(n_files):
        (folder / f"probe-{i}.bin").unlink()
    return secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=4096, help="H (4096: Llama-3.1-8B)")
    ap.add_argument("--n-aux", type=int, default=3, help="aux slots")
    ap.add_argument("--samples", type=int, default=256, help="samples written per repeat")
    ap.add_argument("--sample-len", type=int, default=512, help="tokens per sample")
    ap.add_argument("--shard-size", type=int, default=64, help="samples per shard (02a's default)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating disk / writer repeats")
    ap.add_argument("--dir", default="/tmp/eagle3nb-writer", help="folder written to (removed)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "writer.json"))
    a = ap.parse_args()
    for k in ("hidden", "n_aux", "samples", "sample_len", "shard_size", "repeats"):
        if getattr(a, k) < 1:
            raise SystemExit(f"--{k.replace('_', '-')}={getattr(a, k)}: must be >= 1")
    folder = Path(a.dir)
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    pool = [  # states replayed by the capture callable, made before any timing
        (
            torch.randn(a.sample_len, a.n_aux * a.hidden, generator=g).to(torch.bfloat16),
            torch.randn(a.sample_len, a.hidden, generator=g).to(torch.bfloat16),
        )
        for _ in range(8)
    ]

    def replay_capture(xs):
        return [Captured(aux=pool[i % 8][0], final=pool[i % 8][1]) for i in range(len(xs))]

    samples = [(i, [1] * a.sample_len, [1] * a.sample_len) for i in range(a.samples)]
    man = {
        "target": {"name": "bench", "hidden_size": a.hidden},
        "engine": {"name": "replayed states (bench/writer.py)"},
        "convention": "hf",
        "layer_ids": list(range(1, a.n_aux + 1)),
        "aux_boundaries": list(range(1, a.n_aux + 1)),
        "dtype": "bfloat16",
        "template": {"mode": "completion"},
    }
    runs = []
    for r in range(a.repeats):
        ds = folder / "dataset"
        shutil.rmtree(ds, ignore_errors=True)
        t0 = time.perf_counter()
        m = write_dataset(ds, samples, replay_capture, man, a.shard_size, torch.bfloat16)
        w_s = time.perf_counter() - t0
        files = [ds / s["file"] for s in m["shards"]]
        nbytes = sum(f.stat().st_size for f in files)
        shutil.rmtree(ds)
        d_s = disk_write_seconds(folder, len(files), nbytes // len(files))
        runs.append({"writer_s": round(w_s, 3), "disk_s": round(d_s, 3), "bytes": nbytes})
        print(f"repeat {r}: writer {nbytes / w_s / 1e6:.0f} MB/s, disk {nbytes / d_s / 1e6:.0f} MB/s", flush=True)  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)
    nbytes = runs[0]["bytes"]
    w = nbytes / min(x["writer_s"] for x in runs)
    d = nbytes / min(x["disk_s"] for x in runs)
    res = {
        "what": "write_dataset (02a's writer) bytes/s against the disk's (same bytes, same folder, one fsynced file per shard), fastest of the repeats each",
        "writer_bytes_per_s": round(w, 1),
        "disk_bytes_per_s": round(d, 1),
        "writer_over_disk": round(w / d, 3),
        "dataset_bytes": nbytes,
        "shape": {
            k: getattr(a, k) for k in ("hidden", "n_aux", "samples", "sample_len", "shard_size")
        },  # fmt: skip
        "dtype": "bfloat16",
        "runs": runs,
        "dir": str(folder),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d"),
    }
    atomic_write_json(a.out, res)
    print(f"writer {w / 1e6:.0f} MB/s, disk {d / 1e6:.0f} MB/s: ratio {w / d:.3f} -> {a.out}")


if __name__ == "__main__":
    main()
