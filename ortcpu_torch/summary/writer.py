"""``SummaryWriter``: call-compatible with ``torch.utils.tensorboard.SummaryWriter``.

Differences, by design (issue #7):
- ``add_scalars`` and ``add_hparams`` write into this writer's run by default (tags
  ``main_tag/key``; hparams as this run's session), not into one sub-run per key or per
  call; ``separate_runs=True`` (or a ``run_name`` for hparams) restores torch's layout.
- ``add_histogram(bins="ort")`` uses ONNX Runtime's bucket scheme (SummaryHistogram);
  the default ``bins="tensorflow"`` matches torch. Both are computed natively.
- ``add_summary(bytes, global_step)`` writes the output of the Summary* kernels.
- Only rank 0 writes (see ``set_rank_source``); other ranks get a writer that validates
  its arguments and writes nothing.
- Pending events are flushed at interpreter exit; a failing background flush is raised
  at the next call instead of being lost.
"""

from __future__ import annotations

import atexit
import math
import numbers
import os
import socket
import time
import weakref
from datetime import datetime

import numpy as np
import torch

from ..kernels import summary as _k
from . import _rank
from ._records import EventFileWriter

_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _flush_all_at_exit() -> None:
    for w in list(_LIVE):
        try:
            w.close()
        except Exception:  # nothing to report to at exit
            pass


def _pb():
    from tensorboard.compat.proto import event_pb2, summary_pb2

    return event_pb2, summary_pb2


def _check_tag(what: str, tag) -> str:
    if not isinstance(tag, str):
        raise TypeError(f"SummaryWriter.{what}: tag must be a str, got {type(tag).__name__}")
    return tag


def _scalar(what: str, name: str, v) -> float:
    if isinstance(v, float):
        return v
    if isinstance(v, (bool, numbers.Real)):
        return float(v)
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError(f"SummaryWriter.{what}: {name} must hold one value, got a tensor "
                             f"of shape {tuple(v.shape)}")
        return float(v.detach().reshape(()).item())
    if isinstance(v, np.ndarray) or isinstance(v, np.generic):
        a = np.asarray(v)
        if a.size != 1:
            raise ValueError(f"SummaryWriter.{what}: {name} must hold one value, got an array "
                             f"of shape {a.shape}")
        return float(a.reshape(()))
    raise TypeError(f"SummaryWriter.{what}: {name} must be a number or a one-element "
                    f"tensor, got {type(v).__name__}")


def _step(what: str, global_step):
    if global_step is None:
        return None
    if isinstance(global_step, torch.Tensor):
        if global_step.numel() != 1:
            raise ValueError(f"SummaryWriter.{what}: global_step must hold one value, got a "
                             f"tensor of shape {tuple(global_step.shape)}")
        global_step = global_step.item()
    if isinstance(global_step, bool) or not isinstance(global_step, numbers.Integral):
        if isinstance(global_step, numbers.Real) and float(global_step).is_integer():
            return int(global_step)
        raise TypeError(f"SummaryWriter.{what}: global_step must be an int, got "
                        f"{global_step!r}")
    return int(global_step)


def _hist_values(what: str, values) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        t = values.detach()
    elif isinstance(values, np.ndarray):
        if values.dtype.kind not in "biuf":
            raise TypeError(f"SummaryWriter.{what}: values must be numeric, got dtype "
                            f"{values.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(values))
    else:
        try:
            t = torch.as_tensor(np.asarray(values, dtype=np.float64))
        except (TypeError, ValueError):
            raise TypeError(f"SummaryWriter.{what}: values must be a tensor, array or "
                            f"numbers, got {type(values).__name__}") from None
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_complex():
        raise TypeError(f"SummaryWriter.{what}: values must be real, got {t.dtype}")
    if t.dtype not in (torch.float32, torch.float64):
        # exact widening: halves to float32, integers and bools to float64 (torch's numpy)
        t = t.to(torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else torch.float64)
    return t.contiguous().reshape(-1)


def _trim_numpy_histogram(counts: np.ndarray, edges: np.ndarray, max_bins):
    """torch.utils.tensorboard's layout of a numpy histogram: optional subsampling to
    ``max_bins``, then only the span from the first to the last non-empty bin, preceded
    by one empty bucket (so its left edge is kept); limits are right edges."""
    if max_bins is not None and len(counts) > max_bins:
        step = len(counts) // max_bins
        pad = (-len(counts)) % step
        c = np.concatenate([counts, np.zeros(pad)]) if pad else counts
        counts = c.reshape(-1, step).sum(axis=-1)
        new_edges = np.empty(len(counts) + 1, dtype=edges.dtype)
        new_edges[:-1] = edges[:-1:step]
        new_edges[-1] = edges[-1]
        edges = new_edges
    nz = np.flatnonzero(counts)
    if nz.size == 0:
        raise ValueError("SummaryWriter.add_histogram: no values fall into the bins (empty "
                         "input, or only NaN/inf / out-of-range values); torch raises here "
                         "too. Use bins='ort' to log such data with NaN/inf skipped.")
    first, last = int(nz[0]), int(nz[-1])
    if first > 0:
        return counts[first - 1:last + 1], edges[first:last + 2]
    return np.concatenate([[0.0], counts[:last + 1]]), edges[:last + 2]


class SummaryWriter:
    """Writes TensorBoard event files; the methods and arguments of
    ``torch.utils.tensorboard.SummaryWriter`` (see the module docstring for the
    differences). ``rank``: this process's rank (default: the rank source); only rank 0
    writes unless ``all_ranks=True``."""

    def __init__(self, log_dir=None, comment="", purge_step=None, max_queue=10,
                 flush_secs=120, filename_suffix="", *, rank=None, all_ranks=False):
        if log_dir is None:
            stamp = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", stamp + "_" + socket.gethostname() + comment)
        if not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"SummaryWriter: log_dir must be a path, got "
                            f"{type(log_dir).__name__}")
        self.log_dir = os.fspath(log_dir)
        self.purge_step = purge_step
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        self.filename_suffix = filename_suffix
        self._rank = _rank.get_rank() if rank is None else int(rank)
        self.active = bool(all_ranks) or self._rank == 0
        self._writer: EventFileWriter | None = None
        self._subwriters: dict[str, SummaryWriter] = {}
        self._closed = False
        if self.active:
            self._writer = EventFileWriter(self.log_dir, max_queue, flush_secs,
                                           filename_suffix)
            event_pb2, _ = _pb()
            self._writer.add_record(event_pb2.Event(
                wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
            if purge_step is not None:
                self._writer.add_record(event_pb2.Event(
                    wall_time=time.time(), step=int(purge_step),
                    session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)
                ).SerializeToString())
            self._writer.flush()
            _LIVE.add(self)

    # ---- plumbing -----------------------------------------------------------------

    def get_logdir(self) -> str:
        """The directory this writer's event file is in."""
        return self.log_dir

    def _write(self, summary, global_step, walltime) -> None:
        if self._closed:
            raise RuntimeError("SummaryWriter: write after close()")
        if not self.active:
            return
        event_pb2, _ = _pb()
        ev = event_pb2.Event(
            wall_time=time.time() if walltime is None else _scalar("add_*", "walltime", walltime),
            summary=summary)
        if global_step is not None:
            ev.step = global_step
        self._writer.add_record(ev.SerializeToString())

    def add_summary(self, summary, global_step=None, walltime=None) -> None:
        """Write a ``Summary``: serialized bytes (the Summary* kernels' output) or a
        ``tensorboard.compat.proto.summary_pb2.Summary``."""
        _, summary_pb2 = _pb()
        step = _step("add_summary", global_step)
        if isinstance(summary, (bytes, bytearray, memoryview)):
            from google.protobuf.message import DecodeError

            try:
                summary = summary_pb2.Summary.FromString(bytes(summary))
            except DecodeError as e:
                raise ValueError(f"SummaryWriter.add_summary: not a serialized Summary "
                                 f"({e})") from None
        elif not isinstance(summary, summary_pb2.Summary):
            raise TypeError("SummaryWriter.add_summary: summary must be bytes or a Summary "
                            f"proto, got {type(summary).__name__}")
        self._write(summary, step, walltime)

    # ---- scalars ----------------------------------------------------------------

    def add_scalar(self, tag, scalar_value, global_step=None, walltime=None,
                   new_style=False, double_precision=False) -> None:
        """One scalar; non-finite values are logged as they are (TensorBoard shows
        nan/inf)."""
        _check_tag("add_scalar", tag)
        v = _scalar("add_scalar", "scalar_value", scalar_value)
        step = _step("add_scalar", global_step)
        if not self.active:
            if self._closed:
                raise RuntimeError("SummaryWriter: write after close()")
            return
        _, summary_pb2 = _pb()
        if new_style:
            from tensorboard.compat.proto import tensor_pb2, types_pb2

            t = (tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, double_val=[v])
                 if double_precision else
                 tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[v]))
            t.tensor_shape.SetInParent()
            meta = summary_pb2.SummaryMetadata(
                plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
            value = summary_pb2.Summary.Value(tag=tag, tensor=t, metadata=meta)
        else:
            value = summary_pb2.Summary.Value(tag=tag, simple_value=v)
        self._write(summary_pb2.Summary(value=[value]), step, walltime)

    def add_scalars(self, main_tag, tag_scalar_dict, global_step=None, walltime=None,
                    separate_runs=False) -> None:
        """Several scalars at once, tagged ``main_tag/key`` in this run (one run, shown on
        one chart per key). ``separate_runs=True``: torch's layout, one sub-run
        ``log_dir/main_tag_key`` per key, all under the tag ``main_tag``."""
        _check_tag("add_scalars", main_tag)
        if not isinstance(tag_scalar_dict, dict):
            raise TypeError("SummaryWriter.add_scalars: tag_scalar_dict must be a dict, got "
                            f"{type(tag_scalar_dict).__name__}")
        vals = {}
        for k, v in tag_scalar_dict.items():
            _check_tag("add_scalars", k)
            vals[k] = _scalar("add_scalars", f"tag_scalar_dict[{k!r}]", v)
        step = _step("add_scalars", global_step)
        walltime = time.time() if walltime is None else walltime
        if not separate_runs:
            _, summary_pb2 = _pb()
            self._write(summary_pb2.Summary(value=[
                summary_pb2.Summary.Value(tag=f"{main_tag}/{k}", simple_value=v)
                for k, v in vals.items()]), step, walltime)
            return
        for k, v in vals.items():
            sub = os.path.join(self.log_dir, main_tag.replace("/", "_") + "_" + k)
            w = self._subwriters.get(sub)
            if w is None:
                w = self._subwriters[sub] = SummaryWriter(
                    sub, max_queue=self.max_queue, flush_secs=self.flush_secs,
                    filename_suffix=self.filename_suffix, rank=self._rank,
                    all_ranks=self.active)
            w.add_scalar(main_tag, v, step, walltime)

    # ---- histograms ---------------------------------------------------------------

    def add_histogram(self, tag, values, global_step=None, bins="tensorflow", walltime=None,
                      max_bins=None) -> None:
        """Histogram of ``values``. ``bins``: ``"tensorflow"`` (torch's default, computed
        natively), ``"ort"`` (ONNX Runtime's scheme: NaN/inf skipped, as
        SummaryHistogram), or anything ``numpy.histogram`` takes (as torch does)."""
        _check_tag("add_histogram", tag)
        step = _step("add_histogram", global_step)
        x = _hist_values("add_histogram", values)
        if not self.active:
            return
        _, summary_pb2 = _pb()
        if isinstance(bins, str) and bins == "ort":
            h = _k.ort_histogram_proto(x)
        else:
            if x.numel() == 0:
                raise ValueError("SummaryWriter.add_histogram: values is empty (torch raises "
                                 "here too; bins='ort' logs an empty histogram)")
            if isinstance(bins, str) and bins == "tensorflow":
                counts, (mn, mx, num, s, sq) = _k.histogram_counts(
                    x, _k._tf_edges(), _k.lib.ORTCPU_HIST_NUMPY)
                edges = _k.tensorflow_bin_edges()
            else:
                a = x.numpy().astype(np.float64)
                counts, edges = np.histogram(a, bins=bins)
                mn, mx, num = float(a.min()), float(a.max()), float(a.size)
                s, sq = float(a.sum()), float(a.dot(a))
            counts, limits = _trim_numpy_histogram(np.asarray(counts, dtype=np.float64),
                                                   np.asarray(edges, dtype=np.float64),
                                                   max_bins)
            h = summary_pb2.HistogramProto(min=mn, max=mx, num=num, sum=s, sum_squares=sq,
                                           bucket_limit=limits.tolist(),
                                           bucket=counts.tolist())
        self._write(summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, histo=h)]),
                    step, walltime)

    def add_histogram_raw(self, tag, min, max, num, sum, sum_squares, bucket_limits,
                          bucket_counts, global_step=None, walltime=None) -> None:
        """A histogram from precomputed statistics (as torch's)."""
        _check_tag("add_histogram_raw", tag)
        if len(bucket_limits) != len(bucket_counts):
            raise ValueError("SummaryWriter.add_histogram_raw: bucket_limits and "
                             "bucket_counts must have the same length")
        _, summary_pb2 = _pb()
        h = summary_pb2.HistogramProto(min=min, max=max, num=num, sum=sum,
                                       sum_squares=sum_squares,
                                       bucket_limit=[float(b) for b in bucket_limits],
                                       bucket=[float(c) for c in bucket_counts])
        self._write(summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, histo=h)]),
                    _step("add_histogram_raw", global_step), walltime)

    # ---- text ------------------------------------------------------------------------

    def add_text(self, tag, text_string, global_step=None, walltime=None) -> None:
        """Text (markdown) under ``tag/text_summary``, as torch writes it."""
        _check_tag("add_text", tag)
        if not isinstance(text_string, str):
            raise TypeError("SummaryWriter.add_text: text_string must be a str, got "
                            f"{type(text_string).__name__}")
        _, summary_pb2 = _pb()
        from tensorboard.plugins.text import plugin_data_pb2

        value = _k.text_value(tag + "/text_summary", [text_string], [1])
        value.metadata.plugin_data.content = plugin_data_pb2.TextPluginData(
            version=0).SerializeToString()
        self._write(summary_pb2.Summary(value=[value]), _step("add_text", global_step),
                    walltime)

    # ---- hparams -------------------------------------------------------------------

    def add_hparams(self, hparam_dict, metric_dict, hparam_domain_discrete=None,
                    run_name=None, global_step=None, separate_runs=False) -> None:
        """Hyper-parameters and their metrics. By default this run is the hparams
        session (metrics are this run's scalars); ``run_name`` or ``separate_runs=True``
        writes a sub-run as torch does (``run_name`` defaults to the time there)."""
        if not isinstance(hparam_dict, dict) or not isinstance(metric_dict, dict):
            raise TypeError("SummaryWriter.add_hparams: hparam_dict and metric_dict must be "
                            "dicts")
        summaries = _hparams_summaries(hparam_dict, metric_dict, hparam_domain_discrete)
        metrics = {_check_tag("add_hparams", k): _scalar("add_hparams", f"metric_dict[{k!r}]",
                                                         v)
                   for k, v in metric_dict.items()}
        step = _step("add_hparams", global_step)
        if separate_runs or run_name is not None:
            name = run_name if run_name is not None else str(time.time())
            target = SummaryWriter(os.path.join(self.log_dir, name), rank=self._rank,
                                   all_ranks=self.active)
        else:
            target = self
        for s in summaries:
            target._write(s, step, None)
        for k, v in metrics.items():
            target.add_scalar(k, v, step)
        if target is not self:
            target.close()

    # ---- lifetime ------------------------------------------------------------------

    def flush(self) -> None:
        """Write every pending event to the file."""
        if self._writer is not None and not self._closed:
            self._writer.flush()
        for w in self._subwriters.values():
            w.flush()

    def close(self) -> None:
        """Flush and close the event file(s); later writes raise."""
        if self._closed:
            return
        self._closed = True
        try:
            for w in self._subwriters.values():
                w.close()
            if self._writer is not None:
                self._writer.close()
        finally:
            _LIVE.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass


def _hparams_summaries(hparam_dict, metric_dict, hparam_domain_discrete):
    """(experiment, session_start, session_end) Summaries for the hparams plugin."""
    from google.protobuf import struct_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    _, summary_pb2 = _pb()
    discrete = hparam_domain_discrete or {}
    if not isinstance(discrete, dict):
        raise TypeError("SummaryWriter.add_hparams: hparam_domain_discrete must be a dict")
    infos, start = [], plugin_data_pb2.SessionStartInfo()
    for k, v in hparam_dict.items():
        _check_tag("add_hparams", k)
        if isinstance(v, torch.Tensor):
            v = v.item()
        info = api_pb2.HParamInfo(name=k)
        dom = discrete.get(k)
        if isinstance(v, bool):
            start.hparams[k].bool_value = v
            info.type = api_pb2.DATA_TYPE_BOOL
            kind = bool
        elif isinstance(v, numbers.Real):
            start.hparams[k].number_value = float(v)
            info.type = api_pb2.DATA_TYPE_FLOAT64
            kind = numbers.Real
        elif isinstance(v, str):
            start.hparams[k].string_value = v
            info.type = api_pb2.DATA_TYPE_STRING
            kind = str
        elif v is None:
            start.hparams[k].string_value = "None"
            info.type = api_pb2.DATA_TYPE_STRING
            kind = str
        else:
            raise TypeError(f"SummaryWriter.add_hparams: hparam {k!r} must be a bool, number, "
                            f"str or one-element tensor, got {type(v).__name__}")
        if dom is not None:
            if not isinstance(dom, (list, tuple)) or not all(isinstance(d, kind) for d in dom):
                raise TypeError(f"SummaryWriter.add_hparams: hparam_domain_discrete[{k!r}] "
                                f"must be a list of {kind.__name__} values")
            lv = struct_pb2.ListValue()
            for d in dom:
                if kind is bool:
                    lv.values.add().bool_value = d
                elif kind is str:
                    lv.values.add().string_value = d
                else:
                    lv.values.add().number_value = float(d)
            info.domain_discrete.CopyFrom(lv)
        infos.append(info)
    metric_infos = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=k)) for k in metric_dict]
    exp = api_pb2.Experiment(hparam_infos=infos, metric_infos=metric_infos)
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS)

    def wrap(tag, **content):
        data = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION,
                                                 **content)
        meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=metadata.PLUGIN_NAME, content=data.SerializeToString()))
        return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, metadata=meta)])

    return (wrap(metadata.EXPERIMENT_TAG, experiment=exp),
            wrap(metadata.SESSION_START_INFO_TAG, session_start_info=start),
            wrap(metadata.SESSION_END_INFO_TAG, session_end_info=end))


def log_model(writer: SummaryWriter, model: torch.nn.Module, step: int, weights: bool = True,
              grads: bool = True, bins="tensorflow") -> None:
    """Training summaries for ``model`` at ``step``: a histogram per parameter
    (``weights/<name>``) and per gradient (``grads/<name>``), and the global gradient
    L2 norm (``grads/global_norm``) over every parameter that has a gradient."""
    if not isinstance(writer, SummaryWriter):
        raise TypeError(f"log_model: writer must be an ortcpu_torch.summary.SummaryWriter, "
                        f"got {type(writer).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"log_model: model must be a torch.nn.Module, got "
                        f"{type(model).__name__}")
    step = _step("log_model", step)
    sq = []
    for name, p in model.named_parameters():
        if weights and p.numel():
            writer.add_histogram(f"weights/{name}", p.detach(), step, bins=bins)
        g = p.grad
        if grads and g is not None:
            g = g.detach()
            if g.is_sparse:
                g = g.coalesce().values()
            if g.numel():
                writer.add_histogram(f"grads/{name}", g, step, bins=bins)
            sq.append(torch.linalg.vector_norm(g.reshape(-1), dtype=torch.float64) ** 2)
    if grads and sq:
        norm = math.sqrt(float(torch.stack(sq).sum()))
        writer.add_scalar("grads/global_norm", norm, step)
