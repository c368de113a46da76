"""eagle3nb: train EAGLE-3 drafters on exactly the hidden states the serving engine will feed them.

Modules, by concern: ``conventions`` (layer ids <-> boundaries), ``models`` (find/load targets),
``capture`` (hooks and engines), ``prompts``/``chat``/``generate`` (data), ``dataset`` +
``manifest`` (shards on disk), ``vocab`` (d2t/t2d), ``drafter`` (the EAGLE-3 head),
``objective`` (TTT loss), ``train``, ``export``, ``acceptance`` (speculative decoding),
``plots``, ``params`` and ``run`` (papermill driver).
"""

__version__ = "0.1.0"
