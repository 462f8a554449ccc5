"""The chaos run (issue 41): TPC-H and TPC-DS on a namespaced fleet while faults come at random, every answer
checked against DuckDB's, every error's message judged, nothing left behind (docs/fleet-harness.md, "The chaos run").

``cli`` (the command line and the run), ``workload`` (queries, data, DuckDB's answers), ``faults`` (what breaks),
``tally`` (the counts, which error messages are clear), ``rig`` (the processes around the fleet, the final checks),
``client`` (the process in the coordinator's namespace that runs the queries).
"""
