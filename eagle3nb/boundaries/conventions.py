"""Layer-id conventions of EAGLE-3 engines and trainers, mapped to physical boundaries.

One physical name for every captured tensor: **boundary b** (0 <= b <= N) is the residual stream
entering decoder layer b (HF ``hidden_states[b]``); boundary N is the last layer's output *before*
the final norm. Every engine's "layer id" is a convention mapping ids to boundaries; this module
holds the table and converts both ways, raising on ids an engine cannot capture.

Sources (read November 2026, see ``../shared/reference/conventions.md``):
- SGLang 0.5.x ``srt/models/llama.py`` ``set_eagle3_layers_to_capture``: explicit ids are stored as
  ``layers_to_capture = [val + 1 ...]`` and captured inside the layer loop *before* layer ``val+1``
  runs (so id L = boundary L+1; ids >= N-1 are never reached); the default ``[2, N//2, N-3]`` is
  stored unshifted. Reads only its nested key (:mod:`eagle3nb.boundaries.config_ids`).
- vLLM ``model_executor/models/llama.py`` + ``eagle3_utils.py``: id L = boundary L (captured before
  layer L, id N = final pre-norm state); default ``(2, N//2, N-3)``; reads the top-level key.
- speculators <= 0.4 ``VllmHiddenStatesGenerator``: id L = output of layer L = boundary L+1, default
  ``[2, N//2, N-3, N-1]``. speculators >= 0.5 uses vLLM's ``extract_hidden_states`` (vLLM's rule).
- SpecForge: id L = boundary L+1 (HF ``hidden_states[L+1]``), default ``[1, N//2-1, N-4]``.
- EAGLE official (traineagle3): fixed boundaries ``2, N//2, N-3``; ids are boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from eagle3nb.boundaries.config_ids import IDS_PATH

__all__ = [
    "Convention",
    "CONVENTIONS",
    "get_convention",
    "pick_default_boundaries",
    "check_boundaries",
    "aux_ids_and_boundaries",
    "boundary_table",
]


@dataclass(frozen=True)
class Convention:
    """How one engine or trainer names captured tensors.

    Attributes:
        name: key in :data:`CONVENTIONS`.
        offset: boundary = id + offset.
        default_ids: rule giving the ids used when none are configured, as a function of N.
        default_shifted: whether the engine applies ``offset`` to its own default ids (SGLang does
            not: its defaults are stored as boundaries directly).
        capturable: function N -> (lowest, highest) capturable boundary, inclusive.
        config_key: where the engine reads ids from a drafter config (dotted for nested keys), or
            None when it reads none.
        source: file the rule was read from.
    """

    name: str
    offset: int
    default_ids: Callable[[int], list[int]]
    default_shifted: bool
    capturable: Callable[[int], tuple[int, int]]
    config_key: Optional[str]
    source: str

    def _check_n(self, n_layers: int) -> None:
        if not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(
                f"n_layers={n_layers!r}: must be a positive int (the target's num_hidden_layers)"
            )

    def ids_to_boundaries(self, ids: Sequence[int], n_layers: int) -> list[int]:
        """Boundaries (0..N) that this engine captures for explicit ``ids``.

        Raises:
            ValueError: an id maps outside the engine's capturable range (an engine would silently
                return fewer tensors or the wrong one), or ``ids`` is empty.
        """
        self._check_n(n_layers)
        if len(ids) == 0:
            raise ValueError(f"ids=[] for convention {self.name!r}: give at least one layer id")
        lo, hi = self.capturable(n_layers)
        out = []
        for i in ids:
            b = int(i) + self.offset
            if not lo <= b <= hi:
                raise ValueError(
                    f"layer id {i} in convention {self.name!r} means boundary {b}, but this engine "
                    f"captures only boundaries {lo}..{hi} of a {n_layers}-layer target "
                    f"(ids {lo - self.offset}..{hi - self.offset}); pick ids in that range"
                )
            out.append(b)
        return out

    def boundaries_to_ids(self, boundaries: Sequence[int], n_layers: int) -> list[int]:
        """Ids to write in this engine's config so that it captures ``boundaries``.

        Raises:
            ValueError: a boundary is not capturable by this engine.
        """
        self._check_n(n_layers)
        lo, hi = self.capturable(n_layers)
        bad = [b for b in boundaries if not lo <= int(b) <= hi]
        if bad:
            raise ValueError(
                f"boundaries {bad} cannot be captured by {self.name!r} on a {n_layers}-layer target "
                f"(capturable: {lo}..{hi}); choose boundaries in that range"
            )
        return [int(b) - self.offset for b in boundaries]

    def shift_ids(self, boundaries: Sequence[int]) -> list[int]:
        """Ids ``boundary - offset`` with no range check: what an engine's model file serves where
        its capture-only mode would refuse (SGLang 0.5.23 serves id -1 as boundary 0, its
        ``llama.py:929-941`` adding 1 to every id; only ``arg_groups/validation_hook.py`` of the
        capture-only mode refuses negative ids)."""
        return [int(b) - self.offset for b in boundaries]

    def shift_boundaries(self, ids: Sequence[int]) -> list[int]:
        """Boundaries ``id + offset`` with no range check (the inverse of :meth:`shift_ids`)."""
        return [int(i) + self.offset for i in ids]

    def default_boundaries(self, n_layers: int) -> list[int]:
        """Boundaries the engine captures when the config names no ids (may be broken for small N:
        callers that need valid ones use :func:`check_boundaries`)."""
        self._check_n(n_layers)
        ids = self.default_ids(n_layers)
        return [i + self.offset for i in ids] if self.default_shifted else list(ids)


def _before_layers_and_final(n: int) -> tuple[int, int]:
    return (0, n)


CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in [
        Convention(
            name="sglang",
            offset=1,
            default_ids=lambda n: [2, n // 2, n - 3],
            default_shifted=False,
            # captured inside the loop before layer val+1, so val+1 must be a layer index 1..N-1
            capturable=lambda n: (1, n - 1),
            config_key=IDS_PATH["sglang"],
            source="sglang/srt/models/llama.py (0.5.x) set_eagle3_layers_to_capture",
        ),
        Convention(
            name="vllm",
            offset=0,
            default_ids=lambda n: [2, n // 2, n - 3],
            default_shifted=True,
            capturable=_before_layers_and_final,
            config_key=IDS_PATH["vllm"],
            source="vllm/model_executor/models/llama.py + eagle3_utils.py (0.3x)",
        ),
        Convention(
            name="speculators_le_0.4",
            offset=1,
            default_ids=lambda n: [2, n // 2, n - 3],  # its 4th default id (N-1) is the final state
            default_shifted=True,
            capturable=lambda n: (1, n),
            config_key=None,
            source="speculators<=0.4 data_generation/custom_worker.py VllmHiddenStatesGenerator",
        ),
        Convention(
            name="speculators_ge_0.5",
            offset=0,
            default_ids=lambda n: [2, n // 2, n - 3],  # plus N for the final state
            default_shifted=True,
            capturable=_before_layers_and_final,
            config_key=IDS_PATH["vllm"],
            source="speculators>=0.5 via vLLM extract_hidden_states",
        ),
        Convention(
            name="specforge",
            offset=1,
            default_ids=lambda n: [1, n // 2 - 1, n - 4],
            default_shifted=True,
            capturable=lambda n: (1, n),
            config_key=IDS_PATH["sglang"],
            source="SpecForge modeling/target (HF hidden_states[L+1])",
        ),
        Convention(
            name="eagle",
            offset=0,
            default_ids=lambda n: [2, n // 2, n - 3],
            default_shifted=True,
            capturable=_before_layers_and_final,
            config_key=None,
            source="SafeAILab/EAGLE eagle/traineagle3 (fixed boundaries)",
        ),
    ]
}


def get_convention(name: str) -> Convention:
    """Look up a convention by name.

    Raises:
        ValueError: unknown name (lists the known ones).
    """
    try:
        return CONVENTIONS[name]
    except KeyError:
        raise ValueError(
            f"convention={name!r} is unknown; use one of {sorted(CONVENTIONS)}"
        ) from None


def check_boundaries(
    boundaries: Sequence[int], n_layers: int, name: str = "boundaries"
) -> list[int]:
    """Validate aux boundaries: ints, strictly increasing, each in [0, N].

    Raises:
        ValueError: naming ``name``, the bad value and the rule broken.
    """
    b = [int(x) for x in boundaries]
    if len(b) == 0:
        raise ValueError(f"{name}=[]: give at least one boundary in 0..{n_layers}")
    if any(x < 0 or x > n_layers for x in b):
        raise ValueError(
            f"{name}={b}: every boundary must lie in 0..{n_layers} for a {n_layers}-layer target"
        )
    if any(y <= x for x, y in zip(b, b[1:])):
        raise ValueError(
            f"{name}={b}: boundaries must be strictly increasing without duplicates, e.g. {sorted(set(b))}"
        )
    return b


def pick_default_boundaries(n_layers: int) -> list[int]:
    """Low/mid/high aux boundaries for an N-layer target, strictly increasing in [1, N].

    For N >= 7 this is the shared default of SGLang, vLLM, SpecForge and EAGLE: (2, N//2, N-3)
    (N=32 -> [2, 16, 29]). For 3 <= N < 7 that rule gives duplicates or unsorted ids, so we use
    (1, (1+h)//2, h) with h = max(N-1, 3): N=3 -> [1,2,3], N=5 -> [1,2,4], N=6 -> [1,3,5].

    Raises:
        ValueError: N < 3 (three distinct boundaries in [1, N] do not exist).
    """
    if not isinstance(n_layers, int) or n_layers < 3:
        raise ValueError(
            f"n_layers={n_layers!r}: the default low/mid/high picker needs a target with >= 3 layers; "
            "pass explicit boundaries for smaller models"
        )
    if n_layers >= 7:
        b = [2, n_layers // 2, n_layers - 3]
    else:
        hi = max(n_layers - 1, 3)
        b = [1, (1 + hi) // 2, hi]
    return check_boundaries(b, n_layers)


def aux_ids_and_boundaries(
    convention: str, layer_ids: Sequence[int] | None, n_layers: int
) -> tuple[list[int], list[int]]:
    """``(ids in convention, boundaries)`` a run captures: explicit ``layer_ids`` mapped through the
    convention, or (``None``) the default picker's boundaries expressed as that convention's ids.

    Raises:
        ValueError: ids the engine cannot capture, non-increasing boundaries, or no default for N.
    """
    conv = get_convention(convention)
    if layer_ids is None:
        b = pick_default_boundaries(n_layers)
        return conv.boundaries_to_ids(b, n_layers), b
    b = check_boundaries(
        conv.ids_to_boundaries(layer_ids, n_layers), n_layers, "layer_ids -> boundaries"
    )
    return list(layer_ids), b


def boundary_table(boundaries: Sequence[int], n_layers: int) -> list[dict]:
    """Rows ``{convention, ids, config_key}`` giving, per convention, the ids that name ``boundaries``
    (``ids`` is None where the engine cannot capture one of them)."""
    rows = []
    for c in CONVENTIONS.values():
        try:
            ids = c.boundaries_to_ids(boundaries, n_layers)
        except ValueError:
            ids = None
        rows.append({"convention": c.name, "ids": ids, "config_key": c.config_key})
    return rows
