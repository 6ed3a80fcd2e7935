#!/usr/bin/env python3
"""attn_part_sim.py - the error of 16-bit attention partials, simulated on the host.

The CUDA attention can store each decode split's o / sum in fp16 or bf16 (ANVIL_CUDA_ATTN_PART,
attention.cu). This script draws test_cuda_ops' inputs (K in [-2, 2] and V in [-1, 1] rounded
to bf16, q in [-1, 1], head_dim 128, 32 / 8 heads), computes each split's (max, sum, o / sum)
in float64 as the kernels do in fp32, rounds o / sum to the kind, merges the splits as the
combine does and prints the relative RMS error and the largest absolute error against exact
attention: the basis of test_cuda_ops' s_attn_tol. Needs numpy.

    attn_part_sim.py [--seed N]
"""
import argparse

import numpy as np

SPLIT = 128


def bf16(x):
    """Round float32 values to bf16 (nearest even), returned as float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


KINDS = {
    "f16": lambda x: x.astype(np.float16).astype(np.float64),
    "bf16": lambda x: bf16(x).astype(np.float64),
}


def run(rng, ctxs, nh=32, nkv=8, hd=128):
    g = nh // nkv
    err = {k: [0.0, 0.0, 0.0] for k in KINDS}  # sum d^2, sum ref^2, max |d|
    for c in ctxs:
        k_all = bf16(rng.uniform(-2, 2, (c, nkv, hd))).astype(np.float64)
        v_all = bf16(rng.uniform(-1, 1, (c, nkv, hd))).astype(np.float64)
        q = rng.uniform(-1, 1, (nh, hd))
        for h in range(nh):
            kv = h // g
            s = k_all[:, kv, :] @ q[h] / np.sqrt(hd)
            p = np.exp(s - s.max())
            ref = p @ v_all[:, kv, :] / p.sum()
            ms, ls, os = [], [], []
            for k0 in range(0, c, SPLIT):
                ss = s[k0:k0 + SPLIT]
                e = np.exp(ss - ss.max())
                ms.append(ss.max())
                ls.append(e.sum())
                os.append(e @ v_all[k0:k0 + SPLIT, kv, :] / e.sum())
            ms, ls, os = np.array(ms), np.array(ls), np.array(os)
            w = np.exp(ms - ms.max()) * ls
            for kind, rnd in KINDS.items():
                d = (w[:, None] * rnd(os)).sum(0) / w.sum() - ref
                err[kind][0] += (d * d).sum()
                err[kind][1] += (ref * ref).sum()
                err[kind][2] = max(err[kind][2], np.abs(d).max())
    return {k: (np.sqrt(a / b), m) for k, (a, b, m) in err.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    rng = np.random.default_rng(ap.parse_args().seed)
    ctx = [1 + (s * 347) % 700 for s in range(64)]
    ctx[1:5] = [128, 129, 700, 256]  # test_attention_decodes' batch
    batches = [("64 decodes of 1..700 positions", ctx),
               ("decodes of 4096 / 4097 / 9000 positions", [4096, 4097, 9000]),
               ("decodes of 600 / 1 / 768 positions", [600, 1, 768])]
    for name, ctxs in batches:
        for kind, (rel, mx) in run(rng, ctxs).items():
            print(f"{name}: {kind} partials relative RMS {rel:.2e}, max |error| {mx:.2e}")


if __name__ == "__main__":
    main()
