"""The offline bundle's composition on CPU, without network: the engine picker against the torch
pins as the reference states them, refusals before any download, pruning on a fake staging tree,
tar | xz split into parts and reassembled by install.sh (a fake bundle), the manifest's fields.
Tests that need the real downloaded wheels or the real bundle skip when the cache lacks them."""

from __future__ import annotations

import hashlib
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
    check_python,
    have_names,
    pick_engine,
)

# the reference's prose (../shared/reference/gpu_engines_h200.md): vLLM versions per torch pin
REFERENCE_PINS = {"2.11.0": ["0.20.0", "0.26.0"], "2.13": ["0.27.0", "0.30.0"], "2.14": ["0.34.0"]}


def _newest(torch: str) -> str:
    """The newest vLLM the reference's prose pins to ``torch`` (major.minor match for X.Y pins)."""
    t = torch.split("+")[0]
    hits = [
        v for pin, vs in REFERENCE_PINS.items() for v in vs if t == pin or t.startswith(pin + ".")
    ]
    return max(hits, key=lambda v: tuple(map(int, v.split("."))))


@pytest.mark.parametrize("torch", ["2.11.0", "2.11.0+cu130"])
def test_picker_takes_the_newest_engine_pinned_to_the_host_torch(torch):
    pin, ws = pick_engine(torch)
    assert pin.last == ws.version == _newest(torch) == "0.26.0"
    assert pin.torch == "2.11.0" and "METADATA" in pin.source


def test_table_rows_agree_with_the_reference():
    for p in (p for p in ENGINE_PINS if p.engine == "vllm"):  # SGLang's: test_offline_sglang.py
        assert p.first in REFERENCE_PINS[p.torch] or p.first.startswith("0.2"), p
        lo, hi = (tuple(map(int, v.split("."))) for v in (p.first, p.last))
        ref = [tuple(map(int, v.split("."))) for v in REFERENCE_PINS[p.torch]]
        assert min(ref) <= lo <= hi <= max(ref), p


REFUSALS = [
    (
        lambda: pick_engine("2.12.0"),
        "--torch 2.12.0: no vllm version in the table pins this torch (0.20.0-0.25.1 -> 2.11.0, "
        "0.26.0-0.26.0 -> 2.11.0, 0.27.0-0.30.0 -> 2.13, 0.34.0-0.34.0 -> 2.14); pass the host's "
        "torch, or add the engine's row to ENGINE_PINS in eagle3nb/offline/sets.py",
    ),
    (
        lambda: pick_engine("2.13.0"),
        "--torch 2.13.0: vllm 0.30.0 pins it, but no wheel set is measured for that version "
        "(known: vllm 0.26.0, sglang 0.5.17); use a host with a torch a known set pins, or add a WheelSet to "
        "WHEEL_SETS in eagle3nb/offline/sets.py",
    ),
    (
        lambda: pick_engine("latest"),
        "--torch latest: not a torch version; pass the host's torch as X.Y.Z (python -c "
        '"import torch; print(torch.__version__)" on the host)',
    ),
    (
        lambda: check_python("3.13", WHEEL_SETS[("vllm", "0.26.0")]),
        "--python-version 3.13: the wheel set of vllm 0.26.0 is resolved for Python 3.12 only "
        "(binary wheels such as pydantic-core are built per Python); pass the host's python3 "
        "--version as X.Y, or resolve a set for it in WHEEL_SETS in eagle3nb/offline/sets.py",
    ),
]


@pytest.mark.parametrize("call,msg", REFUSALS)
def test_refusals_name_parameter_value_and_fix(call, msg):
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value) == msg


@pytest.mark.parametrize("args", [["--torch", "2.12.0"], ["--python-version", "3.11"]])
def test_cli_refuses_before_any_download(args, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from eagle3nb.offline.__main__ import app

    def no_download(*a, **k):  # a refusal must come first
        raise AssertionError("download called")

    monkeypatch.setattr(bundle, "download", no_download)
    base = {"--python-version": "3.12", "--torch": "2.11.0"}
    base[args[0]] = args[1]
    cli = ["build", "--out", str(tmp_path)] + [x for kv in base.items() for x in kv]
    r = CliRunner().invoke(app, cli)
    assert r.exit_code == 2 and f"{args[0]} {args[1]}:" in r.output, r.output
    assert not list(tmp_path.iterdir())


def test_wanted_wheels_skip_what_the_host_has_never_the_engine():
    ws = WHEEL_SETS[("vllm", "0.26.0")]
    have = HAVE_IMAGES["h200"] | {"vllm", "pydantic"}
    wanted, skipped = bundle.wanted_wheels("vllm==0.26.0", ws.extras, have)
    names = [n for n, _, _ in wanted]
    assert names[0] == "vllm" and len(names) == len(set(names))
    assert "pydantic" in skipped and "typer" in skipped and "pydantic" not in names
    assert not set(names[1:]) & have
    assert {"papermill", "ipykernel", "plotly", "datasets", "cbor2"} <= set(names)
    assert have_names("Package Version\n------ -----\nTyper_X 0.1\nfoo==1 # x\n\n") == {
        "typer-x",
        "foo",
    }


def _fake_stage(root: Path) -> Path:
    """A fake staging tree with the files the prune rules name and files they must keep."""
    site = root / "site-packages"
    files = {
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": 300,
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": 200,
        "vllm/vllm-rs": 100,
        "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so": 10,
        "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": 11,
        "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so": 12,
        "vllm/_moe_C_stable_libtorch.abi3.so": 50,
        "vllm/_C_stable_libtorch.abi3.so": 70,
        "bin/vllm": 5,
        "pydantic/__init__.py": 7,
    }
    for rel, n in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(os.urandom(n))
    return site


@pytest.mark.parametrize("dense_only", [False, True])
def test_prune_rules_on_a_fake_staging_tree(tmp_path, dense_only):
    site = _fake_stage(tmp_path)
    removed = bundle.prune(site, "3.12", dense_only)
    gone = {r["path"] for r in removed}
    want = {
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
        "vllm/vllm-rs",
        "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so",
        "bin",
    } | ({"vllm/_moe_C_stable_libtorch.abi3.so"} if dense_only else set())
    assert gone == want
    assert sum(r["bytes"] for r in removed) == 300 + 100 + 10 + 12 + 5 + 50 * dense_only
    left = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    assert "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so" in left
    assert "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" in left and not left & want
    assert all(r["why"] for r in removed)


def _fake_bundle(tmp_path: Path, part_bytes: int = 3500) -> tuple[Path, dict, dict]:
    """A fake bundle: random (incompressible) files packed in parts, manifest and install.sh."""
    stage = tmp_path / "stage"
    site = stage / "site-packages"
    want = {}
    for i in range(4):
        rel = f"pkg{i}/data{i}.bin"
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        want[rel] = os.urandom(1500 + 500 * i)
        (site / rel).write_bytes(want[rel])
    out = tmp_path / "fake-bundle"
    out.mkdir()
    parts = bundle.pack(stage, "site-packages", out, "fake", "0", lambda m: None, part_bytes)
    man = {"bundle": "fake", "parts": parts, "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"}}
    man["member"] = "site-packages"
    bundle.write_manifest(out, man)
    return out, man, want


def test_split_and_reassemble_round_trip(tmp_path):
    out, man, want = _fake_bundle(tmp_path)
    parts = man["parts"]
    sizes = [(out / p["name"]).stat().st_size for p in parts]
    assert len(parts) >= 3 and all(s == 3500 for s in sizes[:-1]) and 0 < sizes[-1] <= 3500
    assert [p["bytes"] for p in parts] == sizes
    for p in parts:
        assert p["sha256"] == hashlib.sha256((out / p["name"]).read_bytes()).hexdigest()
    blob = b"".join((out / p["name"]).read_bytes() for p in parts)
    dest = tmp_path / "x"
    dest.mkdir()
    subprocess.run("xz -dc | tar -x -C " + str(dest), shell=True, input=blob, check=True)
    for rel, data in want.items():
        assert (dest / "site-packages" / rel).read_bytes() == data


def test_install_sh_unpacks_a_fake_bundle_and_refuses_a_bad_part(tmp_path):
    out, man, want = _fake_bundle(tmp_path)
    target = tmp_path / "target"
    r = subprocess.run(
        ["bash", str(out / "install.sh"), str(target)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    for rel, data in want.items():
        assert (target / "site-packages" / rel).read_bytes() == data
    line = f'export PYTHONPATH="{target}/site-packages${{PYTHONPATH:+:$PYTHONPATH}}" '
    line += "VLLM_USE_FLASHINFER_SAMPLER=0"
    assert (target / "env.sh").read_text() == line + "\n" and line in r.stdout
    env = subprocess.run(
        ["bash", "-c", f"source {target}/env.sh; echo $PYTHONPATH $VLLM_USE_FLASHINFER_SAMPLER"],
        capture_output=True, text=True, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert env.stdout.split() == [f"{target}/site-packages", "0"]
    first = out / man["parts"][0]["name"]
    first.write_bytes(b"x" + first.read_bytes()[1:])
    r = subprocess.run(
        ["bash", str(out / "install.sh"), str(target)], capture_output=True, text=True
    )
    assert r.returncode == 1 and f"{first} has sha256" in r.stderr and "copy it again" in r.stderr
    first.unlink()
    r = subprocess.run(
        ["bash", str(out / "install.sh"), str(target)], capture_output=True, text=True
    )
    assert r.returncode == 1 and f"missing part {first}" in r.stderr
    assert (target / "site-packages" / "pkg0/data0.bin").read_bytes() == want["pkg0/data0.bin"]


def test_pack_refuses_more_than_four_parts(tmp_path):
    with pytest.raises(
        RuntimeError, match=r"--preset 0: [5-9]\d* parts of 1500 bytes, more than 4"
    ):
        _fake_bundle(tmp_path, part_bytes=1500)


REAL_WHEEL = bundle.CACHE / "wheels/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
REAL_BUNDLE = Path(__file__).resolve().parents[2] / ".offline/vllm-0.26.0-py3.12-torch2.11.0"


@pytest.mark.skipif(not REAL_WHEEL.is_file(), reason=f"{REAL_WHEEL} not downloaded (build once)")
def test_the_real_wheel_pins_the_torch_the_table_says():
    pin, req_py = bundle.wheel_torch_pin(REAL_WHEEL)
    assert pin == pick_engine("2.11.0")[0].torch == "2.11.0"
    assert req_py


@pytest.mark.skipif(
    not (REAL_BUNDLE / "manifest.json").is_file(), reason=f"{REAL_BUNDLE} not built"
)
def test_the_real_bundle_manifest_and_parts():
    man = json.loads((REAL_BUNDLE / "manifest.json").read_text())
    keys = {"engine", "version", "torch_pin", "torch_pin_source", "wheels", "pruned", "parts"}
    assert keys <= set(man) and (man["engine"], man["version"]) == ("vllm", "0.26.0")
    assert 1 <= len(man["parts"]) <= bundle.MAX_PARTS
    assert man["total_part_bytes"] == sum(p["bytes"] for p in man["parts"])
    for p in man["parts"]:
        f = REAL_BUNDLE / p["name"]
        assert f.stat().st_size == p["bytes"] <= bundle.PART_BYTES
    for w in man["wheels"]:
        f = bundle.CACHE / "wheels" / w["file"]
        if f.is_file():
            assert hashlib.sha256(f.read_bytes()).hexdigest() == w["sha256"]
    assert {r["path"] for r in man["pruned"]} >= {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"}
    assert man["env"] == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
