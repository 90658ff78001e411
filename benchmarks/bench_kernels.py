"""Benchmark (and GPU-check) the kvrl Triton kernels on one CUDA device.

Usage: ``python benchmarks/bench_kernels.py [--out FILE] [--sweep]``

1. Correctness on the GPU, small shapes, fp32/fp16/bf16: decode (several splits) and prefill
   (cached prefix, chunked) vs the torch references with NaN-poisoned outputs; store_kv and
   copy_blocks exact. bf16 is only checked here (the Triton CPU interpreter cannot run bf16 dots).
2. Device-to-device copy bandwidth: ``dst.copy_(src)`` over rotating 1 GiB buffers; bytes =
   read + written; median of ``triton.testing.do_bench`` (which flushes L2 between runs).
3. Paged decode attention, Qwen3-0.6B shape (16 query heads, 8 kv heads, head_dim 128, bf16,
   block_size 16), batch {64, 256} x context {1024, 4096}, block tables from a random permutation:
   rel error vs the reference (< 1e-2, poisoned output), median time, GB/s with bytes = K/V
   actually read + q + out, and the fraction of the copy bandwidth.
4. Paged prefill attention, 8 sequences x 1024 tokens, same shape, vs torch SDPA on dense tensors.

``--sweep`` also times decode tile configurations (block_n, num_warps, num_stages) and split
counts per shape, to retune the defaults in ``kernels/triton_decode.py``.
A Markdown table of all results is printed last (and written to ``--out`` when given).
"""
from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import dataclass

import torch
import triton
import triton.runtime.errors
import triton.testing

import kvrl.kernels as K
from kvrl.kernels.reference import copy_blocks_ref, paged_decode_attention_ref, paged_prefill_attention_ref, store_kv_ref
from kvrl.kernels.triton_decode import paged_decode_attention_triton, pick_num_splits
from kvrl.kernels.triton_common import num_sms

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 16
DTYPE = torch.bfloat16
DEVICE = torch.device("cuda")


@dataclass
class Row:
    """One line of the results table; unused metrics stay None."""

    name: str
    config: str
    time_us: float | None = None
    gbps: float | None = None
    frac_copy: float | None = None
    tflops: float | None = None
    rel_err: float | None = None
    ok: bool | None = None


def bench_ms(fn) -> float:
    """Median runtime of ``fn`` in ms (CUDA events; L2 flushed between runs)."""
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf if ``out`` has any non-finite element."""
    if not bool(out.isfinite().all()):
        return math.inf
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def poisoned(fn):
    """Run ``fn`` with torch.empty returning NaN-filled tensors (torch deterministic mode)."""
    torch.use_deterministic_algorithms(True)
    try:
        return fn()
    finally:
        torch.use_deterministic_algorithms(False)


def paged_problem(batch, context_lens, dtype, num_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS,
                  head_dim=HEAD_DIM, block_size=BLOCK_SIZE, spare_blocks=16):
    """Random caches and block tables from a random permutation of all blocks.

    Returns ``(k_cache, v_cache, block_tables int32 [batch, max_blocks], context_lens int32)``.
    """
    blocks = [triton.cdiv(c, block_size) for c in context_lens]
    num_blocks = sum(blocks) + spare_blocks
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(num_blocks, device=DEVICE).to(torch.int32)
    table = torch.zeros(batch, max(blocks), dtype=torch.int32, device=DEVICE)
    start = 0
    for i, n in enumerate(blocks):
        table[i, :n] = perm[start : start + n]
        start += n
    return k_cache, v_cache, table, torch.tensor(context_lens, dtype=torch.int32, device=DEVICE)


# --------------------------------------------------------------------------------------------
# 1. correctness on the GPU
# --------------------------------------------------------------------------------------------


def checked(name: str, config: str, run) -> Row:
    """Row for one correctness check; ``run()`` returns ``(rel_err or None, ok)``.

    An exception (e.g. a kernel that fails to compile) becomes a failed row, not a crash.
    """
    try:
        err, ok = run()
    except Exception as e:  # noqa: BLE001 - reported in the table
        return Row(name, f"{config}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", ok=False)
    return Row(name, config, rel_err=err, ok=ok)


def gpu_checks() -> list[Row]:
    rows = []
    tol = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
    for dtype, (heads, kv_heads, dim, bs) in itertools.product(
        tol, [(16, 8, 128, 16), (12, 2, 64, 8), (8, 8, 96, 32)]
    ):
        ctx = [1, 17, 300, 1000, 64]
        k_cache, v_cache, table, lens = paged_problem(len(ctx), ctx, dtype, heads, kv_heads, dim, bs)
        scale = dim**-0.5
        q = torch.randn(len(ctx), heads, dim, dtype=dtype, device=DEVICE)
        ref = paged_decode_attention_ref(q, k_cache, v_cache, table, lens, scale)
        shape = f"{dtype} H{heads}/KV{kv_heads} D{dim} bs{bs}"
        for splits in (None, 1, 3, 8):
            def run_decode(splits=splits):
                out = poisoned(lambda: K.paged_decode_attention(q, k_cache, v_cache, table, lens, scale, splits))
                err = rel_err(out, ref)
                return err, err < tol[dtype]

            rows.append(checked("check decode", f"{shape} splits={splits}", run_decode))
        q_lens = [1, 17, 150, 1000, 64]  # prefix hits where q_len < context_len
        cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=DEVICE)
        qp = torch.randn(int(cu[-1]), heads, dim, dtype=dtype, device=DEVICE)
        args = (qp, k_cache, v_cache, table, cu, lens, scale, max(q_lens))

        def run_prefill(args=args, dtype=dtype):
            err = rel_err(poisoned(lambda: K.paged_prefill_attention(*args)), paged_prefill_attention_ref(*args))
            return err, err < tol[dtype]

        rows.append(checked("check prefill", shape, run_prefill))

    for dtype in tol:
        k_cache, v_cache, _, _ = paged_problem(4, [64] * 4, dtype)

        def run_store_kv():
            refs = [k_cache.clone(), v_cache.clone()]
            kv = torch.randn(50, 2 * NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE)
            slots = torch.randperm(k_cache.shape[0] * BLOCK_SIZE, device=DEVICE)[:50]
            slots[::7] = -1
            K.store_kv(kv[:, :NUM_KV_HEADS], kv[:, NUM_KV_HEADS:], k_cache, v_cache, slots)
            store_kv_ref(kv[:, :NUM_KV_HEADS], kv[:, NUM_KV_HEADS:], *refs, slots)
            return None, torch.equal(k_cache, refs[0]) and torch.equal(v_cache, refs[1])

        def run_copy_blocks():
            src = torch.tensor([0, 3, 5], device=DEVICE)
            dst = torch.tensor([9, 1, 2], device=DEVICE)
            caches = [k_cache, v_cache, k_cache.clone()]
            refs = [c.clone() for c in caches]
            K.copy_blocks(caches, src, dst)
            copy_blocks_ref(refs, src, dst)
            return None, all(torch.equal(c, r) for c, r in zip(caches, refs))

        rows.append(checked("check store_kv", str(dtype), run_store_kv))
        rows.append(checked("check copy_blocks", str(dtype), run_copy_blocks))
    return rows


# --------------------------------------------------------------------------------------------
# 2-4. timings
# --------------------------------------------------------------------------------------------


def copy_bandwidth(nbytes: int = 1 << 30, num_buffers: int = 3) -> Row:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), rotating buffers."""
    pairs = [(torch.empty(nbytes, dtype=torch.uint8, device=DEVICE).random_(),
              torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)) for _ in range(num_buffers)]
    cycle = itertools.cycle(pairs)

    def step():
        src, dst = next(cycle)
        dst.copy_(src)

    ms = bench_ms(step)
    gbps = 2 * nbytes / (ms * 1e-3) / 1e9
    del pairs
    torch.cuda.empty_cache()
    return Row("d2d copy", f"{nbytes >> 20} MiB x{num_buffers} buffers", ms * 1e3, gbps, 1.0)


def decode_bytes(batch: int, context: int) -> int:
    elem = torch.finfo(DTYPE).bits // 8
    kv = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * elem
    return kv + 2 * batch * NUM_HEADS * HEAD_DIM * elem  # + q + out


def bench_decode(batch: int, context: int, copy_gbps: float, sweep: bool) -> list[Row]:
    k_cache, v_cache, table, lens = paged_problem(batch, [context] * batch, DTYPE)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device=DEVICE)
    scale = HEAD_DIM**-0.5
    out = poisoned(lambda: K.paged_decode_attention(q, k_cache, v_cache, table, lens, scale))
    err = rel_err(out, paged_decode_attention_ref(q, k_cache, v_cache, table, lens, scale))
    nbytes = decode_bytes(batch, context)
    splits = pick_num_splits(batch, NUM_KV_HEADS, table.shape[1] * BLOCK_SIZE, num_sms(DEVICE))

    def timed(name, config, **kw):
        try:
            ms = bench_ms(lambda: paged_decode_attention_triton(q, k_cache, v_cache, table, lens, scale, **kw))
        except triton.runtime.errors.OutOfResources:  # e.g. too many stages of large tiles
            return Row(name, f"{config}: out of resources")
        gbps = nbytes / (ms * 1e-3) / 1e9
        return Row(name, config, ms * 1e3, gbps, gbps / copy_gbps)

    shape = f"B={batch} ctx={context}"
    main = timed("decode", f"{shape} splits={splits} (default)")
    main.rel_err, main.ok = err, err < 1e-2
    rows = [main]
    if sweep:
        for block_n, warps, stages in itertools.product((32, 64, 128), (4, 8), (2, 3, 4)):
            rows.append(timed("decode sweep", f"{shape} block_n={block_n} warps={warps} stages={stages}",
                              block_n=block_n, num_warps=warps, num_stages=stages))
        for s in sorted({1, 2, 4, 8, 16} - {splits}):
            rows.append(timed("decode sweep", f"{shape} splits={s}", num_splits=s))
    del k_cache, v_cache
    torch.cuda.empty_cache()
    return rows


def bench_prefill(num_seqs: int = 8, seq_len: int = 1024) -> list[Row]:
    k_cache, v_cache, table, lens = paged_problem(num_seqs, [seq_len] * num_seqs, DTYPE)
    q = torch.randn(num_seqs * seq_len, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device=DEVICE)
    cu = torch.arange(0, num_seqs * seq_len + 1, seq_len, dtype=torch.int32, device=DEVICE)
    args = (q, k_cache, v_cache, table, cu, lens, HEAD_DIM**-0.5, seq_len)
    out = poisoned(lambda: K.paged_prefill_attention(*args))
    err = rel_err(out, paged_prefill_attention_ref(*args))
    flops = 4 * num_seqs * NUM_HEADS * HEAD_DIM * seq_len * (seq_len + 1) / 2  # causal QK^T + PV
    ms = bench_ms(lambda: K.paged_prefill_attention(*args))
    config = f"{num_seqs} seqs x {seq_len} tokens"
    rows = [Row("prefill (paged, triton)", config, ms * 1e3, tflops=flops / (ms * 1e-3) / 1e12, rel_err=err, ok=err < 1e-2)]

    # Dense SDPA on the same data (K/V gathered and expanded to all query heads outside the timing).
    group = NUM_HEADS // NUM_KV_HEADS

    def dense(cache):  # [P, num_heads, seq_len, D]
        per_seq = cache[table.long()].flatten(1, 2)  # [P, seq_len, kv_heads, D]
        return per_seq.repeat_interleave(group, dim=2).transpose(1, 2).contiguous()

    qd = q.view(num_seqs, seq_len, NUM_HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    kd, vd = dense(k_cache), dense(v_cache)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=HEAD_DIM**-0.5)

    sdpa_err = rel_err(out.view(num_seqs, seq_len, NUM_HEADS, HEAD_DIM).transpose(1, 2), sdpa())
    ms = bench_ms(sdpa)
    rows.append(Row("prefill (dense SDPA)", config, ms * 1e3, tflops=flops / (ms * 1e-3) / 1e12, rel_err=sdpa_err))
    return rows


def markdown(rows: list[Row]) -> str:
    def fmt(value, spec):
        return "" if value is None else format(value, spec)

    lines = ["| kernel | config | time (us) | GB/s | of copy BW | TFLOP/s | rel err | ok |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ok = "" if r.ok is None else ("yes" if r.ok else "**NO**")
        lines.append(f"| {r.name} | {r.config} | {fmt(r.time_us, '.1f')} | {fmt(r.gbps, '.0f')} | "
                     f"{fmt(r.frac_copy, '.1%')} | {fmt(r.tflops, '.1f')} | {fmt(r.rel_err, '.2e')} | {ok} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the Markdown table to this file")
    parser.add_argument("--sweep", action="store_true", help="also time decode tile configs and split counts")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()} ({num_sms(DEVICE)} SMs), torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)

    checks = gpu_checks()
    failed = [r for r in checks if not r.ok]
    summary = Row("GPU checks", f"{len(checks) - len(failed)}/{len(checks)} passed "
                  "(decode/prefill/store_kv/copy_blocks, fp32/fp16/bf16)", ok=not failed)
    print(summary.config, flush=True)
    copy = copy_bandwidth()
    print(f"copy bandwidth: {copy.gbps:.0f} GB/s", flush=True)
    rows = [summary, *failed, copy]
    for batch, context in itertools.product((64, 256), (1024, 4096)):
        decode_rows = bench_decode(batch, context, copy.gbps, args.sweep)
        main_row = decode_rows[0]
        print(f"decode {main_row.config}: {main_row.time_us:.1f} us, {main_row.gbps:.0f} GB/s "
              f"({main_row.frac_copy:.1%} of copy), rel err {main_row.rel_err:.2e}", flush=True)
        rows += decode_rows
    rows += bench_prefill()

    table = markdown(rows)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
