"""The native layer under the registry: the caching arena (tensors it hands out, views
keeping blocks alive, stats, empty_cache, the cache limit, threads), thread settings,
status codes and ``KernelError``.

Arena counters are process-global, so tests compare deltas around their own allocations
and collect garbage first.
"""

from __future__ import annotations

import copy
import gc
import io
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch
from ortcpu_torch import kernels as K
from ortcpu_torch._native import arena, bridge, check_status, ffi, lib, ptr
from ortcpu_torch.kernels import activations as KA

BIG = (512, 256)  # 512 KiB of float32: above the arena threshold
BIG_BYTES = 512 * 256 * 4


def stats():
    gc.collect()
    return ortcpu_torch.memory_stats()


# ---- arena -----------------------------------------------------------------------------------


def test_memory_stats_keys_and_invariants():
    s = stats()
    assert set(s) == {"in_use_bytes", "cached_bytes", "hits", "misses", "peak_bytes",
                      "limit_bytes"}
    assert all(isinstance(v, int) and v >= 0 for v in s.values())
    assert s["peak_bytes"] >= s["in_use_bytes"]


def test_small_outputs_bypass_the_arena():
    assert arena.ARENA_MIN_BYTES == 1 << 18
    before = stats()
    y = K.Gelu(torch.randn(100))
    after = stats()
    assert after["in_use_bytes"] == before["in_use_bytes"]
    assert after["hits"] + after["misses"] == before["hits"] + before["misses"]
    del y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_outputs_are_ordinary_tensors_from_the_arena(dtype):
    x = torch.randn(*BIG, dtype=dtype)
    nbytes = x.numel() * x.element_size()
    before = stats()
    y = K.Gelu(x)
    mid = stats()
    assert mid["in_use_bytes"] - before["in_use_bytes"] >= nbytes
    assert (mid["hits"] + mid["misses"]) - (before["hits"] + before["misses"]) == 1
    assert mid["peak_bytes"] >= mid["in_use_bytes"]
    # an ordinary, writable, contiguous CPU tensor that torch ops accept
    assert isinstance(y, torch.Tensor) and y.device.type == "cpu" and y.dtype == dtype
    assert y.is_contiguous() and y.shape == x.shape and y.data_ptr() % 64 == 0
    assert torch.equal(y, K.Gelu(x))
    assert torch.allclose(y, F.gelu(x), rtol=2e-6, atol=2e-6)
    z = y.clone()
    y.mul_(2).add_(1)
    assert torch.equal(y, z * 2 + 1)
    assert torch.equal(torch.from_numpy(y.numpy()), y)
    torch.mul(x, 3, out=y)  # as an out= tensor of the right shape
    assert torch.equal(y, x * 3)
    del y, z
    after = stats()
    assert after["in_use_bytes"] <= mid["in_use_bytes"] - nbytes


def test_freed_blocks_are_cached_and_reused():
    x = torch.randn(*BIG)
    y = K.Sigmoid(x)
    p = y.data_ptr()
    base = stats()
    del y
    freed = stats()
    assert freed["in_use_bytes"] <= base["in_use_bytes"] - BIG_BYTES
    assert freed["cached_bytes"] >= base["cached_bytes"] + BIG_BYTES
    y2 = K.Sigmoid(x)
    again = stats()
    assert again["hits"] == freed["hits"] + 1
    assert abs(y2.data_ptr() - p) < 8192  # the same, already-touched block (its data
    # starts at another staggered offset: see the next test)
    assert torch.allclose(y2, torch.sigmoid(x), rtol=1e-6, atol=1e-7)


def _gap(a: torch.Tensor, b: torch.Tensor) -> int:
    """How far b's data lies after a's, modulo the 4 KB a core compares first."""
    return (b.data_ptr() - a.data_ptr()) % 4096


def test_arena_outputs_are_not_4k_aliased_with_inputs():
    # a load matching a pending store in its low 12 bits waits for it: an output that
    # starts just after its input modulo 4 KB (torch's big tensors and unstaggered arena
    # blocks started 64 bytes apart) stalls the kernels that stream x into y
    # torch's mmap-served tensors start 64 bytes into a page
    x = torch.randn(*BIG)
    outs = [K.Sigmoid(x) for _ in range(6)]
    for y in outs:
        assert 1024 <= y.data_ptr() % 4096 <= 4096 - 512
    for a, b in zip(outs[:-1], outs[1:], strict=True):  # an op on an arena output, next block
        assert 512 <= _gap(a, b) <= 4096 - 512
    for y in outs:
        assert torch.equal(y, outs[0])


def test_views_keep_their_block_alive():
    x = torch.randn(*BIG)
    y = K.Tanh(x)
    expected = y.clone()
    views = {"slice": y[100:200], "transpose": y.t(), "reshape": y.view(-1, 64),
             "numpy": y.numpy(), "storage": y.untyped_storage()}
    base_in_use = stats()["in_use_bytes"]
    del y
    assert stats()["in_use_bytes"] == base_in_use, "a live view must keep the block in use"
    # allocate more same-size blocks: none may reuse the viewed block
    others = [K.Tanh(torch.randn(*BIG)) for _ in range(3)]
    assert torch.equal(views["slice"], expected[100:200])
    assert torch.equal(views["transpose"], expected.t())
    assert torch.equal(views["reshape"], expected.view(-1, 64))
    assert torch.equal(torch.from_numpy(views["numpy"]), expected)
    del views, others
    assert stats()["in_use_bytes"] <= base_in_use - BIG_BYTES


def test_block_saved_for_backward_stays_valid():
    """Softmax saves its (arena) output for backward; dropping the user's reference and
    allocating more must not disturb the gradient."""
    x = torch.randn(*BIG, dtype=torch.float64).requires_grad_()
    y = ortcpu_torch.ops.softmax(x, -1)
    dy = torch.randn(*BIG, dtype=torch.float64)
    (expected,) = torch.autograd.grad(torch.softmax(x, -1), x, dy)
    loss = (y * dy).sum()
    del y
    gc.collect()
    junk = [K.Softmax(torch.randn(*BIG, dtype=torch.float64)) for _ in range(3)]
    loss.backward()
    torch.testing.assert_close(x.grad, expected, rtol=1e-12, atol=1e-12)
    del junk


def test_empty_cache_releases_cached_blocks_only():
    keep = K.Relu(torch.randn(*BIG))
    keep_copy = keep.clone()
    drop = K.Relu(torch.randn(*BIG))
    del drop
    s = stats()
    assert s["cached_bytes"] >= BIG_BYTES
    ortcpu_torch.empty_cache()
    t = stats()
    assert t["cached_bytes"] == 0
    assert t["in_use_bytes"] == s["in_use_bytes"]
    assert torch.equal(keep, keep_copy)
    # the next allocation of that size is a miss again
    again = K.Relu(torch.randn(*BIG))
    assert stats()["misses"] == t["misses"] + 1
    del again


def test_cache_limit():
    ortcpu_torch.empty_cache()
    ortcpu_torch.set_cache_limit(0)
    assert stats()["limit_bytes"] == 0
    y = K.Relu(torch.randn(*BIG))
    del y
    assert stats()["cached_bytes"] == 0, "with limit 0 a freed block goes back to the OS"
    ortcpu_torch.set_cache_limit(BIG_BYTES * 2)
    ys = [K.Relu(torch.randn(*BIG)) for _ in range(4)]
    del ys
    s = stats()
    assert 0 < s["cached_bytes"] <= BIG_BYTES * 2
    # lowering the limit below what is cached empties the cache
    ortcpu_torch.set_cache_limit(BIG_BYTES // 2)
    assert stats()["cached_bytes"] == 0
    with pytest.raises(ValueError, match="max_cached_bytes must be >= 0, got -1"):
        ortcpu_torch.set_cache_limit(-1)


def test_arena_from_many_python_threads():
    """Concurrent kernel calls allocate and free arena blocks from several threads."""
    xs = [torch.randn(*BIG) for _ in range(4)]
    want = [K.Gelu(x) for x in xs]
    base = stats()["in_use_bytes"]

    def work(i):
        for _ in range(10):
            y = K.Gelu(xs[i % 4])
            if not torch.equal(y, want[i % 4]):
                return False
            del y
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(8)))
    assert stats()["in_use_bytes"] == base


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool,
                                   torch.complex64])
def test_empty_shapes_and_dtypes(dtype):
    t = arena.empty((300, 300), dtype)
    assert t.shape == (300, 300) and t.dtype == dtype and t.is_contiguous()
    assert arena.empty((0, 5), dtype).shape == (0, 5)
    assert arena.empty((), dtype).shape == ()
    like = arena.empty_like(t)
    assert like.shape == t.shape and like.dtype == dtype


def test_arena_tensor_serialisation_and_copies():
    y = K.Gelu(torch.randn(*BIG))
    buf = io.BytesIO()
    torch.save(y, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf), y)
    assert torch.equal(pickle.loads(pickle.dumps(y)), y)
    assert torch.equal(copy.deepcopy(y), y)


def test_arena_tensor_storage_cannot_grow():
    """Documented limitation (README, performance notes): arena tensors wrap a fixed
    block, like ``torch.from_numpy`` tensors, so ``resize_`` can shrink or keep their size
    but growing past the block raises (torch's message) instead of reallocating."""
    y = K.Gelu(torch.randn(*BIG))
    n = y.numel()
    flat = y.view(-1)
    flat.resize_(n // 2)
    assert flat.numel() == n // 2
    grow = K.Gelu(torch.randn(*BIG))
    with pytest.raises(RuntimeError, match="not resizable"):
        grow.resize_(2 * n)


# ---- thread settings ---------------------------------------------------------------------


def test_num_threads_default_follows_torch():
    ortcpu_torch.set_num_threads(None)
    assert ortcpu_torch.get_num_threads() == torch.get_num_threads()
    torch.set_num_threads(1)
    assert ortcpu_torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert ortcpu_torch.get_num_threads() == 2


def test_set_num_threads_is_ours_only():
    torch_threads = torch.get_num_threads()
    ortcpu_torch.set_num_threads(3)
    assert ortcpu_torch.get_num_threads() == 3
    assert torch.get_num_threads() == torch_threads
    ortcpu_torch.set_num_threads(None)
    assert ortcpu_torch.get_num_threads() == torch_threads


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_set_num_threads_rejects(bad):
    with pytest.raises(ValueError, match=r"num_threads must be a positive int or None"):
        ortcpu_torch.set_num_threads(bad)


def test_results_do_not_depend_on_thread_count():
    x = torch.randn(300_000) * 3
    rows = torch.randn(700, 333) * 3
    dy = torch.randn(700, 333)
    out = {}
    for n in (1, 2, 4):
        ortcpu_torch.set_num_threads(n)
        out[n] = [K.Gelu(x), K.FastGelu(x), K.Sigmoid(x), K.Softmax(rows),
                  K.LogSoftmax(rows, axis=0), K.SoftmaxGrad_13(dy, K.Softmax(rows))]
    for n in (2, 4):
        for a, b in zip(out[1], out[n], strict=True):
            assert torch.equal(a, b)


# ---- status codes and KernelError ---------------------------------------------------------


def test_kernel_error_type():
    assert issubclass(ortcpu_torch.KernelError, RuntimeError)
    assert ortcpu_torch.KernelError is bridge.KernelError


def test_status_names():
    names = {0: "OK", -1: "INVALID_ARGUMENT", -2: "OUT_OF_MEMORY", -3: "INDEX_OUT_OF_RANGE",
             -4: "INTERNAL", -99: "UNKNOWN"}
    for code, name in names.items():
        assert ffi.string(lib.ortcpu_status_name(code)).decode() == name
    check_status(0, "Anything")  # OK is silent


@pytest.mark.parametrize("call, message", [
    (lambda: lib.ortcpu_act_forward_f32(99, ffi.NULL, ffi.NULL, 0, 0.0, 1),
     "act_forward: unknown activation op 99"),
    (lambda: lib.ortcpu_act_backward_f64(0, ffi.NULL, ffi.NULL, ffi.NULL, -5, 0.0, 1),
     "act_backward: n must be >= 0"),
    (lambda: lib.ortcpu_softmax_forward_f32(ffi.NULL, ffi.NULL, -1, 3, 1, 0, 1),
     "softmax_forward: sizes must be >= 0"),
    (lambda: lib.ortcpu_gelu_forward_f64(ffi.NULL, ffi.NULL, ffi.NULL, 2, -3, 0, 1),
     "gelu_forward: rows=2 and cols=-3 must be >= 0"),
    (lambda: lib.ortcpu_gelu_backward_f32(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL,
                                          ffi.new("float[4]"), 1, 4, 0, 1),
     "gelu_backward: dbias needs bias"),
    (lambda: lib.ortcpu_gemm_f32(0, 0, -1, 2, 2, 1.0, ffi.NULL, 2, ffi.NULL, 2, 0.0,
                                 ffi.NULL, 2),
     "gemm: negative size m=-1 n=2 k=2"),
])
def test_native_failures_become_kernel_errors(call, message):
    status = call()
    assert status == -1
    with pytest.raises(ortcpu_torch.KernelError) as ei:
        check_status(status, "SomeOp")
    assert str(ei.value) == f"SomeOp: INVALID_ARGUMENT: {message}"


def test_kernel_error_through_the_registry(monkeypatch):
    """A native failure inside a registry call surfaces as KernelError naming the op and
    the reason, and leaves the inputs alone. (Argument checks normally stop bad calls
    before native code, so the failure is forced with an op code the C side rejects.)"""
    monkeypatch.setitem(KA._ACT, "Relu", 42)
    x = torch.randn(5)
    before = x.clone()
    with pytest.raises(ortcpu_torch.KernelError,
                       match=r"^Relu: INVALID_ARGUMENT: act_forward: unknown activation op 42$"):
        K.Relu(x)
    with pytest.raises(ortcpu_torch.KernelError, match=r"^ReluGrad: INVALID_ARGUMENT: "):
        K.ReluGrad(x, x)
    assert torch.equal(x, before)


def test_last_error_is_per_thread():
    lib.ortcpu_act_forward_f32(77, ffi.NULL, ffi.NULL, 0, 0.0, 1)
    seen = {}

    def other():
        lib.ortcpu_softmax_forward_f32(ffi.NULL, ffi.NULL, -1, 1, 1, 0, 1)
        seen["other"] = ffi.string(lib.ortcpu_last_error()).decode()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["other"] == "softmax_forward: sizes must be >= 0"
    assert ffi.string(lib.ortcpu_last_error()).decode() == "act_forward: unknown activation op 77"


def test_ptr_bridge():
    assert ptr(None) == ffi.NULL
    x = torch.arange(6, dtype=torch.float64)
    p = ptr(x[2:])  # honours the storage offset
    assert ffi.typeof(p) is ffi.typeof("double *")
    assert p[0] == 2.0 and p[3] == 5.0
    assert ffi.typeof(ptr(x.float())) is ffi.typeof("float *")
    assert bridge.native_fn("gelu_forward", torch.float64) is lib.ortcpu_gelu_forward_f64
