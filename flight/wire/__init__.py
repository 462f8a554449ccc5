"""What crosses the network: protocol frames and their checks, IPC validation, limits, the function
whitelist, Flight client helpers, and the generated protobuf code (``_proto``). Everything a
peer sends is checked here before any other package sees it.
"""
