"""The Acero engine: a stage plan compiled to Acero declarations (``pipeline``), and the unit-
tagged stream (``tagged``).
"""
