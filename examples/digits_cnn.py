"""A small CNN (Conv + BatchNorm + GELU + MaxPool, Dropout, Linear) on scikit-learn's
digits (8x8 images shipped with scikit-learn).

    python examples/digits_cnn.py [--no-wrap] [--steps 300] [--threads 2] [--log-dir runs/cnn]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import _common as C


class DigitsCNN(torch.nn.Module):
    def __init__(self, dropout: float = 0.1):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.GELU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.GELU(),
            torch.nn.MaxPool2d(2),
        )
        self.head = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Dropout(dropout), torch.nn.Linear(64 * 2 * 2, 128),
            torch.nn.GELU(), torch.nn.Linear(128, 10),
        )

    def forward(self, x):
        return self.head(self.features(x))


def session(args, *, wrap: bool | str, writer=None, progress: bool = True,
            dropout: float = 0.1) -> C.Training:
    """A training run not yet started; ``wrap`` as in ``_common.make_optimizer``."""
    train_set, test_set = C.digits(args.seed, as_images=True)
    torch.manual_seed(args.seed)
    model, optimizer = C.make_optimizer(DigitsCNN(dropout), args.lr, wrap)

    def finish(model, res):
        res.metrics["test_acc"] = C.accuracy(model, *test_set)

    return C.Training(model, optimizer, C.Batches(*train_set, args.batch, args.seed),
                      F.cross_entropy, args.steps, writer=writer,
                      desc=f"digits_cnn ({C.side_name(wrap)})", progress=progress,
                      finish=finish)


def run(args, **kwargs) -> C.RunResult:
    return session(args, **kwargs).run()


def main() -> None:
    args = C.parse_args(__doc__.splitlines()[0], steps=300, batch=64, lr=3e-3)
    writer = C.summary_writer(args.log_dir)
    res = run(args, wrap=args.wrap, writer=writer)
    if writer is not None:
        writer.add_scalar("accuracy/test", res.metrics["test_acc"], args.steps)
        writer.close()
    C.print_final("digits_cnn" + (" (ortcpu_torch)" if args.wrap else " (torch)"), res)


if __name__ == "__main__":
    main()
