"""The transport: the scheduler (ordered and pipelined paths, written once), its deliveries, the ring and its config.

Nothing here imports a machine: the scheduler talks to ``backends.base`` alone.
"""
