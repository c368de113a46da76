"""Which engine version reads which drafter variant flag (the EAGLE-3.1 flavours, see
:data:`eagle3nb.drafter.model.FLAVOURS`), so an export can refuse by name an engine version that
would serve the drafter without one of its flags (another function than the one trained).

Read from each version's ``llama_eagle3.py`` (lines below): vLLM 0.32.0 and SGLang 0.5.23 as
installed here; vLLM 0.26.0 from its wheel (``pip download vllm==0.26.0 --no-deps``). All three
read the three flags at the top level of config.json (vLLM's speculators reader,
``transformers_utils/configs/speculators/algos.py:36-38`` in both vLLM versions, copies them).
When an engine is upgraded, read its file and add ``flag_reads`` to its version file
(:mod:`eagle3nb.boundaries.versions`).
"""

from __future__ import annotations

from eagle3nb.boundaries.versions import VERSIONS

__all__ = ["FLAG_READS", "VARIANT_FLAGS", "flag_refusals"]

VARIANT_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")

# (engine, version) -> {variant flag: where that version reads it}, from each version's file
# (eagle3nb.boundaries.versions); a version absent here, or a flag absent from its row, makes an
# export that sets the flag refuse that engine by name.
FLAG_READS = {
    (vf.engine, vf.version): dict(vf.flag_reads)
    for vf in VERSIONS.values()
    if vf.flag_reads is not None
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
                f"versions read: {held}); read its llama_eagle3.py and add flag_reads to its file in eagle3nb/boundaries/versions/ (FLAG_READS)"
            )
        elif row is not None and [k for k in on if k not in row]:
            lack = [k for k in on if k not in row]
            out[engine] = (
                f"{engine} {version} does not read {lack} (llama_eagle3.py): it would serve the "
                "drafter without them, another function than the one trained"
            )
    return out
