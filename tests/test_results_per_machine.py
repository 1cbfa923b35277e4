"""Benchmark results are kept per machine kind and the README shows each kind's table."""

import importlib.util
import pathlib

import pytest

from benchmarks import _util

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def update_readme(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "update_readme", ROOT / "tools" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    return module


@pytest.mark.parametrize("cpu_isa,cap,kind", [("avx512", None, "avx512"), ("avx2", None, "avx2"),
                                              ("avx512", "avx2", None), ("baseline", None, None)])
def test_machine_kind(monkeypatch, cpu_isa, cap, kind):
    monkeypatch.setattr(_util.loader, "CPU_ISA", cpu_isa)
    monkeypatch.setattr(_util.loader, "CAP", cap)
    monkeypatch.setattr(_util, "cpu_vendor", lambda: "AuthenticAMD")
    assert _util.machine_kind() == kind
    monkeypatch.setattr(_util, "cpu_vendor", lambda: "GenuineIntel")
    assert _util.machine_kind() == (kind and "intel-" + kind)


def test_cpu_vendor_reads_this_machine():
    assert _util.cpu_vendor() in ("GenuineIntel", "AuthenticAMD", "")


def test_write_results_keeps_a_copy_per_kind(tmp_path, monkeypatch):
    monkeypatch.setattr(_util, "RESULTS", str(tmp_path))
    monkeypatch.setattr(_util, "machine_kind", lambda: "avx2")
    _util.write_results("demo_case", {"x": 1}, "| table |\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "demo_case.avx2.md", "demo_case.json", "demo_case.md"]
    monkeypatch.setattr(_util, "machine_kind", lambda: None)
    _util.write_results("capped", {"x": 1}, "| capped |\n")
    assert not (tmp_path / "capped.avx2.md").exists()
    monkeypatch.setattr(_util, "machine_kind", lambda: "avx512")
    _util.write_results("case_partial", {"x": 1}, "| quick |\n")
    assert not (tmp_path / "case_partial.avx512.md").exists()


def test_readme_table_shows_every_kind_avx512_first(update_readme):
    results = update_readme.ROOT / "benchmarks" / "results"
    assert "No results yet" in update_readme.bench_table("case.md", "make x")
    (results / "case.md").write_text("latest\n")
    assert update_readme.bench_table("case.md", "make x") == "latest"
    (results / "case.avx2.md").write_text("zen3 table\n")
    (results / "case.avx512.md").write_text("zen5 table\n")
    body = update_readme.bench_table("case.md", "make x")
    assert body.index("AVX-512 machine") < body.index("zen5 table") < body.index("AVX2-only")
    assert body.index("AVX2-only") < body.index("zen3 table")
    assert "latest" not in body
