"""Table formats: an Iceberg or Delta table's snapshot, planned with its own library on the
coordinator, becomes a ``Query`` over a feed of its data files.
"""
