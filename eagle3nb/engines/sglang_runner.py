"""SGLang captures aux states in this process through its own ``ModelRunner``: the route for SGLang
versions without ``enable_return_aux_hidden_states`` (0.5.14-0.5.22; 0.5.17 is the newest that
runs on torch 2.11), behind :meth:`eagle3nb.engines.sglang_backend.Backend.capture`.

The recipe is SGLang's own offline benchmark, ``sglang/benchmark/one_batch.py`` (line numbers
below: 0.5.17 wheel / 0.5.23 wheel; 0.5.22's ``one_batch.py`` is byte-identical to 0.5.23's, its
other lines are listed after this paragraph): ``load_model`` builds the ``ModelRunner`` with its memory
pool and attention backend (0.5.17 ``:299-369`` / 0.5.23 ``:327-387``; 0.5.23 wants the scheduler
context published first, as its ``correctness_test`` does, ``:691-699``);
``prepare_synthetic_inputs_for_latency_test(custom_inputs=samples)`` makes the ``Req`` s (``:435-461``
/ ``:450-476``: ``set_extend_range`` in 0.5.17, ``extend_end`` in 0.5.23); ``extend`` builds the
``ScheduleBatch`` with ``TreeCacheNamespace`` as a dummy cache (``:481-517`` / ``:496-533``), here
with ``ForwardBatch.init_new(..., capture_hidden_mode=CaptureHiddenMode.FULL)``
(``srt/model_executor/forward_batch_info.py:706-730`` / ``:958-995``). The target's
``set_eagle3_layers_to_capture(ids)`` (``srt/models/llama.py:885-897``: layers_to_capture = id + 1,
the input of that layer = boundary id + 1, ``:434-437``) switches the capture on; in FULL mode the
logits processor returns the packed aux states of every prompt token
(``srt/layers/logits_processor.py:654-705``; 0.5.17). No SGLang file is patched for the capture.
Each forward first resets the model to its state after a load and re-arms SGLang's own capture
checks (:func:`eagle3nb.engines.sglang_capture_ids.set_capture`): one load serves every id set.

SGLang 0.5.22 (read in ``~/.cache/eagle3nb/engines/sglang-0.5.22``, ``bench/setup_engine_versions.sh``):
``one_batch.py`` as 0.5.23 (``load_model`` ``:327-387``, ``_init_process_global_configs`` published
as ``correctness_test`` does ``:691-699``, ``prepare_synthetic_inputs_for_latency_test`` with
``extend_end`` ``:450-476``, ``extend`` ``:496-533``); ``runtime_context.py`` ``spawn_world_rank``
``:95``, ``SpawnRanks`` ``:230``, ``get_schedule`` ``:1314``, ``publish`` ``:1481``;
``ScheduleBatch.init_new`` (``srt/managers/schedule_batch.py:2556-2567``, the same arguments as
0.5.23), ``prefill_input_ids_cpu`` ``:2407``; ``ForwardBatch.init_new(..., capture_hidden_mode=,
return_hidden_states_before_norm=)`` ``forward_batch_info.py:937-972``; FULL mode returns the packed
aux states, else the post-norm final state (``logits_processor.py:815-834``,
``_get_hidden_states_to_store``); the setters ``models/llama.py:922-934`` (loop ``:478-498``),
``qwen3.py:725-738``, ``qwen3_moe.py:1141-1156`` (-> ``qwen2_moe.py:1160-1163``),
``deepseek_v2.py:3404-3419``, ``gpt_oss.py:1336-1351``, ``kimi_k25.py:916-927`` (their rules:
``eagle3nb/boundaries/versions/sglang_0_5_22.py``); ``destroy_model_parallel`` /
``destroy_distributed_environment`` ``srt/distributed/parallel_state.py:3261, 3328``. No
``enable_return_aux_hidden_states`` anywhere in the 0.5.22 wheel, so ``auto`` picks this route.

Boundary N is not capturable here either (an id N - 1 names a layer N that does not exist), so
:meth:`RunnerCapture.capture` returns no ``final``, as the engine route. ``logprobs=True`` runs a
second pass with the capture off: FULL mode then returns SGLang's post-norm final state for every
token (the same lines), and log p(x_t | x_<t) is taken from it and SGLang's own ``lm_head.weight``
(the matmul in float32 here; SGLang's logits processor computes it only at the last position in
an extend pass).

One optional patch, torch ops (:func:`eagle3nb.engines.sglang_ops.native_ops`), and the MLP widths
SGLang's CUDA kernels fault on (:func:`eagle3nb.engines.sglang_ops.mlp_width_problem`) are in
:mod:`eagle3nb.engines.sglang_ops`. The route is gated on :data:`SHOWN`.

Engine side: imports stdlib at module level, torch and sglang inside the functions.
"""

from __future__ import annotations

import contextlib
import os

from eagle3nb.engines.sglang_capture_ids import set_capture
from eagle3nb.engines.sglang_ops import mlp_width_problem, native_ops

__all__ = [
    "SHOWN",
    "ANY_VERSION_ENV",
    "has_aux_api",
    "check_version",
    "pick_route",
    "RunnerCapture",
]

# the versions this route was run on, and where: anything else is refused (ANY_VERSION_ENV=1 to try)
SHOWN = {
    "0.5.17": "one NVIDIA H100, torch 2.11.0+cu130, bf16, 2026-12-06 "
    "(../shared/reference/gpu_engines_h200.md)",
    "0.5.22": "CPU (SGLANG_USE_CPU_ENGINE=1), float32, bench/engine_versions.py: the twins' rules "
    "and the default job's 02b (bench/reference_engine_versions.json)",
    "0.5.23": "CPU (SGLANG_USE_CPU_ENGINE=1), float32 and bfloat16, tests/engines/test_sglang_runner.py",
}
ANY_VERSION_ENV = "EAGLE3NB_SGLANG_RUNNER_ANY_VERSION"
ROUTES = ("auto", "engine", "runner")


def has_aux_api() -> bool:
    """Whether the installed SGLang's ``ServerArgs`` has ``enable_return_aux_hidden_states`` (first
    in 0.5.23, ``srt/arg_groups/fields/exec_.py:126-157``; absent in 0.5.17's ``ServerArgs``)."""
    import inspect

    from sglang.srt.server_args import (
        ServerArgs,
    )  # a dataclass in 0.5.17, a msgspec Struct in 0.5.23

    return "enable_return_aux_hidden_states" in inspect.signature(ServerArgs).parameters


def check_version(version: str) -> None:
    """Refuse an SGLang version the runner route was not run on.

    Raises:
        RuntimeError: ``version`` not in :data:`SHOWN` and ``$EAGLE3NB_SGLANG_RUNNER_ANY_VERSION``
            is not 1 (the message names the shown versions and both ways out).
    """
    if version in SHOWN or os.environ.get(ANY_VERSION_ENV) == "1":
        return
    raise RuntimeError(
        f"SGLang {version}: the in-process ModelRunner capture route was run on SGLang "
        f"{', '.join(sorted(SHOWN))} only (eagle3nb/engines/sglang_runner.py SHOWN); its internal "
        f"API changes between releases. Install one of those, or set {ANY_VERSION_ENV}=1 to try it "
        "(the twin proof and 02b's alignment check still measure which boundaries come back)"
    )


def pick_route(requested: str, version: str, aux_api: bool) -> str:
    """``"engine"`` (``sglang.Engine`` with the aux API) or ``"runner"`` (this module).

    ``auto``: the engine where the aux API exists, else the runner. ``engine`` without the API and
    ``runner`` on an unshown version are refused.

    Raises:
        ValueError: ``requested`` not in auto/engine/runner, or ``engine`` without the aux API.
        RuntimeError: the runner on a version not in :data:`SHOWN` (:func:`check_version`).
    """
    if requested not in ROUTES:
        raise ValueError(
            f"sglang_options.capture_route={requested!r}: give one of {ROUTES} (auto: the engine's "
            "aux API where the installed SGLang has it, else the in-process ModelRunner)"
        )
    route = requested if requested != "auto" else ("engine" if aux_api else "runner")
    if route == "engine" and not aux_api:
        raise ValueError(
            f"sglang_options.capture_route=engine: SGLang {version} has no "
            "enable_return_aux_hidden_states (first in 0.5.23); use capture_route: runner or auto"
        )
    if route == "runner":
        check_version(version)
    return route


class RunnerCapture:
    """One SGLang ``ModelRunner`` on one model, dtype and device, in this process.

    Args:
        model_path: local HF folder. dtype: float32, bfloat16 or float16. device: cpu or cuda.
        seed: SGLang's ``random_seed``. max_total_tokens: the KV pool in tokens (a call is split
            into batches that fit it). native: build the model with torch ops (:func:`native_ops`).
        server_kwargs: more ``ServerArgs`` fields (e.g. ``attention_backend``).

    Raises:
        RuntimeError: an SGLang version not in :data:`SHOWN`, or an MLP width SGLang's CUDA kernels
            fault on (:func:`mlp_width_problem`), both before the model is built.
    """

    def __init__(self, model_path, dtype, device="cpu", seed=0, max_total_tokens=None,
                 native=False, server_kwargs=None):  # fmt: skip
        import sglang

        self.version = sglang.__version__
        check_version(self.version)
        if why := mlp_width_problem(str(model_path), dtype, device, native, self.version):
            raise RuntimeError(why)
        from sglang.benchmark import one_batch as ob
        from sglang.srt.server_args import PortArgs, ServerArgs

        kw = dict(model_path=str(model_path), dtype=dtype, device=device, random_seed=int(seed),
                  disable_radix_cache=True, disable_cuda_graph=True, chunked_prefill_size=-1,
                  log_level="error")  # fmt: skip
        if max_total_tokens:
            kw["max_total_tokens"] = int(max_total_tokens)
        if device == "cpu":
            kw.setdefault("mem_fraction_static", 0.3)  # as the engine route (sglang_backend)
        kw.update(server_kwargs or {})
        sa = ServerArgs(**kw)
        pa = PortArgs.init_new(sa)
        if hasattr(ob, "_init_process_global_configs"):  # 0.5.23: one_batch.py:691-699
            from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank

            ranks = SpawnRanks(world_rank=spawn_world_rank(sa, tp_rank=0, pp_rank=0), gpu_id=0)
            publish(sa, role="scheduler", ranks=ranks)
            ob._init_process_global_configs()
        try:
            with native_ops(self.version) if native else contextlib.nullcontext():
                bench, _ = ob.load_model(sa, pa, 0, 0)
        except BaseException:  # a load that failed half way must not block the next one
            _release_process_state()
            raise
        self.runner, self.ob, self.server_args = bench.torch_runner, ob, sa
        self.model_path, self.dtype, self.device, self.native = (
            str(model_path),
            dtype,
            device,
            native,
        )
        self.vocab = self.runner.model_config.vocab_size
        self._ids: tuple | None = None

    def prefill(self, samples) -> list[list[int]]:
        """A plain prefill of ``samples`` (capture off, ``CaptureHiddenMode.NULL``: logits of the
        last token only): the baseline capture is timed against. Returns each sample's greedy next
        token (argmax of SGLang's last-position logits) as ``[[id]]``, read on the host, so the
        work is finished on the device."""
        out = []
        for chunk in self._batches([list(map(int, s)) for s in samples]):
            out += [[int(t)] for t in self._forward(chunk, None, plain=True).tolist()]
        return out

    def _forward(self, samples, ids, plain=False):
        """One extend pass over ``samples``: FULL capture (``[sum T, width]`` rows in order), or
        with ``plain`` none (returns the greedy next token per sample, ``[B]`` int64)."""
        import torch
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        r, ob = self.runner, self.ob
        # ids None: capture off, the post-norm final state comes back (logits_processor.py); a
        # set: as a fresh load with it, SGLang's own refusals raised here (sglang_capture_ids)
        set_capture(r.model, r.model_config, None if ids is None else list(ids))
        reqs = ob.prepare_synthetic_inputs_for_latency_test(len(samples), 0, custom_inputs=samples)
        try:  # the published schedule context (0.5.23; 0.5.17's ModelRunner publishes it too,
            from sglang.srt.runtime_context import get_schedule  # model_runner.py:334)

            page = get_schedule().page_size
        except Exception:  # noqa: BLE001 - nothing published: ServerArgs' own (one_batch.py:485)
            page = None
        page = page or getattr(r.server_args, "page_size", None) or 1
        cache = ob.TreeCacheNamespace(page_size=page, device=r.device,
                                      token_to_kv_pool_allocator=r.token_to_kv_pool_allocator)  # fmt: skip
        batch = ScheduleBatch.init_new(
            reqs=reqs, req_to_token_pool=r.req_to_token_pool,
            token_to_kv_pool_allocator=r.token_to_kv_pool_allocator, tree_cache=cache,
            model_config=r.model_config, enable_overlap=False,
            spec_algorithm=SpeculativeAlgorithm.NONE,
        )  # fmt: skip
        try:
            batch.prepare_for_extend()
            ob._maybe_prepare_mlp_sync_batch(batch, r)
            if (
                batch.input_ids is None
                and getattr(batch, "prefill_input_ids_cpu", None) is not None
            ):
                batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)
                batch.prefill_input_ids_cpu = None
            mode = CaptureHiddenMode.NULL if plain else CaptureHiddenMode.FULL
            fb = ForwardBatch.init_new(batch, r, capture_hidden_mode=mode,
                                       return_hidden_states_before_norm=False)  # fmt: skip
            with torch.no_grad():
                out = r.forward(fb).logits_output
            return out.next_token_logits.argmax(-1) if plain else out.hidden_states
        finally:  # as one_batch's _TorchBenchRunner.clear: every slot back for the next batch
            r.req_to_token_pool.clear()
            r.token_to_kv_pool_allocator.clear()

    def _batches(self, samples):
        cap = int(self.runner.max_total_num_tokens) - 8
        slots = max(1, int(self.runner.req_to_token_pool.size) - 1)
        cur, n = [], 0
        for i, s in enumerate(samples):
            if len(s) > cap:
                raise ValueError(
                    f"sample {i}: {len(s)} tokens, more than SGLang's KV pool of {cap}; raise "
                    "sglang_options.max_total_tokens"
                )
            if cur and (n + len(s) > cap or len(cur) == slots):
                yield cur
                cur, n = [], 0
            cur.append(s)
            n += len(s)
        if cur:
            yield cur

    def capture(self, samples, layer_ids, logprobs=False) -> list[dict]:
        """Per sample ``{"aux": [T, len(layer_ids) * H] float32}`` on CPU, slots in ``layer_ids``
        order (SGLang ids: boundary = id + 1), plus ``input_logprobs`` ``[T]`` float32 (NaN at t = 0)
        with ``logprobs``. No ``final`` (module docstring).

        Raises:
            RuntimeError: SGLang returned another number of rows than the batch has tokens.
        """

        ids = tuple(int(i) for i in layer_ids)
        out = []
        for chunk in self._batches([list(map(int, s)) for s in samples]):
            total = sum(len(s) for s in chunk)
            aux = self._forward(chunk, ids)
            if aux is None or aux.shape[0] != total:
                got = None if aux is None else tuple(aux.shape)
                raise RuntimeError(f"SGLang ModelRunner returned rows {got} for {total} tokens")
            aux = aux.float().cpu()
            lp = self._logprobs(chunk) if logprobs else None
            o = 0
            for j, s in enumerate(chunk):
                item = {"aux": aux[o : o + len(s)].clone()}
                if lp is not None:
                    item["input_logprobs"] = lp[j]
                out.append(item)
                o += len(s)
        self._ids = ids
        return out

    def _logprobs(self, chunk) -> list:
        import torch

        final = self._forward(chunk, None).float()  # [sum T, H] after SGLang's final norm
        w = self.runner.model.lm_head.weight.float()[: self.vocab]
        res, o = [], 0
        for s in chunk:
            lp = torch.log_softmax(final[o : o + len(s)] @ w.T, dim=-1).cpu()
            got = torch.full((len(s),), float("nan"))
            got[1:] = lp[:-1].gather(1, torch.tensor(s[1:])[:, None])[:, 0]
            res.append(got)
            o += len(s)
        return res

    def close(self) -> None:
        """Free the runner and SGLang's process-wide parallel groups, so another runner (a twin, or
        another dtype) can be built in this process (``srt/distributed/parallel_state.py``
        ``destroy_model_parallel`` / ``destroy_distributed_environment``, both versions)."""
        import gc

        import torch

        self.runner = None
        gc.collect()
        _release_process_state()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _release_process_state() -> None:
    """SGLang's process-wide state a ModelRunner sets up: the parallel groups
    (``srt/distributed/parallel_state.py`` ``destroy_model_parallel`` /
    ``destroy_distributed_environment``, both versions; 0.5.23's destroy also clears
    ``init_parallel_runtime``'s once-guard, ``distributed/bootstrap.py:66-72``) and, for an MoE
    model, 0.5.23's expert-location metadata, which a second MoE load asserts is unset
    (``eplb/expert_location.py:484-489``)."""
    from sglang.srt.distributed import parallel_state as ps

    with contextlib.suppress(Exception):  # nothing to destroy is fine
        ps.destroy_model_parallel()
    with contextlib.suppress(Exception):
        ps.destroy_distributed_environment()
    with contextlib.suppress(Exception):  # absent before 0.5.23, or nothing published yet
        from sglang.srt.runtime_context import get_resources

        get_resources().expert_location_metadata = None


class RunnerRoute:
    """Backend mixin (:class:`eagle3nb.engines.sglang_backend.Backend`): ``capture`` through a
    :class:`RunnerCapture` where :func:`pick_route` says ``runner``. Reads the backend's
    ``model_path``, ``device``, ``options`` (``capture_route``, ``native_ops``, ``seed``,
    ``max_total_tokens``, ``engine_kwargs`` as ``ServerArgs`` fields) and calls its ``_stop``
    before building a runner (one engine or runner at a time)."""

    _runner: RunnerCapture | None = None
    _runner_key: tuple | None = None
    _route: str | None = None

    def capture_route(self) -> str:
        """``engine`` or ``runner`` for this backend (decided once; see :func:`pick_route`)."""
        if self._route is None:
            import sglang

            req = str(self.options.get("capture_route", "auto"))
            self._route = pick_route(req, sglang.__version__, has_aux_api())
        return self._route

    def runner_capture(self, samples, layer_ids, logprobs, dtype) -> list[dict]:
        """:meth:`RunnerCapture.capture` on a runner of ``dtype`` (built, or rebuilt, here)."""
        native = bool(self.options.get("native_ops", False))
        key = (dtype, native)
        if self._runner is None or self._runner_key != key:
            self._stop()  # the engine, a twin's backend, an old runner
            dev = "cpu" if self.device == "cpu" else "cuda"
            self._runner = RunnerCapture(
                self.model_path, dtype, dev, int(self.options.get("seed", 0)),
                self.options.get("max_total_tokens"), native,
                self.options.get("engine_kwargs") or {},
            )  # fmt: skip
            self._runner_key, self._mode = key, ("runner", dtype)
        res = self._runner.capture(samples, layer_ids, logprobs)
        for i, r in enumerate(res):
            self.check_width(i, r["aux"].shape[1], layer_ids)
        return res

    def check_width(self, i: int, width: int, ids) -> None:
        """:func:`eagle3nb.engines.worker.check_aux_width` for this target (both capture routes)."""
        from eagle3nb.engines.worker import check_aux_width

        check_aux_width(i, width, ids, self.hidden_size, "SGLang")

    def close_runner(self) -> None:
        """Free the runner, if one is built."""
        runner, self._runner, self._runner_key = self._runner, None, None
        if runner is not None:
            runner.close()
