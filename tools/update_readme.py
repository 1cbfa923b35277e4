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


def bench_table() -> str:
    path = ROOT / "benchmarks" / "results" / "latest.md"
    if not path.exists():
        return "_No benchmark results yet: run `make bench`._"
    return path.read_text().strip()


def optim_bench_table() -> str:
    path = ROOT / "benchmarks" / "results" / "optim.md"
    if not path.exists():
        return "_No optimizer benchmark results yet: run `make bench-optim`._"
    return path.read_text().strip()


def summary_bench_table() -> str:
    path = ROOT / "benchmarks" / "results" / "summary.md"
    if not path.exists():
        return "_No results yet: run `make bench-summary`._"
    return path.read_text().strip()


def rnn_bench_table() -> str:
    path = ROOT / "benchmarks" / "results" / "rnn_tensor.md"
    if not path.exists():
        return "_No results yet: run `make bench-rnn`._"
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
    text = replace_section(text, "benchmarks", bench_table())
    text = replace_section(text, "benchmarks-optim", optim_bench_table())
    if "<!-- BEGIN summary-benchmarks -->" in text:
        text = replace_section(text, "summary-benchmarks", summary_bench_table())
    if "<!-- BEGIN rnn-benchmarks -->" in text:
        text = replace_section(text, "rnn-benchmarks", rnn_bench_table())
    readme.write_text(text)
    print(f"updated {readme}")


if __name__ == "__main__":
    main()
