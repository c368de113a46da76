"""02a_extract_vllm and 02b_extract_sglang: aux states captured by an engine, written as shards."""
