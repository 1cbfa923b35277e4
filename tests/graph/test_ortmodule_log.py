"""``ORTModule(log_dir=...)``: the training graph's summary nodes write the loss, the global
gradient norm and per-parameter gradient histograms every ``log_every`` steps; read back
with tensorboard's own event reader and compared with eager torch."""

from __future__ import annotations

import copy

import pytest
import torch

from ortcpu_torch import ORTModule

from .capture_models import make

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_loss_grad_norm_and_histograms_every_n_steps(tmp_path):
    model, args = make("cnn")
    ref = copy.deepcopy(model)
    om = ORTModule(model, log_dir=tmp_path, log_every=2)
    expected = {}
    for step in range(5):
        for m in (om, ref):
            m.zero_grad(set_to_none=True)
            torch.manual_seed(step)
            loss = m(*args)[0]
            loss.backward()
        if step % 2 == 0:
            grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
            norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
            expected[step] = (float(loss), float(norm), grads)
    om._log.writer.close()

    acc = event_accumulator.EventAccumulator(
        str(tmp_path), size_guidance={event_accumulator.SCALARS: 0,
                                      event_accumulator.HISTOGRAMS: 0})
    acc.Reload()
    tags = acc.Tags()
    assert set(tags["scalars"]) == {"loss", "grad_norm"}
    names = [n for n, _ in ref.named_parameters()]
    assert set(tags["histograms"]) == {f"gradients/{n}" for n in names}
    assert [e.step for e in acc.Scalars("loss")] == [0, 2, 4]
    for e in acc.Scalars("loss"):
        assert e.value == pytest.approx(expected[e.step][0], rel=1e-5)
    for e in acc.Scalars("grad_norm"):
        assert e.value == pytest.approx(expected[e.step][1], rel=1e-4)
    for n in names:
        events = acc.Histograms(f"gradients/{n}")
        assert [e.step for e in events] == [0, 2, 4]
        for e in events:
            g = expected[e.step][2][n]
            h = e.histogram_value
            assert h.num == g.numel()
            assert h.min == pytest.approx(float(g.min()), abs=1e-6)
            assert h.max == pytest.approx(float(g.max()), abs=1e-6)
            # the sum can cancel to ~0 (BN makes some gradients sum to zero): bound its error
            # by the float32 rounding of the elements, not by the sum itself
            err = 1e-5 * float(g.double().abs().sum()) + 1e-6
            assert h.sum == pytest.approx(float(g.double().sum()), rel=1e-3, abs=err)
            assert sum(h.bucket) == g.numel()


def test_log_every_checked_and_no_log_dir_means_no_summary_nodes(tmp_path):
    model, args = make("mlp")
    with pytest.raises(ValueError, match="log_every"):
        ORTModule(model, log_dir=tmp_path, log_every=0)
    om = ORTModule(model)
    om(*args)[0].backward()
    (entry,) = om._cache.values()
    ops = {n.op_type for n in entry.training_model.graph.node}
    assert not ops & {"SummaryScalar", "SummaryHistogram", "SummaryMerge"}
    assert entry.backward_logged is None and om._log is None
