"""Empty and tiny inputs: refused with the parameter, the value and the fix, before generation."""

import pytest

from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.params import RunParams
from eagle3nb.text.prompts import load_prompts, split_prompts
from eagle3nb.steps.generate.step import generate_step

BAD = REPO_ROOT / "tests" / "bad_inputs" / "prompts"


def test_zero_prompts_and_duplicates():
    with pytest.raises(ValueError, match="holds no prompt"):
        load_prompts(BAD / "empty.txt")
    with pytest.raises(ValueError, match="repeats 1 prompt"):
        load_prompts(BAD / "duplicate.txt")


def test_split_is_deterministic_and_disjoint():
    ps = [f"prompt {i}" for i in range(200)]
    tr, ho = split_prompts(ps, 0.2, seed=0)
    tr2, ho2 = split_prompts(list(reversed(ps)), 0.2, seed=0)
    assert (
        set(ho) == set(ho2) and set(tr) | set(ho) == set(ps) and not set(tr) & set(ho)
    )  # order-independent
    assert 20 <= len(ho) <= 60


def test_prompt_longer_than_context_refused_before_generation(tmp_path):
    f = tmp_path / "long.txt"
    f.write_text(
        "Tom ran. " * 400
        + "\n"
        + "Lily sang a song.\nBen had a dog.\nMia saw a cat.\nMax ate a cake.\n"
    )
    p = RunParams(
        prompts_file=str(f), outputs_dir=str(tmp_path), heldout_fraction=0.5, max_new_tokens=8
    )
    with pytest.raises(ValueError, match="exceeds the context of 512"):
        generate_step(p, progress=False)
    assert not (tmp_path / "smoke" / "data" / "generated.jsonl").exists()


def test_runner_refuses_empty_prompts_file_before_any_notebook(tmp_path):
    from eagle3nb.run import run_notebooks

    f = tmp_path / "p.yaml"
    f.write_text(f"prompts_file: {BAD / 'empty.txt'}\noutputs_dir: {tmp_path}\nrun_name: empty\n")
    with pytest.raises(ValueError, match="holds no prompt"):
        run_notebooks(f)
    assert not (tmp_path / "empty").exists()
