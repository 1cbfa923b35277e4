"""An ``onnx.backend.base.Backend`` over the executor, for ONNX's backend test suite
(``onnx.backend.test.BackendTest``) and for code written against that interface."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.backend.base as base

from .session import InferenceSession


class ExecutorRep(base.BackendRep):
    def __init__(self, session: InferenceSession):
        self.session = session
        self._names = [i.name for i in session.get_inputs()]

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feed = inputs
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feed = dict(zip(self._names, inputs, strict=False))
        return self.session.run(None, {k: np.asarray(v) if not isinstance(v, list) else v
                                       for k, v in feed.items()})


class ExecutorBackend(base.Backend):
    """``prepare(model)`` builds an ``InferenceSession``; CPU only."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        return ExecutorRep(InferenceSession(model))

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)
