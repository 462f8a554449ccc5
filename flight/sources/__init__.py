"""Where work units come from, on the coordinator: feeds and their providers (file lists,
listings), Parquet footers, object storage, and the task-count estimate from early discovery.
Workers use ``storage`` (to read what units name) and ``feed`` (unit latencies).
"""
