"""Fixtures for the on-device training tests: artifacts written by onnxruntime-training
1.19.2's own ``generate_artifacts`` (the conformance extra), generated once per session."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

from . import models

ort_artifacts_module = pytest.importorskip("onnxruntime.training.artifacts")
ort_api = pytest.importorskip("onnxruntime.training.api")
pytest.importorskip("onnxruntime").set_default_logger_severity(3)  # ORT logs every pass


@dataclass
class Artifacts:
    """Paths of one artifact set."""

    folder: Path
    prefix: str = ""

    def path(self, what: str) -> str:
        return os.fspath(self.folder / f"{self.prefix}{what}")

    @property
    def train(self) -> str:
        return self.path("training_model.onnx")

    @property
    def eval(self) -> str:
        return self.path("eval_model.onnx")

    @property
    def optimizer(self) -> str:
        return self.path("optimizer_model.onnx")

    @property
    def checkpoint(self) -> str:
        return self.path("checkpoint")

    @property
    def nominal_checkpoint(self) -> str:
        return self.path("nominal_checkpoint")


def generate_with_ort(folder: Path, model: onnx.ModelProto, **kwargs) -> Artifacts:
    """ORT's generate_artifacts, then the one fix every ORT user needs with onnx >= 1.16:
    its optimizer model comes out with the installed onnx's IR version (14 with onnx 1.23),
    which ORT 1.19.2 itself refuses to load; it is set back to 10."""
    folder.mkdir(parents=True, exist_ok=True)
    logging.getLogger().setLevel(logging.WARNING)
    ort_artifacts_module.generate_artifacts(model, artifact_directory=os.fspath(folder), **kwargs)
    art = Artifacts(folder)
    if os.path.exists(art.optimizer):
        opt = onnx.load(art.optimizer)
        opt.ir_version = min(opt.ir_version, 10)
        onnx.save(opt, art.optimizer)
    return art


LOSS = ort_artifacts_module.LossType
OPTIM = ort_artifacts_module.OptimType


@pytest.fixture(scope="session")
def ort_mlp(tmp_path_factory) -> Artifacts:
    """MLP 20-32-10 + CrossEntropy + AdamW; fc2.bias frozen; "output" as extra output."""
    m = models.mlp()
    return generate_with_ort(tmp_path_factory.mktemp("ort_mlp"), m,
                             requires_grad=["fc1.weight", "fc1.bias", "fc2.weight"],
                             frozen_params=["fc2.bias"], loss=LOSS.CrossEntropyLoss,
                             optimizer=OPTIM.AdamW, additional_output_names=["output"],
                             nominal_checkpoint=True)


def _ort_cnn(tmp_path_factory, pool: bool) -> Artifacts:
    m = models.cnn(pool=pool)
    params = [p for p in models.parameter_names(m) if "running" not in p]
    return generate_with_ort(tmp_path_factory.mktemp("ort_cnn"), m, requires_grad=params,
                             loss=LOSS.CrossEntropyLoss, optimizer=OPTIM.SGD)


@pytest.fixture(scope="session")
def ort_cnn(tmp_path_factory) -> Artifacts:
    """Conv + BatchNorm + ReLU + Linear, CrossEntropy + SGD."""
    return _ort_cnn(tmp_path_factory, pool=False)


@pytest.fixture(scope="session")
def ort_cnn_maxpool(tmp_path_factory) -> Artifacts:
    """Conv + BatchNorm + ReLU + MaxPool + Linear, CrossEntropy + SGD."""
    return _ort_cnn(tmp_path_factory, pool=True)


@pytest.fixture(scope="session")
def ort_gru(tmp_path_factory) -> Artifacts:
    """GRU + Linear, MSE + AdamW."""
    m = models.gru()
    return generate_with_ort(tmp_path_factory.mktemp("ort_gru"), m,
                             requires_grad=models.parameter_names(m), loss=LOSS.MSELoss,
                             optimizer=OPTIM.AdamW)


def mlp_batch(rng: np.random.Generator, n: int = 16, features: int = 20, classes: int = 10):
    return (rng.standard_normal((n, features)).astype(np.float32),
            rng.integers(0, classes, n).astype(np.int64))
