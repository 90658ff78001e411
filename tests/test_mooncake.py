"""The Mooncake trace format (kvrl.workloads.mooncake): prompts rebuilt from block hash ids share
exactly the prefixes the ids record, scaling keeps that structure, bad lines are named, the format
is detected, written and read back, and a served trace hits the prefix cache where it reuses."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from kvrl.workloads import TraceFormatError, build_workload, default_config, detect_format, load_trace
from kvrl.workloads.cli import main as cli_main
from kvrl.workloads.mooncake import load_mooncake, read_mooncake, write_mooncake
from kvrl.workloads.stats import prefix_reuse
from kvrl.workloads.tokens import prefix_block_ids

sys.path.insert(0, str(Path(__file__).parent))
from helpers import make_engine  # noqa: E402

VOCAB = 151936


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


@pytest.fixture
def trace(tmp_path):
    return _write(tmp_path / "t.jsonl", [
        {"timestamp": 2000, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 500, "input_length": 1300, "output_length": 20, "hash_ids": [0, 1, 2]},
        {"timestamp": 3000, "input_length": 700, "output_length": 30, "hash_ids": [0, 3]},
        {"timestamp": 3000, "input_length": 900, "output_length": 40, "hash_ids": [0, 3], "chat_id": 7},
        {"timestamp": 4000, "input_length": 600, "output_length": 5, "hash_ids": [4]},
    ])


def test_prompts_share_exactly_the_blocks_their_hash_ids_share(trace):
    reqs = load_mooncake(trace, vocab_size=VOCAB)
    assert [r.request_id for r in reqs] == [f"mooncake-00000{i}" for i in (1, 0, 2, 3, 4)]
    assert [r.arrival_s for r in reqs] == [0.0, 1.5, 2.5, 2.5, 3.5]  # ms, re-based to the first
    assert [r.prompt_len for r in reqs] == [1300, 1024, 700, 900, 600]
    assert [r.output_len for r in reqs] == [20, 10, 30, 40, 5]
    by = {r.request_id[-1]: r.prompt_token_ids for r in reqs}
    assert _common_prefix(by["0"], by["1"]) == 1024          # blocks 0, 1 shared; 2 is new
    assert _common_prefix(by["0"], by["2"]) == 512           # block 0 only
    assert _common_prefix(by["2"], by["3"]) == 700           # a partial block 3 is block 3's start
    assert _common_prefix(by["0"], by["4"]) < 5              # nothing shared (chance agreement only)
    assert max(r.prompt_token_ids.max() for r in reqs) < VOCAB
    again = load_mooncake(trace, vocab_size=VOCAB)
    assert all(np.array_equal(a.prompt_token_ids, b.prompt_token_ids) for a, b in zip(reqs, again))
    other = load_mooncake(trace, vocab_size=VOCAB, seed=1)
    assert not np.array_equal(reqs[0].prompt_token_ids, other[0].prompt_token_ids)


def test_scaling_keeps_the_block_structure(trace):
    reqs = load_mooncake(trace, vocab_size=VOCAB, prompt_scale=1 / 16, output_scale=0.5)
    by = {r.request_id[-1]: r for r in reqs}
    assert [by[k].prompt_len for k in "01234"] == [64, 81, 44, 56, 38]
    assert [by[k].output_len for k in "01234"] == [5, 10, 15, 20, 2]
    assert _common_prefix(by["0"].prompt_token_ids, by["1"].prompt_token_ids) == 64   # 2 blocks of 32
    assert _common_prefix(by["0"].prompt_token_ids, by["2"].prompt_token_ids) == 32
    assert read_mooncake(trace, prompt_scale=1 / 16).block_tokens == 32


def test_tokens_past_the_recorded_blocks_are_the_requests_own(tmp_path):
    p = _write(tmp_path / "few.jsonl", [
        {"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [5]},
        {"timestamp": 1, "input_length": 100, "output_length": 1, "hash_ids": [5]},
        {"timestamp": 2, "input_length": 30, "output_length": 1}])
    a, b, c = load_mooncake(p, vocab_size=VOCAB, block_tokens=64)
    assert _common_prefix(a.prompt_token_ids, b.prompt_token_ids) in range(64, 66)
    assert c.prompt_len == 30


@pytest.mark.parametrize("row, field, message", [
    ({"input_length": 10, "output_length": 1}, "timestamp", "missing"),
    ({"timestamp": -1, "input_length": 10, "output_length": 1}, "timestamp", "finite number >= 0"),
    ({"timestamp": 0, "input_length": 0, "output_length": 1}, "input_length", "integer in [1"),
    ({"timestamp": 0, "input_length": 10, "output_length": 2.5}, "output_length", "integer in [1"),
    ({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, -2]}, "hash_ids", "integers"),
    ({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [True]}, "hash_ids", "integers"),
    ({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_id": [1]}, "hash_id", "unknown field"),
    ({"timestamp": 0, "text_input": "hi", "output_length": 1}, "text_input", "tokenizer"),
    ({"timestamp": 0, "input_length": 1600, "output_length": 1, "hash_ids": list(range(100))}, "hash_ids",
     "100 blocks of 512 tokens for an input of 1600 tokens (about 16 tokens a block)"),
])
def test_a_bad_line_is_named_and_can_be_skipped(tmp_path, row, field, message):
    p = _write(tmp_path / "bad.jsonl", [{"timestamp": 0, "input_length": 3, "output_length": 1}, row])
    with pytest.raises(TraceFormatError) as e:
        load_mooncake(p, vocab_size=VOCAB)
    assert f"bad.jsonl:2: field '{field}'" in str(e.value) and message in str(e.value)
    kept = load_mooncake(p, vocab_size=VOCAB, skip_bad_rows=True)
    assert len(kept) == 1 and kept.skipped == 1 and message in kept.errors[0]


def test_bad_options_and_lines_that_are_not_objects(tmp_path):
    p = _write(tmp_path / "t.jsonl", ["[1, 2]", "", "{nope"])
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:1: expected a JSON object"):
        load_mooncake(p, vocab_size=VOCAB)
    kept = load_mooncake(p, vocab_size=VOCAB, skip_bad_rows=True)
    assert (len(kept), kept.skipped) == (0, 2)   # the blank line is not a row
    for kw in ({"time_unit": "us"}, {"block_tokens": 0}, {"prompt_scale": 0.0}, {"output_scale": float("nan")}):
        with pytest.raises(ValueError):
            load_mooncake(p, vocab_size=VOCAB, **kw)
    with pytest.raises(TraceFormatError, match="cannot open"):
        load_mooncake(tmp_path / "missing.jsonl", vocab_size=VOCAB)


def test_seconds_and_the_block_size_of_another_trace(tmp_path):
    p = _write(tmp_path / "qwen.jsonl", [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 61.5, "input_length": 40, "output_length": 3,
         "type": "text", "turn": 1, "hash_ids": [10, 11, 12]},
        {"chat_id": 2, "parent_chat_id": 1, "timestamp": 62.0, "input_length": 50, "output_length": 3,
         "type": "text", "turn": 2, "hash_ids": [10, 11, 12, 13]}])
    a, b = load_mooncake(p, vocab_size=VOCAB, block_tokens=16, time_unit="s")
    assert (a.arrival_s, b.arrival_s) == (0.0, 0.5)
    assert _common_prefix(a.prompt_token_ids, b.prompt_token_ids) == 40


def test_detected_and_told_apart_from_kvrl_jsonl(trace, tmp_path):
    assert detect_format(trace) == "mooncake"
    plain = _write(tmp_path / "k.jsonl", ["", {"arrival_s": 0, "prompt_len": 4, "output_len": 1}])
    assert detect_format(plain) == "jsonl"
    noext = _write(tmp_path / "trace.txt", [{"timestamp": 0, "input_length": 4, "output_length": 1}])
    assert detect_format(noext) == "mooncake"
    assert len(load_trace(trace, vocab_size=VOCAB, prompt_scale=0.5)) == 5
    with pytest.raises(ValueError, match="do not apply to the mooncake format"):
        load_trace(trace, vocab_size=VOCAB, tenant_from="model")
    with pytest.raises(ValueError, match="do not apply to the jsonl format"):
        load_trace(plain, vocab_size=VOCAB, prompt_scale=0.5)


def test_written_and_read_back_with_the_same_reuse(trace, tmp_path):
    reqs = load_mooncake(trace, vocab_size=VOCAB)
    out = tmp_path / "out.jsonl"
    assert write_mooncake(reqs, out) == 5
    back = load_mooncake(out, vocab_size=VOCAB, seed=3)
    assert [r.prompt_len for r in back] == [r.prompt_len for r in reqs]
    assert [r.output_len for r in back] == [r.output_len for r in reqs]
    assert [r.arrival_s for r in back] == pytest.approx([r.arrival_s for r in reqs])
    # Renumbered in order of first appearance. A writer sees tokens, not the file's ids: the two
    # prompts that hold the file's block 3 hold 188 and 388 of its tokens, two different last
    # blocks; the 88 tokens past the one recorded block of the last line are a block of their own.
    assert prefix_block_ids(back, 512) == prefix_block_ids(reqs, 512) == [[0, 1, 2], [0, 1], [0, 3], [0, 4], [5, 6]]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0] == {"timestamp": 0.0, "input_length": 1300, "output_length": 20, "hash_ids": [0, 1, 2]}


def test_kvrl_trace_converts_to_mooncake(tmp_path, capsys):
    src = _write(tmp_path / "k.jsonl", [{"arrival_s": 0.25, "prompt_len": 600, "output_len": 2,
                                         "prefix_group": "g", "prefix_len": 512},
                                        {"arrival_s": 0.5, "prompt_len": 530, "output_len": 2,
                                         "prefix_group": "g", "prefix_len": 512}])
    out = tmp_path / "m.jsonl"
    assert cli_main(["convert", str(src), str(out), "--to", "mooncake"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["hash_ids"] for r in rows] == [[0, 1], [0, 2]]
    assert [r["timestamp"] for r in rows] == [250.0, 500.0]
    assert cli_main(["stats", str(out)]) == 0 and "2" in capsys.readouterr().out


def test_the_workload_config_and_the_prefix_cache_see_the_reuse(trace):
    cfg = default_config("mooncake")
    cfg.update(path=str(trace), prompt_scale=1 / 16)
    reqs = build_workload(cfg, vocab_size=VOCAB)
    assert [r.prompt_len for r in reqs] == [81, 64, 44, 56, 38]
    engine = make_engine(num_blocks=400, block_size=16)
    engine.run(reqs)
    # In arrival order, with hash blocks of 32 tokens over engine blocks of 16: request 0 shares
    # all 64 tokens with request 1 (48 hit: the last block is computed), request 2 hash block 0
    # (32), request 3 request 2's 44 tokens, of which 2 full engine blocks (32), request 4 nothing.
    assert (engine.metrics.prompt_tokens_hit, engine.metrics.prompt_tokens_looked_up) == (48 + 32 + 32, 283)
    cfg.update(block_tokens=2048)       # the lines then hold more blocks than tokens: named, not guessed
    with pytest.raises(TraceFormatError, match="tokens a block"):
        build_workload(cfg, vocab_size=VOCAB)


def test_trace_stats_count_the_prefix_reuse_the_ids_record(trace):
    reqs = load_mooncake(trace, vocab_size=VOCAB, prompt_scale=1 / 16)
    # full 16-token blocks also held by another prompt: request 0's 4 (request 1 holds them), request 2's 2
    # and request 3's first 2 (hash block 0); request 3's third block (tokens 32-47) is full in it alone
    assert prefix_reuse(reqs) == pytest.approx(16 * (4 + 2 + 2) / 283)
    assert prefix_reuse(reqs, block=32) == pytest.approx(32 * (2 + 1 + 1) / 283)
    apart = [dataclasses.replace(r, tenant=f"t{i}") for i, r in enumerate(reqs)]
    assert prefix_reuse(apart) == 0.0                 # tenant scope: no one else's blocks
    salted = [dataclasses.replace(r, cache_salt="s" if i % 2 else None) for i, r in enumerate(reqs)]
    assert 0 < prefix_reuse(salted) < prefix_reuse(reqs)
    assert prefix_reuse([]) == 0.0
