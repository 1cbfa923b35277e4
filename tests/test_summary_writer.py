"""ortcpu_torch.summary.SummaryWriter: read back with tensorboard's EventAccumulator and
its record reader, against torch.utils.tensorboard for histograms, rank-0-only writing,
flush at exit, errors, a real TensorBoard server, and SIGKILL crash safety."""

from __future__ import annotations

import glob
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2

from ortcpu_torch import kernels
from ortcpu_torch.summary import SummaryWriter, get_rank, log_model, set_rank_source
from ortcpu_torch.summary._records import frame_records, masked_crc32c, read_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = {"scalars": 0, "histograms": 0, "tensors": 0, "compressedHistograms": 0}


def _acc(path) -> EventAccumulator:
    ea = EventAccumulator(str(path), size_guidance=SIZE)
    ea.Reload()
    return ea


def _events(logdir) -> list:
    (f,) = glob.glob(os.path.join(str(logdir), "events.out.tfevents.*"))
    recs, used = read_records(f)
    assert used == os.path.getsize(f)
    return [event_pb2.Event.FromString(r) for r in recs]


# ---- framing -------------------------------------------------------------------------


def test_framing_matches_tensorboard():
    import io

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tb_crc
    from tensorboard.summary.writer.record_writer import RecordWriter

    recs = [b"", b"a", bytes(range(256)) * 3, os.urandom(1001), b"x" * 17]
    for r in recs:
        assert masked_crc32c(r) == tb_crc(r)
    buf = io.BytesIO()
    w = RecordWriter(buf)
    for r in recs:
        w.write(r)
    assert frame_records(recs) == buf.getvalue()


# ---- read back -------------------------------------------------------------------------


def test_scalars_histograms_text_hparams_read_back(tmp_path):
    with SummaryWriter(tmp_path) as w:
        assert w.get_logdir() == str(tmp_path)
        for i in range(5):
            w.add_scalar("loss", 1.0 / (i + 1), i)
        w.add_scalar("t/tensor", torch.tensor(2.5), 9)
        w.add_scalar("nan", math.nan, 1)
        w.add_scalar("inf", -math.inf, 1)
        w.add_scalar("np", np.float64(0.25), 2)
        w.add_scalars("lr", {"a": 1.0, "b": 2.0}, 3)
        x = torch.randn(1000)
        w.add_histogram("hist/tf", x, 4)
        w.add_histogram("hist/ort", x, 4, bins="ort")
        w.add_text("notes", "**hello**", 5)
        w.add_hparams({"lr": 0.1, "opt": "adam", "wd": True}, {"acc": 0.75}, global_step=6)
        w.add_summary(kernels.SummaryScalar(torch.tensor([3.0, 4.0]), tags=["k1", "k2"]), 7)
        w.add_summary(kernels.SummaryHistogram(x, tag="kh"), 8)
    assert os.listdir(tmp_path) and all(not os.path.isdir(tmp_path / p)
                                        for p in os.listdir(tmp_path))  # one run
    ea = _acc(tmp_path)
    assert [(e.step, e.value) for e in ea.Scalars("loss")] == [
        (i, float(np.float32(1.0 / (i + 1)))) for i in range(5)]
    assert ea.Scalars("t/tensor")[0].value == 2.5 and ea.Scalars("np")[0].value == 0.25
    assert math.isnan(ea.Scalars("nan")[0].value) and ea.Scalars("inf")[0].value == -math.inf
    assert [(e.step, e.value) for e in ea.Scalars("lr/a")] == [(3, 1.0)]
    assert [(e.step, e.value) for e in ea.Scalars("lr/b")] == [(3, 2.0)]
    h = ea.Histograms("hist/tf")[0]
    assert h.step == 4 and h.histogram_value.num == 1000
    assert h.histogram_value.min == pytest.approx(float(x.min()))
    ho = ea.Histograms("hist/ort")[0].histogram_value
    assert ho.bucket_limit[-1] == 0.0 and sum(ho.bucket) == 1000
    kh = ea.Histograms("kh")[0]
    assert kh.step == 8 and kh.histogram_value.bucket_limit == ho.bucket_limit
    t = ea.Tensors("notes/text_summary")[0]
    assert t.step == 5 and list(t.tensor_proto.string_val) == [b"**hello**"]
    assert [(e.step, e.value) for e in ea.Scalars("acc")] == [(6, 0.75)]
    assert [e.value for e in ea.Scalars("k2")] == [4.0]
    # hparams plugin data
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = ea.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["lr"].number_value == 0.1
    assert start.hparams["opt"].string_value == "adam" and start.hparams["wd"].bool_value
    exp = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in exp.metric_infos] == ["acc"]


def test_separate_runs_restore_torch_layout(tmp_path):
    with SummaryWriter(tmp_path) as w:
        w.add_scalars("loss", {"train": 1.0, "val": 2.0}, 1, separate_runs=True)
        w.add_hparams({"lr": 0.1}, {"m": 1.0}, run_name="hp")
    subs = sorted(p for p in os.listdir(tmp_path) if os.path.isdir(tmp_path / p))
    assert subs == ["hp", "loss_train", "loss_val"]
    assert [e.value for e in _acc(tmp_path / "loss_val").Scalars("loss")] == [2.0]
    assert [e.value for e in _acc(tmp_path / "hp").Scalars("m")] == [1.0]


def _torch_histogram(values, bins, max_bins=None):
    from torch.utils.tensorboard.summary import histogram

    return histogram("h", values, bins, max_bins=max_bins).value[0].histo


@pytest.mark.parametrize("case", ["normal", "edges", "wide", "ints", "f64", "max_bins",
                                  "int_bins", "outliers"])
def test_histogram_matches_torch(tmp_path, case):
    from torch.utils.tensorboard import SummaryWriter as TorchWriter

    from ortcpu_torch.kernels.summary import tensorflow_bin_edges

    g = torch.Generator().manual_seed(5)
    bins, max_bins = "tensorflow", None
    if case == "normal":
        x = torch.randn(50_000, generator=g)
    elif case == "edges":
        e = torch.from_numpy(tensorflow_bin_edges())
        x = torch.cat([e, e.float().double(), torch.tensor([0.0, -0.0])])
    elif case == "wide":
        x = torch.randn(40_000, generator=g, dtype=torch.float64) * 1e8
    elif case == "ints":
        x = torch.randint(-50, 50, (3000,), generator=g)
    elif case == "f64":
        x = torch.rand(70, generator=g, dtype=torch.float64)
    elif case == "max_bins":
        x, max_bins = torch.randn(20_000, generator=g), 37
    elif case == "int_bins":
        x, bins = torch.randn(999, generator=g), 30
    else:
        x = torch.cat([torch.randn(100, generator=g), torch.tensor([1e25, -1e25])])
    torch_bins = tensorflow_bin_edges().tolist() if bins == "tensorflow" else bins
    want = _torch_histogram(x, torch_bins, max_bins)
    with SummaryWriter(tmp_path) as w:
        w.add_histogram("h", x, 1, bins=bins, max_bins=max_bins)
    (got,) = [v.histo for e in _events(tmp_path) for v in e.summary.value]
    assert list(got.bucket_limit) == list(want.bucket_limit)
    assert list(got.bucket) == list(want.bucket)
    assert (got.min, got.max, got.num) == (want.min, want.max, want.num)
    # summation orders differ (pairwise vs chunked): n ulp of sum |x|
    assert abs(got.sum - want.sum) <= x.numel() * 2.3e-16 * float(x.double().abs().sum())
    assert got.sum_squares == pytest.approx(want.sum_squares, rel=1e-9)
    assert callable(TorchWriter.add_histogram)


def test_log_model(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    m(torch.randn(5, 4)).pow(2).sum().backward()
    with SummaryWriter(tmp_path) as w:
        log_model(w, m, 3)
        log_model(w, m, 4, weights=False)
    ea = _acc(tmp_path)
    names = [n for n, _ in m.named_parameters()]
    assert sorted(ea.Tags()["histograms"]) == sorted(
        [f"weights/{n}" for n in names] + [f"grads/{n}" for n in names])
    assert [e.step for e in ea.Histograms("weights/0.weight")] == [3]
    assert [e.step for e in ea.Histograms("grads/0.weight")] == [3, 4]
    norm = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in m.parameters()))
    assert ea.Scalars("grads/global_norm")[0].value == pytest.approx(float(norm), rel=1e-6)


def test_purge_step_and_file_version(tmp_path):
    with SummaryWriter(tmp_path, purge_step=10, filename_suffix=".x") as w:
        w.add_scalar("a", 1.0, 10)
    (f,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    assert f.endswith(".x")
    ev = _events(tmp_path)
    assert ev[0].file_version == "brain.Event:2"
    assert ev[1].step == 10 and ev[1].session_log.status == event_pb2.SessionLog.START


# ---- ranks -----------------------------------------------------------------------------


def test_rank_nonzero_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert get_rank() == 1
    with SummaryWriter(tmp_path / "r1") as w:
        w.add_scalar("a", 1.0, 1)
        w.add_histogram("h", torch.randn(10), 1)
        with pytest.raises(TypeError, match="tag must be a str"):
            w.add_scalar(3, 1.0)  # arguments are still checked
    assert not os.path.exists(tmp_path / "r1")
    with SummaryWriter(tmp_path / "all", all_ranks=True) as w:
        w.add_scalar("a", 1.0, 1)
    assert _acc(tmp_path / "all").Scalars("a")[0].value == 1.0
    try:
        set_rank_source(lambda: 0)
        assert get_rank() == 0
        with SummaryWriter(tmp_path / "r0") as w:
            w.add_scalar("a", 1.0, 1)
        assert os.path.exists(tmp_path / "r0")
    finally:
        set_rank_source(None)
    with pytest.raises(TypeError, match="callable"):
        set_rank_source(3)


# ---- errors ------------------------------------------------------------------------------


def test_errors(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="cannot create log_dir"):
        SummaryWriter(blocker / "sub")
    with pytest.raises(TypeError, match="log_dir must be a path"):
        SummaryWriter(3)
    w = SummaryWriter(tmp_path / "ok")
    with pytest.raises(TypeError, match="add_scalar: tag must be a str"):
        w.add_scalar(None, 1.0)
    with pytest.raises(TypeError, match="scalar_value must be a number"):
        w.add_scalar("a", "1.0")
    with pytest.raises(ValueError, match="must hold one value"):
        w.add_scalar("a", torch.ones(2))
    with pytest.raises(TypeError, match="global_step must be an int"):
        w.add_scalar("a", 1.0, "x")
    with pytest.raises(ValueError, match="global_step must hold one value"):
        w.add_scalar("a", 1.0, torch.arange(3))
    with pytest.raises(ValueError, match="walltime must hold one value"):
        w.add_scalar("a", 1.0, 3, torch.ones(2))
    with pytest.raises(TypeError, match="add_histogram: tag must be a str"):
        w.add_histogram(1, torch.ones(2))
    with pytest.raises(ValueError, match="empty"):
        w.add_histogram("h", torch.ones(0))
    with pytest.raises(ValueError, match="no values fall into the bins"):
        w.add_histogram("h", torch.tensor([math.nan]))
    w.add_histogram("h", torch.tensor([math.nan]), bins="ort")  # NaN skipped: fine
    with pytest.raises(TypeError, match="text_string must be a str"):
        w.add_text("t", 3)
    with pytest.raises(ValueError, match="not a serialized Summary"):
        w.add_summary(b"\xff\xff")
    with pytest.raises(TypeError, match="hparam 'x' must be"):
        w.add_hparams({"x": [1]}, {"m": 1.0})
    w.close()
    with pytest.raises(RuntimeError, match="after close"):
        w.add_scalar("a", 1.0)
    w.close()  # idempotent


def test_background_flush_error_surfaces_at_next_call(tmp_path):
    w = SummaryWriter(tmp_path, flush_secs=0.05, max_queue=1000)
    w.add_scalar("a", 1.0, 1)
    os.close(w._writer._fd)  # make the timer's write fail
    w._writer._fd = os.open(os.devnull, os.O_RDONLY)
    w.add_scalar("a", 2.0, 2)
    deadline = time.monotonic() + 10
    while w._writer._error is None and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(OSError, match="writing .* failed"):
        w.add_scalar("a", 3.0, 3)
    os.close(w._writer._fd)
    w._writer._fd = os.open(os.devnull, os.O_WRONLY)
    w.close()


# ---- processes: exit flush, SIGKILL ------------------------------------------------------


def _child(code: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def test_flushed_at_interpreter_exit(tmp_path):
    p = _child(f"""
from ortcpu_torch.summary import SummaryWriter
w = SummaryWriter({str(tmp_path)!r}, max_queue=10**6, flush_secs=10**6)
for i in range(100):
    w.add_scalar("x", float(i), i)
""")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert [e.step for e in _acc(tmp_path).Scalars("x")] == list(range(100))


def test_sigkill_keeps_flushed_events(tmp_path):
    p = _child(f"""
import sys
from ortcpu_torch.summary import SummaryWriter
w = SummaryWriter({str(tmp_path)!r}, max_queue=10**6, flush_secs=10**6)
step = 0
while True:
    for _ in range(50):
        w.add_scalar("x", step * 0.5, step)
        w.add_histogram("h", [float(step)] * 20, step)
        step += 1
    w.flush()
    print(step - 1, flush=True)
""")
    last = -1
    try:
        while last < 400:
            line = p.stdout.readline()
            assert line, p.stderr.read()
            last = int(line)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL
    (f,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    recs, used = read_records(f)
    assert used == os.path.getsize(f)  # whole records only: nothing corrupt at the end
    steps = [e.step for e in _acc(tmp_path).Scalars("x")]
    assert steps == list(range(len(steps))) and steps[-1] >= last
    assert all(e.value == e.step * 0.5 for e in _acc(tmp_path).Scalars("x"))


# ---- a real TensorBoard server ------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())


def test_tensorboard_server_reads_our_files(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for i in range(3):
            w.add_scalars("loss", {"train": 1.0 / (i + 1), "val": 2.0 / (i + 1)}, i)
            w.add_scalar("lr", 0.1 * i, i)
    port = _free_port()
    tb = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    cmd = [tb] if os.path.exists(tb) else [sys.executable, "-m", "tensorboard.main"]
    proc = subprocess.Popen(cmd + ["--logdir", str(tmp_path), "--host", "127.0.0.1",
                                   "--port", str(port), "--load_fast", "false",
                                   "--reload_interval", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        tags = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"tensorboard exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                runs = _get(base + "/data/runs")
                tags = _get(base + "/data/plugin/scalars/tags")
                if runs and tags.get(".", {}).keys() >= {"loss/train", "loss/val", "lr"}:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"tensorboard did not serve our data within 90 s (tags: {tags})")
        assert runs == ["."]  # add_scalars: one run, not one per key
        vals = _get(base + "/data/plugin/scalars/scalars?run=.&tag=loss/val")
        assert [(s, v) for _, s, v in vals] == [(i, pytest.approx(2.0 / (i + 1)))
                                                for i in range(3)]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
