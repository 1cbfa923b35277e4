"""ONNX Runtime's on-device training API on ortcpu_torch: an MLP with BatchNorm on
scikit-learn's digits, from an ONNX model to a trained inference model.

    python examples/ondevice_training.py [--steps 300] [--batch 64] [--threads 2] [--out DIR]

1. export a torch model to ONNX (``ortcpu_torch.graph.export``; an ORT user starts from
   such a file);
2. ``artifacts.generate_artifacts``: training / eval / optimizer models + checkpoint;
3. train with ``api.Module`` / ``api.Optimizer`` / ``api.LinearLRScheduler``;
4. save the checkpoint (with the optimizer state), reload it, train on;
5. ``export_model_for_inferencing`` and run the result with our ``InferenceSession`` (and
   onnxruntime's, when it is installed).

The same script runs on onnxruntime-training by changing the one import line below.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch

from ortcpu_torch.graph import InferenceSession, export
from ortcpu_torch.training import api, artifacts

import _common as C


class DigitsMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.bn = torch.nn.BatchNorm1d(128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def export_onnx(path: str, seed: int) -> tuple[str, str, list[str]]:
    """The torch model as ONNX with ``ortcpu_torch.graph.export``, in training mode (so
    BatchNorm normalizes with its batch statistics) and a variable batch size; returns the
    graph's input and output names and the names of the trainable parameters."""
    torch.manual_seed(seed)
    model = DigitsMLP().train()
    graph = export(model, (torch.zeros(8, 64),), path, train=True,
                   dynamic_shapes=({0: torch.export.Dim("batch")},))
    return graph.user_inputs[0], graph.user_outputs[0], [n for n, _ in model.named_parameters()]


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(1) == labels).mean())


def train(module, optimizer, scheduler, batches, steps: range, every: int) -> None:
    module.train()
    for step in steps:
        x, y = batches()
        loss, _ = module(x.numpy(), y.numpy())
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
        if step % every == 0 or step == steps[-1]:
            print(f"  step {step:4d}  loss {float(loss):.4f}  "
                  f"lr {optimizer.get_learning_rate():.5f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="artifact folder (default: a temporary one)")
    args = p.parse_args()
    C.set_threads(args.threads)
    (x_train, y_train), (x_test, y_test) = C.digits(args.seed, as_images=False)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or tmp
        os.makedirs(out, exist_ok=True)
        onnx_path = os.path.join(out, "digits_mlp.onnx")
        input_name, logits_name, params = export_onnx(onnx_path, args.seed)
        artifacts.generate_artifacts(
            onnx_path, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
            optimizer=artifacts.OptimType.AdamW, artifact_directory=out,
            additional_output_names=[logits_name])
        a = {k: os.path.join(out, f) for k, f in (
            ("train", "training_model.onnx"), ("eval", "eval_model.onnx"),
            ("optimizer", "optimizer_model.onnx"), ("checkpoint", "checkpoint"))}
        print(f"artifacts in {out}: {sorted(os.listdir(out))}")

        state = api.CheckpointState.load_checkpoint(a["checkpoint"])
        module = api.Module(a["train"], state, a["eval"])
        optimizer = api.Optimizer(a["optimizer"], module)
        first = args.steps * 2 // 3
        scheduler = api.LinearLRScheduler(optimizer, warmup_step_count=first // 10,
                                          total_step_count=args.steps, initial_lr=args.lr)
        batches = C.Batches(x_train, y_train, args.batch, args.seed)
        print(f"training {first} steps (inputs {module.input_names()}, "
              f"outputs {module.output_names()})")
        train(module, optimizer, scheduler, batches, range(1, first + 1), every=50)

        state.properties["steps_done"] = first
        saved = os.path.join(out, "checkpoint_trained")
        api.CheckpointState.save_checkpoint(state, saved, include_optimizer_state=True)
        state = api.CheckpointState.load_checkpoint(saved)
        print(f"reloaded {saved} (steps_done={state.properties['steps_done']}); "
              f"running mean of bn: {state.parameters['bn.running_mean'].data[:3]}")
        module = api.Module(a["train"], state, a["eval"])
        optimizer = api.Optimizer(a["optimizer"], module)
        scheduler = api.LinearLRScheduler(optimizer, first // 10, args.steps, args.lr)
        train(module, optimizer, scheduler, batches, range(first + 1, args.steps + 1),
              every=50)

        module.eval()
        _, logits = module(x_test.numpy(), y_test.numpy())
        print(f"eval model: test accuracy {accuracy(logits, y_test.numpy()):.3f}")
        inference = os.path.join(out, "digits_inference.onnx")
        module.export_model_for_inferencing(inference, [logits_name])
        ours = InferenceSession(inference).run(None, {input_name: x_test.numpy()})[0]
        print(f"exported inference model, our InferenceSession: test accuracy "
              f"{accuracy(ours, y_test.numpy()):.3f}")
        try:
            import onnxruntime
        except ImportError:
            return
        theirs = onnxruntime.InferenceSession(inference).run(None, {input_name: x_test.numpy()})[0]
        print(f"onnxruntime.InferenceSession on the same file: test accuracy "
              f"{accuracy(theirs, y_test.numpy()):.3f} (max |diff| "
              f"{np.abs(theirs - ours).max():.2e})")


if __name__ == "__main__":
    main()
