"""The SGLang bundle's composition on CPU, without network: SGLang's torch pins as the reference
states them, the 0.5.17 set picked for the GPU host's torch, its wheels composed beside vLLM's set
(nothing of vLLM's or eagle3nb's repeated, transformers and tokenizers kept ahead of the host's),
its pruning, and install.sh's python wrapper putting both sites on the path (a fake bundle)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from eagle3nb.offline import bundle
from eagle3nb.offline.sets import (
    ENGINE_PINS,
    HAVE_IMAGES,
    WHEEL_SETS,
    beside_names,
    pick_engine,
)

# ../shared/reference/gpu_engines_h200.md: "sglang 0.5.12-0.5.17 pin torch 2.11.0 (0.5.18 pins
# 2.13, 0.5.23 pins 2.14.1)"; streaming_and_versions.md 2a: 0.5.19-0.5.21 pin 2.13.0
REFERENCE = {"0.5.12": "2.11.0", "0.5.17": "2.11.0", "0.5.18": "2.13.0", "0.5.21": "2.13.0",
             "0.5.23": "2.14.1"}  # fmt: skip


def test_sglang_pins_agree_with_the_reference():
    rows = [p for p in ENGINE_PINS if p.engine == "sglang"]
    for v, torch in REFERENCE.items():
        vt = tuple(map(int, v.split(".")))
        hit = [
            p
            for p in rows
            if tuple(map(int, p.first.split("."))) <= vt <= tuple(map(int, p.last.split(".")))
        ]
        assert [p.torch for p in hit] == [torch], v


@pytest.mark.parametrize("torch", ["2.11.0", "2.11.0+cu130"])
def test_the_gpu_host_gets_sglang_0517(torch):
    pin, ws = pick_engine(torch, "sglang")
    assert pin.last == ws.version == "0.5.17" and pin.torch == "2.11.0"
    assert ws.beside == ("vllm", "0.26.0") and set(ws.ahead) == {"transformers", "tokenizers"}


def test_no_wheel_set_for_other_sglang_pins():
    with pytest.raises(ValueError, match="sglang 0.5.21 pins it, but no wheel set"):
        pick_engine("2.13.0", "sglang")


def test_sglang_wheels_beside_vllms():
    ws = WHEEL_SETS[("sglang", "0.5.17")]
    have = HAVE_IMAGES["h200"] | beside_names(ws)
    wanted, skipped = bundle.wanted_wheels(
        "sglang==0.5.17", ws.extras, have, ws.beside is None, ws.ahead
    )
    got = {(n, v) for n, v, _ in wanted}
    assert got == {
        ("sglang", "0.5.17"),
        ("sglang-kernel", "0.4.5"),
        ("flashinfer-python", "0.6.15.post1"),
        ("transformers", "5.12.1"),  # the image has 5.17: kept, ahead of it
        ("tokenizers", "0.22.2"),
        ("orjson", "3.13.0"),
        ("setproctitle", "1.3.8"),
        ("uvicorn", "0.55.0"),
        ("gguf", "0.19.0"),  # missing on the H100 when sglang.Engine loaded (bench/gpu_2026-12-06)
    }
    assert wanted[0] == ("sglang", "0.5.17", "engine")
    assert {r for _, _, r in wanted} == {"engine", "engine-extra"}  # eagle3nb's set is vLLM's
    assert not {n for n, _, _ in wanted} & beside_names(ws)  # nothing of vLLM's site repeated
    assert "pyzmq" in beside_names(ws) and "papermill" in beside_names(ws)


def test_prune_drops_fa3_and_other_pythons(tmp_path):
    site = tmp_path / "site-packages"
    for rel, n in (("sgl_kernel/flash_ops.abi3.so", 40), ("sgl_kernel/sm90/common_ops.abi3.so", 7),
                   ("sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so", 9),
                   ("sgl_kernel/x.cpython-312-x86_64-linux-gnu.so", 3)):  # fmt: skip
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(b"x" * n)
    gone = {r["path"]: r["bytes"] for r in bundle.prune(site, "3.12")}
    assert gone == {
        "sgl_kernel/flash_ops.abi3.so": 40,
        "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so": 9,
    }
    assert (site / "sgl_kernel/sm90/common_ops.abi3.so").is_file()


def test_install_sh_writes_the_python_wrapper(tmp_path):
    stage = tmp_path / "stage"
    (stage / "site-packages" / "sgfake").mkdir(parents=True)
    (stage / "site-packages" / "sgfake" / "__init__.py").write_text("X = 'sglang site'\n")
    out = tmp_path / "bundle"
    out.mkdir()
    parts = bundle.pack(stage, "site-packages", out, "sgl", "0", lambda m: None)
    beside = {"engine": "vllm", "version": "0.26.0", "stem": "vllm-stem"}
    man = {"bundle": "sgl", "parts": parts, "env": {"SGLANG_DISABLE_REQUEST_LOGGING": "1"},
           "member": "site-packages", "beside": beside}  # fmt: skip
    bundle.write_manifest(out, man)
    root = tmp_path / "off"
    r = subprocess.run(["bash", str(out / "install.sh"), str(root / "sglang")],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 1 and "vllm-stem/site-packages" in r.stderr  # vLLM's site first
    vsite = root / "vllm-stem" / "site-packages" / "vfake"
    vsite.mkdir(parents=True)
    (vsite / "__init__.py").write_text("X = 'vllm site'\n")
    r = subprocess.run(["bash", str(out / "install.sh"), str(root / "sglang")],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    code = "import os, sgfake, vfake; print(sgfake.X, '|', vfake.X, '|', os.environ['PYTHONPATH'])"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "/repo"}
    got = subprocess.run([str(root / "sglang" / "python"), "-c", code], capture_output=True,
                         text=True, env=env, check=True).stdout.strip()  # fmt: skip
    want = f"/repo:{root}/sglang/site-packages:{root}/vllm-stem/site-packages"
    assert got == f"sglang site | vllm site | {want}"
    assert json.loads((out / "manifest.json").read_text())["beside"] == beside


REAL = Path(__file__).resolve().parents[2] / ".offline/sglang-0.5.17-py3.12-torch2.11.0"


@pytest.mark.skipif(not (REAL / "manifest.json").is_file(), reason=f"{REAL} not built")
def test_the_real_sglang_bundle():
    man = json.loads((REAL / "manifest.json").read_text())
    assert (man["engine"], man["version"], man["torch_pin"]) == ("sglang", "0.5.17", "2.11.0")
    assert man["beside"]["stem"] == "vllm-0.26.0-py3.12-torch2.11.0"
    names = {w["name"]: w["version"] for w in man["wheels"]}
    assert names["transformers"] == "5.12.1" and names["sglang-kernel"] == "0.4.5"
    assert "sgl_kernel/flash_ops.abi3.so" in {r["path"] for r in man["pruned"]}
    assert man["total_part_bytes"] == sum((REAL / p["name"]).stat().st_size for p in man["parts"])
    assert all(p["bytes"] <= bundle.PART_BYTES for p in man["parts"])
    assert "BESIDE_SITE" in (REAL / "install.sh").read_text()
