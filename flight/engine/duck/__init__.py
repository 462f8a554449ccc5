"""The DuckDB engine: a stage plan translated to SQL (``sql``, ``translate``), run per task on the
process's database (``engine``, ``task``), with feeds as unit fragments (``units``).
"""
