"""A deterministic, seeded simulation of the whole system (issue 39, "What users get" 2).

See ``tests/sim/world.py`` for what runs and ``tests/sim/ledger.py`` for what must hold.
"""
