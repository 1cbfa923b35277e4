"""Small models for the capture and ORTModule tests; each returns the loss first.

``make(name)`` -> (module, example args): MLP, CNN (BatchNorm, pooling, dropout), GPT-style
block (Embedding, LayerNorm, causal attention with matmul + masked softmax, GELU MLP, cross
entropy), LSTM and GRU classifiers, a model written with in-place ops and ``F.*`` calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in=12, hidden=16, classes=5):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x, y):
        logits = self.fc2(torch.relu(self.fc1(x)))
        return F.cross_entropy(logits, y), logits


class CNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 2 * 2, classes)

    def forward(self, x, y):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = F.avg_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        logits = self.fc(self.drop(torch.flatten(x, 1)))
        return F.cross_entropy(logits, y), logits


class Block(nn.Module):
    def __init__(self, d, heads, ctx, p):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)
        self.register_buffer("causal", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (d // self.heads) ** 0.5)
        att = att.masked_fill(~self.causal[:t, :t], float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab=40, d=32, heads=4, ctx=16, layers=2, p=0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads, ctx, p) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return loss, logits


class LSTMClassifier(nn.Module):
    def __init__(self, vocab=30, d=8, hidden=12, classes=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.rnn = nn.LSTM(d, hidden, num_layers=2, batch_first=True, bidirectional=True,
                           dropout=0.2)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, idx, y):
        out, (h, c) = self.rnn(self.emb(idx))
        logits = self.fc(out[:, -1])
        return F.cross_entropy(logits, y), logits


class GRUClassifier(nn.Module):
    def __init__(self, d=6, hidden=10, classes=3):
        super().__init__()
        self.rnn = nn.GRU(d, hidden)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x, y):
        _, h = self.rnn(x)
        logits = self.fc(h[-1])
        return F.cross_entropy(logits, y, label_smoothing=0.1), logits


class Functional(nn.Module):
    """In-place tensor methods and F.* calls instead of modules."""

    def __init__(self, d=10):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(16, d) * 0.3)
        self.b1 = nn.Parameter(torch.zeros(16))
        self.w2 = nn.Parameter(torch.randn(4, 16) * 0.3)
        self.gamma = nn.Parameter(torch.ones(16))

    def forward(self, x, target):
        h = F.linear(x, self.w1, self.b1)
        h.mul_(2.0).add_(0.5)
        h = F.silu(h)
        h = F.layer_norm(h, (16,), self.gamma, None)
        h += torch.tanh(h).clamp(-0.5, 0.5)
        h.relu_()
        h = F.dropout(h, 0.2, training=self.training)
        out = F.linear(h, self.w2).sigmoid_()
        loss = F.mse_loss(out, target) + 0.1 * F.softmax(out, dim=-1).max(dim=-1).values.mean()
        return loss, out


def make(name: str, batch: int = 4):
    """(module, args) for one of the test models, with deterministic example inputs."""
    g = torch.Generator().manual_seed(1234)
    if name == "mlp":
        return MLP(), (torch.randn(batch, 12, generator=g),
                       torch.randint(0, 5, (batch,), generator=g))
    if name == "cnn":
        return CNN(), (torch.randn(batch, 3, 8, 8, generator=g),
                       torch.randint(0, 10, (batch,), generator=g))
    if name == "gpt":
        return GPT(), (torch.randint(0, 40, (batch, 16), generator=g),
                       torch.randint(0, 40, (batch, 16), generator=g))
    if name == "lstm":
        idx = torch.randint(0, 30, (batch, 7), generator=g)
        idx[:, -2:] = 0  # padding positions: no gradient into emb.weight[0]
        return LSTMClassifier(), (idx, torch.randint(0, 4, (batch,), generator=g))
    if name == "gru":
        return GRUClassifier(), (torch.randn(5, batch, 6, generator=g),
                                 torch.randint(0, 3, (batch,), generator=g))
    if name == "functional":
        return Functional(), (torch.randn(batch, 10, generator=g),
                              torch.rand(batch, 4, generator=g))
    raise KeyError(name)


NAMES = ("mlp", "cnn", "gpt", "lstm", "gru", "functional")
