"""One parameter surface: every run parameter is written once, as a field of ``params.RunParams``.

Checks that the notebooks' ``parameters`` cells and the parameter table of docs/parameters.md are the rendering
of RunParams (fix: ``python -m eagle3nb.params sync``), that each field is declared by at least one
notebook or is a run-level switch that ``eagle3nb.run`` reads, that each cell line is a Python literal
equal to the field's default, that ``params/smoke.yaml`` equals the notebooks' defaults, and that
``training.loop.TrainConfig`` (which may not import params) has RunParams's default for every field
the two share.
"""

import ast
import dataclasses
import difflib

import nbformat
import pytest
import yaml

from eagle3nb import run
from eagle3nb.params import sync as params
from eagle3nb.params import NOTEBOOKS, RUN_LEVEL, RunParams, load_params
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.training.loop import TrainConfig

FIX = f"run `{params.SYNC_COMMAND}` (writes the notebooks' parameters cells and docs/parameters.md's table from eagle3nb/params/schema.py RunParams)"


def _cell(name):
    nb = nbformat.read(REPO_ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, (
        f"notebooks/{name}.ipynb: {len(cells)} cells tagged 'parameters'; a notebook needs exactly one"
    )
    return cells[0].source


def test_notebook_list_is_the_notebooks_folder():
    assert run.NOTEBOOKS == NOTEBOOKS
    assert sorted(p.stem for p in (REPO_ROOT / "notebooks").glob("*.ipynb")) == sorted(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_parameters_cell_is_rendered_from_runparams(name):
    have, want = _cell(name), params.parameters_cell(name)
    diff = "\n".join(
        difflib.unified_diff(
            have.splitlines(),
            want.splitlines(),
            f"notebooks/{name}.ipynb (stored)",
            "RunParams (rendered)",
            lineterm="",
        )
    )
    assert have == want, (
        f"the parameters cell of notebooks/{name}.ipynb differs from RunParams; {FIX}\n{diff}"
    )


def test_parameters_page_table_is_rendered_from_runparams():
    text = params.PARAMS_PAGE.read_text()
    assert params.PARAMS_PAGE == REPO_ROOT / "docs" / "parameters.md"
    want = params.page_with_table(text)
    diff = "\n".join(
        difflib.unified_diff(
            text.splitlines(),
            want.splitlines(),
            "docs/parameters.md (stored)",
            "RunParams (rendered)",
            lineterm="",
            n=0,
        )
    )
    assert text == want, (
        f"docs/parameters.md's parameter table differs from RunParams; {FIX}\n{diff}"
    )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_cell_lines_are_literals_equal_to_the_defaults(name):
    """What papermill and the kernel read back is the default itself (strings quoted, None, dicts)."""
    for stmt in ast.parse(params.parameters_cell(name)).body:
        assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1, ast.unparse(stmt)
        key = stmt.targets[0].id
        assert ast.literal_eval(stmt.value) == params.default_of(key), key


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_papermill_reads_every_line_with_its_help(name):
    """papermill's own parser (``papermill --help-notebook``, inject) reads each line: a quote
    character in a help comment made it skip the line with "Unable to parse line"."""
    import papermill

    got = papermill.inspect_notebook(str(REPO_ROOT / "notebooks" / f"{name}.ipynb"))
    want = {k for k, f in RunParams.model_fields.items() if name in _declared_by(f)}
    assert set(got) == want
    for key, info in got.items():
        assert info["help"] == params.help_of(key, name), key


def _declared_by(field):
    nbs = (field.json_schema_extra or {}).get("notebooks", [])
    return [] if nbs == RUN_LEVEL else nbs


def test_every_field_is_declared_by_a_notebook_or_is_run_level():
    enabled_by = set(run.ENABLED_BY.values())  # the run-level switches eagle3nb.run reads
    for key, field in RunParams.model_fields.items():
        where = params.declared_by(key)
        assert field.description and "\n" not in field.description, (
            f"{key}: needs a one-line help (description)"
        )
        if where == RUN_LEVEL:
            assert key in enabled_by, (
                f"{key} is marked run-level but eagle3nb.run does not read it; name the notebooks that declare it"
            )
            continue
        assert where and set(where) <= set(NOTEBOOKS), (
            f"{key}: notebooks={where}; name at least one of {NOTEBOOKS} (or RUN_LEVEL)"
        )
        assert set(field.json_schema_extra.get("notebook_help", {})) <= set(where), (
            f"{key}: notebook_help for a notebook that does not declare it"
        )
    # a switch is run-level, or declared only by the notebook it enables (06's audit_drafter: a
    # path that 06 reads, null to skip it)
    for name, key in run.ENABLED_BY.items():
        assert params.declared_by(key) in (RUN_LEVEL, [name]), (name, key)


def test_smoke_yaml_is_the_notebook_defaults():
    """The tests' pipeline runs (tests/test_pipeline.py, training/test_online.py) use params/smoke.yaml as the
    notebooks run as stored; every key it sets is the default."""
    smoke = yaml.safe_load((REPO_ROOT / "params" / "smoke.yaml").read_text())
    assert {k: v for k, v in smoke.items() if v != params.default_of(k)} == {}
    assert load_params(REPO_ROOT / "params" / "smoke.yaml") == RunParams()


def test_train_config_defaults_are_runparams_defaults():
    shared = [f for f in dataclasses.fields(TrainConfig) if f.name in RunParams.model_fields]
    assert (
        len(shared) >= 19
    )  # the training settings steps.train.step passes from the run's parameters
    differ = {
        f.name: (f.default, params.default_of(f.name))
        for f in shared
        if f.default != params.default_of(f.name)
    }
    assert differ == {}, (
        f"TrainConfig default vs RunParams default: {differ}; make eagle3nb/training/loop.py TrainConfig agree"
    )


def test_03_exports_ids_by_the_run_pythons_engine_versions(monkeypatch):
    """03's export writes each engine's ids by the rule of the version installed for the run's
    python (``engine_versions``): papermill injects into 03 only the fields its cell declares, so
    without ``sglang_python`` / ``vllm_python`` there 03 read the CI venvs' versions (the default
    job on vLLM 0.31.0 / SGLang 0.5.22 exported ids recorded as 0.32.0 / 0.5.23 rules,
    bench/engine_versions.py --only-jobs)."""
    from eagle3nb.engines import versions
    from eagle3nb.steps.shared.checks import engine_versions

    run = {
        "sglang_python": "/v/sglang-0.5.22/bin/python",
        "vllm_python": "/v/vllm-0.31.0/bin/python",
    }
    injected = {k: v for k, v in run.items() if "03_train" in params.declared_by(k)}
    monkeypatch.setattr(versions, "installed_engine_version", lambda e, py: py.split("-")[1][:6])
    assert engine_versions(RunParams(**injected)) == {"sglang": "0.5.22", "vllm": "0.31.0"}
