"""Which engine version reads which drafter variant flag (the EAGLE-3.1 flavours, see
:data:`eagle3nb.drafter.model.FLAVOURS`), so an export can refuse by name an engine version that
would serve the drafter without one of its flags (another function than the one trained).

Read from each version's ``llama_eagle3.py`` (lines below): vLLM 0.32.0 and SGLang 0.5.23 as
installed here; vLLM 0.26.0 from its wheel (``pip download vllm==0.26.0 --no-deps``). All three
read the three flags at the top level of config.json (vLLM's speculators reader,
``transformers_utils/configs/speculators/algos.py:36-38`` in both vLLM versions, copies them).
When an engine is upgraded, read its file and add a row.
"""

from __future__ import annotations

__all__ = ["FLAG_READS", "VARIANT_FLAGS", "flag_refusals"]

VARIANT_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")

# (engine, version) -> {variant flag: where that version reads it}; a version absent here, or a flag
# absent from its row, makes an export that sets the flag refuse that engine by name.
FLAG_READS = {
    ("vllm", "0.32.0"): {
        "norm_before_fc": "model_executor/models/llama_eagle3.py:184-188, 405-407",
        "fc_norm": "model_executor/models/llama_eagle3.py:231-240, 409-416",
        "norm_output": "model_executor/models/llama_eagle3.py:252, 285-286",
    },
    ("vllm", "0.26.0"): {  # read from the 0.26.0 wheel (pip download vllm==0.26.0 --no-deps)
        "norm_before_fc": "model_executor/models/llama_eagle3.py:150-152, 367-368",
        "fc_norm": "model_executor/models/llama_eagle3.py:197-206, 370-376",
        "norm_output": "model_executor/models/llama_eagle3.py:218, 251-252",
    },
    ("sglang", "0.5.23"): {
        "norm_before_fc": "srt/models/llama_eagle3.py:173-182, 239-240",
        "fc_norm": "srt/models/llama_eagle3.py:184-196, 241-246",
        "norm_output": "srt/models/llama_eagle3.py:207, 267-268",
    },
}


def flag_refusals(flags: dict, versions: dict) -> dict:
    """``{engine: why}`` for each engine version that would not read a variant flag set in
    ``flags`` (:data:`FLAG_READS`): it lacks the flag, or the table does not hold that version.

    Args:
        flags: ``{flag: value}`` (e.g. :func:`trainer_flags`); only the set flags of
            :data:`FLAG_READS`' rows count. versions: ``{engine: version}`` (a ``+cpu`` suffix
            is ignored).
    """
    on = sorted(k for k in VARIANT_FLAGS if flags.get(k))
    out = {}
    for engine, version in versions.items():
        v = str(version).split("+")[0]
        row = FLAG_READS.get((engine, v))
        if on and row is None:
            held = sorted(vv for e, vv in FLAG_READS if e == engine)
            out[engine] = (
                f"which variant flags {engine} {version} reads is not known (flags set: {on}; "
                f"versions read: {held}); read its llama_eagle3.py and add it to FLAG_READS"
            )
        elif row is not None and [k for k in on if k not in row]:
            lack = [k for k in on if k not in row]
            out[engine] = (
                f"{engine} {version} does not read {lack} (llama_eagle3.py): it would serve the "
                "drafter without them, another function than the one trained"
            )
    return out
