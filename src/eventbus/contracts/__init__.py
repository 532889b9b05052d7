"""Public contracts as files: schemas for Pub/Sub and readers, the compatibility check.

* ``schemas``: each public contract as a JSON Schema (and Pub/Sub's Avro form);
* ``files``: the files under ``docs/contracts/``, written and checked;
* ``compat``: whether a contract's new version still reads the old ones' events.

May import: ``eventbus.model`` and the standard library. The contracts
themselves and the forwarding declarations are in ``eventbus.model.contract``
and ``eventbus.model.forward``; this package turns them into the files under
``docs/contracts/`` (``eventbus contracts write|check``).
"""
