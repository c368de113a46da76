"""04_eval_acceptance: acceptance by the simulator and the serving engines; the serving files."""
