"""A FAKE engine backend for the unit tests of the process boundary (worker/client) only.

It is not an engine: ``engine_name`` says ``fake``; its "capture" returns deterministic tensors
computed from the token ids, so the test can recompute them independently on the client side.
"""

import os
import signal
import sys
import time

import torch

H = 4


def fake_states(sample, layer_ids):
    """aux [T, n*H]: value = token * 10 + id (per column block); final [T, H] = token."""
    t = torch.tensor(sample, dtype=torch.float32)[:, None]
    aux = torch.cat([(t * 10 + i).expand(-1, H) for i in layer_ids], dim=1)
    return {"aux": aux, "final": t.expand(-1, H).clone()}


class Backend:
    def __init__(self, model_path, dtype, options):
        if options.get("fail_start"):
            raise ValueError("fake engine asked to fail at start")
        self.options = options
        self.closed = False

    def info(self):
        return {
            "engine_name": "fake",
            "engine_version": "0",
            "torch_version": torch.__version__,
            "convention": "vllm",
            "pid": os.getpid(),
            # what the backend itself runs with (the thread budget's test reads these)
            "torch_threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        }

    def generate(self, prompts, max_new_tokens, stop_token_ids, temperature, top_p, seed):
        print("engine noise on stdout must not break the protocol", flush=True)
        return [[(p[-1] + j + 1) % 7 for j in range(max_new_tokens)] for p in prompts]

    def capture(self, samples, layer_ids):
        if self.options.get("die_with"):  # as SGLang: the reason in the log, then SIGKILL
            print("Traceback (most recent call last):", file=sys.stderr)
            print(self.options["die_with"], file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if any(i < 0 for i in layer_ids):
            raise ValueError(f"layer_ids={layer_ids}: negative")
        if self.options.get("sleep"):
            time.sleep(self.options["sleep"])
        return [fake_states(s, layer_ids) for s in samples]

    def close(self):
        self.closed = True
