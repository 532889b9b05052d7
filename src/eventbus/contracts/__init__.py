"""Public contracts as files: schemas for Pub/Sub and readers, the compatibility check.

May import: ``eventbus.model`` and the standard library. The contracts
themselves and the forwarding declarations are in ``eventbus.model.contract``
and ``eventbus.model.forward``; this package turns them into the files under
``docs/contracts/`` (``eventbus contracts write|check``).
"""
