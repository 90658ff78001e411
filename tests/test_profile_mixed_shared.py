"""Fit version 10 (issue 16): the price of a shared KV token in a step that also prefills
(``mixed_shared``), old profiles pricing as before, profiles pooled from several re-profiles of the
same code, and the "every target at once" count of scripts/fidelity_compare.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvrl.executors import profile as P
from tests.helpers import known_eager_model, step_features

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = P.PACKAGED_DIR / "h200_qwen3-0.6b_bfloat16.json"
RUN23 = ROOT / "docs" / "results" / "profiles" / "h200_qwen3-0.6b_run23_shared.json"
TINY_KEY = {"device": "cpu", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
            "intermediate_size": 128, "vocab_size": 512, "dtype_bytes": 4}


def _truth(dec_shared: float, **coef) -> P.StepModel:
    """A small known eager model (no graphs) with a shared-token price ``dec_shared`` and ``coef``."""
    return known_eager_model({"dec_shared": dec_shared, **coef})


def _grid(truth: P.StepModel, shared_mixed: bool = True, scale: float = 1.0) -> list[dict]:
    """Samples timed by ``truth`` (times ``scale``) over a small grid like kvrl-profile's: decodes,
    ragged decodes, prefills, mixed steps, decodes over a shared prefix and (``shared_mixed``) the
    same beside a prefill chunk."""
    out = []
    add = lambda f, g: out.append({**f, "graph": False, "group": g, "t": scale * truth.predict_features(f, False)})
    for L in (64, 512, 2048):
        for b in (1, 8, 16, 64, 256):
            add(step_features([L] * b), "decode")
        for b in (8, 64):
            add(step_features([L] * b, pre=[(256, 0)]), "mixed")
            add(step_features([L] * b, pre=[(32, 1024)]), "mixed_long")
    for n in (64, 256, 1024):
        add(step_features(pre=[(n, 0)]), "prefill")
        add(step_features(pre=[(n, 0), (n, 512)]), "prefill")
    for b in (8, 16, 64):        # ragged batches tell the per-token price from the longest context's
        lens = [256 + (3584 * i) // (b - 1) for i in range(b)]
        add(step_features(lens), "ragged")
        add(step_features(lens, shared=512), "shared")
    for b in (16, 64):
        for L, s in ((1024, 512), (2048, 512), (2048, 1024)):
            add(step_features([L] * b, shared=s), "shared")
            if shared_mixed:
                add(step_features([L] * b, pre=[(256, 0)], shared=s), "shared_mixed")
    return out


# ------------------------------------------------------------------------------ old profiles
@pytest.mark.parametrize("path, old", [
    (SHIPPED, (0.005227432627940587, 0.0044931932049220745, 0.0033621690674747132)),
    (RUN23, (0.006067640594805133, 0.004809380092824489, 0.0032843935341077806))])
def test_fit_9_and_older_profiles_price_shared_tokens_beside_a_prefill_as_before(path, old):
    """The shipped (fit 8) and run 23's (fit 9) profiles have no ``mixed_shared``: a shared token
    beside a prefill keeps the price of a shared token in any eager step, exactly (values from the
    code before fit version 10, commit bb58bef)."""
    m = P.StepProfile.load(path).model
    assert "mixed_shared" not in m.eager["coef"]
    cases = [step_features([1024] * 64, pre=[(256, 0)], shared=512),
             step_features([2048] * 16, pre=[(32, 1024)], shared=1024),
             step_features([1024] * 64, shared=512)]
    assert [m.predict_features(f, True, host=False) for f in cases] == list(old)


# ------------------------------------------------------------------------------ the new term
def test_fit_recovers_a_cheaper_shared_token_beside_a_prefill():
    """Steps timed by a known model in which a shared KV token costs 2e-8 s in a decode-only step
    and 4e-9 s beside a prefill (what run 23's grid-only fit found): the fit separates the two prices
    and prices a mixed step over shared blocks as the truth does; one shared price (fit 9) cannot."""
    truth = _truth(2e-8, mixed_shared=4e-9)
    fit = P.StepModel.fit(_grid(truth), [])
    c = fit.eager["coef"]
    assert c["dec_shared"] == pytest.approx(2e-8, rel=0.02)
    assert c["mixed_shared"] == pytest.approx(4e-9, rel=0.05)
    f = step_features([1536] * 64, pre=[(256, 0)], shared=768)     # off the grid's points
    assert fit.predict_features(f, False) == pytest.approx(truth.predict_features(f, False), rel=0.005)
    one_price = _truth(c["dec_shared"])       # the fitted model with fit 9's single shared price
    one_price.eager["dense"], one_price.eager["kv"] = fit.eager["dense"], fit.eager["kv"]
    one_price.eager["coef"] = {k: v for k, v in c.items() if k != "mixed_shared"}
    one_price.rebuild()
    assert one_price.predict_features(f, False) > 1.03 * truth.predict_features(f, False)


def test_without_shared_mixed_samples_the_fit_keeps_one_shared_price():
    """A grid without steps that prefill beside shared decode KV (profiles before run 23) does not
    identify ``mixed_shared``: it is not fitted, and a shared token beside a prefill costs
    ``dec_shared``, as in fit 9 (not zero)."""
    truth = _truth(2e-8)
    fit = P.StepModel.fit(_grid(truth, shared_mixed=False), [])
    assert "mixed_shared" not in fit.eager["coef"]
    assert fit.eager["coef"]["dec_shared"] == pytest.approx(2e-8, rel=0.02)
    f = step_features([1024] * 64, pre=[(256, 0)], shared=512)
    assert fit.predict_features(f, False) == pytest.approx(truth.predict_features(f, False), rel=0.005)


def test_a_model_with_mixed_shared_round_trips_and_says_its_version():
    """A model with fit version 10's mixed_shared term saves the current fit version (11 since the
    queue's per-step host term, 12 since the co-read shared tokens, 13 since the path term) and loads back
    pricing the same; version 10 files still load."""
    fit = P.StepModel.fit(_grid(_truth(2e-8, mixed_shared=4e-9)), [])
    d = fit.to_dict()
    assert d["fit_version"] == P.FIT_VERSION == 13 and 10 in P.LOADABLE_FIT_VERSIONS
    again = P.StepModel.from_dict(json.loads(json.dumps(d)))
    f = step_features([700] * 33, pre=[(100, 50)], shared=256)
    assert again.predict_features(f, False) == fit.predict_features(f, False)


# ------------------------------------------------------------------------------ pooled re-profiles
def _profile(samples: list[dict], created: float, code: str = "abc", key: dict = TINY_KEY) -> P.StepProfile:
    meta = {"created": created, "created_utc": f"t{created:g}", "block_size": 16, "fingerprint": {"code": code}}
    model = P.StepModel.fit(samples, [])
    return P.StepProfile(P.ProfileKey.from_dict(key), model, meta, samples, [], {}, dict(key))


def test_pooled_profile_fits_the_re_profiles_together():
    """Two re-profiles of the same code whose times differ by +-6% (one machine state and then
    another): each alone prices a step 6% off; pooled, the fit sees both and lands within 1% of the
    truth (at the least-squares mean on relative error of 0.94 and 1.06 times it: 0.993). The pooled profile says what it was pooled from and reports its fit errors."""
    truth = _truth(2e-8, mixed_shared=4e-9)
    fast, slow = _profile(_grid(truth, scale=0.94), 1.0), _profile(_grid(truth, scale=1.06), 2.0)
    pooled = P.StepProfile.pooled([fast, slow])
    f = step_features([1536] * 64, pre=[(256, 0)], shared=768)
    want = truth.predict_features(f, False)
    assert fast.model.predict_features(f, False) == pytest.approx(0.94 * want, rel=0.005)
    assert pooled.model.predict_features(f, False) == pytest.approx(want, rel=0.01)
    assert len(pooled.samples) == 2 * len(fast.samples)
    assert [s["created_utc"] for s in pooled.meta["pooled_from"]] == ["t1", "t2"]
    assert pooled.meta["created"] == 2.0 and pooled.fit_report["pooled"] == 2
    assert pooled.fit_report["grid"]["n"] == len(pooled.samples)
    assert set(pooled.fit_report["by_group"]) >= {"shared", "shared_mixed"}


@pytest.mark.parametrize("change, field", [({"code": "def"}, "fingerprint.code"),
                                           ({"key": {**TINY_KEY, "num_layers": 4}}, "num_layers")])
def test_pooling_refuses_profiles_of_other_code_or_shape(change, field):
    samples = _grid(_truth(2e-8))
    with pytest.raises(P.ProfileError, match=field):
        P.StepProfile.pooled([_profile(samples, 1.0), _profile(samples, 2.0, **change)])
    with pytest.raises(P.ProfileError, match="at least two"):
        P.StepProfile.pooled([_profile(samples, 1.0)])


def test_pool_script_writes_a_pooled_profile_and_its_report(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import fidelity_pool_profiles

    truth = _truth(2e-8, mixed_shared=4e-9)
    paths = []
    for i, scale in enumerate((0.95, 1.05)):
        paths.append(tmp_path / f"p{i}.json")
        _profile(_grid(truth, scale=scale), float(i)).save(paths[-1])
    out = tmp_path / "pooled.json"
    assert fidelity_pool_profiles.main([*map(str, paths), "--out", str(out)]) == 0
    prof = P.StepProfile.load(out)
    assert prof.model.to_dict()["fit_version"] == P.FIT_VERSION and len(prof.meta["pooled_from"]) == 2
    assert "mixed_shared, fit version 10" in out.with_suffix(".md").read_text()


# ------------------------------------------------------------------------------ fidelity_compare
def test_fidelity_compare_counts_the_pairs_within_every_target(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import fidelity_compare

    live = {"throughput_tok_s": 1000.0, "goodput_tok_s": 900.0, "ttft_p50_s": 0.1, "ttft_p99_s": 1.0,
            "tpot_p50_s": 0.01}
    runs = {"a": {"w1/p": 1.0, "w2/p": 1.0}, "b": {"w1/p": 1.0, "w2/p": 1.15}}    # b: w2's TTFT p50 +15%
    dirs = []
    for name, ttft in runs.items():
        d = tmp_path / name
        d.mkdir()
        res = {pair: {"live": live, "live_repeats": [live, live], "sim": {**live, "ttft_p50_s": 0.1 * k}}
               for pair, k in ttft.items()}
        (d / "fidelity.json").write_text(json.dumps(res))
        dirs.append(f"{name}={d}")
    # a dotted name (as calibrate.sh's residuals_qwen3-0.6b) keeps its dot: not cmp_0.md
    assert fidelity_compare.main([*dirs, "--out", str(tmp_path / "cmp_0.6b")]) == 0
    assert (tmp_path / "cmp_0.6b.csv").exists()
    text = (tmp_path / "cmp_0.6b.md").read_text()
    assert "| held out | 2 | 2 of 2 (2) | 1 of 2 (1) |" in text
    assert "- misses, b: w2/p (TTFT p50)" in text and "- misses, a: none" in text


def test_fidelity_compare_counts_a_ranking_error_only_beyond_the_live_spread(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import fidelity_compare

    def m(tput):
        return {"throughput_tok_s": tput, "goodput_tok_s": tput, "ttft_p50_s": 0.1, "ttft_p99_s": 1.0,
                "tpot_p50_s": 0.01, "tpot_mean_s": 0.01}
    # w1: p1 beats p2 live by 10% with 1% spreads (resolved); w2: 1% apart with 5% spreads (not resolved)
    live = {"w1/p1": [1100, 1111, 1089], "w1/p2": [1000, 1010, 990], "w2/p1": [1010, 1060, 960],
            "w2/p2": [1000, 1050, 950]}
    res = {pair: {"live": m(v[0]), "live_repeats": [m(x) for x in v[1:]], "sim": m(1000.0 if "p1" in pair else 1050.0)}
           for pair, v in live.items()}          # the sim ranks p2 first on both workloads
    d = tmp_path / "run"
    d.mkdir()
    (d / "fidelity.json").write_text(json.dumps(res))
    assert fidelity_compare.main([f"s={d}", "--out", str(tmp_path / "cmp")]) == 0
    text = (tmp_path / "cmp.md").read_text()
    assert "| w1 | throughput_tok_s | p1 > p2 | 9.1% [1.0%] | yes | REVERSED |" in text
    assert "| w2 | throughput_tok_s | p1 > p2 | 1.0% [5.0%] | no | reversed (within spread) |" in text
    assert "- sim s reverses 2 of them: w1 goodput_tok_s; w1 throughput_tok_s" in text


def test_small_decode_keeps_only_quiet_small_decode_steps_and_reads_a_tarball(tmp_path):
    """fidelity_small_decode.py: decode steps of at most --max-batch sequences, with nothing waiting and no
    swap in the --quiet-steps before; the priced compute is sim_s less its host term; a run directory and
    its replay.tar.xz give the same numbers."""
    import tarfile

    sys.path.insert(0, str(ROOT / "scripts"))
    import fidelity_small_decode as S

    head = "step,kind,n_dec,n_wait,swap_out,swap_in,live_execute_s,sim_s,sim_host_s\n"
    rows = ["1,decode,2,0,0,0,0.002,0.0025,0.0005",     # kept: priced 0.002
            "2,decode,8,0,0,0,0.004,0.004,0.0",         # too large a batch
            "3,decode,1,3,0,0,0.002,0.002,0.0",         # requests waiting
            "4,mixed,1,0,0,0,0.003,0.003,0.0",          # not a decode step
            "5,decode,1,0,2,0,0.002,0.002,0.0",         # swaps itself
            "6,decode,1,0,0,0,0.002,0.002,0.0",         # right after a swap
            "7,decode,1,0,0,0,0.001,0.0013,0.0001"]     # kept once far enough from step 5
    replay = tmp_path / "pressure_0" / "runs" / "w" / "p" / "replay.csv"
    replay.parent.mkdir(parents=True)
    replay.write_text(head + "\n".join(rows) + "\n")
    near = S.small_decode(replay.read_text(), max_batch=4, quiet_steps=1)
    assert near["steps"] == 2 and near["live_ms"] == pytest.approx(1.5)
    assert near["priced_err"] == pytest.approx((0.002 + 0.0012) / 0.003 - 1)
    assert S.small_decode(replay.read_text(), max_batch=4, quiet_steps=5)["steps"] == 1
    with tarfile.open(tmp_path / "replay.tar.xz", "w:xz") as tar:
        tar.add(replay, arcname="pressure_0/runs/w/p/replay.csv")
    assert S.replay_files(tmp_path) == S.replay_files(tmp_path / "replay.tar.xz") == {"w/p": replay.read_text()}


def test_meets_every_target_compares_the_sim_with_the_mean_of_the_live_runs():
    """kvrl.fidelity.report.meets_every_target: every TARGETS bound against the live runs' mean; a bound
    missed by one metric, or a metric the sim lacks, misses the pair."""
    from kvrl.fidelity.compare import TARGETS
    from kvrl.fidelity.report import meets_every_target

    live = {k: 1.0 for k in TARGETS}
    pair = {"live": live, "live_repeats": [{k: 1.2 for k in TARGETS}]}       # mean 1.1
    assert meets_every_target(pair, {k: 1.1 for k in TARGETS})
    assert not meets_every_target(pair, {k: 1.0 for k in TARGETS})            # -9% misses the 3% throughput bound
    key, bound = next(iter(TARGETS.items()))
    near = {k: 1.1 for k in TARGETS}
    near[key] = 1.1 * (1 + 0.9 * bound)
    assert meets_every_target(pair, near)
    near[key] = 1.1 * (1 + 1.1 * bound)
    assert not meets_every_target(pair, near)
    assert not meets_every_target(pair, {k: 1.1 for k in list(TARGETS)[1:]})
