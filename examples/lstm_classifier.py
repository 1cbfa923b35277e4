"""An LSTM reading each scikit-learn digits image row by row (8 steps of 8 pixels),
classifying from the last hidden state.

    python examples/lstm_classifier.py [--no-wrap] [--steps 300] [--threads 2] [--log-dir DIR]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import _common as C


class RowLSTM(torch.nn.Module):
    def __init__(self, hidden: int = 128):
        super().__init__()
        self.lstm = torch.nn.LSTM(8, hidden, num_layers=1, batch_first=True)
        self.head = torch.nn.Linear(hidden, 10)

    def forward(self, x):
        out, (h, _) = self.lstm(x.view(-1, 8, 8))
        return self.head(h[-1])


def run(args, *, wrap: bool | str, writer=None, progress: bool = True) -> C.RunResult:
    train_set, test_set = C.digits(args.seed, as_images=False)
    torch.manual_seed(args.seed)
    model, optimizer = C.make_optimizer(RowLSTM(), args.lr, wrap)

    def finish(model, res):
        res.metrics["test_acc"] = C.accuracy(model, *test_set)

    return C.Training(model, optimizer, C.Batches(*train_set, args.batch, args.seed),
                      F.cross_entropy, args.steps, writer=writer,
                      desc=f"lstm ({C.side_name(wrap)})", progress=progress,
                      finish=finish).run()


def main() -> None:
    args = C.parse_args(__doc__.splitlines()[0], steps=300, batch=64, lr=5e-3)
    writer = C.summary_writer(args.log_dir)
    res = run(args, wrap=args.wrap, writer=writer)
    if writer is not None:
        writer.add_scalar("accuracy/test", res.metrics["test_acc"], args.steps)
        writer.close()
    C.print_final("lstm_classifier" + (" (ortcpu_torch)" if args.wrap else " (torch)"), res)


if __name__ == "__main__":
    main()
