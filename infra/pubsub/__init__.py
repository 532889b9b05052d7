"""Pub/Sub emulator resources for local runs and tests.

``pubsub-emulator.sh`` runs the emulator; ``python -m infra.pubsub`` creates
the topic, the push subscription, the worker's pull subscription and the
dead-letter queue on it
(``ensure``), lists them (``list``) and probes the emulator (``ping``).
"""
