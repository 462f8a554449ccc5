"""From a logical plan to stages: the stage contract (``stages``), the cut at network boundaries
(``cut``), and every planning pass (filter pushdown, eager aggregation, co-location, replication
of small broadcasts, cost and range estimates).
"""
