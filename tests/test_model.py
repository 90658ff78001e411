"""kvrl.model against Hugging Face transformers on tiny random checkpoints (CPU, fp32).

A small test-side block allocator (:class:`PagedBatcher`) packs prefills and decodes into the
batch layout of :mod:`kvrl.model.metadata`, over random (shuffled) block tables.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from kvrl.model import AttentionMetadata, CausalLM, ModelConfig, load_model, make_random_checkpoint
from kvrl.model.loader import CheckpointError
from kvrl.model.random_checkpoint import preset_config

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]
BLOCK_SIZE = 4
NUM_BLOCKS = 96


class PagedBatcher:
    """Allocates random cache blocks per sequence and runs steps of a :class:`CausalLM`."""

    def __init__(self, model: CausalLM, seed: int = 0):
        cfg = model.config
        shape = (NUM_BLOCKS, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
        self.model = model
        self.kv_caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}

    def share_prefix(self, seq: str, source: str, num_blocks: int) -> None:
        """Start ``seq`` with the first ``num_blocks`` full blocks of ``source`` already cached."""
        self.tables[seq] = self.tables[source][:num_blocks]
        self.lens[seq] = num_blocks * BLOCK_SIZE

    def _append(self, seq: str, num_tokens: int) -> tuple[list[int], list[int]]:
        """Reserve slots for ``num_tokens`` new tokens of ``seq``; returns (positions, slots)."""
        start = self.lens.get(seq, 0)
        table = self.tables.setdefault(seq, [])
        positions = list(range(start, start + num_tokens))
        while len(table) * BLOCK_SIZE < start + num_tokens:
            table.append(self.free.pop())
        self.lens[seq] = start + num_tokens
        return positions, [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in positions]

    def _tables(self, seqs: list[str]) -> torch.Tensor:
        width = max([len(self.tables[s]) for s in seqs], default=1)
        return torch.tensor([self.tables[s] + [0] * (width - len(self.tables[s])) for s in seqs],
                            dtype=torch.int32).reshape(len(seqs), width)

    def step(self, prefills: dict[str, list[int]], decodes: dict[str, int]) -> dict[str, torch.Tensor]:
        """One forward: prefill chunks (seq -> new prompt tokens), then decodes (seq -> token).

        Returns the fp32 logits ``[vocab]`` of each sequence's last token in this step.
        """
        ids, positions, slots, q_lens = [], [], [], []
        for seq, tokens in list(prefills.items()) + [(s, [t]) for s, t in decodes.items()]:
            pos, slot = self._append(seq, len(tokens))
            ids += tokens
            positions += pos
            slots += slot
            q_lens.append(len(tokens))
        p_seqs, d_seqs = list(prefills), list(decodes)
        cu = torch.tensor([0] + q_lens[: len(p_seqs)], dtype=torch.int32).cumsum(0).to(torch.int32)
        attn = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            num_prefill_tokens=sum(q_lens[: len(p_seqs)]),
            prefill_cu_seqlens_q=cu,
            prefill_context_lens=torch.tensor([self.lens[s] for s in p_seqs], dtype=torch.int32),
            prefill_block_tables=self._tables(p_seqs),
            max_prefill_q_len=max(q_lens[: len(p_seqs)], default=0),
            decode_context_lens=torch.tensor([self.lens[s] for s in d_seqs], dtype=torch.int32),
            decode_block_tables=self._tables(d_seqs),
            block_size=BLOCK_SIZE,
        )
        with torch.no_grad():
            hidden = self.model(torch.tensor(ids), torch.tensor(positions), self.kv_caches, attn)
            last_rows = torch.tensor(q_lens).cumsum(0) - 1
            logits = self.model.compute_logits(hidden[last_rows])
        return dict(zip(p_seqs + d_seqs, logits))


def random_prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


def hf_last_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0, -1].float()


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    scale = ref.abs().max().item()
    assert (ours - ref).abs().max().item() <= 1e-4 * max(scale, 1.0), "logits differ from the reference"


@pytest.fixture(scope="module", params=FAMILIES)
def family_models(request, tmp_path_factory):
    """(kvrl model, HF model, checkpoint path) of the tiny checkpoint of one family."""
    path = make_random_checkpoint(tmp_path_factory.mktemp(request.param), family=request.param, seed=1)
    model, config = load_model(path)
    assert config.family == request.param
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, hf_model, path


def test_batched_prefill_and_greedy_decode_match_hf(family_models):
    model, hf_model, _ = family_models
    rng = random.Random(0)
    vocab = model.config.vocab_size
    prompts = {f"s{i}": random_prompt(rng, n, vocab) for i, n in enumerate([5, 9, 14])}
    steps = 4
    batcher = PagedBatcher(model, seed=3)

    # s0 and s1 prefill together; then s2 prefills in the same batch as the first decodes.
    logits = batcher.step({s: prompts[s] for s in ("s0", "s1")}, {})
    for s in ("s0", "s1"):
        assert_logits_close(logits[s], hf_last_logits(hf_model, prompts[s]))
    generated = {s: [int(logits[s].argmax())] for s in ("s0", "s1")}
    logits = batcher.step({"s2": prompts["s2"]}, {s: generated[s][-1] for s in ("s0", "s1")})
    assert_logits_close(logits["s2"], hf_last_logits(hf_model, prompts["s2"]))
    generated["s2"] = []
    for s in prompts:
        generated[s].append(int(logits[s].argmax()))
    while any(len(g) < steps for g in generated.values()):
        logits = batcher.step({}, {s: g[-1] for s, g in generated.items() if len(g) < steps})
        for s, row in logits.items():
            generated[s].append(int(row.argmax()))

    gen_config = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=steps, eos_token_id=None, pad_token_id=0
    )
    for s, prompt in prompts.items():
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([prompt]), generation_config=gen_config)
        assert out[0, len(prompt):].tolist() == generated[s], f"greedy tokens differ for {s}"


def test_decode_logits_match_hf(family_models):
    model, hf_model, _ = family_models
    rng = random.Random(1)
    prompt = random_prompt(rng, 7, model.config.vocab_size)
    batcher = PagedBatcher(model, seed=4)
    logits = batcher.step({"a": prompt}, {})["a"]
    tokens = list(prompt)
    for _ in range(3):
        tokens.append(int(logits.argmax()))
        logits = batcher.step({}, {"a": tokens[-1]})["a"]
        assert_logits_close(logits, hf_last_logits(hf_model, tokens))


def test_chunked_prefill_matches_single_shot(family_models):
    model, hf_model, _ = family_models
    prompt = random_prompt(random.Random(2), 11, model.config.vocab_size)
    whole = PagedBatcher(model, seed=5).step({"a": prompt}, {})["a"]
    chunked = PagedBatcher(model, seed=6)
    chunked.step({"a": prompt[:6]}, {})
    in_two = chunked.step({"a": prompt[6:]}, {})["a"]
    torch.testing.assert_close(in_two, whole, rtol=1e-5, atol=1e-5)
    assert_logits_close(in_two, hf_last_logits(hf_model, prompt))


def test_prefix_hit_reuses_cached_blocks(family_models):
    model, hf_model, _ = family_models
    rng = random.Random(3)
    vocab = model.config.vocab_size
    first = random_prompt(rng, 10, vocab)  # blocks 0 and 1 full, block 2 partial
    second = first[:8] + random_prompt(rng, 5, vocab)
    batcher = PagedBatcher(model, seed=7)
    batcher.step({"first": first}, {})
    batcher.share_prefix("second", "first", num_blocks=2)
    hit = batcher.step({"second": second[8:]}, {})["second"]
    cold = PagedBatcher(model, seed=8).step({"second": second}, {})["second"]
    torch.testing.assert_close(hit, cold, rtol=1e-5, atol=1e-5)
    assert_logits_close(hit, hf_last_logits(hf_model, second))


def test_sharded_checkpoint_loads_identically(family_models, tmp_path):
    model, _, path = family_models
    family = model.config.family
    sharded = make_random_checkpoint(tmp_path / "sharded", family=family, seed=1, max_shard_size="40KB")
    assert os.path.isfile(os.path.join(sharded, "model.safetensors.index.json"))
    assert len([f for f in os.listdir(sharded) if f.endswith(".safetensors")]) > 1
    sharded_model, _ = load_model(sharded)
    reference = model.state_dict()
    for name, tensor in sharded_model.state_dict().items():
        assert torch.equal(tensor, reference[name]), name


def test_config_counts_match_hf(family_models):
    model, hf_model, _ = family_models
    config = model.config
    assert config.num_params() == sum(p.numel() for p in hf_model.parameters())
    assert config.num_params() == sum(p.numel() for p in model.parameters())
    assert config.kv_bytes_per_token() == 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    assert config.kv_bytes_per_token("bfloat16") == config.kv_bytes_per_token() // 2


@pytest.mark.parametrize(
    "family, overrides, expect",
    [
        ("llama", dict(attention_bias=True, mlp_bias=True), dict(qkv_bias=True, o_bias=True, mlp_bias=True)),
        # head_dim * num_heads != hidden_size, as in real Qwen3 models.
        ("qwen3", dict(head_dim=32), dict(head_dim=32)),
    ],
)
def test_config_switches_load_and_match_hf(tmp_path, family, overrides, expect):
    path = make_random_checkpoint(tmp_path, family=family, **overrides)
    model, config = load_model(path)
    assert {key: getattr(config, key) for key in expect} == expect
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    prompt = random_prompt(random.Random(4), 6, config.vocab_size)
    assert_logits_close(PagedBatcher(model).step({"a": prompt}, {})["a"], hf_last_logits(hf_model, prompt))


def test_bfloat16_checkpoint_loads_in_config_dtype(tmp_path):
    path = make_random_checkpoint(tmp_path, family="qwen3", dtype="bfloat16")
    model, config = load_model(path)
    assert config.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.rotary.inv_freq.dtype == torch.float32
    model32, config32 = load_model(path, dtype="float32")
    assert config32.dtype == torch.float32 and model32.embed_tokens.weight.dtype == torch.float32


@pytest.mark.parametrize(
    "preset, params, kv_bytes",
    [
        ("qwen3-0.6b", 596_049_920, 28 * 2 * 8 * 128 * 2),
        ("llama-3-8b", 8_030_261_248, 32 * 2 * 8 * 128 * 2),
    ],
)
def test_preset_shapes(preset, params, kv_bytes):
    config = ModelConfig.from_dict({**preset_config(preset).to_dict(), "dtype": "bfloat16"})
    assert config.num_params() == params
    assert config.kv_bytes_per_token() == kv_bytes


def test_old_and_new_rope_keys_parse_alike():
    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)
    base = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=128, vocab_size=512)
    old = ModelConfig.from_dict({**base, "rope_theta": 500000.0, "rope_scaling": scaling})
    new = ModelConfig.from_dict({**base, "rope_parameters": {**scaling, "rope_theta": 500000.0}})
    assert old == new
    assert old.rope.rope_type == "llama3" and old.rope.theta == 500000.0 and old.rope.factor == 8.0
    with pytest.raises(ValueError, match="yarn"):
        ModelConfig.from_dict({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_sliding_window_caps_max_model_len():
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                vocab_size=512, max_position_embeddings=32768, sliding_window=4096)
    mistral = ModelConfig.from_dict({**base, "architectures": ["MistralForCausalLM"]})
    assert mistral.sliding_window == 4096 and mistral.max_model_len == 4096
    qwen2 = ModelConfig.from_dict({**base, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False})
    assert qwen2.sliding_window is None and qwen2.max_model_len == 32768


@pytest.mark.skipif(os.environ.get("KVRL_FORCE_TRITON") == "1", reason="already running on Triton")
def test_model_on_triton_kernels_in_interpreter():
    """The HF-equivalence tests of one family, with every kernel call on Triton (interpreted on CPU).

    ``TRITON_INTERPRET`` must be set before triton is imported, hence the subprocess.
    """
    env = {**os.environ, "TRITON_INTERPRET": "1", "KVRL_FORCE_TRITON": "1"}
    selection = "qwen3 and (batched or chunked or prefix)"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-k", selection],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "3 passed" in result.stdout


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*Qwen3ForCausalLM"):
        load_model(tmp_path)


def test_missing_shard_is_named(tmp_path):
    path = make_random_checkpoint(tmp_path / "ckpt", family="qwen2", max_shard_size="40KB")
    shard = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))[-1]
    os.remove(os.path.join(path, shard))
    with pytest.raises(FileNotFoundError, match=shard):
        load_model(path)


def test_shape_mismatch_is_named(tmp_path):
    path = make_random_checkpoint(tmp_path / "ckpt", family="mistral")
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        raw = json.load(f)
    raw["intermediate_size"] = 96
    with open(config_path, "w") as f:
        json.dump(raw, f)
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight.*\[128, 64\].*\[96, 64\]"):
        load_model(path)


def test_missing_tensor_is_named(tmp_path):
    path = make_random_checkpoint(tmp_path / "ckpt", family="qwen3")
    weights_path = os.path.join(path, "model.safetensors")
    tensors = load_file(weights_path)
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, weights_path, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight"):
        load_model(path)


def test_missing_weights_file(tmp_path):
    path = make_random_checkpoint(tmp_path / "ckpt", family="qwen3")
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(path)
    shutil.rmtree(path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(path)


def test_checkpoint_with_more_layers_than_config_names_the_unused_weights(tmp_path):
    path = make_random_checkpoint(tmp_path / "ckpt", family="qwen3")
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        raw = json.load(f)
    last = raw["num_hidden_layers"] - 1
    raw["num_hidden_layers"] = last                   # config.json describes one layer fewer
    with open(config_path, "w") as f:
        json.dump(raw, f)
    with pytest.raises(CheckpointError, match=rf"not used .*model\.layers\.{last}\."):
        load_model(path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_fail_at_load_naming_the_tensor(tmp_path, bad):
    path = make_random_checkpoint(tmp_path / "ckpt", family="qwen3")
    weights_path = os.path.join(path, "model.safetensors")
    tensors = load_file(weights_path)
    tensors["model.layers.0.self_attn.k_proj.weight"][3, 1] = bad
    save_file(tensors, weights_path, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight.*NaN or infinite"):
        load_model(path)
