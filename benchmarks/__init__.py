"""Side-by-side timings of ortcpu_torch against PyTorch eager (``python -m benchmarks.run``)."""
