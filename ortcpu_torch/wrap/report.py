"""``report()``: what ran where in a wrapped model. Every module is accounted for
(swapped for ours, left on torch with the reason, excluded, or without a counterpart),
every routed functional (calls on ours / on torch and why), every other torch function
the forward called (by calling module class, with the reason it ran on torch), and, with
timing on, the share of forward and backward time on each side."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .policy import CHOSE_TORCH, RANDOM_TORCH, STATE_ATTR, Stats
from .routing import KernelMode, is_metadata
from .tables import FUNCTIONALS

_CHOSEN = (CHOSE_TORCH, RANDOM_TORCH)  # select's reasons: not fallbacks


@dataclass
class Report:
    """What ``report()`` found; ``str(report)`` is the printed text.

    ``modules``: swapped modules (dicts: name, type, ours, calls_ours, calls_torch,
    reasons). ``skipped``: modules left on torch with the reason (name, type, reason).
    ``no_counterpart``: class path -> qualified names of the modules ortcpu_torch has
    nothing for (their forward's own code runs on torch; what it calls is in
    ``torch_functions``). ``functionals``: routed functionals (name, calls_ours,
    calls_torch, reasons). ``torch_functions``: every other torch function the forward
    called (name, calls, reason, modules: calling module class paths), views and metadata
    reads included (``metadata``: True); the calls inside a swapped module that
    ``select`` ran on torch are not listed (they run without the kernel mode: the
    module's own entry counts them as its torch calls). ``timing``: None, or ms per side and phase.
    ``selection``: the side chosen per input signature under ``select="fastest"``
    (``wrap(model, select=report.selection)`` replays it); ``choices`` adds the timings.
    ``model_check``: select's in-model check (``wrap/model_check.py``), None until it
    decided: {"outcome": "kept the selection" | "all torch" | "nothing ran ours",
    "steps_per_arm", "selected_ms", "torch_ms"} (median step times of the two arms)."""

    fallback: str
    modules: list
    skipped: list
    no_counterpart: dict
    functionals: list
    torch_functions: list
    functionals_available: list  # names routable in this build
    functionals_missing: list  # names whose op is not in this build
    optimizer: str | None
    timing: dict | None = None
    selection: dict | None = None  # signature -> "ours" | "torch" (wrap(select=...))
    choices: dict | None = None  # signature -> {"side", "ours_ms", "torch_ms"}
    text: str = ""
    graph: dict | None = None  # ORTModule: ``ORTModule.report_data()``
    # torch.compile: {"routed": functionals run as ortcpu:: ops in a compiled graph,
    # "traced_ops": ortcpu:: ops traced into compiled graphs in this process}
    compiled: dict | None = None
    # root forwards {"counted", "uncounted", "signatures", "plans": {kind: signatures}}:
    # functionals' and torch functions' calls are counted on the "counted" ones only
    forwards: dict | None = None
    model_check: dict | None = None

    def __str__(self) -> str:
        return self.text

    @property
    def torch_side(self) -> set:
        """Names of everything that ran on torch: class paths of modules (left on torch,
        without counterpart) and names of functions (with at least one torch call)."""
        out = {d["type"] for d in self.skipped} | set(self.no_counterpart)
        out |= {d["name"] for d in self.torch_functions}
        out |= {d["name"] for d in self.functionals if d["calls_torch"]}
        out |= {d["type"] for d in self.modules if d["calls_torch"]}
        return out


def _reasons(stats: Stats) -> dict:
    return stats.reason_counts()


def _names(names: list, k: int = 3) -> str:
    if len(names) == 1:
        return names[0]
    return f"{len(names)}x: {', '.join(names[:k])}{', ...' if len(names) > k else ''}"


def _torch_functions(state) -> list:
    by: dict[tuple, dict] = {}
    for (name, where, why), n in state.torch_calls.items():
        d = by.setdefault((name, why), {"name": name, "calls": 0, "reason": why,
                                        "modules": [], "metadata": is_metadata(name)})
        d["calls"] += n
        if where not in d["modules"]:
            d["modules"].append(where)
    return sorted(by.values(), key=lambda d: (d["metadata"], -d["calls"], d["name"]))


def _timing(state) -> dict:
    t = state.times
    ms = {ph: {s: v / 1e6 for s, v in t[ph].items()} for ph in t}
    tot = {s: ms["forward"][s] + ms["backward"][s] for s in ("ours", "torch")}
    ms["total"] = tot
    all_ms = tot["ours"] + tot["torch"]
    ms["ours_share"] = tot["ours"] / all_ms if all_ms else 0.0
    return ms


def report(model, file="stdout", timing: bool = False) -> Report:
    """Print (to ``file``, default ``sys.stdout``; None: do not print) and return what ran
    where in a wrapped ``model`` (or a ``kernels_enabled()`` context): the modules swapped
    for ours, the modules left on torch and why, the routed functionals (calls on ours /
    on torch and why), every other torch function its forward called (by calling module
    class), and what happened to the optimizer.

    ``timing=True``: also the forward and backward time on each side, measured since
    timing was turned on (``wrap(..., timing=True)``); if it was off, it is turned on now
    and the next report has the figures."""
    from ..graph.ortmodule import ORTModule

    if isinstance(model, ORTModule):
        return _emit(_ortmodule_report(model), file)
    if isinstance(model, KernelMode):
        state = model.state
    else:
        state = getattr(model, "__dict__", {}).get(STATE_ATTR)
        if state is None:
            raise ValueError("report: this model is not wrapped (call ortcpu_torch.wrap or "
                             "ortcpu_torch.optimize first)")
    mods = [{"name": q, "type": d["type"], "ours": f"ortcpu_torch.nn.{d['ours'].__name__}",
             "calls_ours": d["stats"].ours, "calls_torch": d["stats"].torch,
             "reasons": _reasons(d["stats"])} for q, d in state.modules.items()]
    skipped = [{"name": q, "type": t, "reason": r} for q, t, r in state.skipped]
    funcs = [{"name": n, "calls_ours": s.ours, "calls_torch": s.torch, "reasons": _reasons(s)}
             for n, s in state.funcs.items()]
    tfuncs = _torch_functions(state)
    avail = [e.name for e in FUNCTIONALS if e.ours() is not None]
    missing = [e.name for e in FUNCTIONALS if e.ours() is None]
    lines = [f"ortcpu_torch.wrap report (fallback={state.fallback!r})"]
    fwd = None if isinstance(model, KernelMode) else _forwards(state)
    if fwd is not None:
        lines.append(fwd.pop("line"))
    if mods:
        lines.append("modules swapped for ortcpu_torch.nn counterparts (calls: ours / torch):")
        for d in mods:
            lines.append(f"  {d['name']:<28} {d['type']} -> {d['ours']}  "
                         f"{d['calls_ours']} / {d['calls_torch']}")
            lines.extend(f"      {'on torch' if msg in _CHOSEN else 'fell back'} {n}x: {msg}"
                         for msg, n in d["reasons"].items())
    elif not isinstance(model, KernelMode):
        lines.append("modules swapped: none")
    if skipped:
        lines.append("modules left on torch:")
        grouped: dict[tuple, list] = {}
        for d in skipped:
            grouped.setdefault((d["type"], d["reason"]), []).append(d["name"] or "(root)")
        for (t, r), names in grouped.items():
            lines.append(f"  {t} ({_names(names)}): {r}")
    if state.no_counterpart:
        lines.append("modules with no ortcpu_torch counterpart (their own code runs on torch; "
                     "the torch functions they call are listed below):")
        for path, names in sorted(state.no_counterpart.items()):
            lines.append(f"  {path} ({_names(names)})")
    if funcs:
        lines.append("functionals routed to ortcpu_torch.ops (calls: ours / torch):")
        for d in funcs:
            lines.append(f"  {d['name']:<28} {d['calls_ours']} / {d['calls_torch']}")
            lines.extend(f"      on torch {n}x: {msg}" for msg, n in d["reasons"].items())
    else:
        lines.append("functionals routed during forward: none called so far")
    compute = [d for d in tfuncs if not d["metadata"]]
    meta = [d for d in tfuncs if d["metadata"]]
    if compute:
        lines.append("torch functions that ran on torch (calls; reason; called from):")
        for d in compute:
            lines.append(f"  {d['name']:<28} {d['calls']}; {d['reason']}; "
                         f"{', '.join(d['modules'][:3])}"
                         f"{', ...' if len(d['modules']) > 3 else ''}")
    if meta:
        names = sorted({d["name"] for d in meta})
        lines.append(f"views and metadata reads on torch (no arithmetic): "
                     f"{sum(d['calls'] for d in meta)} calls of {len(names)} functions "
                     f"({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})")
    lines.append("functionals routable in this build: " + (", ".join(avail) or "none"))
    if missing:
        lines.append("not yet in this build (run on torch): " + ", ".join(missing))
    if state.optimizer is not None:
        lines.append(f"optimizer: {state.optimizer}")
    if state.choices:
        n_t = sum(c["side"] == "torch" for c in state.choices.values())
        lines.append(f"select={state.select!r}: {len(state.choices)} signatures chosen, "
                     f"{n_t} run on torch (forward+backward CPU ms ours / torch):")
        for k, c in state.choices.items():
            ms = "random op" if c.get("random") else "model check" if c.get("model_check") \
                else "given" if c["ours_ms"] is None \
                else f"{c['ours_ms']:.3f} / {c['torch_ms']:.3f}"
            lines.append(f"  {c['side']:<5} {ms:<18} {k}")
    else:
        lines.append(f"select={state.select!r}")
    check = state.model_check
    if check is not None and check["selected_ms"] is not None:
        lines.append("in-model check ({} steps per arm, median step ms): selection {:.2f}, all "
                     "torch {:.2f}: {}".format(check["steps_per_arm"], check["selected_ms"],
                                               check["torch_ms"], check["outcome"]))
    elif state.check is not None and state.choices:
        lines.append("in-model check: not done yet (it alternates selection and all-torch "
                     "steps once the choices settle)")
    compiled = _compiled(state)
    lines.append(compiled.pop("line"))
    tim = None
    if timing:
        if not state.timing:
            state.timing = True
            lines.append("timing: was off, on from now (report again after some steps)")
        else:
            tim = _timing(state)
            lines.append("time (ms) on ours / torch: forward {:.2f} / {:.2f}, backward "
                         "{:.2f} / {:.2f}; ours {:.0%} of forward+backward".format(
                             tim["forward"]["ours"], tim["forward"]["torch"],
                             tim["backward"]["ours"], tim["backward"]["torch"],
                             tim["ours_share"]))
    rep = Report(state.fallback, mods, skipped, dict(state.no_counterpart), funcs, tfuncs,
                 avail, missing, state.optimizer, tim,
                 {k: c["side"] for k, c in state.choices.items()},
                 {k: dict(c) for k, c in state.choices.items()}, "\n".join(lines),
                 compiled=compiled, forwards=fwd,
                 model_check=None if state.model_check is None else dict(state.model_check))
    return _emit(rep, file)


def _forwards(state) -> dict:
    """How many root forwards the call counts of functionals and torch functions cover
    (``census.py``: the first forward of each input signature is counted, later ones run
    by its plan, uncounted; swapped modules count every call)."""
    counted, uncounted = state.forwards
    plans: dict[str, int] = {}
    for p in state.plans.values():
        plans[p.kind] = plans.get(p.kind, 0) + 1
    kinds = {"none": "no torch function mode", "patch": "functional attributes patched",
             "lean": "a routing-only mode"}
    line = (f"forwards: {counted} counted, {uncounted} uncounted. Calls of functionals and "
            "torch functions below are counted on the counted forwards only: the first "
            "forward of each input signature (tensor shapes/dtypes, training flag), and "
            "every forward while timing is on; later forwards of a signature run the same "
            "routing uncounted (swapped modules count every call)")
    if plans:
        line += "; steady state of the " + ", ".join(
            f"{n} signature{'s' if n > 1 else ''}: {kinds[k]}" for k, n in plans.items())
    return {"counted": counted, "uncounted": uncounted, "signatures": len(state.plans),
            "plans": plans, "line": line}


def _compiled(state) -> dict:
    """What a compiled graph of this model runs on ours (``wrap(compile_kernels=...)``)."""
    from ..ops.library import TRACED
    from .compiled import routed_names

    routed = routed_names(state) if getattr(state, "compile_kernels", ()) else []
    traced = sorted(TRACED)
    if routed:
        line = ("under torch.compile: the " + ", ".join(state.compile_kernels) + " calls ("
                + ", ".join(routed[:4]) + ", ...; swapped modules included) run as ortcpu:: "
                "ops in the compiled graph (under select='fastest' their linear and conv ops run "
                "ours or ATen's kernel per input signature, timed on the first call; "
                "ours always under select='ours'); everything "
                "else in it is torch's (Inductor); "
                "ortcpu:: ops traced into compiled graphs so far in this process: "
                + (", ".join(traced) or "none") + "; calls in compiled graphs are not "
                "counted here")
    else:
        line = ("under torch.compile (compile_kernels='torch') the compiled graph is "
                "torch's; calls in it are not counted here")
    return {"routed": routed, "traced_ops": traced, "line": line}


def _emit(rep: Report, file) -> Report:
    if file is not None:
        print(rep.text, file=sys.stdout if file == "stdout" else file)
    return rep


def _op_line(ops: dict) -> str:
    return ", ".join(f"{k} x{c['kernel'] + c['torch']}" for k, c in sorted(ops.items()))


def _ortmodule_report(om) -> Report:
    """The Report of an ORTModule (``ORTModule.report_data()`` as text)."""
    data = om.report_data()
    name = data["module"].rsplit(".", 1)[-1]
    lines = [f"ortcpu_torch.ORTModule report ({name}, fallback={data['fallback_policy']!r})"]
    skipped = []
    if data["fallback"] is not None:
        skipped.append({"name": "", "type": data["module"], "reason": data["fallback"]})
        lines.append(f"fell back: {name} runs in eager torch: {data['fallback']}")
    elif not data["signatures"]:
        lines.append(f"{name}: not run yet (captured on the first call)")
    for k, sig in enumerate(data["signatures"]):
        lines.append(f"signature {k} [{sig['mode']}]: graph-wide, captured {sig['captured_nodes']}"
                     f" nodes, backward {sig['backward_nodes']} nodes, "
                     f"{sig['parameters_with_grad']} parameters with gradients"
                     + ("; TensorBoard summaries on" if sig["summaries"] else ""))
        if sig["training_fusions"]:
            counts: dict[str, int] = {}
            for f in sig["training_fusions"]:
                counts[f] = counts.get(f, 0) + 1
            lines.append("  training graph rewritten: " + "; ".join(
                f"{f} x{n}" for f, n in counts.items()))
        for part, p in sig["plans"].items():
            kernel = {o: c for o, c in p["ops"].items() if c["kernel"]}
            on_torch = {o: c for o, c in p["ops"].items() if c["torch"]}
            lines.append(f"  {part}: {p['nodes']} nodes run ({p['folded']} folded at plan "
                         f"time)")
            lines.append(f"    on our kernels: {_op_line(kernel) or 'none'}")
            lines.append(f"    on torch ops (ONNX long tail): {_op_line(on_torch) or 'none'}")
            lines.append(f"    fused: {'; '.join(p['fusions']) or 'nothing'}")
    return Report(data["fallback_policy"], [], skipped, {}, [], [], [], [], None,
                  text="\n".join(lines), graph=data)
