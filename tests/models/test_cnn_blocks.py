"""ResNet- and MobileNetV3-style networks written the way torchvision writes them
(``torchvision_style.py``): torchvision itself has no CPU build for torch 2.13 on the
package index. Trained 20 AdamW steps under
``optimize()`` vs plain torch, within torch's own float32 drift from a float64 run,
BatchNorm statistics included; then DDP (gloo, 2 processes) around the wrapped model, and
autocast's documented fallback."""

from __future__ import annotations

import os
import socket
import warnings

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch

from ._train import (
    check_eval,
    check_report,
    check_state_dict_round_trip,
    check_training,
    train_three_ways,
)
from .torchvision_style import MobileNetV3Tiny, ResNetTiny


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    ortcpu_torch.set_num_threads(1)


def _batches(n=4):
    g = torch.Generator().manual_seed(3)
    return [[torch.randn(6, 3, 16, 16, generator=g), torch.randint(0, 5, (6,), generator=g)]
            for _ in range(n)]


def _loss(m, b):
    return F.cross_entropy(m(b[0]), b[1])


MODELS = {"resnet": ResNetTiny, "mobilenet_v3": MobileNetV3Tiny}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cnn_trains_like_torch(name):
    build = MODELS[name]
    data = _batches()
    runs = train_three_ways(build, data, _loss)
    check_training(runs)
    forward = lambda m, dtype: m(data[0][0].to(dtype))  # noqa: E731
    check_eval(runs, forward)
    check_state_dict_round_trip(runs, build, forward)
    rep = check_report(runs["ours"][0])
    swapped = {d["type"] for d in rep.modules}
    assert {"torch.nn.Conv2d", "torch.nn.BatchNorm2d", "torch.nn.Linear"} <= swapped
    assert all(d["calls_torch"] == 0 for d in rep.modules), rep.text


def test_autocast_keeps_its_documented_fallback():
    m = ortcpu_torch.wrap(ResNetTiny(), fallback="silent")
    x = torch.randn(2, 3, 16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    assert y.dtype == torch.bfloat16
    rep = ortcpu_torch.report(m, file=None)
    conv = next(d for d in rep.modules if d["name"] == "conv1")
    assert conv["calls_torch"] == 1 and "autocast" in next(iter(conv["reasons"]))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ortcpu_torch.wrap(ResNetTiny())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ortcpu_torch.wrap(ResNetTiny())(x)
    assert any(issubclass(x.category, ortcpu_torch.FallbackWarning) for x in w)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, world, port, out):
    """Both variants in one process group: DDP around the plain model, then around the
    wrapped one (same seed, same batch halves per rank)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        ortcpu_torch.set_num_threads(1)
        results = {}
        for wrapped in (False, True):
            torch.manual_seed(0)
            model = ResNetTiny()
            if wrapped:
                ortcpu_torch.wrap(model, fallback="error")
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
            losses = []
            for b in _batches(3):
                x, y = b[0][rank::world], b[1][rank::world]  # each rank its half
                opt.zero_grad()
                loss = _loss(ddp, [x, y])
                loss.backward()
                opt.step()
                losses.append(loss.item())
            results[wrapped] = {"losses": losses,
                                "params": [p.detach() for p in model.parameters()]}
        if rank == 0:
            torch.save(results, out)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow  # two spawned processes importing torch: ~30 s on a loaded 2-core box
def test_ddp_around_wrapped_model_trains_like_ddp_around_plain(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "ddp.pt"
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(out)), nprocs=2)
    results = torch.load(out)
    torch.testing.assert_close(results[True]["losses"], results[False]["losses"],
                               rtol=1e-4, atol=1e-5)
    for p, q in zip(results[True]["params"], results[False]["params"], strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
