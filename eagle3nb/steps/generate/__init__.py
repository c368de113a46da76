"""01_generate: the target regenerates the train prompts' continuations (prompts or chat)."""
