"""Regenerate the README's generated sections: the kernel list (from the registry)
and the benchmark tables (from benchmarks/results/latest.md, written by
``make bench``; benchmarks/results/optim.md, by ``make bench-optim``). Run by
``make readme``; sections sit between
``<!-- BEGIN name -->`` / ``<!-- END name -->`` markers."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def kernel_list() -> str:
    from ortcpu_torch import kernels

    lines = []
    for name in kernels.names():
        doc = (kernels.get(name).__doc__ or "").strip()
        summary = " ".join(doc.split("\n\n")[0].split())
        lines.append(f"- `{name}` — {summary}")
    return f"{len(lines)} ops in `ortcpu_torch.kernels`:\n\n" + "\n".join(lines)


#: README section -> (result file under benchmarks/results, the command that writes it)
BENCH_SECTIONS = {
    "benchmarks": ("latest.md", "make bench"),
    "benchmarks-optim": ("optim.md", "make bench-optim"),
    "norm-benchmarks": ("norm_loss.md", "python -m benchmarks.norm_loss"),
    "conv-benchmarks": ("conv_pool.md", "python -m benchmarks.conv_pool"),
    "rnn-benchmarks": ("rnn_tensor.md", "make bench-rnn"),
    "summary-benchmarks": ("summary.md", "make bench-summary"),
    "train-step-benchmarks": ("train_step.md", "python -m benchmarks.train_step"),
    "models-benchmarks": ("models.md", "python -m benchmarks.models"),
    "models-compile-benchmarks": ("models_compile.md", "python -m benchmarks.models --compile"),
    "overhead-benchmarks": ("overhead.md", "python -m benchmarks.overhead"),
    "gemm-peak": ("gemm_peak.md", "python -m benchmarks.gemm_peak"),
    "graph-benchmarks": ("graph.md", "python -m benchmarks.graph"),
    "distributed-benchmarks": ("distributed.md", "make bench-distributed"),
}


#: machine kinds whose latest results sit beside the plain file as <stem>.<kind>.md
#: (benchmarks._util.write_results), shown one after the other
MACHINE_KINDS = {
    "avx512": "AVX-512 machine (AMD EPYC Zen 4/5)",
    "avx2": "AVX2-only machine (AMD EPYC Zen 3)",
    "intel-avx512": "Intel Xeon AVX-512 machine (Emerald Rapids or Ice Lake)",
    "intel-avx2": "Intel Xeon AVX2-only machine",
}


def bench_table(filename: str, command: str) -> str:
    results = ROOT / "benchmarks" / "results"
    stem = filename.removesuffix(".md")
    per_kind = [(label, results / f"{stem}.{kind}.md") for kind, label in MACHINE_KINDS.items()]
    per_kind = [(label, path) for label, path in per_kind if path.exists()]
    if per_kind:
        return "\n\n".join(f"**{label}** (`benchmarks/results/{path.name}`):\n\n"
                           f"{path.read_text().strip()}" for label, path in per_kind)
    path = results / filename
    if not path.exists():
        return f"_No results yet: run `{command}`._"
    return path.read_text().strip()


def replace_section(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- BEGIN {name} -->\n)(?:.*?\n)?(<!-- END {name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no '{name}' section markers")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    text = replace_section(text, "kernels", kernel_list())
    for name, (filename, command) in BENCH_SECTIONS.items():
        if f"<!-- BEGIN {name} -->" in text:
            text = replace_section(text, name, bench_table(filename, command))
    readme.write_text(text)
    print(f"updated {readme}")


if __name__ == "__main__":
    main()
