"""``python -m eagle3nb.run``: ``--set key=value`` (issue 32 item 9) read as 03's entry point reads
it and validated by the same schema with the same messages, before any notebook runs."""

import subprocess
import sys

import pytest

from eagle3nb.repo_paths import REPO_ROOT

pytest.importorskip("papermill")


def _cli(module: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", module, "params/smoke.yaml", *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "sets, message",
    [
        (
            ["--set", "max_stepz=3"],
            "invalid parameters in --set (over params/smoke.yaml):\n  max_stepz=3: unknown key; did you mean "
            "'max_steps'? (all keys with their help: the parameters cells of notebooks/*.ipynb, or "
            "eagle3nb/params/schema.py RunParams)",
        ),
        (
            ["--set", "max_steps=-1"],
            "invalid parameters in --set (over params/smoke.yaml):\n  max_steps=-1: Input should be greater "
            "than or equal to 1; e.g. max_steps: 100 (the default)",
        ),
        (["--set", "max_steps"], "--set 'max_steps': write key=value, e.g. --set max_steps=200"),
    ],
    ids=["unknown_key", "out_of_range", "no_equals"],
)
def test_set_refused_with_the_train_entry_points_message(tmp_path, sets, message):
    out = ["--set", f"outputs_dir={tmp_path}", "--set", "run_name=cli-set"]
    run = _cli("eagle3nb.run", *out, *sets)
    train = _cli("eagle3nb.steps.train.step", *out, *sets)
    assert (run.returncode, train.returncode) == (2, 2), (run.stderr, train.stderr)
    assert run.stderr == f"eagle3nb: {message}\n"
    assert train.stderr == f"eagle3nb.steps.train.step: {message}\n"  # one parser, one schema
    assert not any(tmp_path.iterdir())


def test_set_values_reach_the_preflight(tmp_path):
    # YAML values: a list and a path, each refused by the preflight naming the value given
    r = _cli("eagle3nb.run", "--set", f"outputs_dir={tmp_path}", "--set", "layer_ids=[0,1,4]")
    assert r.returncode == 2 and "layer_ids=[0, 1, 4] (convention 'sglang') do not fit" in r.stderr
    three = "tests/bad_inputs/prompts/three.txt"
    r = _cli("eagle3nb.run", "--set", f"prompts_file={three}", "--set", "heldout_fraction=0.1")
    assert r.returncode == 2
    assert r.stderr.startswith(
        f"eagle3nb: heldout_fraction=0.1 holds out 0 of the 3 prompts of prompts_file='{three}'"
    )
    assert not any(tmp_path.iterdir())


# --- the main job's own output: live training lines, no kernel plumbing warning (item 5) ----------


def test_log_follower_passes_lines_while_the_block_runs(tmp_path):
    import time

    from eagle3nb.training.progress import LogFollower

    log = tmp_path / "train.log"
    log.write_text("[train] step 1/9 from an earlier call\n")  # resumed run: not repeated
    got = []
    with LogFollower(log, got.append, interval_s=0.02):
        with open(log, "a") as f:
            f.write("[train] step 2/9 loss 1.0 ETA 3s\n[eval]  step 2/9 held-out tau 1.5 (par")
            f.flush()
            deadline = time.time() + 10
            while len(got) < 1 and time.time() < deadline:
                time.sleep(0.02)
            # live: the complete line came while the block still runs; the partial one waits
            assert got == ["[train] step 2/9 loss 1.0 ETA 3s"]
            f.write("tial)\n[train] step 3/9 loss 0.5 ETA 0s")  # the last line has no newline yet
    assert got == [
        "[train] step 2/9 loss 1.0 ETA 3s",
        "[eval]  step 2/9 held-out tau 1.5 (partial)",
        "[train] step 3/9 loss 0.5 ETA 0s",
    ]


def test_kernel_filter_drops_only_the_plaintext_tcp_warning():
    import json
    import logging
    import logging.config

    from eagle3nb.training.progress import KERNEL_ARGS

    # the handler config the kernel receives, applied to a logger of our own
    cfg = json.loads(KERNEL_ARGS[0].split("=", 1)[1])
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logging.config.dictConfig(
        {
            "version": 1,
            "filters": cfg["filters"],
            "handlers": {"console": {"()": Keep, **cfg["handlers"]["console"]}},
            "loggers": {"fake-kernel-app": {"handlers": ["console"], "level": "DEBUG"}},
            "disable_existing_loggers": False,
        }
    )
    log = logging.getLogger("fake-kernel-app")
    log.warning("Kernel is running over TCP without encryption. All communication ...")
    log.warning("Parent appears to have exited, shutting down.")
    assert seen == ["Parent appears to have exited, shutting down."]


@pytest.mark.slow  # over 20 s on a 2-core box (2026-12-04)
def test_main_job_shows_training_live_and_no_kernel_warning(tmp_path):
    # a short job on the smoke params (01 and 03, online: no 02 dataset to extract), run name ours
    run = "cli-live"
    r = _cli(
        "eagle3nb.run",
        *("--only", "01_generate", "--only", "03_train"),
        *("--set", f"outputs_dir={tmp_path}", "--set", f"run_name={run}"),
        *("--set", "training_mode=online", "--set", "log_every=25", "--set", "eval_every=50"),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "without encryption" not in r.stdout + r.stderr
    out = r.stdout.splitlines()
    log = (tmp_path / run / "train" / "train.log").read_text().splitlines()
    shown = [x for x in out if x.startswith(("[train]", "[eval]"))]
    assert shown == log  # every line of the log, once, in the runner's own output
    # smoke: max_steps 100, a line every 25 steps, a held-out evaluation every 50
    steps = [int(x.split()[2].split("/")[0]) for x in shown if x.startswith("[train]")]
    assert steps == [25, 50, 75, 100]
    assert all(" loss " in x and " ETA " in x for x in shown if x.startswith("[train]"))
    evals = [x for x in shown if x.startswith("[eval]")]
    assert len(evals) == 2 and all("held-out tau" in x for x in evals)
    start = out.index(next(x for x in out if x.startswith("[eagle3nb] 03_train: running")))
    done = out.index(next(x for x in out if x.startswith("[eagle3nb] 03_train: done")))
    assert start < out.index(shown[0]) and out.index(shown[-1]) < done
