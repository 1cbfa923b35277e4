"""Shared harness of the model tests: the same model trained three ways from the same
initial weights and batches — plain torch float32, plain torch float64 (the reference),
and ``ortcpu_torch.optimize()`` float32 — with AdamW. Ours must stay within torch's own
float32 drift from the float64 run (ours is not compared with torch float32 directly:
both round differently, and on a long run both drift from the exact result)."""

from __future__ import annotations

import copy
import warnings

import torch

import ortcpu_torch
from ortcpu_torch.wrap import Report

STEPS = 20


def drift_bound(ours, torch32, exact, slack: float = 4.0, floor: float = 1e-6) -> tuple:
    """(ours' max deviation from ``exact``, the bound ``slack`` x torch float32's + floor
    relative to the scale)."""
    exact = torch.as_tensor(exact, dtype=torch.float64)
    ours = torch.as_tensor(ours, dtype=torch.float64)
    torch32 = torch.as_tensor(torch32, dtype=torch.float64)
    scale = max(1.0, float(exact.abs().max())) if exact.numel() else 1.0
    err_o = float((ours - exact).abs().max()) if exact.numel() else 0.0
    err_t = float((torch32 - exact).abs().max()) if exact.numel() else 0.0
    return err_o, slack * err_t + floor * scale


def assert_within_drift(what: str, ours, torch32, exact, **kw) -> None:
    err, bound = drift_bound(ours, torch32, exact, **kw)
    assert err <= bound, f"{what}: ours deviates {err:.3g} from float64, bound {bound:.3g} " \
                         f"(torch float32: {drift_bound(torch32, torch32, exact)[0]:.3g})"


def train_three_ways(build, batches, loss_fn, *, lr=1e-3, steps=STEPS):
    """Train ``build()`` three ways; returns dict side -> (model, losses); side in
    "ours", "torch32", "torch64". ``loss_fn(model, batch)`` returns the scalar loss;
    float batch tensors are cast to float64 for the float64 run."""
    torch.manual_seed(0)
    base = build()
    models = {"ours": copy.deepcopy(base), "torch32": copy.deepcopy(base),
              "torch64": copy.deepcopy(base).double()}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=lr) for k, m in models.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ortcpu_torch.FallbackWarning)
        # select="ours": every supported call on our kernels, the same placement in every
        # run (the default "fastest" decides by timing, which varies on a loaded machine)
        models["ours"], opts["ours"] = ortcpu_torch.optimize(models["ours"], opts["ours"],
                                                             select="ours")
    assert isinstance(opts["ours"], ortcpu_torch.optim.AdamW)
    losses = {k: [] for k in models}
    for i in range(steps):
        batch = batches[i % len(batches)]
        for k, m in models.items():
            b = [t.double() if k == "torch64" and t.is_floating_point() else t for t in batch]
            opts[k].zero_grad(set_to_none=True)
            loss = loss_fn(m, b)
            loss.backward()
            opts[k].step()
            losses[k].append(loss.item())
    return {k: (models[k], losses[k]) for k in models}


def check_training(runs, *, slack: float = 4.0, floor: float = 1e-6,
                   param_floor: float = 1e-5) -> None:
    """Loss curve within ``slack`` x torch float32's drift + ``floor``; parameters and
    buffers with ``param_floor``: AdamW divides by sqrt(v), so a parameter whose gradient
    is near zero moves by ~lr whatever its float32 rounding, and one rounding difference
    in such a gradient moves it by up to ~1e-5 of its scale over 20 steps."""
    (_, lo), (_, lt), (_, lx) = runs["ours"], runs["torch32"], runs["torch64"]
    assert_within_drift("loss curve", lo, lt, lx, slack=slack, floor=floor)
    floor = param_floor
    assert lo[-1] < lo[0], f"ours did not train: {lo[0]} -> {lo[-1]}"
    named = {k: dict(m.named_parameters()) for k, (m, _) in runs.items()}
    for n, p in named["ours"].items():
        assert_within_drift(f"parameter {n}", p.detach(), named["torch32"][n].detach(),
                            named["torch64"][n].detach(), slack=slack, floor=floor)
    bufs = {k: dict(m.named_buffers()) for k, (m, _) in runs.items()}
    for n, b in bufs["ours"].items():  # BatchNorm running statistics
        if b.is_floating_point():
            assert_within_drift(f"buffer {n}", b, bufs["torch32"][n], bufs["torch64"][n],
                                slack=slack, floor=floor)
        else:
            assert torch.equal(b, bufs["torch32"][n]), n


def check_eval(runs, forward, *, slack: float = 4.0, floor: float = 1e-6) -> torch.Tensor:
    """Eval-mode outputs of the three runs on ``forward``'s batch, ours within drift;
    returns ours."""
    outs = {}
    for k, (m, _) in runs.items():
        m.eval()
        with torch.no_grad():
            outs[k] = forward(m, torch.float64 if k == "torch64" else torch.float32)
        m.train()
    assert_within_drift("eval output", outs["ours"], outs["torch32"], outs["torch64"],
                        slack=slack, floor=floor)
    return outs["ours"]


def check_state_dict_round_trip(runs, build, forward) -> None:
    """The wrapped model's state_dict has the plain model's keys and loads into a fresh
    plain model, which then computes (on torch) what the wrapped one computes."""
    ours = runs["ours"][0]
    sd = ours.state_dict()
    assert list(sd) == list(runs["torch32"][0].state_dict())
    fresh = build()
    fresh.load_state_dict(sd)
    ours.eval()
    fresh.eval()
    with torch.no_grad():
        torch.testing.assert_close(forward(fresh, torch.float32), forward(ours, torch.float32),
                                   rtol=1e-4, atol=1e-5)
    ours.train()


def check_report(model) -> Report:
    """Every module of ``model`` is accounted for (swapped, left on torch with a reason, or
    without a counterpart) with class paths, and every torch function it called is listed
    with the module class that called it."""
    rep = ortcpu_torch.report(model, file=None)
    listed = {d["name"] for d in rep.modules} | {d["name"] or "(root)" for d in rep.skipped}
    listed |= {q for names in rep.no_counterpart.values() for q in names}
    inside_excluded = {q for q, _ in model.named_modules()
                       if any(q.startswith(d["name"] + ".") for d in rep.skipped
                              if d["reason"].startswith("excluded"))}
    every = {q or "(root)" for q, _ in model.named_modules()} - inside_excluded
    assert every <= listed, f"modules not in the report: {sorted(every - listed)}"
    for path in rep.no_counterpart:
        assert "." in path and not path.startswith("torch.nn.modules"), path
    for d in rep.torch_functions:
        assert d["calls"] > 0 and d["reason"] and d["modules"], d
    return rep
