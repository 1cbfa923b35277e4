"""The in-model check of ``select="fastest"``: does the selection make the training step
faster than torch's everywhere?

``select`` times each op alone, and an op measured faster alone can make the step
slower: on an Intel Xeon, BERT's LayerNorm measured 17% faster alone (0.23 against
0.27 ms), yet the wrapped step ran 0.92-0.97x plain torch's over several runs, while
every choice put on torch brought it to 0.99x. What an op does to its neighbours (the
layout and cache state it leaves them) only shows in the whole step.

So once the choices have settled (no new signature for ``SETTLE`` training forwards of
the root), and if any of them is ours, the next ``2 * PAIRS`` training steps alternate
between the selection (arm "selected") and every call on torch (arm "torch"), timed
from one root forward's start to the next (the whole step: forward, backward,
optimizer, whatever the loop does between). The selection stays only if its median
step is at least ``MARGIN`` faster than the all-torch median; otherwise every choice
goes to torch for good (new signatures too, unmeasured) and the torch modules are put
back in place of the swapped ones (except those carrying hooks of the user's), so the
wrap is never slower than torch by its choices and costs almost nothing per call.
Steps are real training steps on either arm (both compute the same function), so
nothing is wasted but the slower arm's time. ``report()`` gives both medians and the
outcome. A new signature during the alternation (another input shape,
eval forwards) puts the selection back and starts the wait again.
"""

from __future__ import annotations

import statistics
import time

from .policy import INFO_ATTR
from .swap import restore_originals

SETTLE = 2  # training forwards with no new choice before the alternation starts
PAIRS = 6  # steps per arm
MARGIN = 0.01  # the selection must beat all-torch by this fraction of a step

_clock = time.perf_counter


class ModelCheck:
    """The check of one wrap (``State.check``; None once decided, or where ``select`` is
    not a fresh ``"fastest"``). ``tick(root)`` runs at the start of each training
    forward of the root."""

    def __init__(self, state):
        self.state = state
        self.known = 0  # len(state.choices) at the last tick
        self.quiet = 0
        self.arm = None  # "selected" | "torch" while alternating
        self.t0 = 0.0
        self.times: dict = {"selected": [], "torch": []}
        self.saved = None  # the selection's per-call tables while arm "torch" runs
        self.torch_tables = None

    def tick(self, root) -> None:
        state = self.state
        now = _clock()
        n = len(state.choices)
        if n != self.known:  # a new signature: (back to) waiting for the choices to settle
            self.known, self.quiet = n, 0
            if self.arm is not None:
                self._use(root, "selected")
                self.arm, self.times = None, {"selected": [], "torch": []}
                self.saved = self.torch_tables = None  # rebuilt with the new signature
            return
        if self.arm is None:
            self.quiet += 1
            if self.quiet < SETTLE:
                return
            if not any(c["side"] == "ours" for c in state.choices.values()):
                self._finish("nothing ran ours", None, None)
                return
            self.arm = "torch"
        else:
            self.times[self.arm].append(now - self.t0)
            if len(self.times["selected"]) >= PAIRS and len(self.times["torch"]) >= PAIRS:
                self._decide(root)
                return
            self.arm = "selected" if self.arm == "torch" else "torch"
        self._use(root, self.arm)
        self.t0 = _clock()

    # -- the two arms -------------------------------------------------------------------

    def _infos(self, root):
        return [m.__dict__[INFO_ATTR] for m in root.modules() if INFO_ATTR in m.__dict__]

    def _use(self, root, arm: str) -> None:
        """Put the per-call tables of ``arm`` in place: the functionals' sides and each
        swapped module's sides and direct-call table (``swap.py``)."""
        state, infos = self.state, self._infos(root)
        if self.saved is None:
            self.saved = (state.sides, state.plans, [(i, i.sides, i.steady) for i in infos])
            # the census plans too: with nothing routed to ours, the all-torch arm's
            # forwards take no torch function mode and install no routers
            self.torch_tables = ({k: "torch" for k in state.sides}, {},
                                 [(i, {k: "torch" for k in i.sides}, dict(i.steady))
                                  for i in infos])
        sides, plans, per_module = self.saved if arm == "selected" else self.torch_tables
        state.sides, state.plans, state.torch_arm = sides, plans, arm == "torch"
        for info, s, steady in per_module:
            info.sides, info.steady = s, steady

    def _decide(self, root) -> None:
        sel = statistics.median(self.times["selected"])
        tor = statistics.median(self.times["torch"])
        if sel <= tor * (1.0 - MARGIN):
            self._use(root, "selected")
            self._finish("kept the selection", sel, tor)
            return
        # every choice to torch, for good: the tables of arm "torch" stay (its census plans
        # route nothing), new signatures go to torch, and the torch modules come back in
        # place of the swapped ones (no wrapper left on their calls; the report keeps
        # their record)
        self._use(root, "torch")
        state = self.state
        for c in state.choices.values():
            c["side"] = "torch"
        state.all_torch = True
        restore_originals(root, keep_hooked=True)  # a user's hooks stay where they are
        self._finish("all torch", sel, tor)

    def _finish(self, outcome: str, sel, tor) -> None:
        state = self.state
        state.model_check = {"outcome": outcome, "steps_per_arm": PAIRS if sel else 0,
                             "selected_ms": None if sel is None else sel * 1e3,
                             "torch_ms": None if tor is None else tor * 1e3}
        state.check = None
        self.saved = self.torch_tables = None
