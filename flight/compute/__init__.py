"""The plan's meaning in pyarrow terms, shared by the builder and the engine.

``expressions`` turns the IR's expressions into ``pyarrow.compute`` expressions (the
whitelist in ``flight.wire.functions``), ``relational`` builds Acero's aggregate, join and
sort declarations. The builder (``flight.plan``) runs them over empty tables to learn
exact output types; the engine (``flight.engine``) runs them over data. Neither of
those two packages imports the other.
"""
