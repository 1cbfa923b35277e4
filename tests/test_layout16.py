"""The channel-blocked (NCHW16c) helpers of the graph executor's blocked regions: the
reorders NCHW <-> [N][Cp/16][P][16] (16 x 16 tiles, leftover positions, channels padded
with zeros) and the
blocked MaxPool / AveragePool, against the NCHW kernels on every build (the AVX-512 paths
and the portable ones)."""

from __future__ import annotations

import pytest
import torch

from ortcpu_torch._native import ffi, lib, ptr
from ortcpu_torch.kernels.pool import avgpool_forward, maxpool_forward, pool_geometry


def _blocked(x):
    n, c, h, w = x.shape
    return x.reshape(n, c // 16, 16, h * w).permute(0, 1, 3, 2).contiguous()


@pytest.mark.parametrize("shape,cp", [((1, 16, 1, 1), 16), ((2, 32, 5, 7), 32),
                                      ((3, 48, 4, 4), 48), ((1, 64, 17, 1), 64),
                                      ((2, 16, 33, 35), 16), ((0, 16, 3, 3), 16),
                                      ((2, 24, 5, 4), 32), ((1, 1000, 3, 6), 1024),
                                      ((2, 5, 16, 1), 16)])
@pytest.mark.parametrize("threads", [1, 2])
def test_reorders_round_trip(shape, cp, threads):
    """Whole 16 x 16 tiles and leftover positions; channel counts padded to cp (zeros)."""
    n, c, h, w = shape
    x = torch.randn(shape)
    y = torch.full((n, cp // 16, h * w, 16), float("nan"))
    assert lib.ortcpu_to_nchw16c_f32(ptr(x), ptr(y), n, c, cp, h * w, threads) == 0
    padded = torch.cat([x, x.new_zeros(n, cp - c, h, w)], 1)
    assert torch.equal(y, _blocked(padded))
    back = torch.full(shape, float("nan"))
    assert lib.ortcpu_from_nchw16c_f32(ptr(y), ptr(back), n, c, cp, h * w, threads) == 0
    assert torch.equal(back, x)


def test_reorders_take_a_padded_count_of_whole_blocks_only():
    for fn in (lib.ortcpu_to_nchw16c_f32, lib.ortcpu_from_nchw16c_f32):
        assert fn(ffi.NULL, ffi.NULL, 1, 24, 24, 4, 1) != 0  # not a multiple of 16
        assert fn(ffi.NULL, ffi.NULL, 1, 40, 32, 4, 1) != 0  # fewer than the channels
        assert fn(ffi.NULL, ffi.NULL, -1, 16, 16, 4, 1) != 0


POOLS = [  # (attrs, input H x W)
    ({"kernel_shape": [3, 3], "strides": [2, 2]}, (13, 13)),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, (14, 14)),
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (9, 11)),
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, (8, 8)),
    ({"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0]}, (7, 6)),
    ({"kernel_shape": [7, 7]}, (7, 7)),  # global
    # whole-window runs along a row (the max pools' inner loop) beside clipped edges
    ({"kernel_shape": [2, 4], "strides": [1, 3], "pads": [0, 2, 0, 2]}, (5, 17)),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, (20, 23)),
]


def _blocked_pool(x, attrs, is_max, include_pad, threads=2):
    n, c, h, w = x.shape
    geom, out = pool_geometry("Pool", (n, c // 16, h, w), 2, **attrs)
    y = torch.full((n, c // 16, out[0] * out[1], 16), float("nan"))
    xb = _blocked(x)  # held: ptr() keeps no reference
    assert lib.ortcpu_pool_nchw16c_f32(ptr(xb), ptr(y), ffi.new("int64_t[]", geom),
                                       is_max, include_pad, threads) == 0
    return y


@pytest.mark.parametrize("attrs,hw", POOLS)
def test_blocked_maxpool_equals_the_nchw_kernel(attrs, hw):
    x = torch.randn(2, 32, *hw)
    x[0, 3, 1, 1] = float("nan")  # NaN propagates into every window holding it
    ref = maxpool_forward("MaxPool", x, need_indices=False, **attrs)[0]
    got = _blocked_pool(x, attrs, 1, 0)
    torch.testing.assert_close(got, _blocked(ref), rtol=0, atol=0, equal_nan=True)
    assert got.isnan().any()


@pytest.mark.parametrize("attrs,hw", POOLS)
@pytest.mark.parametrize("cip", [0, 1])
@pytest.mark.parametrize("threads", [1, 2])
def test_blocked_avgpool_matches_the_nchw_kernel(attrs, hw, cip, threads):
    x = torch.randn(3, 16, *hw)
    ref = avgpool_forward("AveragePool", x, count_include_pad=2 * cip, **attrs)
    got = _blocked_pool(x, attrs, 0, 2 * cip, threads)
    torch.testing.assert_close(got, _blocked(ref), rtol=1e-6, atol=1e-7)


def test_blocked_pool_rejects_dilation_and_bad_include_pad():
    geom, _ = pool_geometry("Pool", (1, 1, 5, 5), 2, kernel_shape=[2, 2], dilations=[2, 2])
    g = ffi.new("int64_t[]", geom)
    assert lib.ortcpu_pool_nchw16c_f32(ffi.NULL, ffi.NULL, g, 1, 0, 1) != 0
    geom, _ = pool_geometry("Pool", (1, 1, 5, 5), 2, kernel_shape=[2, 2])
    assert lib.ortcpu_pool_nchw16c_f32(ffi.NULL, ffi.NULL, ffi.new("int64_t[]", geom), 0, 3,
                                       1) != 0
