"""02b refuses, before any capture, a shard_size whose shards the host cannot hold in memory
(eagle3nb.dataset.layout.check_writer_memory), naming the parameter and a size that fits."""

import pytest

import eagle3nb.dataset.layout as layout
from eagle3nb import params
from eagle3nb.rundir import RunDir
from eagle3nb.steps.extract.from_sglang import extract_sglang_step
from eagle3nb.steps.generate.step import generate_step


def test_02b_refuses_shards_too_large_for_memory_before_capturing(tmp_path, monkeypatch):
    p = params.RunParams(
        outputs_dir=str(tmp_path), run_name="mem", max_train_prompts=6, max_new_tokens=8,
        extract_engine="hf", shard_size=4,
    )  # fmt: skip
    generate_step(p, progress=False)
    monkeypatch.setattr(layout, "available_memory_bytes", lambda: 1000)  # 1 kB "available"
    with pytest.raises(
        ValueError, match=r"shard_size=4: the largest shard is .* 0\.00 GB available"
    ):
        extract_sglang_step(p, progress=False)
    assert not list(RunDir(p).dataset.glob("shard-*"))  # refused before any shard was captured
