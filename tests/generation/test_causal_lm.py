"""``NeuronCausalLM``: tiny random-weight transformers models generating on the core.

Greedy tokens equal ``transformers``' own ``generate`` exactly (Llama and GPT-2, batch 1 and a
left-padded batch of 2), each step runs in the bucket its context needs, the KV cache never
crosses to the host, sampling is reproducible and filtered as transformers filters, tp=2 gives
the tokens of tp=1, and a generation under the profiler gives one profile per step.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from neuroncore.generation import GenerationError, NeuronCausalLM, Phase  # noqa: E402

T = transformers
NEW = 14  # contexts 7..19 after a 6-token prompt: buckets 8, 16 and 32 all run


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                           max_position_embeddings=64)
    return T.LlamaForCausalLM(config).eval()


def _prompt(batch: int = 2, length: int = 6, pad: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(3, 128, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.int64)
    if batch > 1:
        mask[1, :pad] = 0  # left padding, as transformers pads decoder-only batches
        ids[1, :pad] = 0
    return ids, mask


def _reference(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, new: int) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return _llama()


@pytest.fixture(scope="module")
def llama_gen(llama) -> NeuronCausalLM:
    """Batch 2, token buckets 8/16/32, one prompt bucket of 8; compiled on first use."""
    return NeuronCausalLM(llama, n_positions=(8, 16, 32), context_length_estimate=8, batch_size=2,
                          instance="trn1.2xlarge")


@pytest.fixture(scope="module")
def greedy(llama, llama_gen):
    ids, mask = _prompt()
    # eos 2 would end Llama's second row at once: no eos, so every step runs in both rows
    out = llama_gen.generate(ids, mask, max_new_tokens=NEW, eos_token_id=[], pad_token_id=0)
    with torch.no_grad():
        want = llama.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                              pad_token_id=0, eos_token_id=None)
    return out, want, llama_gen.last_timing


def test_greedy_tokens_equal_transformers_generate_left_padded_batch(greedy):
    out, want, _ = greedy
    assert out.dtype == torch.int64 and out.shape == (2, 6 + NEW)
    assert torch.equal(out, want)


def test_each_step_runs_the_program_of_the_smallest_bucket_that_holds_its_context(llama_gen, greedy):
    _, _, timing = greedy
    steps = timing.steps
    assert steps[0].phase is Phase.CONTEXT_ENCODING and steps[0].bucket == 8 and steps[0].context == 6
    token = timing.token_steps
    assert [s.context for s in token] == list(range(7, 6 + NEW))
    # context 7-8 -> 8, 9-16 -> 16, 17-19 -> 32
    assert [s.bucket for s in token] == [8] * 2 + [16] * 8 + [32] * 3
    for step in steps:  # the execution really ran that bucket's program (loaded once, reused)
        assert step.model_ids == llama_gen.model_ids(step.phase, step.bucket)
    assert llama_gen.compiled == [(Phase.CONTEXT_ENCODING, 8), (Phase.TOKEN_GENERATION, 8),
                                  (Phase.TOKEN_GENERATION, 16), (Phase.TOKEN_GENERATION, 32)]
    assert len({s.execution_ids for s in steps}) == len(steps) == NEW
    # timing the bench reads: TTFT the prefill, TPOT the mean step (as the host sees them: launch
    # and host copies on top of the device time), a larger bucket costs more
    assert timing.ttft_ns == steps[0].latency_ns > steps[0].device_time_ns > 0
    assert timing.tpot_ns == round(np.mean([s.latency_ns for s in token]))
    # whole ns, as every time the core reports (they were floats with fractional ns)
    assert all(type(t) is int for t in (timing.ttft_ns, timing.tpot_ns, *timing.per_token_ns))
    assert timing.device_ns == [s.device_time_ns for s in steps]
    by_bucket = {s.bucket: s.device_time_ns for s in token}
    assert by_bucket[8] < by_bucket[16] < by_bucket[32]
    assert all(b.start_ns >= a.start_ns + a.device_time_ns for a, b in itertools.pairwise(steps))


def test_the_kv_cache_stays_on_the_device_and_is_written_in_place(llama, llama_gen, greedy):
    out, _, timing = greedy
    cache_bytes = 2 * 2 * 32 * 16 * 4  # [batch, kv heads, 32 positions, head dim] fp32, per tensor
    for step in timing.token_steps:
        # the host sends the token, its position, the mask (bucket + 1) and the slot: int32 each
        assert step.host_to_device_bytes == 4 * (2 + 2 + 2 * (step.bucket + 1) + 1)
        assert step.device_to_host_bytes == 2 * 128 * 4  # the logits, nothing else
        assert step.host_to_device_bytes < cache_bytes // 8
    # the resident cache holds what transformers' own cache holds for the same tokens
    written = 6 + NEW - 1  # the last token was sampled, never run
    mask = torch.cat([_prompt()[1], torch.ones(2, NEW - 1, dtype=torch.int64)], 1)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate places them
    with torch.no_grad():
        ref = llama(out[:, :written], attention_mask=mask, position_ids=positions, use_cache=True)
    ref_keys = ref.past_key_values.layers[1].keys.numpy()
    ours = llama_gen.cache_values(1, "k")
    assert ours.shape == (2, 2, 32, 16)
    np.testing.assert_allclose(ours[0, :, :written], ref_keys[0], atol=1e-4)
    np.testing.assert_allclose(ours[1, :, 2:written], ref_keys[1, :, 2:], atol=1e-4)  # row 1's pads aside
    assert not ours[:, :, written:].any()  # slots past the context were never written


def test_sampling_is_reproducible_with_a_seed_and_filtered(llama_gen):
    ids, mask = _prompt()
    kwargs = dict(max_new_tokens=5, do_sample=True, eos_token_id=[], pad_token_id=0)
    a = llama_gen.generate(ids, mask, seed=7, top_k=20, top_p=0.9, temperature=3.0, **kwargs)
    b = llama_gen.generate(ids, mask, seed=7, top_k=20, top_p=0.9, temperature=3.0, **kwargs)
    c = llama_gen.generate(ids, mask, seed=8, top_k=20, top_p=0.9, temperature=3.0, **kwargs)
    assert torch.equal(a, b) and not torch.equal(a, c)
    greedy = llama_gen.generate(ids, mask, max_new_tokens=5, eos_token_id=[], pad_token_id=0)
    assert torch.equal(llama_gen.generate(ids, mask, seed=3, top_k=1, **kwargs), greedy)
    assert torch.equal(llama_gen.generate(ids, mask, seed=3, top_k=0, top_p=1e-6, **kwargs), greedy)
    # transformers-neuronx's spelling: sample to a total sequence_length (top-k 50 by default)
    sampled = llama_gen.sample(ids, 11, attention_mask=mask, seed=5)
    assert sampled.shape == (2, 11)
    assert torch.equal(sampled, llama_gen.generate(ids, mask, max_new_tokens=5, do_sample=True, seed=5))


def test_bad_requests_are_one_line_errors(llama, llama_gen):
    ids, mask = _prompt()
    with pytest.raises(GenerationError, match=r"input_ids must be \[batch_size=2, length\]"):
        llama_gen.generate(ids[:1], mask[:1])
    with pytest.raises(GenerationError, match="need 37 cache positions; n_positions holds 32"):
        llama_gen.generate(ids, mask, max_new_tokens=32)
    # the setting to change is named (before: "the prompt: a context of 9 positions is larger than
    # every bucket (8)", which said neither context_length_estimate nor that it is the prompt's length)
    with pytest.raises(GenerationError, match=r"^a 9-token prompt is longer than every "
                                              r"context_length_estimate bucket \(8\); add a bucket of "
                                              r"at least 9$"):
        llama_gen.generate(torch.ones(2, 9, dtype=torch.int64), max_new_tokens=2)
    with pytest.raises(GenerationError, match="larger than the KV cache"):
        NeuronCausalLM(llama, n_positions=16, context_length_estimate=32)
    with pytest.raises(GenerationError, match=r"token 128, outside the vocabulary \(0..127\)"):
        llama_gen.generate(torch.full((2, 4), 128), max_new_tokens=2)
    with pytest.raises(ValueError, match="top_p must be in"):
        llama_gen.generate(ids, mask, do_sample=True, top_p=0.0)
    with pytest.raises(GenerationError, match="input_ids must hold integer token ids, not float32"):
        llama_gen.generate(ids.float() + 0.5, mask, max_new_tokens=2)  # was truncated to other ids


def test_greedy_ignores_sampling_settings_as_transformers_does(llama, llama_gen, greedy):
    """temperature, top-k and top-p shape sampling only: with ``do_sample=False`` transformers warns
    and runs greedy, and so does ``generate`` here (before: ``temperature=0.0`` or ``top_p=0.0``
    without sampling, or a model's ``generation_config`` shipping ``temperature=0.0``, was refused
    with 'temperature must be positive'). With sampling they are still checked; a seed that is not a
    non-negative integer is one line (before: NumPy's TypeError)."""
    ids, mask = _prompt()
    no_eos = dict(max_new_tokens=NEW, eos_token_id=[], pad_token_id=0)
    for settings in (dict(temperature=0.0), dict(top_p=0.0), dict(top_k=-1),
                     dict(do_sample=False, temperature=0.0)):
        assert torch.equal(llama_gen.generate(ids, mask, **settings, **no_eos), greedy[0])
    config = T.GenerationConfig(do_sample=False, temperature=0.0, top_p=0.0)
    assert torch.equal(llama_gen.generate(ids, mask, generation_config=config, **no_eos), greedy[0])
    with pytest.raises(ValueError, match=r"temperature must be positive, not 0\.0"):
        llama_gen.generate(ids, mask, do_sample=True, temperature=0.0)
    for seed in ("x", -1, 1.5, True):
        expected = f"^seed must be a non-negative integer, not {re.escape(repr(seed))}$"
        with pytest.raises(GenerationError, match=expected):
            llama_gen.generate(ids, mask, do_sample=True, seed=seed, max_new_tokens=2)


def test_generate_takes_transformers_length_and_config_arguments(llama, llama_gen, greedy):
    """``generate`` as transformers' is called: ``max_length`` counts the prompt, a
    ``generation_config`` sets the length and the sampling; options that would change the tokens
    and are not implemented (beam search, repetition penalty, ...) are one line naming the option,
    not a ``TypeError``, and their neutral values are accepted (before: every one a TypeError)."""
    ids, mask = _prompt()
    greedy = greedy[0]
    no_eos = dict(eos_token_id=[], pad_token_id=0)  # as the greedy fixture
    assert torch.equal(llama_gen.generate(ids, mask, max_length=6 + NEW, **no_eos), greedy)
    assert torch.equal(llama_gen.generate(ids, mask, generation_config=T.GenerationConfig(
        max_new_tokens=NEW, do_sample=False), **no_eos), greedy)
    assert torch.equal(llama_gen.generate(ids, attention_mask=mask, max_new_tokens=NEW, num_beams=1,
                                          repetition_penalty=1.0, use_cache=True, **no_eos), greedy)
    sampled = T.GenerationConfig(max_new_tokens=4, do_sample=True, top_k=5)
    assert torch.equal(llama_gen.generate(ids, mask, generation_config=sampled, seed=1),
                       llama_gen.generate(ids, mask, max_new_tokens=4, do_sample=True, top_k=5, seed=1))
    for option in ({"num_beams": 4}, {"encoder_repetition_penalty": 1.2}, {"force_words_ids": [[5]]},
                   {"forced_eos_token_id": 5}, {"num_return_sequences": 2}):
        name = next(iter(option))
        with pytest.raises(GenerationError, match=f"^generate: {name}=.* is not supported"):
            llama_gen.generate(ids, mask, max_new_tokens=2, **option)
    with pytest.raises(GenerationError, match=r"^generate: num_beams=3 .* is not supported"):
        llama_gen.generate(ids, mask, generation_config=T.GenerationConfig(num_beams=3))
    with pytest.raises(GenerationError, match=r"^generate: unknown argument 'max_tokens'"):
        llama_gen.generate(ids, mask, max_tokens=2)
    with pytest.raises(GenerationError, match="max_length 5 leaves no room for new tokens"):
        llama_gen.generate(ids, mask, max_length=5)


@pytest.mark.parametrize("options", [
    {"repetition_penalty": 1.3}, {"repetition_penalty": 0.7}, {"no_repeat_ngram_size": 2},
    {"no_repeat_ngram_size": 1}, {"min_new_tokens": 6, "eos_token_id": 2},
    {"min_length": 10, "eos_token_id": [2, 5]},
    {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3, "min_new_tokens": 4, "eos_token_id": 2}])
def test_repetition_penalty_ngram_blocking_and_minimum_lengths_give_transformers_tokens(
        llama, llama_gen, greedy, options):
    """transformers' repetition penalty, ``no_repeat_ngram_size``, ``min_length`` and
    ``min_new_tokens`` on the host (sampling.process_logits): the same greedy tokens as
    ``generate`` with them, on a left-padded batch whose prompt padding counts as transformers
    counts it; each changes the tokens here (before: refused in one line)."""
    ids, mask = _prompt()
    eos = options.get("eos_token_id")
    with torch.no_grad():
        want = llama.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                              **{"eos_token_id": None, **options})
    got = llama_gen.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0, **{"eos_token_id": [], **options})
    assert torch.equal(got, want)
    if eos is None:
        assert not torch.equal(got, greedy[0])
    else:  # without the minimum, the padded row ends at once
        without = {k: v for k, v in options.items() if k not in ("min_new_tokens", "min_length")}
        plain = llama_gen.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0, **without)
        assert not torch.equal(got, plain)


def test_processor_settings_come_from_generation_configs_and_bad_values_are_one_line(llama_gen):
    ids, mask = _prompt()
    config = T.GenerationConfig(max_new_tokens=5, repetition_penalty=1.3)
    no_eos = dict(eos_token_id=[], pad_token_id=0)
    assert torch.equal(llama_gen.generate(ids, mask, generation_config=config, **no_eos),
                       llama_gen.generate(ids, mask, max_new_tokens=5, repetition_penalty=1.3, **no_eos))
    with pytest.raises(GenerationError, match=r"^generate: repetition_penalty must be a positive float"):
        llama_gen.generate(ids, mask, max_new_tokens=2, repetition_penalty=0.0)
    with pytest.raises(GenerationError, match=r"^generate: no_repeat_ngram_size must be a non-negative"):
        llama_gen.generate(ids, mask, max_new_tokens=2, no_repeat_ngram_size=-1)
    for bad, message in (({"bad_words_ids": [5]}, r"bad_words_ids must be a non-empty list of non-empty"),
                         ({"sequence_bias": [[5, 1.0]]}, r"sequence_bias must be a non-empty list of"),
                         ({"bad_words_ids": [[200]]}, r"sequence_bias / bad_words_ids name token 200, "
                                                      r"outside the vocabulary \(0..127\)"),
                         ({"suppress_tokens": ["a"]}, r"suppress_tokens must be"),
                         ({"do_sample": True, "min_p": 1.5}, r"min_p must be in \[0, 1\], not 1\.5"),
                         ({"do_sample": True, "typical_p": 0.0}, r"typical_p must be in \(0, 1\]"),
                         ({"do_sample": True, "eta_cutoff": 1.0}, r"eta_cutoff must be in \[0, 1\)"),
                         ({"stop_strings": [""]}, r"stop_strings must be a string or a list of non-empty")):
        with pytest.raises(GenerationError, match="^generate: " + message):
            llama_gen.generate(ids, mask, max_new_tokens=2, **bad)


def _first(g: torch.Tensor, row: int, step: int) -> int:
    return int(g[row, 6 + step])  # the greedy fixture's new token ``step`` of ``row``


# transformers' other per-token processors, from the greedy tokens so that each one bites
PROCESSOR_CASES = {
    "sequence_bias one token": lambda g: {"sequence_bias": [[[_first(g, 0, 3)], -4.0], [[5], 2.5]]},
    "sequence_bias after a prefix (dict form)": lambda g: {"sequence_bias": {
        (_first(g, 0, 1), _first(g, 0, 2)): -10.0, (_first(g, 1, 4), _first(g, 1, 5)): -10.0}},
    "bad_words_ids": lambda g: {"bad_words_ids": [[_first(g, 0, 5)], [_first(g, 1, 2), _first(g, 1, 3)]]},
    "bad word that is an eos id (dropped)": lambda g: {"bad_words_ids": [[_first(g, 0, 3)], [7, 9]],
                                                       "eos_token_id": [_first(g, 0, 3)]},
    "suppress_tokens": lambda g: {"suppress_tokens": [_first(g, 0, 4), _first(g, 1, 6)]},
    "begin_suppress_tokens": lambda g: {"begin_suppress_tokens": [_first(g, 0, 0), _first(g, 1, 0)]},
    "eos_token_id list": lambda g: {"eos_token_id": [120, _first(g, 1, 5), _first(g, 0, 8)]},
    "all at once": lambda g: {"sequence_bias": [[[_first(g, 1, 1)], 1.5]],
                              "bad_words_ids": [[_first(g, 0, 2)]], "suppress_tokens": [_first(g, 1, 3)],
                              "begin_suppress_tokens": [_first(g, 0, 0)], "repetition_penalty": 1.2,
                              "no_repeat_ngram_size": 3},
}


@pytest.mark.parametrize("case", PROCESSOR_CASES)
def test_more_transformers_processors_give_transformers_greedy_tokens(llama, llama_gen, greedy, case):
    """``sequence_bias`` (a token's bias, or a sequence's once its prefix was made),
    ``bad_words_ids`` (a single-token bad word equal to an eos id dropped, as transformers drops
    it), ``suppress_tokens``, ``begin_suppress_tokens`` and lists of end-of-sequence ids, on the
    host (sampling.process_logits): transformers' greedy tokens on a left-padded batch, and each
    changes them here (before: every one but eos lists refused in one line)."""
    ids, mask = _prompt()
    options = PROCESSOR_CASES[case](greedy[0])
    with torch.no_grad():
        want = llama.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                              **{"eos_token_id": None, **options})
    got = llama_gen.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0, **{"eos_token_id": [], **options})
    assert torch.equal(got, want)
    assert not torch.equal(got, greedy[0])


def test_repetition_penalty_leaves_the_prompts_left_padding_out_as_transformers(llama, llama_gen, greedy):
    """transformers (5.x) penalises the tokens a row has seen but not its prompt's left padding
    (``prompt_ignore_length``): with the padding made of the token the padded row would pick, the
    penalty must not touch it (before: the padding counted, and the row's tokens differed)."""
    ids, mask = _prompt()
    ids[1, :2] = _first(greedy[0], 1, 0)  # padding ids: the padded row's first greedy token
    with torch.no_grad():
        want = llama.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                              eos_token_id=None, repetition_penalty=3.0)
    got = llama_gen.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0, eos_token_id=[],
                             repetition_penalty=3.0)
    assert torch.equal(got, want)


@pytest.mark.parametrize("options", [{"min_p": 1.0}, {"typical_p": 1e-3}, {"epsilon_cutoff": 0.999},
                                     {"typical_p": 1e-3, "temperature": 0.5, "top_k": 0},
                                     {"min_p": 1.0, "eta_cutoff": 0.5, "bad_words_ids": [[3]]}])
def test_sampling_warpers_reach_the_sampler_and_give_transformers_tokens(llama, llama_gen, greedy, options):
    """``min_p``, ``typical_p``, ``epsilon_cutoff`` and ``eta_cutoff`` filter sampling as
    transformers' warpers do (the kept tokens are compared exactly in test_sampling.py). Here
    settings that keep one token per step make sampling deterministic, so the sampled tokens
    must be transformers' own ``generate(do_sample=True)``'s: min-p 1 and epsilon 0.999 keep the
    most likely token, a tiny typical-p the token whose surprise is nearest the entropy (not the
    most likely one: the tokens differ from greedy). Before: each refused in one line."""
    ids, mask = _prompt()
    torch.manual_seed(0)
    with torch.no_grad():
        want = llama.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=True, pad_token_id=0,
                              eos_token_id=None, **options)
    got = llama_gen.generate(ids, mask, max_new_tokens=NEW, do_sample=True, seed=1, pad_token_id=0,
                             eos_token_id=[], **options)
    assert torch.equal(got, want)
    if "typical_p" in options:
        assert not torch.equal(got, greedy[0])
    config = T.GenerationConfig(do_sample=True, max_new_tokens=NEW, **options)  # from a config too
    assert torch.equal(llama_gen.generate(ids, mask, generation_config=config, pad_token_id=0,
                                          eos_token_id=[], seed=2), got)


def _tokenizer() -> object:
    """A Llama-style (Metaspace) BPE tokenizer over the tiny model's 128 ids, built here: 13
    symbols and 115 two-symbol merges; nothing is downloaded."""
    tokenizers = pytest.importorskip("tokenizers")
    alphabet = ["\u2581", *"abcdefghijkl"]
    merges = [(a, b) for a, b in itertools.product(alphabet, repeat=2) if b != "\u2581"][:128 - len(alphabet)]
    vocab = {t: i for i, t in enumerate(alphabet + [a + b for a, b in merges])}
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    backend.decoder = tokenizers.decoders.Metaspace()
    return T.PreTrainedTokenizerFast(tokenizer_object=backend)


def test_stop_strings_end_a_row_as_transformers_does(llama, llama_gen, greedy):
    """``stop_strings`` with ``tokenizer=`` (transformers' own ``StopStringCriteria`` on the host,
    on the sequences so far: a row whose text ends with a stop string, one ending inside the last
    token included, is finished): transformers' tokens for a stop string row 0 makes at once, with
    an end-of-sequence id set (the finished row is padded) and without (as transformers, it runs on
    unpadded until every row has finished), and for one never made. Without a tokenizer, one line
    (before: stop_strings refused)."""
    ids, mask = _prompt()
    tokenizer = _tokenizer()
    stop = tokenizer.decode(greedy[0][0, 6:7]).strip()  # row 0's first new token's text
    for strings, eos in (([stop], [120]), ([stop], None), ("jjjjjj", None)):
        with torch.no_grad():
            want = llama.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                                  pad_token_id=0, eos_token_id=eos, stop_strings=strings, tokenizer=tokenizer)
        got = llama_gen.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0, eos_token_id=eos or [],
                                 stop_strings=strings, tokenizer=tokenizer)
        assert torch.equal(got, want), (strings, eos)
        if eos:  # row 0 stopped at its first new token and is padded from then on
            assert (got[0, 7:] == 0).all() and not torch.equal(got, greedy[0])
        else:
            assert torch.equal(got, greedy[0])
    with pytest.raises(GenerationError, match=r"^generate: stop_strings needs the model's tokenizer"):
        llama_gen.generate(ids, mask, max_new_tokens=2, stop_strings=["ab"])
    with pytest.raises(GenerationError, match=r"^generate: stop_strings 'zz': Stop string preprocessing"):
        llama_gen.generate(ids, mask, max_new_tokens=2, stop_strings="zz", tokenizer=tokenizer)


def test_batch_one_stops_at_eos_like_transformers(llama):
    gen = NeuronCausalLM(llama, n_positions=16, context_length_estimate=8, batch_size=1,
                         instance="trn1.2xlarge")
    for seed in range(3):
        torch.manual_seed(seed)
        ids = torch.randint(3, 128, (1, 5))
        out = gen.generate(ids, max_new_tokens=8, pad_token_id=0)
        assert torch.equal(out, _reference(llama, ids, torch.ones_like(ids), 8))
    torch.manual_seed(0)  # a prompt whose first new token is Llama's eos (2): one token, no step
    ids, mask = _prompt()
    out = gen.generate(ids[1:], mask[1:], max_new_tokens=8, pad_token_id=0)
    assert torch.equal(out, _reference(llama, ids[1:], mask[1:], 8)) and out.shape[1] == 7
    assert len(gen.last_timing.steps) == 1 and gen.last_timing.tpot_ns == 0


def test_gpt2_greedy_equals_transformers():
    torch.manual_seed(0)
    config = T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64,
                          bos_token_id=1, eos_token_id=2)
    model = T.GPT2LMHeadModel(config).eval()
    ids, mask = _prompt()
    gen = NeuronCausalLM(model, n_positions=(16,), context_length_estimate=8, batch_size=2,
                         instance="trn1.2xlarge")
    out = gen.generate(ids, mask, max_new_tokens=8, pad_token_id=0)
    assert torch.equal(out, _reference(model, ids, mask, 8))


def test_generation_past_a_learned_position_table_is_refused_before_compiling():
    """GPT-2's ``wpe`` holds ``n_positions`` rows: a generation needing more is one line up front
    (it used to compile, then fail in the gather); one that fits to the last row runs."""
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=12,
                                           bos_token_id=1, eos_token_id=2)).eval()
    gen = NeuronCausalLM(model, n_positions=32, context_length_estimate=8, instance="trn1.2xlarge")
    ids = torch.randint(3, 64, (1, 6))
    with pytest.raises(GenerationError, match=r"position table \(transformer.wpe\) holds 12 positions; "
                                              r"a 6-token prompt and 8 new tokens need 13"):
        gen.generate(ids, max_new_tokens=8)
    assert gen.compiled == []
    out = gen.generate(ids, max_new_tokens=7, eos_token_id=[], pad_token_id=0)  # positions 0..11
    assert torch.equal(out, model.generate(ids, max_new_tokens=7, do_sample=False, pad_token_id=0,
                                           eos_token_id=None))


def test_layer_paths_read_as_the_models_own_modules(llama_gen, greedy):
    """The programs name layers as a trace of the model itself does (``model/model/layers.0``:
    LlamaForCausalLM's ``model.layers.0``), not through the generation wrapper (``model/model/model``)."""
    for phase, bucket in llama_gen.compiled:
        layers = {op.layer for op in llama_gen._programs[(phase, bucket)].traced.graph.ops}
        assert "model/model/layers.0/self_attn/q_proj" in layers and "model/lm_head" in layers
        assert not any(layer.startswith("model/model/model") for layer in layers)
        # the program's own work is a layer of its own, not loose ops at the top of the tree
        # (found by the inference user trials: reduce.419, compare.414 next to model and lm_head)
        ops = llama_gen._programs[(phase, bucket)].traced.graph.ops
        assert [op.name for op in ops if op.layer == "model" and op.opcode != "parameter"] == []
        assert "model/last_token" in layers
        assert phase == "context_encoding" or "model/kv_cache_write" in layers


def test_tensor_parallel_tokens_equal_one_core(llama, llama_gen, greedy):
    ids, mask = _prompt()
    two = NeuronCausalLM(llama, n_positions=32, context_length_estimate=8, batch_size=2,
                         instance="trn1.2xlarge", tp_degree=2)
    kwargs = dict(max_new_tokens=NEW, eos_token_id=[], pad_token_id=0)
    assert torch.equal(two.generate(ids, mask, **kwargs), greedy[0])
    step = two.last_timing.steps[-1]
    assert len(step.execution_ids) == 2 and step.bucket == 32  # one execution per rank
    local = two._programs[(Phase.TOKEN_GENERATION, 32)].traced.variants[0].program.graph
    reduced = {op.name: op.operands[0].name for op in local.ops if op.opcode == "all-reduce"}
    # each all-reduce is named after the partial sum it completes (o_proj, down_proj, ...)
    assert reduced and all(name == f"all-reduce.{src}" for name, src in reduced.items())
    # each rank's core holds its own heads of the cache: one KV head of two
    assert two.cache_values(0, "v", core_rank=0).shape == (2, 1, 32, 16)
    llama_gen.generate(ids, mask, **kwargs)  # the one-core cache after the same generation
    both = np.concatenate([two.cache_values(0, "v", core_rank=r) for r in (0, 1)], axis=1)
    np.testing.assert_allclose(both, llama_gen.cache_values(0, "v"), atol=1e-5)


def test_generation_under_the_profiler_records_one_profile_per_step(llama_gen, tmp_path):
    from collectors import profile
    from formats import open_profile
    from formats.dataset import find_profiles

    gen = llama_gen  # compiled before the profiler started: its programs are announced to it
    ids, mask = _prompt()
    with profile(tmp_path / "device"):
        gen.generate(ids, mask, max_new_tokens=5, eos_token_id=[], pad_token_id=0)
    entries, skipped = find_profiles(tmp_path / "device")
    assert not skipped and len(entries) == len(gen.last_timing.steps) == 5
    models = sorted(e.partitions["model"] for e in entries)
    # the prompt's program and the 8- and 16-position steps, named for the phase and the bucket
    assert models == ["LlamaForCausalLM.context_encoding.8"] + ["LlamaForCausalLM.token_generation.16"] * 2 \
        + ["LlamaForCausalLM.token_generation.8"] * 2
    for entry in entries:
        assert open_profile(entry.path).num_rows("Instruction") > 0


def test_gpt_neo_local_attention_is_refused_in_one_line():
    """GPT-Neo's local layers mask by the key's index in the traced cache (its ``bias`` buffer), which
    is not the token's slot in a bucket's cache: refused, not silently wrong (sliding windows of
    Mistral and Qwen2: tests/generation/test_sliding_window.py)."""
    neo = T.GPTNeoForCausalLM(T.GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=2, vocab_size=64,
                                             attention_types=[[["global", "local"], 1]], window_size=4,
                                             max_position_embeddings=64))
    with pytest.raises(GenerationError, match=r"local attention layers \(window_size 4\).*not supported"):
        NeuronCausalLM(neo, n_positions=16)


def test_an_encoder_decoder_model_is_refused_in_one_line():
    """T5 and Whisper are encoder-decoders: T5 stopped at its first program with torch's 'You must
    specify exactly one of input_ids or inputs_embeds' (its decoder called without inputs), and
    Whisper was accepted and failed later. Their decode loop runs on the host over traced
    programs (tests/frontends/test_hf_user_trials.py: a cache passed back in)."""
    t5 = T.T5ForConditionalGeneration(T.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16,
                                                 vocab_size=64, decoder_start_token_id=0))
    whisper = T.WhisperForConditionalGeneration(T.WhisperConfig(
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=64,
        num_mel_bins=16, max_source_positions=16, max_target_positions=32, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1))
    for model in (t5, whisper):
        with pytest.raises(GenerationError, match="is an encoder-decoder model; NeuronCausalLM serves "
                                                  "decoder-only causal LMs") as info:
            NeuronCausalLM(model, n_positions=16)
        assert "\n" not in str(info.value)


def test_on_device_generation_returns_the_greedy_token_not_the_logits(llama, greedy):
    """transformers-neuronx's on-device generation, greedy: the programs end in an argmax (over the
    vocabulary the ranks split, gathered on the device), so a step sends back one id per row."""
    ids, mask = _prompt()
    gen = NeuronCausalLM(llama, n_positions=32, context_length_estimate=8, batch_size=2,
                         instance="trn1.2xlarge", tp_degree=2, on_device_generation=True)
    out = gen.generate(ids, mask, max_new_tokens=NEW, eos_token_id=[], pad_token_id=0)
    assert torch.equal(out, greedy[0])
    assert all(s.device_to_host_bytes == 2 * 2 * 4 for s in gen.last_timing.steps)  # 2 ranks x [2] ids
    local = gen._programs[(Phase.TOKEN_GENERATION, 32)].traced.variants[0].program.graph
    gathers = [op for op in local.ops if op.opcode == "all-gather"]
    # named after the tensor they gather (the vocabulary-split logits), not the op count
    assert gathers and all(op.name == f"all-gather.{op.operands[0].name}" for op in gathers)
    with pytest.raises(GenerationError, match="sampling needs the logits"):
        gen.generate(ids, mask, do_sample=True)
