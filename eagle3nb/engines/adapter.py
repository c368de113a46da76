"""An :class:`~eagle3nb.engines.client.EngineClient` seen as a :class:`eagle3nb.target.capture.CaptureEngine`.

``eagle3nb.steps.extract.sharded`` writes datasets through the ``CaptureEngine`` interface; this adapter makes a real
engine plug in there. ``engine_name`` / ``engine_version`` are what the engine reported about
itself (the engine that really ran), ``convention`` the convention of the ids it takes.
Imported on the notebook's side only (it needs the rest of ``eagle3nb``).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from eagle3nb.target.capture import Captured
from eagle3nb.boundaries.conventions import check_boundaries, get_convention

__all__ = ["EngineCaptureEngine"]


class EngineCaptureEngine:
    """Capture through an engine client.

    Args:
        client: a started :class:`~eagle3nb.engines.client.EngineClient` (or anything with
            ``info()`` and ``capture(samples, layer_ids)`` of the backend contract).
        n_layers: the target's N (to check ids before calling the engine).
        batch_size: samples per engine call (the engine batches inside a call).
        final_from: ``samples -> list[[T, H]]`` giving boundary N where the engine cannot capture
            it (SGLang); the manifest must then say where ``final`` came from. None = the engine
            must return ``final``.

    Raises:
        ValueError: the engine's convention is unknown to :mod:`eagle3nb.boundaries.conventions`.
    """

    def __init__(
        self, client, n_layers: int, batch_size: int = 32, final_from: Optional[Callable] = None
    ):
        info = client.info()
        self.client = client
        self.engine_name = info["engine_name"]
        self.engine_version = info["engine_version"]
        self.convention = get_convention(info["convention"])
        self.n_layers = int(n_layers)
        self.batch_size = int(batch_size)
        self.final_from = final_from

    def boundaries(self, ids: Sequence[int]) -> list[int]:
        """Boundaries the engine captures for ``ids`` (raises for ids it cannot capture)."""
        return check_boundaries(
            self.convention.ids_to_boundaries(ids, self.n_layers), self.n_layers, "aux boundaries"
        )

    def capture(self, samples: Sequence[Sequence[int]], ids: Sequence[int]) -> list[Captured]:
        """One :class:`Captured` per sample: ``aux [T, len(ids)*H]`` and ``final [T, H]``, float
        tensors on CPU from the engine (``final`` from ``final_from`` if the engine has none).

        Raises:
            ValueError: ids the engine cannot capture; an engine answer with another row count or
                width than asked, or without ``final`` and no ``final_from``.
        """
        self.boundaries(ids)
        out: list[Captured] = []
        for s in range(0, len(samples), self.batch_size):
            chunk = [list(x) for x in samples[s : s + self.batch_size]]
            res = self.client.capture(chunk, list(ids))
            if len(res) != len(chunk):
                raise ValueError(
                    f"{self.engine_name} returned {len(res)} captures for {len(chunk)} samples"
                )
            missing = [i for i, r in enumerate(res) if "final" not in r]
            finals = None
            if missing:
                if self.final_from is None:
                    raise ValueError(
                        f"{self.engine_name} returned no final state (boundary N) and no final_from was given"
                    )
                finals = self.final_from(chunk)
            for i, (x, r) in enumerate(zip(chunk, res)):
                aux = r["aux"]
                fin = r["final"] if "final" in r else finals[i]
                if (
                    aux.shape[0] != len(x)
                    or fin.shape[0] != len(x)
                    or aux.shape[1] != len(ids) * fin.shape[-1]
                ):
                    raise ValueError(
                        f"{self.engine_name} returned aux {tuple(aux.shape)} / final {tuple(fin.shape)} for a sample of {len(x)} tokens and {len(ids)} ids"
                    )
                out.append(
                    Captured(
                        aux=aux.to(torch.float32) if aux.dtype == torch.float16 else aux, final=fin
                    )
                )
        return out
