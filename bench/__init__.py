"""Benchmarks of the peloton daemon (run them with ``python -m bench.bench_jobs``)."""
