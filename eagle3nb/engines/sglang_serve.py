"""SGLang (0.5.23; 0.5.17 on the GPU host) serves an exported EAGLE-3 drafter and reports its own counters: the SGLang
backend's ``serve_acceptance`` (:class:`ServeAcceptance`, mixed into
:class:`eagle3nb.engines.sglang_backend.Backend`) and the engine arguments of each engine mode.

Chain drafting, greedy: ``speculative_algorithm="EAGLE3"``, ``speculative_num_steps=k``,
``speculative_eagle_topk=1``, ``speculative_num_draft_tokens=k+1``. SGLang reads the drafter's ids
from ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang's convention, id = boundary - 1;
written by :mod:`eagle3nb.drafter.export`). On CPU the engine's scheduler first installs
:mod:`eagle3nb.engines.sglang_spec_cpu` (this module sets its variable before such an engine
starts, and checks its gate here first, so a refusal comes before the engine start); on a GPU
SGLang's own kernels run and nothing is patched.

The counters are SGLang's per-request ``meta_info`` (``sglang/srt/managers/tokenizer_manager.py``,
speculative metrics; the same keys in 0.5.17, ``:2750-2808``, the GPU host's version; counted in ``scheduler_components/batch_result_processor.py`` once per
verify pass of a request that had not finished), summed over this call's requests. SGLang's
server-level average accept length is a running average over the server's lifetime and is never
read. Imports only stdlib at module level (engine side).
"""

from __future__ import annotations

import os
import time

from eagle3nb.engines import sglang_spec_cpu
from eagle3nb.engines.worker import folder_stamp

__all__ = ["ServeAcceptance", "mode_kwargs", "cut_at_stop", "sum_counters", "DEFINITIONS"]

DEFINITIONS = {
    "spec_verify_ct": "verify passes (draft-verify cycles) of the request, summed over requests",
    "spec_num_correct_drafts": "drafts accepted, bonus token excluded, summed over requests",
    "spec_num_proposed_drafts": "spec_verify_ct x (speculative_num_draft_tokens - 1), summed",
    "spec_correct_drafts_histogram": "[i] = verify passes that accepted exactly i drafts, summed",
    "tau": "1 + spec_num_correct_drafts / spec_verify_ct (tokens per cycle, as vLLM's and the "
    "simulator's: accepted drafts past max_new_tokens still count)",
    "engine_accept_length": "SGLang's own accept length, sum(completion_tokens) / "
    "sum(spec_verify_ct): counts the prefill token and drops accepted tokens cut by "
    "max_new_tokens",
    "per_position_acceptance": "[i] = fraction of cycles whose draft i + 1 was accepted, from the "
    "histogram (a cycle that accepted m drafts accepted positions 1..m)",
}


def cut_at_stop(ids, stops) -> list[int]:
    """``ids`` up to and including the first id in ``stops`` (all of them when none is)."""
    ids = [int(t) for t in ids]
    cut = next((i for i, t in enumerate(ids) if t in stops), None)
    return ids[: cut + 1] if cut is not None else ids


def mode_kwargs(mode: tuple, device: str) -> dict:
    """``sglang.Engine`` arguments of an engine mode beyond the common ones:
    ``("capture", ids, dtype)``: capture-only aux states; ``("eagle3", drafter_dir, k, stamp,
    dtype)``: the drafter served with chain drafting; ``("plain", dtype)``: none.

    Sets :data:`sglang_spec_cpu.ENV` for the engine's children: ``"1"`` for an ``eagle3`` engine
    on CPU, removed otherwise.

    Raises:
        RuntimeError/ValueError: ``eagle3`` on CPU with another SGLang version (from
            :func:`sglang_spec_cpu.check`, before the engine starts).
    """
    os.environ.pop(sglang_spec_cpu.ENV, None)
    if mode[0] == "capture":
        return dict(
            enable_return_aux_hidden_states=True,
            speculative_algorithm="EAGLE3",
            return_aux_hidden_state_layer_ids=list(mode[1]),
        )
    if mode[0] != "eagle3":
        return {}
    k = int(mode[2])
    if device == "cpu":
        import sglang

        sglang_spec_cpu.check(sglang.__version__, device, 1)
        os.environ[sglang_spec_cpu.ENV] = "1"
    return dict(
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=str(mode[1]),
        speculative_num_steps=k,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=k + 1,
    )


def sum_counters(metas: list[dict], k: int) -> dict:
    """SGLang's per-request speculative counters (``meta_info``) summed over requests; a request
    that never reached a verify pass (done at prefill) has none and counts 0.

    Returns:
        ``spec_verify_ct``, ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``,
        ``completion_tokens`` (ints) and ``spec_correct_drafts_histogram`` (``[k + 1]`` ints).

    Raises:
        RuntimeError: a request's histogram disagrees with its own counters (sum != verify
            passes, or sum of i x count != accepted drafts), or names more than k drafts.
    """
    keys = ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts")
    out = {key: 0 for key in keys + ("completion_tokens",)}
    hist = [0] * (k + 1)
    for i, m in enumerate(metas):
        h = list(m.get("spec_correct_drafts_histogram") or [])
        got = {key: int(m.get(key) or 0) for key in keys}
        if len(h) > k + 1 or sum(h) != got["spec_verify_ct"]:
            raise RuntimeError(
                f"request {i}: SGLang's histogram {h} does not add up to its {got['spec_verify_ct']}"
                f" verify passes of at most k={k} drafts"
            )
        if sum(j * c for j, c in enumerate(h)) != got["spec_num_correct_drafts"]:
            raise RuntimeError(
                f"request {i}: SGLang's histogram {h} gives another number of accepted drafts "
                f"than its spec_num_correct_drafts={got['spec_num_correct_drafts']}"
            )
        for key in keys:
            out[key] += got[key]
        out["completion_tokens"] += int(m["completion_tokens"])
        hist = [a + (h[j] if j < len(h) else 0) for j, a in enumerate(hist)]
    out["spec_correct_drafts_histogram"] = hist
    return out


class ServeAcceptance:
    """Backend mixin: :meth:`serve_acceptance` on an ``eagle3`` engine of the backend (one engine
    at a time: ``_start``/``_mode``; repeated calls with the same drafter folder, unchanged on
    disk, and k reuse it)."""

    def serve_acceptance(
        self,
        drafter_dir: str,
        prompts: list[list[int]],
        k: int,
        max_new_tokens: int,
        stop_token_ids: list[int],
    ) -> dict:
        """Serve ``drafter_dir`` as SGLang's EAGLE-3 drafter (chain, greedy) and read SGLang's own
        per-request counters, summed over ``prompts``.

        Args:
            drafter_dir: exported drafter folder (config.json with
                ``eagle_config.eagle_aux_hidden_state_layer_ids`` in SGLang's convention).
            prompts: token id lists (template applied), each non-empty.
            k: drafts per cycle (``speculative_num_steps``), >= 1.
            stop_token_ids: generation stops after the first of these (kept in the output).

        Returns:
            The vLLM backend's keys: ``outputs`` (new ids per prompt), ``num_drafts`` (=
            ``spec_verify_ct``), ``num_draft_tokens`` (= ``spec_num_proposed_drafts``),
            ``num_accepted_tokens`` (= ``spec_num_correct_drafts``), ``accepted_per_pos`` [k],
            ``per_position_acceptance`` [k], ``tau``, ``draft_acceptance_rate``, ``k``,
            ``seconds``, ``tokens_per_s``; plus SGLang's summed counters under their own names,
            ``engine_accept_length`` and ``definitions`` (:data:`DEFINITIONS`). JSON-serialisable.

        Raises:
            ValueError: an empty prompt, k < 1 or max_new_tokens < 1.
        """
        if any(len(p) == 0 for p in prompts):
            raise ValueError(
                "serve_acceptance: an empty prompt; each needs at least one token (BOS)"
            )
        if int(k) < 1 or int(max_new_tokens) < 1:
            raise ValueError(
                f"serve_acceptance: k={k}, max_new_tokens={max_new_tokens}; both must be >= 1"
            )
        k = int(k)
        self._start(("eagle3", str(drafter_dir), k, folder_stamp(drafter_dir), self.dtype))
        sp = {"max_new_tokens": int(max_new_tokens), "temperature": 0.0}
        if stop_token_ids:
            sp["stop_token_ids"] = [int(t) for t in stop_token_ids]
        t0 = time.time()
        outs = (
            self._engine.generate(
                input_ids=[list(map(int, p)) for p in prompts], sampling_params=sp
            )
            if prompts
            else []
        )
        secs = time.time() - t0
        stops = set(int(t) for t in stop_token_ids or [])
        outputs = [cut_at_stop(o["output_ids"], stops) for o in outs]
        c = sum_counters([o["meta_info"] for o in outs], k)
        hist, nd = c["spec_correct_drafts_histogram"], c["spec_verify_ct"]
        per_pos = [sum(hist[j + 1 :]) for j in range(k)]
        n_tok = sum(len(o) for o in outputs)
        return {
            "outputs": outputs,
            "num_drafts": nd,
            "num_draft_tokens": c["spec_num_proposed_drafts"],
            "num_accepted_tokens": c["spec_num_correct_drafts"],
            "accepted_per_pos": per_pos,
            "per_position_acceptance": [a / max(nd, 1) for a in per_pos],
            "tau": 1 + c["spec_num_correct_drafts"] / max(nd, 1),
            "draft_acceptance_rate": c["spec_num_correct_drafts"]
            / max(c["spec_num_proposed_drafts"], 1),
            "k": k,
            "seconds": secs,
            "tokens_per_s": n_tok / secs if secs else None,
            **c,
            "engine_accept_length": c["completion_tokens"] / nd if nd else None,
            "definitions": dict(DEFINITIONS),
        }
