"""SGLang (``sglang==0.5.23``) behind the engine-worker contract: generation and aux-state capture
through SGLang's own model code (``sglang.Engine``), run in SGLang's own virtual environment.

Imports only stdlib at module level (the client side reads :func:`launch_env` with another torch build); ``torch``/``sglang`` are imported by
:class:`Backend`.

What SGLang captures (read in ``sglang/srt/models/llama.py``, 0.5.23): ``set_eagle3_layers_to_capture``
sets ``layers_to_capture = [id + 1 for id in layer_ids]`` and ``LlamaModel.forward`` captures the
*input* of those layers (``capture_output=aux_hidden_states.capture``, a clone), so SGLang id L is
boundary L + 1 (HF ``hidden_states[L + 1]``). With ``enable_return_aux_hidden_states=True``
(``arg_groups/fields/exec_.py``: capture-only mode; ``speculative_algorithm="EAGLE3"`` only names the
capture convention and is reset to None, no draft is loaded) a request with
``return_hidden_states=True`` gets ``meta_info["hidden_states"]`` = the concatenated aux states
``[T, n_ids * H]`` *in place of* the last-layer states.

Versions without that API (0.5.14-0.5.22; 0.5.17 is the newest on torch 2.11) capture through
SGLang's in-process ``ModelRunner`` instead (:mod:`eagle3nb.engines.sglang_runner`; ``options``
``capture_route``: auto, engine or runner), with the same ids, rows and keys.

Boundary N (the last layer's output before the final norm) is not available from stock SGLang:
``layers_to_capture`` only names layer inputs (an id N - 1 needs a layer N that does not exist:
``layers/logits_processor.py::_check_aux_hidden_states``); in capture-only mode the last-layer
states are replaced by the aux states; without it ``return_hidden_states`` gives the states *after*
``final_norm`` for Llama. So :meth:`Backend.capture` returns no ``final``; the dataset step takes
boundary N from the HF reference engine, names that engine in the manifest, and checks it against
SGLang's own next-token log-probabilities (``input_logprobs`` below).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from eagle3nb.engines import (
    child_watch,
    sglang_forkserver,
    sglang_ops,
    sglang_runner,
    sglang_serve,
    sglang_transport,
)
from eagle3nb.engines.worker import OtherModelCapture, text_hidden_size

__all__ = [
    "ENGINE_NAME",
    "CONVENTION",
    "VERSION",
    "Backend",
    "launch_env",
    "engine_root",
]

ENGINE_NAME = "sglang"
CONVENTION = "sglang"  # ids this backend takes: SGLang's own (id L -> boundary L + 1)
VERSION = "0.5.23"  # the pinned version whose source the docstring above was read from


def _cpu_switch() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"


def _cpu_shim() -> bool:
    return any("cpu-shim" in p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep))


def engine_root() -> Path:
    """The cached SGLang virtualenv made by ``.ci/setup_engines.sh``."""
    return (
        Path(os.environ.get("EAGLE3NB_ENGINES", "~/.cache/eagle3nb/engines")).expanduser()
        / f"sglang-{VERSION}"
    )


def launch_env(
    device: str, root: str | os.PathLike | None = None, base: dict | None = None
) -> dict:
    """Environment for the SGLang worker process.

    CPU: ``SGLANG_USE_CPU_ENGINE=1`` (SGLang's CPU switch; without it model init imports vllm) and the
    CPU-only ``libcuda.so.1`` stand-in on ``LD_LIBRARY_PATH`` (the CUDA-only ``sglang-kernel`` wheel
    needs the library to load; its one imported symbol returns CUDA_ERROR_NO_DEVICE and is never
    called on CPU). GPU (``cuda``/``cuda:N``): neither, and both are removed if inherited.
    Always: offline hub, no usage stats.

    Raises:
        ValueError: ``device`` is not cpu/cuda/cuda:N (resolve ``auto`` first).
        FileNotFoundError: CPU and the shim is missing (run ``bash .ci/setup_engines.sh``).
    """
    env = dict(os.environ if base is None else base)
    env.update(
        HF_HUB_OFFLINE="1",
        SGLANG_DISABLE_REQUEST_LOGGING="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
    )
    root = Path(root) if root else engine_root()
    if device == "cpu":
        shim = root / "cpu-shim" / "libcuda.so.1"
        if not shim.is_file():
            raise FileNotFoundError(
                f"CPU stand-in {shim} is missing; run `bash .ci/setup_engines.sh` (it builds it), or pass device=cuda on a GPU machine"
            )
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [str(shim.parent)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        )
    elif device == "cuda" or device.startswith("cuda:"):
        env.pop("SGLANG_USE_CPU_ENGINE", None)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and "cpu-shim" not in p
        )
        if device.startswith("cuda:"):
            env["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
    else:
        raise ValueError(
            f"device={device!r}: the SGLang worker needs 'cpu', 'cuda' or 'cuda:N' (resolve 'auto' before launching)"
        )
    return env


class Backend(OtherModelCapture, sglang_serve.ServeAcceptance, sglang_runner.RunnerRoute):
    """One SGLang ``Engine`` at a time: plain for :meth:`generate`, capture-only for :meth:`capture`,
    EAGLE-3 serving for :meth:`serve_acceptance` (:mod:`eagle3nb.engines.sglang_serve`).

    SGLang fixes the captured layers and the dtype when the engine starts, so switching to other
    layer ids or another dtype (``capture(..., dtype=)``) restarts the engine (tens of seconds on
    2 CPU cores), in this process. ``generate(..., on_capture_engine=True)`` runs on a running
    capture-only engine of the same dtype instead of restarting a plain one: its requests ask for no
    hidden states, so SGLang returns plain outputs (the aux clones inside the forward still run).

    Args:
        model_path: local HF folder of the target.
        dtype: ``"float32"`` or ``"bfloat16"`` (SGLang computes and returns states in it).
        options: ``device`` (``cpu``/``cuda``/``cuda:N``, default cpu), ``seed`` (SGLang
            ``random_seed``), ``context_length``, ``max_total_tokens`` (KV pool, tokens),
            ``engine_kwargs`` (passed to ``sglang.Engine`` as is, e.g. ``tp_size`` on GPUs),
            ``capture_route`` and ``native_ops`` (:mod:`eagle3nb.engines.sglang_runner`).

    Raises:
        RuntimeError: device cpu without the CPU switch and shim in the environment, or device cuda
            with the CPU shim loaded or no GPU visible (the launcher's :func:`launch_env` sets this up).
    """

    def __init__(self, model_path: str, dtype: str, options: dict | None = None):
        import torch

        options = dict(options or {})
        self.model_path, self.dtype = str(model_path), str(dtype)
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={dtype!r}: SGLang backend takes float32, bfloat16 or float16")
        self.device = str(options.get("device", "cpu"))
        on_cpu, shim = _cpu_switch(), _cpu_shim()
        if self.device == "cpu" and not (on_cpu and shim):
            raise RuntimeError(
                "SGLang on CPU needs SGLANG_USE_CPU_ENGINE=1 and the cpu-shim folder on LD_LIBRARY_PATH in the worker's environment (eagle3nb.engines.sglang_backend.launch_env('cpu') builds it)"
            )
        if self.device.startswith("cuda"):
            if on_cpu or shim:
                raise RuntimeError(
                    "device=cuda but the CPU-only switch/shim is in the environment (SGLANG_USE_CPU_ENGINE or cpu-shim on LD_LIBRARY_PATH); launch with launch_env('cuda')"
                )
            if not torch.cuda.is_available():
                raise RuntimeError(
                    "device=cuda but torch in the SGLang environment sees no GPU; use device=cpu here"
                )
        self.options = options
        self.hidden_size = text_hidden_size(self.model_path)  # aux width = n_ids x this
        os.environ.setdefault(sglang_transport.ENV, "1")  # read by SGLang's scheduler
        if sglang_forkserver.enabled(self.device):  # imports SGLang there while this process does
            sglang_forkserver.start()
        # mode: ("plain", dtype), ("capture", ids, dtype), ("eagle3", drafter, k, stamp, dtype)
        self._engine, self._mode = None, None
        self._torch = torch
        self._transport: str | None = None  # "tensor" or "lists", once a capture ran

    # -- engine lifecycle -------------------------------------------------------------------------
    def _start(self, mode: tuple) -> None:
        if self._mode == mode:
            return
        self._stop()
        import sglang

        native = bool(self.options.get("native_ops", False))  # torch ops in the scheduler
        if why := sglang_ops.mlp_width_problem(
            self.model_path, mode[-1], self.device, native, sglang.__version__
        ):
            raise RuntimeError(why)  # before SGLang's CUDA kernels fault on it
        os.environ.pop(sglang_ops.NATIVE_ENV, None)
        if native:  # read by the scheduler child (worker.py's __mp_main__ block)
            sglang_ops.check_native(sglang.__version__)
            os.environ[sglang_ops.NATIVE_ENV] = "1"
        kw = dict(
            model_path=self.model_path,
            dtype=mode[-1],
            device="cpu" if self.device == "cpu" else "cuda",
            random_seed=int(self.options.get("seed", 0)),
            # a radix-cache hit returns no hidden states for the cached prefix (rows go missing)
            disable_radix_cache=True,
            disable_cuda_graph=True,
            log_level="error",
            # an idle scheduler otherwise spins a thread at 100% CPU, half of 2 cores (sglang/srt/
            # managers/scheduler_components/idle_sleeper.py:15-37; scheduler.py:854-866, 5328)
            sleep_on_idle=True,
            # a prompt split over prefill chunks returns only its last chunk's rows (seen: 25 of 104)
            chunked_prefill_size=-1,
        )
        for k in ("context_length", "max_total_tokens"):
            if self.options.get(k):
                kw[k] = int(self.options[k])
        if self.device == "cpu" and "max_total_tokens" not in kw:
            kw["max_total_tokens"] = 16384  # the CPU KV pool is otherwise sized from host RAM
        if self.device == "cpu":  # unchunked, 0.5.23 derives a negative fraction on CPU
            kw.setdefault("mem_fraction_static", 0.3)  # the pool is capped by max_total_tokens
        kw.update(sglang_serve.mode_kwargs(mode, self.device))  # capture / eagle3 arguments
        kw.update(self.options.get("engine_kwargs") or {})
        if sglang_forkserver.enabled(self.device):  # children forked with SGLang imported
            sglang_forkserver.install(importlib.import_module("sglang.srt.entrypoints.engine"))
        try:
            self._engine = sglang.Engine(**kw)
        except BaseException:  # SGLang saw its scheduler die: the rest of that engine goes too
            child_watch.stop_all()
            child_watch.drop_zmq_contexts()
            raise
        self._mode = mode

    def _stop(self) -> None:
        self._close_other()  # a twin's engine (capture_model)
        self.close_runner()  # the in-process ModelRunner (sglang_runner)
        child_watch.forget()  # its processes stop on purpose now (a dead one was reported)
        if self._engine is not None:
            self._engine.shutdown()
        self._engine, self._mode = None, None

    def close(self) -> None:
        """Shut the SGLang engine (and its scheduler/detokenizer processes) down."""
        self._stop()

    # -- contract ---------------------------------------------------------------------------------
    def info(self) -> dict:
        """Engine name/version, torch version, the id convention it takes, and how it runs."""
        import sglang

        return {
            "engine_name": ENGINE_NAME,
            "engine_version": sglang.__version__,
            "torch_version": self._torch.__version__,
            "convention": CONVENTION,
            "device": self.device,
            "dtype": self.dtype,
            "cpu_engine_switch": _cpu_switch(),
            "cpu_shim": _cpu_shim(),
            "final_boundary_capturable": False,
            "mode": list(self._mode) if self._mode else None,
            "hidden_states_transport": self._transport,  # see sglang_transport
            "capture_route": self.capture_route(),  # engine (aux API) or runner (sglang_runner)
        }

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        stop_token_ids: list[int] | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        on_capture_engine: bool = False,
    ) -> list[list[int]]:
        """Continuations through a plain SGLang engine (no capture), or through the running
        capture-only engine of this dtype with ``on_capture_engine`` (no restart; see the class);
        on the runner route one greedy token per prompt comes from the runner's plain prefill.

        Args:
            prompts: token id lists (BOS/template applied), each non-empty.
            stop_token_ids: generation stops after the first of these (kept in the output, as in
                HF's ``generate_batch``).
            temperature: 0 = greedy; > 0 samples with ``top_p`` and ``sampling_seed=seed``.

        Returns:
            One list of new token ids per prompt.
        """
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("generate: an empty prompt; each needs at least one token (BOS)")
        m = self._mode
        if on_capture_engine and m and m[0] == "runner" and int(max_new_tokens) == 1:
            if temperature == 0 and m[-1] == self.dtype:  # 02b's speed pass: no engine start
                return self._runner.prefill(prompts)
        if not (on_capture_engine and m and m[0] == "capture" and m[-1] == self.dtype):
            self._start(("plain", self.dtype))
        sp = {
            "max_new_tokens": int(max_new_tokens),
            "temperature": float(temperature),
            "top_p": float(top_p),
        }
        if stop_token_ids:
            sp["stop_token_ids"] = [int(t) for t in stop_token_ids]
        if temperature > 0:
            sp["sampling_seed"] = int(seed)
        outs = self._engine.generate(
            input_ids=[list(map(int, p)) for p in prompts], sampling_params=sp
        )
        stops = set(int(t) for t in stop_token_ids or [])
        return [sglang_serve.cut_at_stop(o["output_ids"], stops) for o in outs]

    def capture(
        self,
        samples: list[list[int]],
        layer_ids: list[int],
        logprobs: bool = False,
        dtype: str | None = None,
    ) -> list[dict]:
        """Aux states of each sample from SGLang's forward (capture-only engine, radix cache off).

        One prefill per sample and one sampled token (``max_new_tokens=1``: with 0 SGLang 0.5.23
        returns no hidden states; the prompt block has exactly T rows and the sampled token adds
        none); SGLang batches the requests.

        Args:
            samples: token id lists (ragged, each non-empty).
            layer_ids: SGLang ids (boundary = id + 1); each < N - 1 (SGLang cannot capture boundary N).
            logprobs: also return SGLang's own ``input_logprobs`` ``[T]`` float32: log p(x_t | x_<t)
                from its lm_head (NaN at t = 0), to check where the target distribution comes from.
            dtype: the engine's dtype for this call (None: the backend's); another one restarts
                the engine in it, in this worker (no new process).

        Returns:
            Per sample ``{"aux": [T, len(layer_ids) * H] float32}`` (+ ``input_logprobs``), rows in
            token order, slots in ``layer_ids`` order. No ``final``: see the module docstring.

        Raises:
            RuntimeError: SGLang returned another number of rows than the sample has tokens, another
                width than ``len(layer_ids) * H``, or reports cached tokens (rows for a cached prefix
                would be missing).
        """
        torch = self._torch
        if not samples:
            return []
        if any(len(s) == 0 for s in samples):
            raise ValueError("capture: an empty sample")
        ids = tuple(int(i) for i in layer_ids)
        dtype = dtype or self.dtype
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={dtype!r}: SGLang backend takes float32, bfloat16 or float16")
        if self.capture_route() == "runner":  # no aux API in this SGLang: sglang_runner
            return self.runner_capture(samples, ids, logprobs, dtype)
        self._start(("capture", ids, dtype))
        kw = {"return_logprob": True, "logprob_start_len": 0} if logprobs else {}
        outs = self._engine.generate(
            input_ids=[list(map(int, s)) for s in samples],
            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
            return_hidden_states=True,
            **kw,
        )
        res = []
        for i, (s, o) in enumerate(zip(samples, outs)):
            mi = o["meta_info"]
            if mi.get("cached_tokens"):
                raise RuntimeError(
                    f"sample {i}: SGLang reports {mi['cached_tokens']} cached tokens (prefix cache hit: their rows are missing); the engine must run with disable_radix_cache=True"
                )
            raw = mi.get("hidden_states") or []
            if raw:  # tensors from the patched scheduler, else SGLang's float lists
                self._transport = "tensor" if isinstance(raw[0], torch.Tensor) else "lists"
            blocks = [torch.as_tensor(b, dtype=torch.float32) for b in raw]
            blocks = [b if b.dim() == 2 else b[None, :] for b in blocks]
            aux = torch.cat(blocks) if blocks else torch.zeros(0, 0)
            if aux.shape[0] != len(s):
                raise RuntimeError(
                    f"sample {i}: SGLang returned {aux.shape[0]} hidden-state rows for {len(s)} tokens"
                )
            self.check_width(i, aux.shape[1], ids)
            item = {"aux": aux}
            if logprobs:
                lp = [
                    float("nan") if x[0] is None else float(x[0])
                    for x in mi["input_token_logprobs"]
                ]
                if len(lp) != len(s):
                    raise RuntimeError(
                        f"sample {i}: SGLang returned {len(lp)} input logprobs for {len(s)} tokens"
                    )
                item["input_logprobs"] = torch.tensor(lp, dtype=torch.float32)
            res.append(item)
        if len(res) != len(samples):
            raise RuntimeError(f"SGLang answered {len(res)} of {len(samples)} requests")
        return res
