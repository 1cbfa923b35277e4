"""A small GPT-style character language model (Embedding, causal self-attention,
LayerNorm, GELU MLP, cross entropy) trained on English prose available offline: the
docstrings of a fixed set of Python standard-library modules. Written in the functional
style of most open-source transformer code (F.gelu, torch.softmax inside forward).

    python examples/char_transformer.py [--no-wrap] [--steps 200] [--threads 2] [--log-dir DIR]
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import _common as C


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int, ff: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, ff)
        self.fc2 = torch.nn.Linear(ff, d)
        self.dropout = dropout

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = torch.softmax(att.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + F.dropout(self.proj(y), self.dropout, self.training)
        h = self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x + F.dropout(h, self.dropout, self.training)


class CharGPT(torch.nn.Module):
    def __init__(self, vocab: int, seq: int, d: int = 128, heads: int = 4, layers: int = 2,
                 ff: int = 512, dropout: float = 0.0):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads, ff, dropout) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1),
                             persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.head(self.ln_f(x))


def corpus(seq: int):
    text = C.stdlib_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.int64)
    return data, chars


class Windows:
    """Random (input, next-char target) windows of ``seq`` characters."""

    def __init__(self, data, seq: int, batch: int, seed: int):
        self.data, self.seq, self.batch = data, seq, batch
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self):
        start = torch.randint(0, len(self.data) - self.seq - 1, (self.batch,), generator=self.gen)
        idx = start[:, None] + torch.arange(self.seq + 1)
        w = self.data[idx]
        return w[:, :-1], w[:, 1:]


def lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def session(args, *, wrap: bool | str, writer=None, progress: bool = True,
            seq: int = 64) -> C.Training:
    """A training run not yet started; ``wrap`` as in ``_common.make_optimizer``."""
    data, chars = corpus(seq)
    n_val = len(data) // 10
    train_data, val_data = data[n_val:], data[:n_val]
    torch.manual_seed(args.seed)
    model, optimizer = C.make_optimizer(CharGPT(len(chars), seq), args.lr, wrap)

    def finish(model, res):
        model.eval()
        with torch.no_grad():
            vx, vy = Windows(val_data, seq, 64, args.seed + 1)()
            logits = model(vx)
            res.metrics["val_loss"] = float(lm_loss(logits, vy))
            res.metrics["val_acc"] = float((logits.argmax(-1) == vy).float().mean())

    return C.Training(model, optimizer, Windows(train_data, seq, args.batch, args.seed),
                      lm_loss, args.steps, writer=writer,
                      desc=f"char_transformer ({C.side_name(wrap)})", progress=progress,
                      finish=finish)


def run(args, **kwargs) -> C.RunResult:
    return session(args, **kwargs).run()


def main() -> None:
    args = C.parse_args(__doc__.splitlines()[0], steps=200, batch=32, lr=3e-3)
    writer = C.summary_writer(args.log_dir)
    res = run(args, wrap=args.wrap, writer=writer)
    if writer is not None:
        writer.add_scalar("loss/val", res.metrics["val_loss"], args.steps)
        writer.close()
    C.print_final("char_transformer" + (" (ortcpu_torch)" if args.wrap else " (torch)"), res)


if __name__ == "__main__":
    main()
