"""``flight-sql``, the SQL shell (docs/shell.md).

``cli`` reads the flags and starts a local service when no URL is given (``local``); ``session`` is the
connection (ADBC for statements and metadata, plain Flight for a statement's progress and cancel);
``shell`` runs statements and dot commands and shows their results (``render``); ``text`` splits what
was typed into statements; ``prompt`` is the line editor (prompt_toolkit).
"""
