"""05_drift: one drafter per (engine, dtype, quantization) source, the train x serve matrix."""
