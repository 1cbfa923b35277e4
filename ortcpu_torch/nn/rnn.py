"""``torch.nn.LSTM`` / ``torch.nn.GRU`` drop-ins on ORT's LSTMTraining/LSTMGrad and
GRUTraining/GRUGrad kernels.

Parameters have torch's names, shapes, gate orders and initialisation (``weight_ih_l0``,
``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``, ``..._reverse``), so state_dicts load
either way. The kernels take the parameters in torch's gate orders ([i,f,g,o] for LSTM,
[r,z,n] for GRU, ``torch_gates=True``: no reordering copy), and torch's GRU is ORT's GRU
with ``linear_before_reset=1``. Not supported (clear errors): ``proj_size > 0`` and
``PackedSequence`` input.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..ops.rnn import gru_direction, lstm_direction


class _RNNBase(torch.nn.Module):
    _gates = 0
    _mode = ""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None,
                 dtype=None) -> None:
        super().__init__()
        name = type(self).__name__
        for arg, v in (("input_size", input_size), ("hidden_size", hidden_size),
                       ("num_layers", num_layers)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name}: {arg} must be a positive int, got {v!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0 <= dropout <= 1:
            raise ValueError(f"{name}: dropout must be a number in [0, 1], got {dropout!r}")
        if proj_size:
            raise ValueError(f"{name}: proj_size > 0 is not supported by ortcpu_torch "
                             "(ORT's LSTM kernels have no projection)")
        if device is not None and torch.device(device).type != "cpu":
            raise TypeError(f"{name}: only CPU is supported, got device {device}")
        self.mode = self._mode
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, proj_size
        D = 2 if bidirectional else 1
        G = self._gates * hidden_size
        kw = {"dtype": dtype}
        self._flat_weights_names = []
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else hidden_size * D
            for d in range(D):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                params = [("weight_ih" + sfx, (G, in_size)), ("weight_hh" + sfx, (G, hidden_size))]
                if bias:
                    params += [("bias_ih" + sfx, (G,)), ("bias_hh" + sfx, (G,))]
                for pname, shape in params:
                    setattr(self, pname, torch.nn.Parameter(torch.empty(shape, **kw)))
                    self._flat_weights_names.append(pname)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            torch.nn.init.uniform_(p, -stdv, stdv)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s

    def _prep(self, input):
        name = type(self).__name__
        if isinstance(input, torch.nn.utils.rnn.PackedSequence):
            raise TypeError(f"{name}: PackedSequence input is not supported by ortcpu_torch; "
                            "pad the batch (torch.nn.utils.rnn.pad_packed_sequence) instead")
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"{name}: input must be a torch.Tensor, got {type(input).__name__}")
        if input.dim() not in (2, 3):
            raise ValueError(f"{name}: input must be 2-D (unbatched) or 3-D, got shape "
                             f"{tuple(input.shape)}")
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1)
        if self.batch_first and batched:
            x = x.transpose(0, 1)
        if x.shape[-1] != self.input_size:
            raise ValueError(f"{name}: input.size(-1) must be {self.input_size}, got "
                             f"{x.shape[-1]}")
        return x.contiguous(), batched

    def _states(self, h, x, batched, which="hx"):
        """Initial state ``h`` checked against the input ``x`` ([S, B, I]): one contiguous
        [B, H] tensor per layer and direction, or ``None`` each when ``h`` is None."""
        name = type(self).__name__
        n = self.num_layers * (2 if self.bidirectional else 1)
        if h is None:
            return [None] * n
        if not isinstance(h, torch.Tensor):
            raise TypeError(f"{name}: {which} must be a tensor")
        if not batched:
            if h.dim() != 2:
                raise ValueError(f"{name}: for unbatched input {which} must be 2-D, got "
                                 f"{tuple(h.shape)}")
            h = h.unsqueeze(1)
        want = (n, x.shape[1], self.hidden_size)
        if tuple(h.shape) != want:
            raise ValueError(f"{name}: expected {which} of shape {want}, got {tuple(h.shape)}")
        if h.dtype != x.dtype:
            raise TypeError(f"{name}: {which} dtype {h.dtype} must match input {x.dtype}")
        return [h[k].contiguous() for k in range(n)]

    def _weights(self, layer, d):
        """Parameters of one layer and direction in torch's gate order (the kernels take
        it as is: ``torch_gates=True``), the two biases as one."""
        sfx = f"_l{layer}" + ("_reverse" if d else "")
        b = None
        if self.bias:
            b = torch.cat([getattr(self, "bias_ih" + sfx), getattr(self, "bias_hh" + sfx)])
        return getattr(self, "weight_ih" + sfx), getattr(self, "weight_hh" + sfx), b

    def _run(self, x, states):
        """x [S,B,I]; states: list per (layer*D + d) of state tuples or None."""
        D = 2 if self.bidirectional else 1
        finals = []
        for layer in range(self.num_layers):
            outs = []
            for d in range(D):
                res = self._cell(x, layer, d, states[layer * D + d])
                outs.append(res[0])
                finals.append(res[1:])
            x = outs[0] if D == 1 else torch.cat(outs, dim=2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        return x, finals

    def _finish(self, y, batched):
        if not batched:
            return y.squeeze(1)
        return y.transpose(0, 1) if self.batch_first else y


class LSTM(_RNNBase):
    """Drop-in for ``torch.nn.LSTM`` (``proj_size`` must be 0; no PackedSequence).
    Returns ``output, (h_n, c_n)`` like torch."""

    _gates = 4
    _mode = "LSTM"

    def _cell(self, x, layer, d, st):
        w, r, b = self._weights(layer, d)
        h0, c0 = (None, None) if st is None else st
        return lstm_direction(x, w, r, b, None, h0, c0, reverse=bool(d), torch_gates=True)

    def forward(self, input, hx=None):
        x, batched = self._prep(input)
        if hx is None:
            states = self._states(None, x, batched)
        else:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError("LSTM: hx must be a tuple (h_0, c_0)")
            states = list(zip(self._states(hx[0], x, batched, "h_0"),
                              self._states(hx[1], x, batched, "c_0"), strict=True))
        y, finals = self._run(x, states)
        h_n = torch.stack([f[0] for f in finals])
        c_n = torch.stack([f[1] for f in finals])
        if not batched:
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return self._finish(y, batched), (h_n, c_n)


class GRU(_RNNBase):
    """Drop-in for ``torch.nn.GRU`` (no PackedSequence). Returns ``output, h_n``."""

    _gates = 3
    _mode = "GRU"

    def __init__(self, *args, **kwargs) -> None:
        if kwargs.get("proj_size") or (len(args) > 7 and args[7]):
            raise TypeError("GRU: unexpected argument proj_size")
        super().__init__(*args, **kwargs)

    def _cell(self, x, layer, d, st):
        w, r, b = self._weights(layer, d)
        return gru_direction(x, w, r, b, st, linear_before_reset=1, reverse=bool(d),
                             torch_gates=True)

    def forward(self, input, hx=None):
        x, batched = self._prep(input)
        states = self._states(hx, x, batched)
        y, finals = self._run(x, states)
        h_n = torch.stack([f[0] for f in finals])
        if not batched:
            h_n = h_n.squeeze(1)
        return self._finish(y, batched), h_n
