"""Boundary b and each engine's layer ids, in one room (the ground floor: imports no other eagle3nb
module).

Boundary b is the residual stream entering decoder layer b (HF ``hidden_states[b]``); boundary N is
the last layer's output before the final norm. Every engine names these with its own layer ids, by a
rule that differs per engine, per engine version and per architecture class. This package holds the
conventions, the rules (read from source or measured), the limits of each engine version, how ids
are written into and read from drafter configs, and the alignment check that names a captured
slot by the boundary it equals.
"""
