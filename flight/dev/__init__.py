"""Tools for development, tests and benchmarks: ``LocalCluster`` (real worker processes on
loopback), ``run_local`` (a plan as one task in this process), and test readers (``--extension
flight.dev.testing``).
"""
