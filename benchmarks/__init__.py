"""Benchmarks of flight-exec: the TPC-H suite (``python -m benchmarks``) and micro benchmarks (``benchmarks/micro``)."""
