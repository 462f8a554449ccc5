"""Micro benchmarks: each module runs as a script (``python benchmarks/micro/X.py``) or with ``-m``."""
