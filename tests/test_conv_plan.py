"""The conv front end's per-signature plans (ops/conv.py): a repeated call runs the checked
plan of its signature without checking again; a call of any other signature (shape,
dtype, attribute spelling, device, bias) is checked afresh, so bad input still raises a
clear error after a good call of a similar signature was cached."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ortcpu_torch import ops
from ortcpu_torch.ops import conv as OC


def _check(x, w, b, **kw):
    y = ops.conv2d(x, w, b, **kw)
    torch.testing.assert_close(y, F.conv2d(x, w, b, **kw), rtol=1e-5, atol=1e-5)
    return y


def test_repeated_calls_reuse_one_plan_and_stay_correct():
    x, w, b = torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3), torch.randn(4)
    OC._PLANS.clear()
    _check(x, w, b, stride=(2, 2), padding=(1, 1))
    assert len(OC._PLANS) == 1
    (plan,) = OC._PLANS.values()
    for _ in range(3):
        _check(torch.randn(2, 3, 9, 9), w, b, stride=(2, 2), padding=(1, 1))
    assert list(OC._PLANS.values()) == [plan]
    # a non-contiguous input of the same shape: copied, not misread
    xt = torch.randn(2, 3, 9, 9).transpose(2, 3)
    _check(xt, w, b, stride=(2, 2), padding=(1, 1))
    # another shape, dtype or attribute: its own plan
    _check(torch.randn(1, 3, 9, 9), w, b, stride=(2, 2), padding=(1, 1))
    _check(x, w, None, stride=(2, 2), padding=(1, 1))
    _check(x.double(), w.double(), b.double(), stride=(2, 2), padding=(1, 1))
    assert len(OC._PLANS) == 4


def test_gradients_through_a_cached_plan():
    w = torch.randn(4, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        x = torch.randn(3, 2, 6, 5, dtype=torch.float64, requires_grad=True)
        torch.autograd.gradcheck(lambda x, w, b: ops.conv2d(x, w, b, 1, 1), (x, w, b))
    # unbatched input after batched ones of the same channels
    xu = torch.randn(2, 6, 5, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x, w, b: ops.conv2d(x, w, b, 1, 1), (xu, w, b))


@pytest.mark.parametrize("bad,kw,err,msg", [
    ("stride_bool", dict(stride=(True, True)), ValueError, "stride"),
    ("groups_bool", dict(groups=True), ValueError, "groups"),
    ("dtype", dict(), TypeError, "dtype"),
    ("bias_shape", dict(), ValueError, "B must be 1-D"),
    ("meta", dict(), TypeError, "CPU tensor"),
    ("channels", dict(), ValueError, "W.shape\\[1\\]"),
])
def test_bad_input_after_a_cached_good_call(bad, kw, err, msg):
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    _check(x, w, b, stride=(1, 1))  # cached
    _check(x, w, b, stride=1, groups=1)
    args = {"input": x, "weight": w, "bias": b}
    if bad == "dtype":
        args["weight"] = w.double()
    elif bad == "bias_shape":
        args["bias"] = torch.randn(5)
    elif bad == "meta":
        args["input"] = torch.empty(2, 3, 8, 8, device="meta")
    elif bad == "channels":
        args["input"] = torch.randn(2, 4, 8, 8)
    before = {k: v.clone() for k, v in args.items() if v.device.type == "cpu"}
    with pytest.raises(err, match=msg):
        ops.conv2d(**args, **({"stride": (1, 1)} | kw))
    for k, v in before.items():
        assert torch.equal(args[k], v)


def test_list_attributes_are_checked_every_call():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    n = len(OC._PLANS)
    _check(x, w, None, stride=[1, 1], padding=[1, 1])
    _check(x, w, None, stride=[1, 1], padding=[1, 1])
    assert len(OC._PLANS) == n  # unhashable spelling: no plan kept, still correct
    with pytest.raises(ValueError, match="padding"):
        ops.conv2d(x, w, None, padding=[-1, 1])
