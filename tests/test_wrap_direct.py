"""wrap/direct.py: torch's forward of a swapped module as one ATen call, for the calls
``select`` gave to torch. Each runner must do exactly what torch's module forward does:
outputs, input and parameter gradients, running statistics and counters, RNG use; and
decline (``NotImplemented``) what it does not cover, leaving no trace."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ortcpu_torch
from ortcpu_torch import report, wrap
from ortcpu_torch.wrap.direct import direct_forward
from ortcpu_torch.wrap.policy import INFO_ATTR


def _compare(module: nn.Module, *inputs, seed: int = 0):
    """Runner on a copy vs torch's forward on another copy: same outputs, gradients of
    inputs that need one and of parameters, same buffers afterwards."""
    run = direct_forward(module)
    assert run is not None
    a, b = copy.deepcopy(module), copy.deepcopy(module)
    ia = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    ib = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    torch.manual_seed(seed)
    ya = run(a, tuple(ia))
    assert ya is not NotImplemented
    torch.manual_seed(seed)
    yb = b(*ib)
    torch.testing.assert_close(ya, yb, rtol=0, atol=0)
    if yb.requires_grad:
        g = torch.randn_like(yb)
        ya.backward(g)
        yb.backward(g)
        for ta, tb in zip(ia, ib, strict=True):
            if tb.requires_grad:
                torch.testing.assert_close(ta.grad, tb.grad, rtol=0, atol=0)
        for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=n)
    for (n, p), q in zip(a.named_buffers(), b.buffers(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=n)


def _x(*shape):
    return torch.randn(*shape, requires_grad=True)


@pytest.mark.parametrize("m, shape", [
    (nn.Linear(5, 3), (4, 5)), (nn.Linear(5, 3, bias=False), (2, 7, 5)), (nn.Linear(1, 1), (1,)),
    (nn.GELU(), (3, 9)), (nn.GELU("tanh"), (2, 3, 5)),
    (nn.Conv1d(4, 6, 3, padding=1), (2, 4, 7)),
    (nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 9, 7)),
    (nn.Conv2d(3, 5, 3, padding="same", dilation=2, bias=False), (1, 3, 6, 6)),
    (nn.Conv2d(2, 4, 1), (2, 6, 6)),  # unbatched
    (nn.Conv3d(2, 3, 2), (1, 2, 4, 4, 3)),
    (nn.MaxPool1d(2), (2, 3, 9)), (nn.MaxPool2d(3, 2, 1, ceil_mode=True), (2, 3, 7, 8)),
    (nn.MaxPool2d(2, dilation=2), (1, 2, 9, 9)), (nn.MaxPool3d(2), (1, 2, 4, 5, 4)),
    (nn.LayerNorm(6), (3, 6)), (nn.LayerNorm([2, 3], elementwise_affine=False), (4, 2, 3)),
    (nn.LayerNorm(5, bias=False), (2, 3, 5)),
])
def test_stateless_runners_match_torch(m, shape):
    _compare(m, _x(*shape))


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.BatchNorm1d(4), (6, 4)),
    (lambda: nn.BatchNorm1d(4), (3, 4, 5)),
    (lambda: nn.BatchNorm2d(3), (2, 3, 4, 5)),
    (lambda: nn.BatchNorm2d(3, momentum=None), (2, 3, 1, 1)),
    (lambda: nn.BatchNorm2d(3, affine=False), (2, 3, 3, 3)),
    (lambda: nn.BatchNorm2d(3, track_running_stats=False), (2, 3, 3, 3)),
    (lambda: nn.BatchNorm3d(2), (2, 2, 3, 2, 2)),
    (lambda: nn.BatchNorm2d(3, dtype=torch.float64), (2, 3, 4, 4)),
])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_runner_matches_torch(make, shape, training):
    m = make().train(training)
    dtype = next(iter(m.buffers()), torch.zeros(())).dtype if m.track_running_stats \
        else torch.float32
    dtype = torch.float64 if any(p.dtype == torch.float64 for p in m.parameters()) else dtype
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    for _ in range(2):  # running statistics and the cumulative-average count move
        _compare(m, x)
        m(x.detach())


def test_batch_norm_runner_declines_what_torch_rejects_without_counting():
    m = nn.BatchNorm2d(3)
    run = direct_forward(m)
    assert run(m, (torch.randn(1, 3, 1, 1),)) is NotImplemented  # one value per channel
    assert run(m, (torch.randn(3, 4, 4),)) is NotImplemented  # wrong rank
    assert int(m.num_batches_tracked) == 0
    with pytest.raises(ValueError):
        m(torch.randn(1, 3, 1, 1))


def test_dropout_runner_matches_torch_with_the_same_rng():
    for p, inplace, training in ((0.3, False, True), (0.0, False, True), (1.0, False, True),
                                 (0.5, False, False), (0.4, True, True)):
        m = nn.Dropout(p, inplace=inplace).train(training)
        x = torch.randn(5, 7)
        ya, yb = x.clone(), x.clone()
        torch.manual_seed(3)
        oa = direct_forward(m)(m, (ya,))
        torch.manual_seed(3)
        ob = m(yb)
        torch.testing.assert_close(oa, ob, rtol=0, atol=0)
        torch.testing.assert_close(ya, yb, rtol=0, atol=0)  # in place or untouched alike
    m = nn.Dropout(0.5)
    m.p = 1.5
    assert direct_forward(m)(m, (torch.randn(3),)) is NotImplemented


@pytest.mark.parametrize("kwargs", [
    {}, {"reduction": "sum"}, {"reduction": "none"}, {"ignore_index": 2},
    {"label_smoothing": 0.1}, {"weight": torch.rand(5)},
])
def test_cross_entropy_runner_matches_torch(kwargs):
    m = nn.CrossEntropyLoss(**kwargs)
    target = torch.tensor([0, 2, 4, 1, 2, 3])
    _compare(m, _x(6, 5), target)
    if "ignore_index" not in kwargs:  # (torch refuses it with probability targets)
        _compare(m, _x(6, 5), torch.rand(6, 5).softmax(-1))  # probability targets


def test_runners_decline_configurations_torch_forward_treats_specially():
    conv = nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect")
    assert direct_forward(conv)(conv, (torch.randn(1, 2, 5, 5),)) is NotImplemented
    pool = nn.MaxPool2d(2, return_indices=True)
    assert direct_forward(pool)(pool, (torch.randn(1, 2, 4, 4),)) is NotImplemented
    ce = nn.CrossEntropyLoss()
    ce.reduction = "avg"
    assert direct_forward(ce)(ce, (torch.randn(2, 3), torch.tensor([0, 1]))) is NotImplemented
    lin = nn.Linear(2, 2)
    assert direct_forward(lin)(lin, (torch.randn(2), torch.randn(2))) is NotImplemented


def test_subclass_with_its_own_forward_keeps_it():
    class Doubled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    class Plain(nn.Linear):
        pass

    assert direct_forward(Doubled(2, 2)) is None
    assert direct_forward(Plain(2, 2)) is not None
    assert direct_forward(nn.ReLU()) is None  # no runner: the original forward runs


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.GELU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, 3))


def test_wrapped_model_on_torch_by_choice_trains_like_torch():
    """Every signature forced to torch: the swapped modules run the direct runners, and
    losses, gradients and BatchNorm statistics follow plain torch exactly."""
    torch.manual_seed(0)
    ref = _cnn()
    probe = wrap(copy.deepcopy(ref))
    probe(torch.randn(8, 1, 4, 4)).sum().backward()
    forced = {k: "torch" for k in report(probe, file=None).selection}
    m = wrap(copy.deepcopy(ref), select=forced, fallback="error")
    x, y = torch.randn(8, 1, 4, 4), torch.randint(0, 3, (8,))
    for step in range(3):
        for net in (m, ref):
            for p in net.parameters():
                p.grad = None
        torch.manual_seed(step)
        la = nn.functional.cross_entropy(m(x), y)
        torch.manual_seed(step)
        lb = nn.functional.cross_entropy(ref(x), y)
        torch.testing.assert_close(la, lb, rtol=0, atol=0)
        la.backward()
        lb.backward()
        for (n, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=n)
    for a, b in zip(m.buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    rep = report(m, file=None)
    assert all(d["calls_ours"] == 0 and d["calls_torch"] == 3 for d in rep.modules)
    used = [s.__dict__[INFO_ATTR].torch_direct for s in m.modules() if INFO_ATTR in s.__dict__]
    assert all(callable(r) for r in used)  # every swapped module here has a runner


def test_wrapped_outputs_on_torch_side_are_modifiable_in_place():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    probe = wrap(copy.deepcopy(net))
    probe(torch.randn(6, 4))
    m = wrap(net, select={k: "torch" for k in report(probe, file=None).selection})
    for _ in range(2):
        y = m(torch.randn(6, 4))
        y += 1
        y.relu_()
        y.sum().backward()


def test_swap_info_pickles_without_the_runner():
    import pickle

    m = wrap(nn.Sequential(nn.Linear(3, 3)), select="fastest")
    m(torch.randn(2, 3))
    m2 = pickle.loads(pickle.dumps(m))
    assert m2(torch.randn(2, 3)).shape == (2, 3)
    assert ortcpu_torch.report(m2, file=None) is not None
