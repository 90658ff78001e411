"""Tests of kvrl.workloads: loaders, generators, transforms, configs, CLI (fast, CPU only)."""
from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvrl.engine.request import Request
from kvrl.workloads import (WORKLOADS, ArrivalProcess, LengthDist, TraceFormatError,
                            WorkloadConfigError, build_workload, clip_lengths, default_config,
                            fill_and_squeeze, load_azure_csv, load_burstgpt_csv, load_jsonl,
                            make_offline, multi_tenant, multi_turn, packaged_trace_path,
                            prefix_probe, probe_label, scale_rate, shared_prefix, split_by_time,
                            split_windows, subsample, synthetic, take, time_window, trace_stats,
                            with_default_slos, write_azure_csv, write_burstgpt_csv, write_jsonl,
                            write_mooncake)
from kvrl.workloads import formats
from kvrl.workloads.cli import main as cli_main
from kvrl.workloads.formats import convert
from kvrl.workloads.config import workload_config_path

VOCAB = 32000
SHARED_TRACE = Path("/work/shared/traces/azure_llm_2023_code.csv")
HYP = settings(max_examples=60, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def azure():
    return load_azure_csv(packaged_trace_path("azure_code"), vocab_size=VOCAB)


def same_request(a: Request, b: Request) -> bool:
    return (a.request_id == b.request_id and a.arrival_s == b.arrival_s
            and np.array_equal(a.prompt_token_ids, b.prompt_token_ids)
            and a.prompt_token_ids.dtype == b.prompt_token_ids.dtype
            and a.output_len == b.output_len and a.tenant == b.tenant and a.priority == b.priority
            and a.n == b.n and a.prefix_group == b.prefix_group and a.slo_ttft_s == b.slo_ttft_s
            and a.slo_tpot_s == b.slo_tpot_s and a.cache_salt == b.cache_salt)


def same_workload(a, b) -> bool:
    return len(a) == len(b) and all(same_request(x, y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------- packaged trace
def test_packaged_trace_loads_with_independent_percentiles(azure):
    reqs = load_azure_csv(packaged_trace_path("azure_code"), vocab_size=VOCAB)
    assert len(reqs) == 8819 and reqs.skipped == 0

    with open(packaged_trace_path("azure_code"), newline="") as f:
        rows = list(csv.DictReader(f))
    ctx = np.array([int(r["ContextTokens"]) for r in rows])
    gen = np.array([int(r["GeneratedTokens"]) for r in rows])
    stats = trace_stats(reqs)
    for key, vals in (("prompt_len", ctx), ("output_len", gen)):
        for p in (50, 90, 99):
            assert stats[key][f"p{p}"] == pytest.approx(float(np.percentile(vals, p)), abs=1e-9)
        assert stats[key]["max"] == vals.max()
    # statistics.quantiles(method="inclusive") is the same interpolation
    import statistics
    assert stats["prompt_len"]["p50"] == statistics.median(ctx.tolist())

    # arrivals: seconds since the first row, computed here with datetime (fraction cut to 6 digits)
    def ts(s):
        return dt.datetime.strptime(s[:26], "%Y-%m-%d %H:%M:%S.%f")
    t0 = ts(rows[0]["TIMESTAMP"])
    expect = sorted((ts(r["TIMESTAMP"]) - t0).total_seconds() for r in rows)
    got = [r.arrival_s for r in reqs]
    assert got[0] == 0.0 and np.allclose(got, expect, atol=2e-6)
    assert all(a <= b for a, b in zip(got, got[1:]))
    assert sorted(r.prompt_len for r in reqs) == sorted(ctx.tolist())
    for r in reqs[:50]:
        r.validate()
        assert r.prompt_token_ids.dtype == np.int32
        assert 0 <= r.prompt_token_ids.min() and r.prompt_token_ids.max() < VOCAB


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="no ../shared checkout")
def test_packaged_copy_matches_shared_trace():
    assert Path(packaged_trace_path()).read_bytes() == SHARED_TRACE.read_bytes()
    readme = (Path(packaged_trace_path()).parent / "README.md").read_text()
    assert "CC-BY 4.0" in readme and "Splitwise" in readme


def test_token_fill_is_seeded(azure):
    again = load_azure_csv(packaged_trace_path(), vocab_size=VOCAB)
    assert np.array_equal(again[7].prompt_token_ids, azure[7].prompt_token_ids)
    other = load_azure_csv(packaged_trace_path(), vocab_size=VOCAB, seed=1)
    assert not np.array_equal(other[7].prompt_token_ids, azure[7].prompt_token_ids)
    small = load_azure_csv(packaged_trace_path(), vocab_size=50)
    assert max(int(r.prompt_token_ids.max()) for r in small) < 50


# ----------------------------------------------------------------------------- malformed files
def _write(path: Path, lines) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _azure_lines(n=20):
    return ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"2023-11-16 18:17:{i:02d}.1000000,{100 + i},{10 + i}" for i in range(n)]


def test_azure_bad_row_names_file_line_field(tmp_path):
    lines = _azure_lines()
    lines[16] = "2023-11-16 18:17:15.1000000,115,-3"  # physical line 17
    path = _write(tmp_path / "trace.csv", lines)
    with pytest.raises(TraceFormatError) as e:
        load_azure_csv(path, vocab_size=VOCAB)
    assert str(e.value) == f"{path}:17: field 'GeneratedTokens': expected a non-negative integer, got '-3'"
    assert isinstance(e.value, ValueError) and e.value.line == 17

    ok = load_azure_csv(path, vocab_size=VOCAB, skip_bad_rows=True)
    assert len(ok) == 19 and ok.skipped == 1 and "trace.csv:17" in ok.errors[0]
    assert "azure-000015" not in {r.request_id for r in ok}  # ids keep row positions


@pytest.mark.parametrize("line, field", [
    ("not-a-time,1,2", "TIMESTAMP"),
    ("2023-13-16 18:17:00.0,1,2", "TIMESTAMP"),
    ("2023-11-16 18:17:00.0,abc,2", "ContextTokens"),
    ("2023-11-16 18:17:00.0,1.5,2", "ContextTokens"),
    ("2023-11-16 18:17:00.0,1,", "GeneratedTokens"),
])
def test_azure_field_errors(tmp_path, line, field):
    path = _write(tmp_path / "t.csv", _azure_lines(3) + [line])
    with pytest.raises(TraceFormatError, match=rf"t\.csv:5: field '{field}'"):
        load_azure_csv(path, vocab_size=VOCAB)


def test_azure_structural_errors(tmp_path):
    p = _write(tmp_path / "a.csv", _azure_lines(3) + ["2023-11-16 18:17:00.0,1"])
    with pytest.raises(TraceFormatError, match=r"a\.csv:5: expected 3 comma-separated fields, got 2"):
        load_azure_csv(p, vocab_size=VOCAB)
    p = _write(tmp_path / "b.csv", ["TIMESTAMP,ContextTokens", "2023-11-16 18:17:00.0,1"])
    with pytest.raises(TraceFormatError, match=r"b\.csv:1: missing column 'GeneratedTokens'"):
        load_azure_csv(p, vocab_size=VOCAB)
    (tmp_path / "c.csv").write_text("")
    with pytest.raises(TraceFormatError, match=r"c\.csv: empty file"):
        load_azure_csv(tmp_path / "c.csv", vocab_size=VOCAB)
    lines = [s.encode() for s in _azure_lines(30)]
    lines[25] = b"\xff\xfe," + lines[25]
    (tmp_path / "d.csv").write_bytes(b"\n".join(lines))
    with pytest.raises(TraceFormatError, match=r"d\.csv:26: not valid UTF-8"):
        load_azure_csv(tmp_path / "d.csv", vocab_size=VOCAB)
    assert load_azure_csv(tmp_path / "d.csv", vocab_size=VOCAB, skip_bad_rows=True).skipped == 1


def test_azure_2024_timestamps_with_offset(tmp_path):
    p = _write(tmp_path / "t.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens",
                                    "2024-05-10 00:00:00.009930+00:00,10,2",
                                    "2024-05-10 00:00:01.5+00:00,20,3",
                                    "2024-05-10T02:00:02Z,5,1"])
    reqs = load_azure_csv(p, vocab_size=VOCAB)
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 1.49007, 7202 - 0.00993])


BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def test_burstgpt_failures_filters_and_errors(tmp_path):
    p = _write(tmp_path / "b.csv", [BURST_HEADER,
                                    "5,ChatGPT,472,18,490,Conversation log",
                                    "7,GPT-4,100,0,100,API log",        # failure
                                    "6,GPT-4,300,30,330,API log",
                                    "9,ChatGPT,0,12,12,Conversation log"])
    reqs = load_burstgpt_csv(p, vocab_size=VOCAB)
    assert [r.request_id for r in reqs] == ["burstgpt-000000", "burstgpt-000002", "burstgpt-000003"]
    assert [r.arrival_s for r in reqs] == [0.0, 1.0, 4.0]
    assert reqs.dropped == 1 and reqs[2].prompt_len == 1  # 0 request tokens -> 1
    kept = load_burstgpt_csv(p, vocab_size=VOCAB, drop_failures=False, tenant_from="model")
    assert len(kept) == 4 and {r.tenant for r in kept} == {"ChatGPT", "GPT-4"}
    assert min(r.output_len for r in kept) == 1
    only = load_burstgpt_csv(p, vocab_size=VOCAB, models=["GPT-4"], tenant_from="log_type")
    assert [r.tenant for r in only] == ["API log"]

    bad = _write(tmp_path / "bad.csv", [BURST_HEADER, "5,ChatGPT,472,18,490,Conversation log",
                                        "6,ChatGPT,12,x,1,Conversation log"])
    with pytest.raises(TraceFormatError) as e:
        load_burstgpt_csv(bad, vocab_size=VOCAB)
    assert str(e.value) == f"{bad}:3: field 'Response tokens': expected a non-negative integer, got 'x'"
    assert load_burstgpt_csv(bad, vocab_size=VOCAB, skip_bad_rows=True).skipped == 1
    nan = _write(tmp_path / "nan.csv", [BURST_HEADER, "nan,ChatGPT,1,1,2,Conversation log"])
    with pytest.raises(TraceFormatError, match=r"nan\.csv:2: field 'Timestamp'"):
        load_burstgpt_csv(nan, vocab_size=VOCAB)


def test_jsonl_errors_and_skip(tmp_path):
    good = {"arrival_s": 0.5, "prompt_tokens": [1, 2, 3], "output_len": 4}
    cases = [
        ({"arrival_s": 1.0, "prompt_len": 3, "output_len": 0}, "output_len"),
        ({"arrival_s": -1, "prompt_len": 3, "output_len": 2}, "arrival_s"),
        ({"arrival_s": 1, "prompt_tokens": [1, -2], "output_len": 2}, "prompt_tokens"),
        ({"arrival_s": 1, "prompt_tokens": [], "output_len": 2}, "prompt_tokens"),
        ({"arrival_s": 1, "prompt_tokens": ["a"], "output_len": 2}, "prompt_tokens"),
        ({"arrival_s": 1, "prompt_len": 3}, "output_len"),
        ({"arrival_s": 1, "output_len": 3}, "prompt_tokens"),
        ({"arrival_s": 1, "prompt_len": 3, "output_len": 2, "ouput_len": 2}, "ouput_len"),
        ({"arrival_s": 1, "prompt_len": 3, "output_len": 2, "n": True}, "n"),
        ({"arrival_s": 1, "prompt_len": 3, "output_len": 2, "tenant": 5}, "tenant"),
        ({"arrival_s": 1, "prompt_len": 3, "output_len": 2, "slo_ttft_s": 0}, "slo_ttft_s"),
        ({"arrival_s": 1, "prompt_tokens": [1, 2], "prompt_len": 3, "output_len": 2}, "prompt_len"),
        ({"arrival_s": 1, "prompt_len": 3, "prefix_len": 4, "output_len": 2, "prefix_group": "g"}, "prefix_len"),
        ({"arrival_s": 1, "prompt_tokens": [1, 2], "prefix_len": 3, "output_len": 2}, "prefix_len"),
        ({"arrival_s": 1, "prompt_len": 3, "output_len": 2, "request_id": "a\ud800"}, "request_id"),
        ({"arrival_s": 1, "prompt_len": 3, "output_len": 2, "tenant": "\udfff"}, "tenant"),
    ]
    for i, (obj, field) in enumerate(cases):
        p = tmp_path / f"c{i}.jsonl"
        p.write_text(json.dumps(good) + "\n\n" + json.dumps(obj) + "\n")
        with pytest.raises(TraceFormatError) as e:
            load_jsonl(p, vocab_size=VOCAB)
        assert str(e.value).startswith(f"{p}:3: field '{field}': "), str(e.value)
        ok = load_jsonl(p, vocab_size=VOCAB, skip_bad_rows=True)
        assert len(ok) == 1 and ok.skipped == 1
    p = tmp_path / "syntax.jsonl"
    p.write_text(json.dumps(good) + "\n{not json\n[1]\n" + json.dumps(good) + "\n")
    with pytest.raises(TraceFormatError, match=r"syntax\.jsonl:2: invalid JSON"):
        load_jsonl(p, vocab_size=VOCAB)
    ok = load_jsonl(p, vocab_size=VOCAB, skip_bad_rows=True)
    assert ok.skipped == 2 and [r.request_id for r in ok] == ["req-000000", "req-000003"]
    p = tmp_path / "vocab.jsonl"
    p.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": [5, 99], "output_len": 1}) + "\n")
    with pytest.raises(TraceFormatError, match=r"vocab\.jsonl:1: field 'prompt_tokens': token ids must be in \[0, 49\]"):
        load_jsonl(p, vocab_size=50)


def test_jsonl_duplicate_ids(tmp_path):
    p = tmp_path / "d.jsonl"
    row = {"request_id": "a", "arrival_s": 0, "prompt_len": 2, "output_len": 1}
    p.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(TraceFormatError, match=r"d\.jsonl:2: field 'request_id': duplicate id 'a' \(first on line 1\)"):
        load_jsonl(p, vocab_size=VOCAB)


# ----------------------------------------------------------------------------- round trips
def test_jsonl_round_trip_is_exact(tmp_path, azure):
    reqs = take(azure, 300)
    path = tmp_path / "azure.jsonl"
    assert write_jsonl(reqs, path) == 300
    back = load_jsonl(path, vocab_size=VOCAB)
    assert same_workload(reqs, back)
    # every field survives, not just the azure ones
    rich = with_default_slos(fill_and_squeeze(vocab_size=VOCAB, seed=3)[:50], 0.25, 0.01)
    rich += multi_tenant(default_config("multi_tenant")["tenants"], 10.0, vocab_size=VOCAB)[:50]
    rich.sort(key=lambda r: r.arrival_s)
    write_jsonl(rich, path)
    assert same_workload(rich, load_jsonl(path, vocab_size=VOCAB))


def test_csv_writers_round_trip_lengths_and_times(tmp_path, azure):
    reqs = take(azure, 200)
    write_azure_csv(reqs, tmp_path / "a.csv")
    back = load_azure_csv(tmp_path / "a.csv", vocab_size=VOCAB)
    assert [r.prompt_len for r in back] == [r.prompt_len for r in reqs]
    assert np.allclose([r.arrival_s for r in back], [r.arrival_s for r in reqs], atol=1e-6)
    assert [r.request_id for r in back] == [r.request_id for r in reqs]
    assert all(np.array_equal(a.prompt_token_ids, b.prompt_token_ids) for a, b in zip(back, reqs))
    write_burstgpt_csv(reqs, tmp_path / "b.csv")
    bg = load_burstgpt_csv(tmp_path / "b.csv", vocab_size=VOCAB)
    assert [r.arrival_s for r in bg] == [r.arrival_s for r in reqs]
    assert [r.output_len for r in bg] == [r.output_len for r in reqs]


def test_jsonl_length_only_prefix_groups(tmp_path):
    rows = [{"arrival_s": 0, "prompt_len": 40, "output_len": 1, "prefix_group": "g"},
            {"arrival_s": 1, "prompt_len": 30, "output_len": 1, "prefix_group": "g"},
            {"arrival_s": 2, "prompt_len": 50, "output_len": 1, "prefix_group": "g", "prefix_len": 35},
            {"arrival_s": 3, "prompt_len": 60, "output_len": 1, "prefix_group": "h"},
            {"arrival_s": 4, "prompt_len": 60, "output_len": 1}]
    p = tmp_path / "g.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b, c, d, e = load_jsonl(p, vocab_size=VOCAB)
    assert np.array_equal(a.prompt_token_ids[:30], b.prompt_token_ids)        # min length shared
    assert np.array_equal(c.prompt_token_ids[:30], b.prompt_token_ids)
    assert not np.array_equal(a.prompt_token_ids[30:40], c.prompt_token_ids[30:40])
    assert not np.array_equal(d.prompt_token_ids[:30], a.prompt_token_ids[:30])
    with pytest.raises(ValueError, match="vocab_size"):
        load_jsonl(p)


# ----------------------------------------------------------------------------- generators
GENERATORS = {
    "synthetic": lambda seed: synthetic(300, vocab_size=VOCAB, seed=seed, parallel_n=3,
                                        parallel_prob=0.5),
    "shared_prefix": lambda seed: shared_prefix(300, vocab_size=VOCAB, seed=seed, group_skew=1.0),
    "multi_turn": lambda seed: multi_turn(30, vocab_size=VOCAB, seed=seed, system_prompt_len=32),
    "multi_tenant": lambda seed: multi_tenant(default_config("multi_tenant")["tenants"], 30.0,
                                              vocab_size=VOCAB, seed=seed),
    "fill_and_squeeze": lambda seed: fill_and_squeeze(vocab_size=VOCAB, seed=seed),
    "prefix_probe": lambda seed: prefix_probe(vocab_size=VOCAB, seed=seed),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generators_reproducible_bit_for_bit(name):
    gen = GENERATORS[name]
    a, b, c = gen(7), gen(7), gen(8)
    assert same_workload(a, b)
    arr = lambda w: np.array([r.arrival_s for r in w])  # noqa: E731
    assert arr(a).tobytes() == arr(b).tobytes()
    assert np.concatenate([r.prompt_token_ids for r in a]).tobytes() == \
        np.concatenate([r.prompt_token_ids for r in b]).tobytes()
    assert not same_workload(a, c)
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:]))
    assert len({r.request_id for r in a}) == len(a)
    for r in a:
        r.validate()
        assert r.prompt_token_ids.dtype == np.int32 and r.prompt_token_ids.max() < VOCAB


def test_arrival_processes_statistics():
    rng = np.random.default_rng(0)
    t = ArrivalProcess("poisson", 5.0).times(20000, rng)
    assert t[0] == 0.0 and (len(t) - 1) / t[-1] == pytest.approx(5.0, rel=0.03)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    g = np.diff(ArrivalProcess("gamma", 2.0, cv=3.0).times(40000, rng))
    assert 1 / g.mean() == pytest.approx(2.0, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(3.0, rel=0.1)
    c = ArrivalProcess("constant", 4.0).times(5, rng)
    assert np.allclose(c, [0, 0.25, 0.5, 0.75, 1.0])
    assert not ArrivalProcess("offline").times(10, rng).any()
    u = ArrivalProcess("poisson", 10.0).until(100.0, rng)
    assert u.max() < 100.0 and len(u) == pytest.approx(1000, rel=0.1)
    with pytest.raises(ValueError, match="rate"):
        ArrivalProcess("poisson", 0.0)


def test_length_distributions_statistics():
    rng = np.random.default_rng(1)
    x = LengthDist("lognormal", mean=200, cv=1.0).sample(50000, rng)
    assert x.mean() == pytest.approx(200, rel=0.03) and x.min() >= 1
    y = LengthDist("lognormal", mean=300, sigma=0.5).sample(50000, rng)
    assert y.mean() == pytest.approx(300, rel=0.02)
    assert np.std(np.log(y)) == pytest.approx(0.5, rel=0.05)
    u = LengthDist("uniform", low=3, high=9).sample(10000, rng)
    assert u.min() == 3 and u.max() == 9 and u.mean() == pytest.approx(6, rel=0.03)
    clamp = LengthDist("lognormal", mean=100, cv=2.0, low=10, high=50).sample(1000, rng)
    assert clamp.min() >= 10 and clamp.max() <= 50
    emp = LengthDist("empirical", trace="azure_code", field="output").sample(20000, rng)
    with open(packaged_trace_path()) as f:
        gen = {int(r["GeneratedTokens"]) for r in csv.DictReader(f)}
    assert set(emp.tolist()) <= gen and len(set(emp.tolist())) > 100
    with pytest.raises(ValueError, match="low and high"):
        LengthDist("uniform", low=3)


def test_parallel_sampling_and_slos():
    reqs = synthetic(2000, vocab_size=VOCAB, seed=0, parallel_n=4, parallel_prob=0.3,
                     slo_ttft_s=0.2, slo_tpot_s=0.02)
    ns = np.array([r.n for r in reqs])
    assert set(ns.tolist()) == {1, 4} and (ns == 4).mean() == pytest.approx(0.3, abs=0.04)
    assert all(r.slo_ttft_s == 0.2 and r.slo_tpot_s == 0.02 for r in reqs)
    fixed = synthetic(50, vocab_size=VOCAB, parallel_n=2)
    assert all(r.n == 2 for r in fixed)
    off = synthetic(20, vocab_size=VOCAB, arrival={"process": "offline"})
    assert all(r.arrival_s == 0 for r in off)


def test_shared_prefix_groups_share_prefix_ids():
    reqs = shared_prefix(400, vocab_size=VOCAB, seed=2, num_groups=5, prefix_len=64)
    by_group: dict[str, list[Request]] = {}
    for r in reqs:
        by_group.setdefault(r.prefix_group, []).append(r)
    assert len(by_group) == 5
    prefixes = {}
    for g, rs in by_group.items():
        head = rs[0].prompt_token_ids[:64]
        assert all(np.array_equal(r.prompt_token_ids[:64], head) for r in rs)
        assert all(r.prompt_len > 64 for r in rs)
        suffixes = {r.prompt_token_ids[64:].tobytes() for r in rs}
        assert len(suffixes) == len(rs)  # unique suffixes
        prefixes[g] = head.tobytes()
    assert len(set(prefixes.values())) == 5
    skewed = shared_prefix(4000, vocab_size=VOCAB, num_groups=4, prefix_len=8, group_skew=2.0)
    counts = sorted((sum(r.prefix_group == g for r in skewed) for g in
                     {r.prefix_group for r in skewed}), reverse=True)
    assert counts[0] > 3 * counts[1]


def test_multi_turn_prompts_extend_previous_turns():
    reqs = multi_turn(40, vocab_size=VOCAB, seed=5, min_turns=2, max_turns=5, system_prompt_len=16)
    convs: dict[str, list[Request]] = {}
    for r in reqs:
        convs.setdefault(r.prefix_group, []).append(r)
    assert len(convs) == 40
    systems = set()
    for turns in convs.values():
        turns.sort(key=lambda r: r.request_id)
        assert 2 <= len(turns) <= 5
        systems.add(turns[0].prompt_token_ids[:16].tobytes())
        for prev, cur in zip(turns, turns[1:]):
            assert cur.arrival_s >= prev.arrival_s
            assert cur.prompt_len > prev.prompt_len + prev.output_len
            assert np.array_equal(cur.prompt_token_ids[:prev.prompt_len], prev.prompt_token_ids)
    assert len(systems) == 1
    capped = multi_turn(40, vocab_size=VOCAB, seed=5, max_turns=8, max_total_len=600)
    assert all(r.prompt_len + r.output_len <= 600 for r in capped)


def test_multi_tenant_streams():
    tenants = default_config("multi_tenant")["tenants"]
    reqs = multi_tenant(tenants, 200.0, vocab_size=VOCAB, seed=1)
    by = {t["name"]: [r for r in reqs if r.tenant == t["name"]] for t in tenants}
    assert len(by["interactive"]) / 200 == pytest.approx(4.0, rel=0.1)
    assert len(by["batch"]) / 200 == pytest.approx(1.0, rel=0.2)
    assert all(r.priority == 1 for r in by["batch"]) and all(r.slo_ttft_s == 0.5 for r in by["interactive"])
    assert np.mean([r.prompt_len for r in by["batch"]]) > 4 * np.mean([r.prompt_len for r in by["interactive"]])
    assert len({r.prompt_token_ids[:256].tobytes() for r in by["bursty"]}) == 1
    # editing one tenant leaves the others untouched
    tenants2 = json.loads(json.dumps(tenants))
    tenants2[1]["arrival"]["rate"] = 3.0
    again = multi_tenant(tenants2, 200.0, vocab_size=VOCAB, seed=1)
    assert same_workload(by["interactive"], [r for r in again if r.tenant == "interactive"])


def test_multi_tenant_rate_phases_shift_the_mix():
    """Two tenants in antiphase (rates x1.8 / x0.2 for 5 s each, swapped): each phase's arrivals
    are dominated by one tenant, at its phased rate; a tenant without phases is unchanged; bad
    phases are a clear error; the adversarial workloads' tenants take phases too."""
    a = {"name": "a", "arrival": {"rate": 10.0}, "rate_phases": [1.8, 0.2], "phase_s": 5.0}
    b = {"name": "b", "arrival": {"rate": 10.0}, "rate_phases": [0.2, 1.8], "phase_s": 5.0}
    reqs = multi_tenant([a, b], 400.0, vocab_size=VOCAB, seed=3)
    phase = np.array([int(r.arrival_s // 5.0) % 2 for r in reqs])
    is_a = np.array([r.tenant == "a" for r in reqs])
    assert is_a[phase == 0].mean() == pytest.approx(0.9, abs=0.03)
    assert is_a[phase == 1].mean() == pytest.approx(0.1, abs=0.03)
    assert (phase == 0)[is_a].sum() / 200.0 == pytest.approx(18.0, rel=0.1)   # a's rate in its busy phases
    assert max(r.arrival_s for r in reqs) < 400.0 and len(reqs) / 400.0 == pytest.approx(20.0, rel=0.05)
    plain = multi_tenant([{**a, "rate_phases": None}], 100.0, vocab_size=VOCAB, seed=3)
    assert same_workload(plain, multi_tenant([{"name": "a", "arrival": {"rate": 10.0}}], 100.0, vocab_size=VOCAB, seed=3))
    with pytest.raises(ValueError, match="rate_phases must be a non-empty list"):
        multi_tenant([{**a, "rate_phases": [1.0, 0.0]}], 10.0, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="phase_s must be"):
        multi_tenant([{**a, "phase_s": 0.0}], 10.0, vocab_size=VOCAB)
    reqs = fill_and_squeeze(vocab_size=VOCAB, seed=0, benign={"name": "benign", "arrival": {"rate": 4.0},
                                                             "rate_phases": [2.0, 0.0001], "phase_s": 10.0})
    benign = np.array([r.arrival_s for r in reqs if r.tenant == "benign"])
    assert (benign // 10.0 % 2 == 1).sum() <= 1 < (benign // 10.0 % 2 == 0).sum()


def test_fill_and_squeeze_phases():
    reqs = fill_and_squeeze(vocab_size=VOCAB, seed=0, max_model_len=2048, flood_output_len=100)
    phase = lambda p: [r for r in reqs if f"attacker-{p}-" in r.request_id]  # noqa: E731
    probes, flood, squeeze = phase("probe"), phase("flood"), phase("squeeze")
    assert (len(probes), len(flood), len(squeeze)) == (8, 32, 200)
    assert max(r.arrival_s for r in probes) < min(r.arrival_s for r in flood)
    assert max(r.arrival_s for r in flood) < min(r.arrival_s for r in squeeze)
    assert all(r.prompt_len + r.output_len == 2048 for r in flood)
    assert all(r.prompt_len == 8 and r.output_len == 8 for r in squeeze)
    assert {r.tenant for r in reqs} == {"benign", "attacker"}
    assert min(r.arrival_s for r in probes) == 20.0


def test_prefix_probe_labels():
    reqs = prefix_probe(vocab_size=VOCAB, seed=4, num_probes=30, correct_fraction=0.4)
    victim = [r for r in reqs if r.tenant == "victim"]
    system = victim[0].prompt_token_ids[:512]
    assert all(np.array_equal(r.prompt_token_ids[:512], system) for r in victim)
    probes = [r for r in reqs if r.tenant == "attacker"]
    labels = [probe_label(r) for r in probes]
    assert labels.count(True) == 12 and labels.count(False) == 18
    assert all(probe_label(r) is None for r in victim)
    for r, ok in zip(probes, labels):
        assert np.array_equal(r.prompt_token_ids[:512], system) == ok
        assert r.prompt_len == 513 and r.output_len == 1
        assert (r.prefix_group == "victim-system") == ok
    near = prefix_probe(vocab_size=VOCAB, seed=4, wrong_mode="perturb_last", probe_len=64)
    for r in near:
        if probe_label(r) is False:
            assert np.array_equal(r.prompt_token_ids[:63], system[:63])
            assert r.prompt_token_ids[63] != system[63]


# ----------------------------------------------------------------------------- transforms
def test_transforms(azure):
    reqs = take(azure, 1000)
    fast = scale_rate(reqs, 2.0)
    assert [r.arrival_s for r in fast] == [r.arrival_s / 2.0 for r in reqs]
    with pytest.raises(ValueError, match="workload.rate_scale=.* keeps arrival times finite"):
        scale_rate(reqs, 2.2250738585e-313)     # a denormal factor: arrivals overflow (found by test_fuzz)
    win = time_window(reqs, 200.0, 50.0)
    assert win and all(0 <= r.arrival_s < 50.0 for r in win)
    assert len(win) == sum(200.0 <= r.arrival_s < 250.0 for r in reqs)
    sub = subsample(reqs, 0.25, seed=1)
    assert len(sub) == 250 and sub == subsample(reqs, 0.25, seed=1) != subsample(reqs, 0.25, seed=2)
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(sub, sub[1:]))
    clipped = clip_lengths(reqs, 1024)
    assert len(clipped) == len(reqs) and all(r.prompt_len + r.output_len <= 1024 for r in clipped)
    long = [(a, b) for a, b in zip(reqs, clipped) if a.prompt_len >= 1024]
    assert long and all(np.array_equal(b.prompt_token_ids, a.prompt_token_ids[:1023]) and
                        b.output_len == 1 for a, b in long)
    dropped = clip_lengths(reqs, 1024, drop=True)
    assert len(dropped) == sum(r.prompt_len + r.output_len <= 1024 for r in reqs)
    assert all(r.arrival_s == 0 for r in make_offline(reqs))
    assert reqs[5].arrival_s > 0  # inputs are not modified


def test_splits_are_disjoint_contiguous_windows(azure):
    parts = split_by_time(azure, rebase=False)
    windows = split_windows(azure)
    assert windows["train"][0] == 0.0 and windows["test"][1] == azure[-1].arrival_s
    assert windows["train"][1] == windows["val"][0] and windows["val"][1] == windows["test"][0]
    span = azure[-1].arrival_s
    assert windows["train"][1] == pytest.approx(0.6 * span) and windows["val"][1] == pytest.approx(0.8 * span)
    ids = {k: [r.request_id for r in v] for k, v in parts.items()}
    assert sum(map(len, ids.values())) == len(azure)
    assert set().union(*map(set, ids.values())) == {r.request_id for r in azure}
    for k, (lo, hi) in windows.items():
        assert all(lo <= r.arrival_s <= hi for r in parts[k])
        assert all(r.arrival_s < hi for r in parts[k]) or k == "test"
    assert max(r.arrival_s for r in parts["train"]) < min(r.arrival_s for r in parts["val"])
    assert max(r.arrival_s for r in parts["val"]) < min(r.arrival_s for r in parts["test"])
    # through build_workload: re-based, and the same request sets
    built = {s: build_workload({"name": "azure_code", "split": s}, vocab_size=VOCAB)
             for s in ("train", "val", "test")}
    for s in built:
        assert [r.request_id for r in built[s]] == ids[s]
        start = windows[s][0]
        assert np.allclose([r.arrival_s for r in built[s]], [r.arrival_s - start for r in parts[s]])
        assert built[s][0].arrival_s >= 0
    other = build_workload({"name": "azure_code", "split": "train",
                            "split_fractions": [0.5, 0.25, 0.25]}, vocab_size=VOCAB)
    assert len(other) < len(built["train"])
    # offline traces have no span: split by position
    off = split_by_time(make_offline(take(azure, 100)))
    assert [len(v) for v in off.values()] == [60, 20, 20]


# ----------------------------------------------------------------------------- configs
def test_build_workload_common_keys(azure):
    reqs = build_workload({"name": "azure_code", "max_requests": 2000, "rate_scale": 2.0,
                           "slo_ttft_s": 1.0}, vocab_size=VOCAB, max_model_len=4096)
    assert len(reqs) == 2000
    assert reqs[-1].arrival_s == pytest.approx(azure[1999].arrival_s / 2.0)
    # overlong=reject (the default): over-long requests reach the engine unchanged, and are counted
    assert [r.prompt_len for r in reqs] == [r.prompt_len for r in azure[:2000]]
    assert reqs.overlong == sum(r.prompt_len + r.output_len > 4096 for r in azure[:2000]) == 277
    assert reqs.clipped == 0 and reqs.dropped == [] and not any(r.clipped for r in reqs)
    assert all(r.slo_ttft_s == 1.0 and r.slo_tpot_s is None for r in reqs)
    off = build_workload({"name": "synthetic", "offline": True, "num_requests": 10}, vocab_size=VOCAB)
    assert len(off) == 10 and all(r.arrival_s == 0 for r in off)
    win = build_workload({"name": "azure_code", "start_s": 200, "duration_s": 30}, vocab_size=VOCAB)
    assert all(0 <= r.arrival_s < 30 for r in win)
    sub = build_workload({"name": "azure_code", "subsample": 0.1}, vocab_size=VOCAB)
    assert len(sub) == 882
    drop = build_workload({"name": "azure_code", "overlong": "drop"}, vocab_size=VOCAB,
                          max_model_len=2048)
    assert len(drop) == sum(r.prompt_len + r.output_len <= 2048 for r in azure)


def test_overlong_requests_are_rejected_clipped_or_dropped_never_silently(azure, caplog):
    """engine.max_model_len=256 on azure_code: 1,682 of the first 2,000 requests are too long."""
    cfg = {"name": "azure_code", "max_requests": 2000}
    long = [r for r in azure[:2000] if r.prompt_len + r.output_len > 256]
    assert len(long) == 1682
    with caplog.at_level("INFO", logger="kvrl.workloads.config"):
        kept = build_workload(cfg, vocab_size=VOCAB, max_model_len=256)
    assert "max_requests=2000 keeps the first 2000 of 8819 requests" in caplog.text
    assert "1682 of 2000 requests exceed max_model_len=256" in caplog.text and "overlong=reject" in caplog.text
    assert len(kept) == 2000 and kept.overlong == 1682 and kept.clipped == 0 and kept.truncated == 6819
    caplog.clear()
    with caplog.at_level("WARNING", logger="kvrl.workloads.config"):
        clipped = build_workload({**cfg, "overlong": "clip"}, vocab_size=VOCAB, max_model_len=256)
    assert "overlong=clip clipped 1682 of 2000 requests" in caplog.text
    assert clipped.clipped == 1682 and clipped.overlong == 0 and clipped.dropped == []
    first = next(r for r in clipped if r.request_id == long[0].request_id)
    assert first.clipped == f"prompt {long[0].prompt_len}->255, output {long[0].output_len}->1"
    assert sum(1 for r in clipped if r.clipped) == 1682
    caplog.clear()
    with caplog.at_level("WARNING", logger="kvrl.workloads.config"):
        dropped = build_workload({**cfg, "overlong": "drop"}, vocab_size=VOCAB, max_model_len=256)
    assert "overlong=drop dropped 1682 of 2000 requests" in caplog.text
    assert len(dropped) == 318 and [rid for rid, _ in dropped.dropped] == [r.request_id for r in long]
    assert dropped.dropped[0][1] == (f"prompt ({long[0].prompt_len}) + output ({long[0].output_len}) tokens "
                                     f"exceed max_model_len=256 (workload.overlong=drop)")


def test_build_workload_rejects_bad_configs(tmp_path):
    def err(cfg, match):
        with pytest.raises(ValueError, match=match):
            build_workload(cfg, vocab_size=VOCAB)
    err({"name": "synthetic", "num_request": 5}, r"unknown key 'num_request'")
    err({"name": "synthetic", "prompt_len": {"dist": "uniform", "lo": 1}}, r"unknown key 'prompt_len\.lo'")
    err({"name": "synthetic", "num_requests": "5"}, r"key 'num_requests' expects an integer")
    err({"name": "synthetic", "num_requests": True}, r"key 'num_requests'")
    err({"name": "synthetic", "rate_scale": 0}, r"key 'rate_scale' expects a number > 0")
    err({"name": "synthetic", "split": "training"}, r"key 'split'")
    err({"name": "synthetic", "split_fractions": [0.5, 0.5]}, r"key 'split_fractions'")
    err({"name": "synthetic", "split_fractions": [0.5, 0.4, 0.4]}, r"'split_fractions' must sum to 1")
    err({"name": "synthetic", "prompt_len": {"dist": "uniform", "high": None}}, r"key 'prompt_len': uniform lengths need low and high")
    err({"name": "synthetic", "arrival": {"process": "poisson", "rate": None}}, r"key 'arrival': arrival rate")
    err({"name": "multi_tenant", "tenants": [{"name": "a", "colour": 1}]}, r"unknown key 'tenants\.0\.colour'")
    err({"name": "nope"}, r"key 'name' must be one of")
    err({"num_requests": 3}, r"key 'name' is required")
    err({"name": "azure_csv"}, r"key 'path' is required")
    err({"name": "jsonl", "path": str(tmp_path / "missing.jsonl")}, r"missing\.jsonl: cannot open")
    err({"name": "azure_code", "max_requests": 0}, r"no requests")
    with pytest.raises(WorkloadConfigError):
        build_workload({"name": "synthetic", "seed": -1}, vocab_size=VOCAB)


def test_yaml_configs_hold_every_key_with_comments():
    from omegaconf import OmegaConf
    for name in WORKLOADS:
        path = workload_config_path(name)
        cfg = OmegaConf.to_container(OmegaConf.load(path))
        assert cfg.pop("defaults") == [f"/workload_schema/{name}@_here_", "_self_"], name
        assert cfg == default_config(name), name
        for line in Path(path).read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                assert " # " in line, f"{name}: no comment on {line!r}"


def test_every_yaml_builds_through_omegaconf(tmp_path, azure):
    from omegaconf import OmegaConf
    write_jsonl(take(azure, 20), tmp_path / "t.jsonl", tokens=False)
    write_burstgpt_csv(take(azure, 20), tmp_path / "t.csv")
    write_mooncake(take(azure, 20), tmp_path / "m.jsonl")
    paths = {"azure_csv": packaged_trace_path(), "jsonl": str(tmp_path / "t.jsonl"),
             "burstgpt": str(tmp_path / "t.csv"), "mooncake": str(tmp_path / "m.jsonl")}
    for name in WORKLOADS:
        cfg = OmegaConf.load(workload_config_path(name))
        cfg.pop("defaults")                    # Hydra's schema line
        cfg.max_requests = 300
        cfg.overlong = "clip"
        if name in paths:
            cfg.path = paths[name]
        reqs = build_workload(cfg, vocab_size=VOCAB, max_model_len=4096)
        assert 0 < len(reqs) <= 300, name
        assert all(r.prompt_len + r.output_len <= 4096 for r in reqs)
        again = build_workload(cfg, vocab_size=VOCAB, max_model_len=4096)
        assert same_workload(reqs, again), name


# ----------------------------------------------------------------------------- CLI
def test_cli_stats_and_convert(tmp_path, capsys, azure):
    png = tmp_path / "a.png"
    assert cli_main(["stats", packaged_trace_path(), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "requests         8819" in out and "p99" in out and "inter-arrival CV" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out_jsonl = tmp_path / "a.jsonl"
    assert cli_main(["convert", packaged_trace_path(), str(out_jsonl), "--from", "azure",
                     "--to", "jsonl", "--no-tokens"]) == 0
    back = load_jsonl(out_jsonl, vocab_size=VOCAB)
    assert [(r.request_id, r.arrival_s, r.prompt_len, r.output_len) for r in back] == \
        [(r.request_id, r.arrival_s, r.prompt_len, r.output_len) for r in azure]
    assert cli_main(["stats", "fill_and_squeeze", "--set", "probe_count=2", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["tenants"]["attacker"] == 2 + 32 + 200
    assert cli_main(["stats", str(tmp_path / "nope.csv"), "--format", "azure"]) == 2
    assert "nope.csv" in capsys.readouterr().err
    assert cli_main(["stats", "synthetic", "--set", "bogus=1"]) == 2
    assert "unknown key 'bogus'" in capsys.readouterr().err


def test_convert_refuses_to_overwrite_its_input(tmp_path, capsys, azure):
    src = tmp_path / "a.jsonl"
    write_jsonl(take(azure, 5), src, tokens=False)
    before = src.read_bytes()
    assert cli_main(["convert", str(src), str(src)]) == 2
    assert "is the input file" in capsys.readouterr().err
    assert cli_main(["convert", str(src), str(tmp_path / "." / "a.jsonl"), "--to", "azure"]) == 2
    assert src.read_bytes() == before
    with pytest.raises(ValueError, match="is the input file"):
        convert(src, src)


def test_convert_is_atomic_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch, azure):
    src, dst = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_jsonl(take(azure, 5), src, tokens=False)
    dst.write_text("the old file\n")

    def full_disk(requests, path, tokens=True):
        with open(path, "w") as f:
            f.write('{"arrival_s": 0, "prompt_len"')          # half a line, then the disk is full
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(formats, "write_jsonl", full_disk)
    assert cli_main(["convert", str(src), str(dst)]) == 2
    assert dst.read_text() == "the old file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]    # no temp file left


# ----------------------------------------------------------------------------- fuzzing
FIELD_TEXT = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["", " ", "2023-11-16 18:17:03.9799600", "2023-02-30 00:00:00", "1e9", "-0",
                     "0", "١٢", "1_000", "\x00", '"', "a,b", "\n", "9" * 30]),
    st.text(max_size=8),
)
ROWS = st.lists(st.lists(FIELD_TEXT, min_size=0, max_size=7), max_size=8)


def _fuzz_csv(path: Path, header: str, rows, loader, **kw):
    with open(path, "w", newline="", encoding="utf-8", errors="surrogatepass") as f:
        f.write(header + "\n")
        w = csv.writer(f)
        for row in rows:
            w.writerow(row)
    for skip in (False, True):
        try:
            reqs = loader(path, vocab_size=100, skip_bad_rows=skip, **kw)
        except TraceFormatError as e:
            assert str(e).startswith(str(path))
            assert not skip or e.line in (None, 1) or "malformed CSV" in str(e)
        else:
            for r in reqs:
                r.validate()
            assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))


@HYP
@given(rows=ROWS)
def test_fuzz_azure_csv(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("fz") / "f.csv"
    _fuzz_csv(path, "TIMESTAMP,ContextTokens,GeneratedTokens", rows, load_azure_csv)


@HYP
@given(rows=ROWS)
def test_fuzz_burstgpt_csv(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("fz") / "f.csv"
    _fuzz_csv(path, BURST_HEADER, rows, load_burstgpt_csv)


JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(), st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8)
JSON_OBJ = st.fixed_dictionaries(
    {}, optional={k: JSON_VALUE for k in ("arrival_s", "prompt_tokens", "prompt_len", "output_len",
                                          "n", "tenant", "priority", "prefix_group", "prefix_len",
                                          "slo_ttft_s", "request_id", "extra")})


@HYP
@given(lines=st.lists(st.one_of(JSON_OBJ.map(json.dumps), st.text(max_size=20),
                                st.sampled_from(['{"arrival_s": 0, "prompt_len": 2, "output_len": 1}',
                                                 "[[[[", "NaN", '{"arrival_s": 1e999}'])),
                      max_size=6))
def test_fuzz_jsonl(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("fz") / "f.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    for skip in (False, True):
        try:
            reqs = load_jsonl(path, vocab_size=1000, skip_bad_rows=skip)
        except TraceFormatError as e:
            assert str(e).startswith(str(path)) and not skip
        else:
            for r in reqs:
                r.validate()


@HYP
@given(data=st.binary(max_size=200))
def test_fuzz_raw_bytes(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("fz")
    for name, loader, header in (("a.csv", load_azure_csv, b"TIMESTAMP,ContextTokens,GeneratedTokens\n"),
                                 ("b.csv", load_burstgpt_csv, BURST_HEADER.encode() + b"\n"),
                                 ("c.jsonl", load_jsonl, b"")):
        p = d / name
        p.write_bytes(header + data)
        try:
            loader(p, vocab_size=1000, skip_bad_rows=bool(len(data) % 2))
        except TraceFormatError as e:
            assert str(e).startswith(str(p))
