"""Bad input to every registry op, every ``ortcpu_torch.ops`` front end and the ``nn``
modules: random, mostly wrong arguments (tensors of the wrong
dtype, rank or size, empty or 0-d tensors, NaN, tensors where an attribute belongs,
strings, lists, None) must raise TypeError, ValueError or KernelError, never anything
else and never crash, and must leave the caller's tensors as they were. Seeded, so a
failure reproduces; the cases at the top are the ones this fuzzing first found."""

from __future__ import annotations

import inspect
import random

import pytest
import torch

from ortcpu_torch import kernels as K
from ortcpu_torch import nn, ops
from ortcpu_torch._native import KernelError

# IndexError: the torch-signature front ends raise what torch raises (embedding's
# out-of-range index, negative ones included)
ALLOWED = (TypeError, ValueError, IndexError, KernelError)
# Send / Recv need an MPI peer (tests/distributed)
OPS = [n for n in K.names() if n not in ("Send", "Recv")]


def _value(rng: random.Random):
    shape = [rng.choice([0, 1, 1, 2, 3, 5]) for _ in range(rng.randrange(0, 5))]
    kind = rng.randrange(12)
    if kind == 0:
        return None
    if kind == 1:
        return rng.randint(-3, 6)
    if kind == 2:
        return rng.choice([0.0, -1.0, 0.5, float("nan"), float("inf")])
    if kind == 3:
        return [rng.randint(-3, 6) for _ in range(rng.randrange(0, 4))]
    if kind == 4:
        return rng.choice(["mean", "none", "forward", "NOTSET", "SAME_UPPER", "x"])
    if kind == 5:
        return torch.randint(-3, 6, shape, dtype=rng.choice([torch.int64, torch.int32]))
    if kind == 6:
        return torch.rand(shape) > 0.5
    if kind == 7:
        return torch.randn(shape, dtype=torch.float64)
    t = torch.randn(shape)
    if kind == 8 and t.numel():
        t.view(-1)[0] = float("nan")
    if kind == 9 and t.dim() > 1:
        t = t.transpose(0, -1)
    return t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.nan_to_num() if a.is_floating_point() else a,
        b.nan_to_num() if b.is_floating_point() else b)


def _fuzz(name: str, f, calls: int = 40) -> None:
    params = inspect.signature(f).parameters.values()
    positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    keyword = [p for p in params if p.kind is p.KEYWORD_ONLY and p.name != "generator"]
    rng = random.Random(name)
    torch.manual_seed(len(name))
    for _ in range(calls):
        # optional positionals are sometimes left at their defaults
        n = len(positional)
        while n and positional[n - 1].default is not inspect.Parameter.empty \
                and rng.random() < 0.3:
            n -= 1
        args = [_value(rng) for _ in positional[:n]]
        if variadic:
            args += [_value(rng) for _ in range(rng.randrange(0, 3))]
        kwargs = {p.name: _value(rng) for p in keyword
                  if p.default is inspect.Parameter.empty or rng.random() < 0.5}
        before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
        try:
            f(*args, **kwargs)
        except ALLOWED:
            for a, b in zip(args, before, strict=True):
                if b is not None:
                    assert _same(a, b), f"{name} changed an input before raising"
        except Exception as e:  # noqa: BLE001 -- the point: nothing else may escape
            pytest.fail(f"{name}{tuple(type(a).__name__ for a in args)} {kwargs!r:.200} "
                        f"raised {type(e).__name__}: {e}")


@pytest.mark.parametrize("op", OPS)
def test_registry_random_bad_arguments(op):
    _fuzz(op, K.get(op))


@pytest.mark.parametrize("name", ops.__all__)
def test_ops_random_bad_arguments(name):
    _fuzz(name, getattr(ops, name))


_MODULES = {
    "GELU": lambda: nn.GELU(), "LeakyReLU": lambda: nn.LeakyReLU(),
    "Softmax": lambda: nn.Softmax(1), "LogSoftmax": lambda: nn.LogSoftmax(-1),
    "LayerNorm": lambda: nn.LayerNorm(3), "RMSNorm": lambda: nn.RMSNorm(3),
    "BatchNorm1d": lambda: nn.BatchNorm1d(3), "BatchNorm2d": lambda: nn.BatchNorm2d(3),
    "BatchNorm3d": lambda: nn.BatchNorm3d(3), "CrossEntropyLoss": lambda: nn.CrossEntropyLoss(),
    "Dropout": lambda: nn.Dropout(0.3), "Conv1d": lambda: nn.Conv1d(3, 2, 3),
    "Conv2d": lambda: nn.Conv2d(3, 2, 3), "Conv3d": lambda: nn.Conv3d(3, 2, 2),
    "MaxPool2d": lambda: nn.MaxPool2d(2), "AvgPool2d": lambda: nn.AvgPool2d(2),
    "AdaptiveAvgPool2d": lambda: nn.AdaptiveAvgPool2d(1), "Linear": lambda: nn.Linear(3, 2),
    "Embedding": lambda: nn.Embedding(5, 3), "LSTM": lambda: nn.LSTM(3, 2),
    "GRU": lambda: nn.GRU(3, 2, batch_first=True),
}


@pytest.mark.parametrize("name", sorted(_MODULES))
def test_nn_modules_random_bad_inputs(name):
    module = _MODULES[name]()
    rng = random.Random(name)
    torch.manual_seed(len(name))
    for _ in range(40):
        args = [_value(rng) for _ in range(2 if name == "CrossEntropyLoss" else 1)]
        try:
            module(*args)
        except ALLOWED:
            pass
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"nn.{name}{tuple(type(a).__name__ for a in args)} raised "
                        f"{type(e).__name__}: {e}")


x4 = torch.randn(2, 3, 4, 4)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: K.Gemm(torch.randn(2, 3), torch.randn(3, 4), transA=torch.tensor([0.0, 1.0])),
     TypeError, "transA must be an integer scalar"),
    (lambda: K.Gemm(torch.randn(2, 3), torch.randn(3, 4), alpha=torch.ones(2)),
     TypeError, "alpha must be a float"),
    (lambda: K.BatchNormalization(x4, torch.ones(3), torch.zeros(3), torch.zeros(3),
                                  torch.ones(3), training_mode=torch.ones(3)),
     TypeError, "training_mode must be 0 or 1"),
    (lambda: K.Conv(torch.randn(4, 2, 3), torch.tensor(1.0), torch.randn(4)),
     ValueError, "W must have rank 3"),
    (lambda: K.LSTMTraining(torch.randn(2, 1, 3), torch.randn(1, 8, 3), torch.randn(1, 8, 2),
                            hidden_size=2, activations=torch.ones(1)),
     TypeError, "activations must be a list of names"),
    (lambda: K.IsAllFinite(torch.randn(3), isinf_only=torch.ones(2, dtype=torch.int64)),
     TypeError, "isinf_only must be an integer scalar"),
    (lambda: K.ReduceSumTraining(torch.randn(2, 3), [0], torch.ones(2)),
     TypeError, "keepdims must be an integer scalar"),
    (lambda: K.Dropout(torch.randn(4), needs=torch.ones(2, 2)),
     TypeError, "needs must be a sequence of 2 bools"),
    (lambda: K.MaxPool(x4, kernel_shape=[2, 2], needs=[True]),
     ValueError, "needs must have 2 entries"),
    (lambda: K.ConvGrad(torch.randn(2, 4, 2, 2), x4, torch.randn(4, 3, 3, 3), needs="dx"),
     TypeError, "needs must be a sequence of 3 bools"),
    (lambda: ops.dropout(torch.randn(4), 0.5, training=torch.ones(3)),
     TypeError, "training must be a bool"),
    (lambda: ops.softmax(torch.randn(4), 0, dtype=1), TypeError, "dtype must be a torch.dtype"),
    (lambda: ops.linear(torch.randn(2, 3), None), TypeError, "weight must be a torch.Tensor"),
    (lambda: ops.rms_norm(torch.randn(2, 3), (3,), [1.0, 1.0, 1.0]),
     TypeError, "weight must be a torch.Tensor or None"),
    (lambda: ops.batch_norm(x4, None, None, training=True, momentum=torch.ones(2)),
     TypeError, "momentum must be a float"),
    (lambda: nn.BatchNorm2d(3)([1.0]), TypeError, "BatchNorm2d: input must be a torch.Tensor"),
])
def test_attribute_errors_name_the_attribute(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
