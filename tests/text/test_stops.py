"""Generation stops at any end id: the tokenizer's eos and the model's generation_config eos list."""

import copy

from eagle3nb.drafter.acceptance import greedy_generate
from eagle3nb.text.generation import generate_batch
from eagle3nb.target.models import stop_token_ids


def test_stop_ids_merge_tokenizer_and_generation_config(target):
    model, tok, _ = target
    assert stop_token_ids(model, tok) == [2]
    m2 = copy.copy(model)
    m2.generation_config = copy.deepcopy(model.generation_config)
    m2.generation_config.eos_token_id = [7, 2]  # e.g. a chat model's end-of-turn token first
    assert stop_token_ids(m2, tok) == [2, 7]


def test_generation_cut_at_first_of_several_stops(target):
    model, tok, _ = target
    p = tok("Once upon a time, there was a little girl named Lily.").input_ids
    free = greedy_generate(model, p, 30, None)
    stop = free[5]  # pretend the 6th generated token ends a turn
    assert stop not in free[:5]
    never = next(i for i in range(3, 512) if i not in free)
    out = generate_batch(model, [p], 30, [never, stop])
    assert out == [free[:6]]
    assert greedy_generate(model, p, 30, [stop]) == free[:6]
