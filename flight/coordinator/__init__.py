"""The driver side: ``DistributedExec`` sizes a plan's stages, opens task channels, streams feeds
(the state machine in ``state``, its driver in ``dispatch``), reads the head stage and recovers
from lost workers; ``resolver`` says where workers are.
"""
