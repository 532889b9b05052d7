"""The message model and its rules: events, keys, errors, statuses, the router, the context.

Pure: no I/O, no Flask, no pymongo, no Google client. May import the
standard library and ``eventbus.settings`` only; every other layer may
import it.
"""
