"""A scalar transcription of llama.cpp's ``quantize_row_q4_K_ref`` (ggml-quants.c) that writes real Q4_K
blocks (144 bytes: fp16 d, fp16 dmin, 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles).

Independent of :mod:`losslens.lm.quant.ggml_kquants` on purpose: element-by-element loops over
``numpy.float32`` scalars (every operation rounds to float32 as the C code does), no torch, no
vectorisation; the packed blocks are then decoded by the ``gguf`` package's own dequantizer.
"""

from __future__ import annotations

import numpy as np

F = np.float32
QK_K = 256


def nearest_int(v) -> int:
    """ggml's nearest_int: add 1.5·2^23 in float32 and read the mantissa (round half to even)."""
    val = F(v) + F(12582912.0)
    i = int(np.array([val], dtype=np.float32).view(np.int32)[0])
    return (i & 0x007FFFFF) - 0x00400000


def make_qkx2_quants(x, weights, nmax, rmin, rdelta, nstep):
    n = len(x)
    mn, mx = x[0], x[0]
    sum_w = weights[0]
    sum_x = F(sum_w * x[0])
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        sum_w = F(sum_w + weights[i])
        sum_x = F(sum_x + F(weights[i] * x[i]))
    if mn > 0:
        mn = F(0)
    if mx == mn:
        return F(0), F(-mn), [0] * n
    iscale = F(F(nmax) / F(mx - mn))
    scale = F(F(1) / iscale)
    L = [0] * n
    best = F(0)
    for i in range(n):
        L[i] = max(0, min(nmax, nearest_int(F(iscale * F(x[i] - mn)))))
        diff = F(F(F(scale * F(L[i])) + mn) - x[i])
        best = F(best + F(weights[i] * F(diff * diff)))
    for step in range(nstep + 1):
        iscale = F(F(F(F(rmin) + F(F(rdelta) * F(step))) + F(nmax)) / F(mx - mn))
        sum_l = sum_l2 = sum_xl = F(0)
        aux = [0] * n
        for i in range(n):
            lv = max(0, min(nmax, nearest_int(F(iscale * F(x[i] - mn)))))
            aux[i] = lv
            wl = F(weights[i] * F(lv))
            sum_l = F(sum_l + wl)
            sum_l2 = F(sum_l2 + F(wl * F(lv)))
            sum_xl = F(sum_xl + F(wl * x[i]))
        D = F(F(sum_w * sum_l2) - F(sum_l * sum_l))
        if D > 0:
            this_scale = F(F(F(sum_w * sum_xl) - F(sum_x * sum_l)) / D)
            this_min = F(F(F(sum_l2 * sum_x) - F(sum_l * sum_xl)) / D)
            if this_min > 0:
                this_min = F(0)
                this_scale = F(sum_xl / sum_l2)
            cur = F(0)
            for i in range(n):
                diff = F(F(F(this_scale * F(aux[i])) + this_min) - x[i])
                cur = F(cur + F(weights[i] * F(diff * diff)))
            if cur < best:
                L, best, scale, mn = list(aux), cur, this_scale, this_min
    return scale, F(-mn), L


def quantize_row_q4_k(row: np.ndarray) -> bytes:
    """Q4_K blocks of a float32 row (length a multiple of 256), as bytes."""
    out = bytearray()
    for s in range(0, len(row), QK_K):
        x = [F(v) for v in row[s : s + QK_K]]
        L = [0] * QK_K
        scales, mins = [F(0)] * 8, [F(0)] * 8
        max_scale = max_min = F(0)
        for j in range(8):
            sub = x[32 * j : 32 * j + 32]
            sum_x2 = F(0)
            for v in sub:
                sum_x2 = F(sum_x2 + F(v * v))
            av_x = F(np.sqrt(F(sum_x2 / F(32))))
            w = [F(av_x + F(abs(v))) for v in sub]
            scales[j], mins[j], L[32 * j : 32 * j + 32] = make_qkx2_quants(sub, w, 15, -1.0, 0.1, 20)
            if scales[j] > max_scale:
                max_scale = scales[j]
            if mins[j] > max_min:
                max_min = mins[j]
        inv_scale = F(F(63) / max_scale) if max_scale > 0 else F(0)
        inv_min = F(F(63) / max_min) if max_min > 0 else F(0)
        packed = [0] * 12
        ls_all, lm_all = [], []
        for j in range(8):
            ls = min(63, nearest_int(F(inv_scale * scales[j])) & 0xFF)
            lm = min(63, nearest_int(F(inv_min * mins[j])) & 0xFF)
            ls_all.append(ls)
            lm_all.append(lm)
            if j < 4:
                packed[j] = ls
                packed[j + 4] = lm
            else:
                packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
                packed[j - 4] |= (ls >> 4) << 6
                packed[j] |= (lm >> 4) << 6
        d16 = np.float16(F(max_scale / F(63)))
        dmin16 = np.float16(F(max_min / F(63)))
        for j in range(8):
            d = F(F(d16) * F(ls_all[j]))
            if d == 0:
                continue
            dm = F(F(dmin16) * F(lm_all[j]))
            for i in range(32):
                L[32 * j + i] = max(0, min(15, nearest_int(F(F(x[32 * j + i] + dm) / d))))
        qs = bytearray(128)
        for c in range(0, QK_K, 64):
            for i in range(32):
                qs[c // 2 + i] = L[c + i] | (L[c + i + 32] << 4)
        out += np.array([d16, dmin16], dtype=np.float16).tobytes() + bytes(packed) + bytes(qs)
    return bytes(out)
