"""Helpers shared by several test folders (importable as ``testkit``: pytest puts ``tests/`` on
``sys.path`` through ``tests/conftest.py``): the engine-venv mark :func:`requires_engine`, the
tiny HF-captured dataset and the installed engines' source files."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

import pytest
import torch

from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS, ENGINES_HOME, EngineClient
from eagle3nb.repo_paths import REPO_ROOT

# the engine pythons as installed (requires_engine's skip reads them)
ENGINE_PYTHONS = dict(DEFAULT_ENGINE_PYTHONS)
SETUP_ENGINES = "bash .ci/setup_engines.sh"
# the FAKE engine backend (tests/engines/fake): a worker subprocess of this python runs it
FAKE_BACKEND = "module:fake_engine_backend"
FAKE_ENGINE_DIR = Path(__file__).parent / "engines" / "fake"
FAKE_ENGINE_ENV = {"PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{FAKE_ENGINE_DIR}"}
# vLLM 0.26.0's sdist sources, extracted by .ci/setup_engines.sh (CI's third rule table)
VLLM_026_SRC = ENGINES_HOME / "vllm-src-0.26.0"


def requires_engine(engine: str, version: str | None = None) -> pytest.MarkDecorator:
    """The mark of a test that needs ``engine``'s venv (it starts the engine, or reads the
    venv's files or installed version): ``pytest.mark.engines(engine, version=version)``.

    Use as a decorator, in a module's ``pytestmark`` (a list for both engines) or in
    ``pytest.param(..., marks=...)``. ``tests/conftest.py`` skips the test with
    :func:`engine_skip_reason` where the venv is absent (or holds another version), and refuses
    an engine start (``EngineClient`` on a venv's python) in every test without the mark.
    ``-m "not engines"`` deselects them all (the contributors' fast command, docs/development.md#tests).

    Args:
        engine: ``"vllm"`` or ``"sglang"`` (a key of ``DEFAULT_ENGINE_PYTHONS``).
        version: a version prefix the installed engine must start with (``"0.5"``), or None.

    Raises:
        ValueError: an unknown engine (names the known ones).
    """
    if engine not in ENGINE_PYTHONS:
        raise ValueError(
            f"requires_engine({engine!r}): engine must be one of {list(ENGINE_PYTHONS)}"
        )
    return pytest.mark.engines(engine, version=version)


def engine_skip_reason(engine: str, version: str | None = None) -> str | None:
    """Why a test marked :func:`requires_engine` ``(engine, version)`` cannot run here: the venv's
    python is absent, or its installed version does not start with ``version``; None when it
    can. The one wording of the "engine venv absent" skip."""
    python = ENGINE_PYTHONS[engine]
    if not Path(python).is_file():
        return f"{engine} engine venv absent ({python}); create it with `{SETUP_ENGINES}`"
    if version is not None:
        from eagle3nb.engines.versions import installed_engine_version

        have = installed_engine_version(engine, python)
        if not have.startswith(version):
            return f"needs {engine} {version}*, the venv ({python}) has {have}; `{SETUP_ENGINES}`"
    return None


# five short stories: the tiny dataset's texts (the first 3 tokens of each are prompt, loss mask 0)
TINY_TEXTS = [
    "Once upon a time there was a cat. The cat liked to play.",
    "Tom had a big red ball and a dog.",
    "The sun was warm and the sky was blue.",
    "Mia liked to sing songs with her mom.",
    "Ben ran to the park to see his friend.",
]
# the online-training tests' texts: those five and two more (7 samples leave a 1-sample batch at
# global batch 3, so a rank captures a stand-in row)
ONLINE_TEXTS = TINY_TEXTS + [
    "Lily saw a bird in the tree and she smiled.",
    "The little dog barked at the big truck.",
]
# the manifest of a dataset captured at SGLang's ids [0, 1, 3] (boundaries [1, 2, 4]) of the
# embedded 5-layer target
TINY_MANIFEST = {
    "target": {},
    "engine": {},
    "convention": "sglang",
    "layer_ids": [0, 1, 3],
    "aux_boundaries": [1, 2, 4],
    "final_boundary": 5,
    "dtype": "float32",
    "template": {},
}


def fake_engine(tmp_path, **kw) -> EngineClient:
    """An :class:`EngineClient` of the FAKE backend (:data:`FAKE_BACKEND`, model ``"unused"``) in a
    worker subprocess of this python, its folder under ``tmp_path``; ``kw`` go to the client and
    replace the defaults (``env`` :data:`FAKE_ENGINE_ENV`, ``startup_timeout`` 60)."""
    opts = {"python": sys.executable, "workdir_parent": tmp_path, "env": FAKE_ENGINE_ENV}
    return EngineClient(FAKE_BACKEND, "unused", **{**opts, "startup_timeout": 60, **kw})


def text_samples(tok, texts: Sequence[str], n_prompt: int = 3) -> list[tuple]:
    """``(index, input_ids, loss_mask)`` per text of ``texts`` tokenized by ``tok``: the first
    ``n_prompt`` tokens are prompt (mask 0), the rest continuation (mask 1)."""
    out = []
    for i, t in enumerate(texts):
        ids = tok(t).input_ids
        out.append((i, ids, [0] * n_prompt + [1] * (len(ids) - n_prompt)))
    return out


def same_weights(want, got, atol: float = 0.0) -> None:
    """Assert that modules ``want`` and ``got`` hold the same parameters and buffers, by name:
    bit for bit (``atol`` 0), else each within ``atol`` (rtol 0). Names the first tensor that
    differs."""
    a, b = want.state_dict(), got.state_dict()
    assert list(b) == list(a), set(a) ^ set(b)
    for k, x in a.items():
        if atol == 0:
            assert torch.equal(x, b[k]), k
        else:
            torch.testing.assert_close(b[k], x, rtol=0, atol=atol, msg=k)


def hf_online_source(samples, capture, **kw):
    """An :class:`eagle3nb.training.engine_online.EngineOnlineSource` over ``samples`` fed by
    ``capture`` (the online tests' HF target, one sample per call), with :data:`TINY_MANIFEST`
    naming that capture as its engine; ``kw`` go to the source."""
    from eagle3nb.training.engine_online import EngineOnlineSource

    man = dict(TINY_MANIFEST, engine={"name": "hf-one-by-one", "version": "test"})
    return EngineOnlineSource(samples, capture, man, **kw)


def write_tiny_dataset(
    target, folder, texts: Sequence[str] = TINY_TEXTS, n_prompt: int = 3, shard_size: int = 2
) -> Path:
    """Write ``texts`` as an aux dataset captured by HF at SGLang's capture point (ids [0, 1, 3])
    of the ``target`` fixture's model into ``folder``; the first ``n_prompt`` tokens of each text
    have loss mask 0. Returns ``folder``."""
    from eagle3nb.dataset.write import write_dataset
    from eagle3nb.target.capture import HFCaptureEngine

    model, tok, _ = target
    eng = HFCaptureEngine(model, "sglang")
    samples = text_samples(tok, texts, n_prompt)
    write_dataset(
        folder, samples, lambda xs: eng.capture(xs, [0, 1, 3]), TINY_MANIFEST, shard_size=shard_size
    )
    return Path(folder)


def engine_site_packages(engine: str) -> Path | None:
    """The site-packages folder of ``engine``'s venv (eagle3nb's default engine python), or None
    when that venv is absent."""
    venv = Path(DEFAULT_ENGINE_PYTHONS[engine]).parent.parent
    hits = sorted(venv.glob("lib/python3*/site-packages"))
    return hits[0] if hits else None


def venv_site_packages(venv: str) -> Path | None:
    """The site-packages folder of the engine venv named ``venv`` under ``$EAGLE3NB_ENGINES``
    (e.g. ``sglang-0.5.22``, made by ``bash bench/setup_engine_versions.sh``), or None while that
    venv is absent or unfinished (no ``.ready``)."""
    hits = sorted((ENGINES_HOME / venv).glob("lib/python3*/site-packages"))
    return hits[0] if hits and (ENGINES_HOME / venv / ".ready").is_file() else None


def cited_range(root: Path, rel: str, lo: int, hi: int) -> str:
    """Lines ``lo`` to ``hi`` (1-based, both included) of ``root / rel``, joined by newlines: the
    range a source citation names.

    Raises:
        AssertionError: the file is shorter than ``hi`` lines.
    """
    lines = (root / rel).read_text().splitlines()
    assert hi <= len(lines), f"{root / rel} has {len(lines)} lines, the citation names {lo}-{hi}"
    return "\n".join(lines[lo - 1 : hi])


def cited_texts(root: Path, cited: dict, what: str = "") -> dict:
    """Each cited range's text, after checking that it holds its snippets.

    Args:
        root: the folder the cited paths are relative to (a venv's site-packages, an sdist).
        cited: ``{(rel, lo, hi): (snippet, ...)}``.
        what: names the sources in a failure (e.g. ``"sglang 0.5.22"``).

    Returns:
        ``{(rel, lo, hi): text}`` (:func:`cited_range`), for the caller's further checks.

    Raises:
        AssertionError: a range lacks one of its snippets (names it, the range and the text).
    """
    texts = {}
    for (rel, lo, hi), snippets in cited.items():
        text = cited_range(root, rel, lo, hi)
        for snip in snippets:
            assert snip in text, f"{what} {rel}:{lo}-{hi} lacks {snip!r}: {text!r}".lstrip()
        texts[rel, lo, hi] = text
    return texts


def engine_file_lines(engine: str, rel: str) -> list[str]:
    """The lines of ``rel`` (a path inside site-packages) in ``engine``'s venv; the test carries
    :func:`requires_engine` ``(engine)`` (skipped without the venv).

    Raises:
        AssertionError: the venv lacks the file (another engine version moved it).
    """
    root = engine_site_packages(engine)
    assert root is not None and (root / rel).is_file(), (
        f"{rel} not in {engine}'s venv ({DEFAULT_ENGINE_PYTHONS[engine]}): mark the test "
        f"requires_engine({engine!r}), or the installed {engine} moved the file"
    )
    return (root / rel).read_text().splitlines()


def version_site_packages(engine: str, version: str) -> Path:
    """The site-packages folder of ``engine`` ``version``: CI's venv where it holds that version
    (``bash .ci/setup_engines.sh``), else the bench's venv ``<engine>[-cpu]-<version>``
    (:func:`venv_site_packages`; ``bash bench/setup_engine_versions.sh``, outside CI). Skips the
    calling test, naming both and the fix, where neither holds it; no engine starts."""
    from eagle3nb.engines.versions import installed_engine_version

    python = Path(ENGINE_PYTHONS[engine])
    if python.is_file() and installed_engine_version(engine, str(python)) == version:
        root = engine_site_packages(engine)
        if root is not None:
            return root
    venv = f"{engine}-cpu-{version}" if engine == "vllm" else f"{engine}-{version}"
    root = venv_site_packages(venv)
    if root is None:
        pytest.skip(
            f"{engine} {version} absent: not CI's venv ({python}) nor {ENGINES_HOME / venv}; "
            "`bash bench/setup_engine_versions.sh` installs the bench's versions"
        )
    return root


def train_killed(q, fault: str) -> None:
    """Run 03 on params ``q`` under torchrun with ``fault`` (``"RANK:STEP"``: that rank SIGKILLs
    itself after that step, :data:`eagle3nb.training.loop.FAULT_ENV`) and check the run fails as
    torchrun reports it; the variable is removed again whatever happens."""
    import os

    from eagle3nb.steps.train.step import train_step
    from eagle3nb.training.loop import FAULT_ENV

    os.environ[FAULT_ENV] = fault
    try:
        with pytest.raises(RuntimeError, match="torchrun training failed"):
            train_step(q, progress=False)
    finally:
        del os.environ[FAULT_ENV]


def counts_by_chains(chain):
    """The per-origin definition of :func:`eagle3nb.drafter.acceptance.accepted_counts`, with
    ``chain`` (``draft_chain`` itself, the reference; or a test's fake of it) called once per
    origin t on the prefix ``full[: t + 2]`` and the states ``aux[: t + 1]``, its drafts counted
    against ``full[t + 2 :]`` up to the first miss. Same signature and result layout."""
    import torch

    def counts(drafter, full, aux, start, stop, k):
        out = []
        for t in range(start, stop):
            d = chain(drafter, full[: t + 2], aux[: t + 1], k)
            want = full[t + 2 : t + 2 + k].tolist()
            n = 0
            while n < k and n < len(want) and d[n] == want[n]:
                n += 1
            out.append(n)
        return torch.tensor(out, dtype=torch.long)

    return counts


def planted_draft_chain(greedy: dict, miss):
    """A fake of ``draft_chain`` (tests only): the target's greedy continuation ``greedy[prompt]``
    (``{tuple(prompt ids): continuation ids}``) from the state the tokens reach, with a wrong
    token planted at draft position ``miss(j, k)`` (j = tokens past the prompt; none when it is
    >= k), so accepted counts are long and a function of the state, as real drafting's are."""

    def fake(drafter, tokens, aux, k):
        toks = tokens.tolist()
        for p, g in greedy.items():
            if tuple(toks[: len(p)]) == p:
                j = len(toks) - len(p)
                d = list(g[j : j + k])
                m = miss(j, k)
                if m < k:
                    d[m] = (d[m] + 1) % 512
                return d
        raise AssertionError("unknown prompt")

    return fake


def sglang_ctx(path) -> int:
    """The ``context_length`` the steps give :func:`eagle3nb.engines.sglang_helpers.start_sglang`
    for this target (its ``max_position_embeddings``): a test's own start with it shares the steps'
    kept worker (eagle3nb.engines.pool keys on the options)."""
    import json
    from pathlib import Path

    return int(json.loads((Path(path) / "config.json").read_text())["max_position_embeddings"])


# SGLang 0.5.x classes whose set_eagle3_layers_to_capture reads a drafter's ids by each rule kind:
# + 1 (llama.py:941), unless they include N (gpt_oss.py:1349), + 1 only when the first id is 1
# (deepseek_v2.py:3470-3473)
SGLANG_ID_READERS = (
    ("llama", "LlamaForCausalLM"),
    ("gpt_oss", "GptOssForCausalLM"),
    ("deepseek_v2", "DeepseekV2ForCausalLM"),
)

_SGLANG_READ = """
import importlib, json, sys, types
probes, n = json.loads(sys.argv[1]), int(sys.argv[2])
for mod, name in json.loads(sys.argv[3]):
    cls = getattr(importlib.import_module("sglang.srt.models." + mod), name)
    for probe in [[0, 1, 3]] + probes:  # a plain set first: the call itself works on this stand-in
        m = types.SimpleNamespace(pp_group=types.SimpleNamespace(is_last_rank=True),
                                  model=types.SimpleNamespace(),
                                  config=types.SimpleNamespace(num_hidden_layers=n))
        try:
            cls.set_eagle3_layers_to_capture(m, probe)
            print(name, "ok", json.dumps(m.model.layers_to_capture))
        except Exception as e:
            print(name, "raised", type(e).__name__, e)
"""


def sglang_reads_ids(
    ids: list, n_layers: int, classes=SGLANG_ID_READERS, more: Sequence[list] = ()
) -> list[str]:
    """What SGLang's own ``set_eagle3_layers_to_capture`` (which its scheduler calls at start with
    the drafter config's ids) does with ``ids``, per class, run in SGLang's venv on a stand-in
    model object (no engine started: a scheduler that dies at start leaves eagle3nb's SGLang worker
    waiting on its child). Lines ``"<class> ok <layers>"`` or ``"<class> raised <Error> <text>"``,
    per class: ids [0, 1, 3] first (the call works), then ``ids``, then each of ``more`` (one
    SGLang import for all)."""
    probes = [list(ids)] + [list(x) for x in more]
    import json
    import subprocess

    out = subprocess.run(
        [DEFAULT_ENGINE_PYTHONS["sglang"], "-c", _SGLANG_READ, json.dumps(probes), str(n_layers),
         json.dumps([list(c) for c in classes])],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = out.stdout.strip().splitlines()
    assert len(lines) == (1 + len(probes)) * len(classes), out.stdout + out.stderr[-3000:]
    return lines
