"""TensorBoard summaries: ortcpu_torch.summary.SummaryWriter vs torch.utils.tensorboard.

    python -m benchmarks.bench_summary [--quick]

Cases (issue #7 targets, ratio = torch time / ours, same process, same run):
- ``add_histogram_10M``: ``add_histogram(tag, x, step)`` of 10M float32 values with each
  writer's default bins (torch: numpy histogram over TensorFlow's edges; ours: the same
  edges, native one-pass bucketing). Target >= 3x.
- ``add_scalar_100k``: 100k ``add_scalar`` calls followed by ``flush()`` (so both sides
  have framed and written every event). Target >= 1.0x.
- ``add_histogram_10M_ort``: ours with ``bins="ort"`` (ORT's scheme: NaN/inf skipped,
  ordered double sums), for reference against the same torch time.
- ``event_framing_100k``: framing and writing 100k serialized scalar events: ours (native
  CRC-32C, one batch) vs tensorboard's ``RecordWriter`` (the framing torch's writer uses),
  both into a file -- the measurement behind not using ``RecordWriter``.

Ours and torch alternate, round by round; each number is the median over rounds after a
warm-up. The load average and the CPU time this process got are recorded: the machine is
shared, and a fork-join over 2 threads suffers most when another process takes a core.
Writes ``benchmarks/results/summary.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TARGETS = {"add_histogram_10M": 3.0, "add_scalar_100k": 1.0}


def _writers(tmp):
    from torch.utils.tensorboard import SummaryWriter as TorchWriter

    from ortcpu_torch.summary import SummaryWriter

    return (SummaryWriter(os.path.join(tmp, "ours")),
            TorchWriter(os.path.join(tmp, "torch")))


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(quick: bool = False) -> dict:
    rounds = 3 if quick else 7
    n_hist = 10_000_000
    n_scalar = 100_000
    x = torch.randn(n_hist, generator=torch.Generator().manual_seed(0))
    load0 = os.getloadavg()
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    samples: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = _writers(tmp)
        step = 0

        def hist(w, bins=None):
            nonlocal step
            step += 1
            return lambda: (w.add_histogram("h", x, step) if bins is None
                            else w.add_histogram("h", x, step, bins=bins))

        def scalars(w):
            def go():
                for i in range(n_scalar):
                    w.add_scalar("loss", 0.5 + i * 1e-6, i)
                w.flush()
            return go

        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        from ortcpu_torch.summary._records import frame_records

        recs = [event_pb2.Event(wall_time=1.0, step=i, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag="loss", simple_value=0.5)]
        )).SerializeToString() for i in range(n_scalar)]

        def frame_ours():
            def go():
                with open(os.path.join(tmp, "ours.rec"), "wb") as f:
                    f.write(frame_records(recs))
            return go

        def frame_tb():
            def go():
                with open(os.path.join(tmp, "tb.rec"), "wb") as f:
                    w = RecordWriter(f)
                    for r in recs:
                        w.write(r)
            return go

        cases = {
            "add_histogram_10M": (lambda: hist(ours), lambda: hist(theirs)),
            "add_histogram_10M_ort": (lambda: hist(ours, "ort"), lambda: hist(theirs)),
            "add_scalar_100k": (lambda: scalars(ours), lambda: scalars(theirs)),
            "event_framing_100k": (frame_ours, frame_tb),
        }
        for name, (mk_ours, mk_torch) in cases.items():
            s = samples[name] = {"ours": [], "torch": []}
            _time(mk_ours())  # warm-up
            _time(mk_torch())
            for r in range(rounds if "scalar" not in name else max(2, rounds // 2)):
                first, second = ((mk_ours, "ours"), (mk_torch, "torch")) if r % 2 == 0 \
                    else ((mk_torch, "torch"), (mk_ours, "ours"))
                for mk, side in (first, second):
                    s[side].append(_time(mk()))
        ours.close()
        theirs.close()
    wall = time.perf_counter() - wall0
    rows = []
    for name, s in samples.items():
        o, t = statistics.median(s["ours"]), statistics.median(s["torch"])
        rows.append({"case": name, "ours_ms": o * 1e3, "torch_ms": t * 1e3, "ratio": t / o,
                     "target": TARGETS.get(name), "ours_samples_ms": [v * 1e3 for v in s["ours"]],
                     "torch_samples_ms": [v * 1e3 for v in s["torch"]]})
    from ._util import isa_info

    return {"machine": isa_info(), "threads": torch.get_num_threads(), "rounds": rounds,
            "loadavg_before": load0, "loadavg_after": os.getloadavg(),
            "cpu_share_of_this_process": (time.process_time() - cpu0) / wall / os.cpu_count(),
            "rows": rows}


def to_markdown(res: dict) -> str:
    from ._util import isa_line

    lines = [isa_line(res.get("machine")), "",
             "| case | torch ms | ours ms | torch ÷ ours | target |", "|---|---:|---:|---:|---:|"]
    for r in res["rows"]:
        tgt = f"≥ {r['target']:.1f}×" if r["target"] else "—"
        lines.append(f"| {r['case']} | {r['torch_ms']:.1f} | {r['ours_ms']:.1f} | "
                     f"{r['ratio']:.2f}× | {tgt} |")
    la, lb = res["loadavg_before"], res["loadavg_after"]
    lines.append("")
    lines.append(f"{res['threads']} threads, median of {res['rounds']} rounds; load average "
                 f"{la[0]:.2f} before, {lb[0]:.2f} after (2 cores).")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    res = run(args.quick)
    md = to_markdown(res)
    print(md)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "summary.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(RESULTS, "summary.md"), "w") as f:
        f.write(md)


if __name__ == "__main__":
    main()
