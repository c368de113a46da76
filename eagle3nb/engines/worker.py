"""Engine worker: one real engine (vLLM or SGLang) in its own Python, serving JSON-line requests.

Why a process boundary: each engine pins its own torch build, so each lives in its own virtual
environment (``bash .ci/setup_engines.sh`` creates them under ``~/.cache/eagle3nb/engines``). The
notebook's side (:class:`eagle3nb.engines.client.EngineClient`) starts this module with the engine
environment's python and ``PYTHONPATH`` = the repository root, so only ``eagle3nb.engines.*``
is imported here: this file and the backends import stdlib, torch, safetensors and the engine,
never the rest of ``eagle3nb`` (whose dependencies the engine environment does not have).

Protocol (stdin/stdout, one JSON object per line; no sockets of ours, so nothing listens; the
engines themselves are told to stay on loopback):

- start: ``python -m eagle3nb.engines.worker '<json spec>'`` with spec ``{"engine": "vllm",
  "model_path": ..., "dtype": ..., "options": {...}, "workdir": ..., "threads": n}`` (``threads``
  optional: the worker's share of the thread budget, :mod:`eagle3nb.threads`; torch's intra-op pool
  is sized to it before the engine is imported; ``log`` optional: the worker's stderr file, whose
  tail :mod:`eagle3nb.engines.child_watch` quotes when an engine process exits); the worker
  answers ``{"ready": true, "info": {...}, "pid", "threads": {"torch_threads", "env"}}`` once the
  backend is built (the thread counts it really runs with), or ``{"ready": false, "error",
  "type", "traceback"}``.
- request ``{"id": n, "method": "generate" | "capture" | "serve_acceptance" | "info" | "close",
  "args": {...}}``; answer ``{"id": n, "ok": true, "result": ...}`` or ``{"id": n, "ok": false,
  "error": str, "type": exception class name, "traceback": str}``.
- tensors (capture results) are not sent as JSON: the worker writes them into one safetensors file
  per call in ``workdir`` (temp file + rename) and answers ``{"file": path, "n": count}``; the
  client loads and deletes it. A key every sample has, with one dtype and trailing shape, travels
  as one tensor concatenated along dim 0 (``cat.{key}``, with ``len.{key}`` int64 ``[n]`` the
  per-sample lengths); the client splits it back into per-sample views. Other keys travel per
  sample (``{i}.{key}``). One tensor per key instead of one per sample halved the write + read of
  a call of 32 samples x 100 tokens x 256 floats (7.5 -> 3.4 ms, a one-off timing of the two file
  layouts on 2 cores, 2026-12-03; not a bench/ script).
- the engines' own prints go to stderr (fd 1 is redirected there at start), which the client
  writes to ``workdir/engine.log``; the protocol uses a private copy of the original stdout.

Backend contract (every module in :data:`REGISTRY` defines ``Backend`` with these methods):

- ``Backend(model_path: str, dtype: str, options: dict)``
- ``info() -> dict``: ``engine_name`` (e.g. ``"vllm"``), ``engine_version``, ``torch_version``,
  ``convention`` (name in :data:`eagle3nb.boundaries.conventions.CONVENTIONS` of the ids ``capture`` takes).
- ``generate(prompts: list[list[int]], max_new_tokens, stop_token_ids, temperature, top_p, seed)
  -> list[list[int]]``: new ids per prompt, cut after the first stop id (kept).
- ``capture(samples: list[list[int]], layer_ids: list[int]) -> list[dict]``: per sample ``aux``
  float tensor ``[T, n_ids*H]`` (ids' states concatenated in the order given = boundary order) and
  ``final`` ``[T, H]`` (boundary N) when the engine can capture it, else the key is absent.
- ``capture_model(model_path, samples, layer_ids, options=None) -> list[dict]``: the same capture
  on another model folder (a tiny twin of the target, :mod:`eagle3nb.engines.twin_check`) by this
  engine and version, in this process (no new worker start); ``options`` override the backend's.
- ``close()``.
- ``serve_acceptance(drafter_dir, prompts, k, max_new_tokens, stop_token_ids) -> dict`` (vLLM and
  SGLang): the exported drafter served greedily with k drafts per cycle; outputs and the engine's
  own counters under the same keys (``num_drafts``, ``num_accepted_tokens``, ``accepted_per_pos``,
  ``per_position_acceptance``, ``tau``, ...), JSON-serialisable; SGLang adds its per-request
  counters summed and ``engine_accept_length`` (:mod:`eagle3nb.engines.vllm_backend`,
  :mod:`eagle3nb.engines.sglang_serve`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

from eagle3nb.engines import child_watch

__all__ = [
    "REGISTRY",
    "REPORTED_ENV",
    "OtherModelCapture",
    "backend_module",
    "load_tensors",
    "folder_stamp",
    "size_threads",
    "serve",
    "main",
]

# SGLang's scheduler and detokenizer are spawned children that import this module as __mp_main__
# first: the one place to patch SGLang's hand-over of hidden states there (sglang_transport), and
# to hook the scheduler's start so it installs the CPU speculative stand-ins when the backend asked
# for them (sglang_spec_cpu: read at the scheduler's start, with its own server_args)
if __name__ == "__mp_main__":
    from eagle3nb.engines import sglang_spec_cpu, sglang_transport

    if sglang_transport.enabled():
        try:
            sglang_transport.install()
        except Exception:  # SGLang's own lists then arrive; the backend reports which form came
            pass
    sglang_spec_cpu.hook_scheduler()  # a failure here must stop the child: serving would fail later
    if os.environ.get("EAGLE3NB_SGLANG_NATIVE_OPS") == "1":  # torch ops (sglang_ops)
        from eagle3nb.engines import sglang_ops

        sglang_ops.install_native_ops()

# engine name -> module defining ``Backend``; "module:<dotted.path>" selects any other module
# (used by the unit tests' fake engine, which is named as a fake)
REGISTRY = {
    "vllm": "eagle3nb.engines.vllm_backend",
    "sglang": "eagle3nb.engines.sglang_backend",
}
# the package each engine needs importable (for the client's in-process check)
ENGINE_PACKAGES = {"vllm": "vllm", "sglang": "sglang"}


def text_hidden_size(model_path: str) -> int:
    """``hidden_size`` of the target's text model from its config.json (multimodal wrappers keep
    it under ``text_config``), read without the engine.

    Raises:
        ValueError: no positive int ``hidden_size`` there.
    """
    with open(os.path.join(str(model_path), "config.json")) as f:
        cfg = json.load(f)
    text = cfg.get("text_config") if "hidden_size" not in cfg else cfg
    h = (text or {}).get("hidden_size")
    if not isinstance(h, int) or h < 1:
        raise ValueError(f"{model_path}/config.json: no positive int hidden_size (got {h!r})")
    return h


def check_aux_width(sample: int, width: int, layer_ids, hidden_size: int, engine: str) -> None:
    """An engine's aux block for one sample must be ``len(layer_ids) * hidden_size`` wide: one
    hidden state per id (a width that merely divides by the number of ids can hide a slot of
    another size, or the states of another layer set).

    Raises:
        RuntimeError: naming the sample, the width, the ids and the expected width.
    """
    want = len(layer_ids) * int(hidden_size)
    if width != want:
        raise RuntimeError(
            f"sample {sample}: {engine} returned aux states {width} wide for layer ids "
            f"{list(layer_ids)}, not {len(layer_ids)} x hidden_size {hidden_size} = {want}: it "
            "captured another number of states than asked (check the ids against its rule, "
            "eagle3nb.boundaries.rules)"
        )


class OtherModelCapture:
    """Backend mixin: ``capture_model`` (the contract above) builds a second backend of the same
    class for another model folder (a tiny twin of the target) with this one's dtype and options
    (``options`` override them), after closing this one's engine (one engine at a time); that
    backend is kept for the next call on the same folder and options and closed by ``close()`` or
    by this backend's next engine start (which call :meth:`_close_other`)."""

    _other = None
    _other_key = None

    def capture_model(self, model_path, samples, layer_ids, options=None) -> list:
        opts = dict(self.options, **dict(options or {}))
        key = (str(model_path), repr(sorted(opts.items())), folder_stamp(model_path))
        if self._other_key != key:
            self.close()
            self._other, self._other_key = type(self)(str(model_path), self.dtype, opts), key
        return self._other.capture(samples, layer_ids)

    def _close_other(self) -> None:
        other, self._other, self._other_key = self._other, None, None
        if other is not None:
            other.close()


def folder_stamp(path) -> tuple:
    """``(name, size, mtime_ns)`` of each file directly in folder ``path``, sorted: a model or
    drafter written again at the same path gets another stamp, so a running worker (kept for reuse,
    :mod:`eagle3nb.engines.pool`) builds its engine again instead of serving the old weights.
    ``()`` for a path that is not a folder (the engine then reports it as before)."""
    if not os.path.isdir(str(path)):
        return ()
    out = []
    for e in os.scandir(str(path)):
        if e.is_file():
            st = e.stat()
            out.append((e.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def backend_module(engine: str) -> str:
    """Module path of ``engine``'s backend.

    Raises:
        ValueError: an unknown engine name.
    """
    if engine.startswith("module:"):
        return engine.split(":", 1)[1]
    if engine not in REGISTRY:
        raise ValueError(f"engine={engine!r} is unknown; use one of {sorted(REGISTRY)}")
    return REGISTRY[engine]


def _save_tensors(workdir: str, rid: int, items: list[dict]) -> dict:
    """Write one call's per-sample tensors to ``workdir`` (see the protocol in the module
    docstring) and return ``{"file", "n"}``."""
    import torch
    from safetensors.torch import save_file

    flat = {}
    keys = list(dict.fromkeys(k for d in items for k in d))
    for k in keys:
        ts = [d.get(k) for d in items]
        if all(
            t is not None
            and t.dim() >= 1
            and t.dtype == ts[0].dtype
            and t.shape[1:] == ts[0].shape[1:]
            for t in ts
        ):
            flat[f"cat.{k}"] = torch.cat([t.detach().cpu() for t in ts])
            flat[f"len.{k}"] = torch.tensor([t.shape[0] for t in ts], dtype=torch.int64)
            continue
        for i, t in enumerate(ts):
            if t is not None:
                flat[f"{i}.{k}"] = t.detach().cpu().contiguous()
    path = os.path.join(workdir, f"capture-{os.getpid()}-{rid}.safetensors")
    save_file(flat, path + ".tmp")
    os.replace(path + ".tmp", path)
    return {"file": path, "n": len(items)}


def load_tensors(res: dict) -> list[dict]:
    """The client's half of :func:`_save_tensors`: read ``res["file"]`` (then delete it) into
    ``res["n"]`` per-sample dicts; concatenated keys come back as per-sample views (no copy)."""
    from safetensors.torch import load_file

    flat = load_file(res["file"])
    os.remove(res["file"])
    out = [{} for _ in range(res["n"])]
    for key, t in flat.items():
        i, name = key.split(".", 1)
        if i == "cat":
            for d, part in zip(out, t.split(flat[f"len.{name}"].tolist())):
                d[name] = part
        elif i != "len":
            out[int(i)][name] = t
    return out


# the pool-size variables a worker reports back (eagle3nb.threads.THREAD_ENV and the engines' own)
REPORTED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")


def size_threads(threads: int | None) -> dict:
    """Size torch's intra-op pool to ``threads`` (None: leave it) before any engine is imported
    (vLLM's CPU worker later makes ``torch.set_num_threads`` a no-op,
    ``vllm/v1/worker/cpu_worker.py:139-145``).

    Returns:
        ``{"torch_threads": torch.get_num_threads(), "env": {name: value or None}}`` for
        :data:`REPORTED_ENV`: what this process really runs with.
    """
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    env = {k: os.environ.get(k) for k in REPORTED_ENV}
    return {"torch_threads": torch.get_num_threads(), "env": env}


def _answer(out, msg: dict) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def _error(e: BaseException) -> dict:
    return {"error": str(e), "type": type(e).__name__, "traceback": traceback.format_exc()}


def _doing(spec: dict, method: str, args: dict) -> str:
    """What the worker is doing, for :mod:`eagle3nb.engines.child_watch`'s message."""
    model = args.get("model_path") or spec["model_path"]
    ids = f" with layer ids {list(args['layer_ids'])}" if "layer_ids" in args else ""
    return f"running {method} of {spec['engine']} on {model}{ids}"


def serve(spec: dict, inp=None, out=None) -> None:
    """Build the backend from ``spec`` and answer requests until ``close`` or end of input. The
    backend's creation and each request run under :func:`eagle3nb.engines.child_watch.watching`:
    an engine process that exits meanwhile makes that call fail within seconds (the answer names
    it, its exit code, the model and ids, the log's tail), and the backend is closed, so the next
    request starts its engine anew."""
    inp = inp or sys.stdin
    workdir = spec["workdir"]
    log = spec.get("log") or os.path.join(workdir, "engine.log")  # the client's (its stderr)
    os.makedirs(workdir, exist_ok=True)
    try:
        threads = size_threads(spec.get("threads"))
        mod = importlib.import_module(backend_module(spec["engine"]))
        opts = dict(spec.get("options") or {})
        opts.setdefault("workdir", workdir)
        with child_watch.watching(_doing(spec, "start", {}), log):
            backend = mod.Backend(spec["model_path"], spec["dtype"], opts)
            info = backend.info()
    except BaseException as e:  # noqa: BLE001 (reported to the client, which raises)
        _answer(out, {"ready": False, **_error(e)})
        return
    _answer(out, {"ready": True, "info": info, "pid": os.getpid(), "threads": threads})
    try:
        for line in inp:
            if not line.strip():
                continue
            req = json.loads(line)
            rid, method, args = req.get("id"), req.get("method"), req.get("args") or {}
            if method == "close":
                backend.close()
                _answer(out, {"id": rid, "ok": True, "result": None})
                return
            try:
                with child_watch.watching(_doing(spec, method, args), log):
                    if method == "info":
                        res = backend.info()
                    elif method in ("capture", "capture_model"):
                        res = _save_tensors(workdir, rid, getattr(backend, method)(**args))
                    elif method in ("generate", "serve_acceptance"):
                        res = getattr(backend, method)(**args)
                    else:
                        raise ValueError(f"unknown method {method!r}")
                _answer(out, {"id": rid, "ok": True, "result": res})
            except (Exception, child_watch.ChildExited) as e:  # noqa: BLE001 (the client re-raises)
                if isinstance(e, (child_watch.EngineChildExited, child_watch.ChildExited)):
                    try:  # its engine is gone: the next request starts a fresh one
                        backend.close()
                    except Exception:  # noqa: BLE001
                        pass
                _answer(out, {"id": rid, "ok": False, **_error(e)})
    finally:
        try:
            backend.close()
        except Exception:  # noqa: BLE001
            pass


def main(argv=None) -> None:
    """Entry: ``python -m eagle3nb.engines.worker '<json spec>'`` (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    # private copy of stdout for the protocol; fd 1 (engines' prints, C++ logs) goes to stderr
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(spec, sys.stdin, proto)
    proto.flush()
    # engines leave non-daemon threads behind; the client waits for this process to exit
    os._exit(0)


if __name__ == "__main__":
    main()
