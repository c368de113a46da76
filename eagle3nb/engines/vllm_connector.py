"""A synchronous hidden-states connector for vLLM's ``extract_hidden_states`` method (CPU and GPU).

vLLM 0.32's ``ExampleHiddenStatesConnector`` (``vllm/distributed/kv_transfer/kv_connector/v1/
example_hidden_states_connector.py``) copies each finished request's cached states with a CUDA
stream into pinned memory and writes them from a thread pool; on CPU that fails
(``pin_memory=True requires a CUDA or other accelerator backend``). This subclass gathers the slots
synchronously (the gather is a copy), then writes the same safetensors file (``hidden_states [T, n_ids, H]``
in the model dtype, ``token_ids [T]``) atomically (temp file + rename), so a reader never sees a
half-written file and no lock file is needed. Everything else (which slots, when a request is
finished, the file name in ``kv_transfer_params["hidden_states_path"]``) is vLLM's own code.

When vLLM's model runner is in the process that asked for the capture (``handover_pid`` in
``kv_connector_extra_config`` equals this process's pid: vLLM's single-process engine,
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` with one rank, as on CPU), the states are handed over in
memory (:data:`HANDOVER`, keyed by the same file name) instead of through a file per request;
with ranks in other processes (tensor parallel) the file is written as before.

On a CUDA KV cache the copy is vLLM's own (the parent's ``_submit_async_write``, 0.26.0 and 0.32):
the slots are gathered on a side stream and copied into pinned host memory without blocking, and
the request counts as done (its blocks freed) once that copy's CUDA event has completed. The
hand-over entry carries the event under ``"ready"`` (on CPU an already-completed stand-in); the
reader synchronises on it. A synchronous
copy into pageable memory, as on CPU, took 47 % of the GPU time of a capture pass on the
Llama-3.1-8B shape on an H200 (bench/h200_2026-12-04/shape_llama-3.1-8b.json, kernel table).

Loaded by vLLM in its engine process through ``kv_transfer_config={"kv_connector":
"SyncHiddenStatesConnector", "kv_connector_module_path": "eagle3nb.engines.vllm_connector", ...}``;
imports vLLM, so only the engine environment imports this module.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

__all__ = ["HANDOVER", "SyncHiddenStatesConnector"]

# file name -> {"hidden_states": [T, n_ids, H], "token_ids": [T]}: the in-memory hand-over to the
# backend of this process (eagle3nb.engines.vllm_backend pops each entry as it reads it)
HANDOVER: dict[str, dict] = {}


class _Done:
    """Stands in for the CUDA event the parent polls in ``get_finished``: the copy is already done."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class SyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` with an in-memory hand-over or an atomic write; on CPU a
    synchronous gather, on CUDA the parent's pinned copy on a side stream."""

    def _submit_async_write(self, pending: PendingSave) -> None:  # noqa: D401 (vLLM's hook name)
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        offs = torch.arange(self._block_size, dtype=torch.long)
        n = pending.token_ids.shape[0]
        # vLLM's slot order, cut to the request's n tokens before the gather (vLLM cuts after it):
        # the gather then moves only those rows
        slots = (offs[None, :] + blocks[:, None] * self._block_size).flatten()[:n]
        if self._kv_cache.is_cuda:
            hs, done = self._copy_cuda(slots, n)
        else:
            # the gather (advanced indexing) copies out of the KV cache, which the next request
            # reuses once the blocks are freed: [n, n_ids, H], contiguous, no clone needed
            hs = extract_from_kv_cache(self._kv_cache, slots, n)
            done = _Done()
        states = {"hidden_states": hs, "token_ids": pending.token_ids.clone()}
        cfg = self._kv_transfer_config
        if cfg.get_from_extra_config("handover_pid", None) == os.getpid():
            # the reader is in this process: no file; it synchronises on "ready" before reading
            HANDOVER[pending.filename] = {**states, "ready": done}
        else:
            done.synchronize()
            os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
            tmp = pending.filename + ".tmp"
            save_file(states, tmp)
            os.replace(tmp, pending.filename)
        fd = self._lock_fds.pop(pending.req_id, None)
        if fd is not None:
            os.close(fd)  # releases the LOCK_EX vLLM took in wait_for_save
        # vLLM frees the request's blocks once this event has completed (get_finished polls it)
        self._req_copy_events[pending.req_id] = done

    def _copy_cuda(self, slots: torch.Tensor, n: int):
        """Gather the ``n`` states at ``slots`` and copy them into pinned host memory on a side
        stream, as the parent does (``example_hidden_states_connector.py``
        ``_submit_async_write``). Returns ``(hidden_states [T, n_ids, H] pinned, the copy's
        CUDA event)``: the tensor holds the states once the event has completed."""
        stream = self._get_copy_stream()
        ready = torch.cuda.Event()
        ready.record()  # the forward that wrote these slots, on the default stream
        stream.wait_event(ready)
        with torch.cuda.stream(stream):
            gpu = extract_from_kv_cache(
                self._kv_cache, slots.to(self._kv_cache.device, non_blocking=True), n
            )  # [T, n_ids, H]
            hs = torch.empty_like(gpu, device="cpu", pin_memory=True)
            hs.copy_(gpu, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        return hs, done
