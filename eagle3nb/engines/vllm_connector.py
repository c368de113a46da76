"""A synchronous hidden-states connector for vLLM's ``extract_hidden_states`` method (CPU and GPU).

vLLM 0.32's ``ExampleHiddenStatesConnector`` (``vllm/distributed/kv_transfer/kv_connector/v1/
example_hidden_states_connector.py``) copies each finished request's cached states with a CUDA
stream into pinned memory and writes them from a thread pool; on CPU that fails
(``pin_memory=True requires a CUDA or other accelerator backend``). This subclass gathers the slots
and clones them synchronously, then writes the same safetensors file (``hidden_states [T, n_ids, H]``
in the model dtype, ``token_ids [T]``) atomically (temp file + rename), so a reader never sees a
half-written file and no lock file is needed. Everything else (which slots, when a request is
finished, the file name in ``kv_transfer_params["hidden_states_path"]``) is vLLM's own code.

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

__all__ = ["SyncHiddenStatesConnector"]


class _Done:
    """Stands in for the CUDA event the parent polls in ``get_finished``: the copy is already done."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class SyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` with a synchronous gather + clone + atomic write."""

    def _submit_async_write(self, pending: PendingSave) -> None:  # noqa: D401 (vLLM's hook name)
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        offs = torch.arange(self._block_size, dtype=torch.long)
        slots = (
            offs[None, :] + blocks[:, None] * self._block_size
        ).flatten()  # same order as vLLM's
        n = pending.token_ids.shape[0]
        # clone: the KV cache is reused by the next request as soon as the blocks are freed
        hs = (
            extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), n)
            .to("cpu")
            .clone()
        )
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        tmp = pending.filename + ".tmp"
        save_file({"hidden_states": hs.contiguous(), "token_ids": pending.token_ids.clone()}, tmp)
        os.replace(tmp, pending.filename)
        fd = self._lock_fds.pop(pending.req_id, None)
        if fd is not None:
            os.close(fd)  # releases the LOCK_EX vLLM took in wait_for_save
        self._req_copy_events[pending.req_id] = _Done()
