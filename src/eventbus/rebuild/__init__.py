"""Rebuild: run chosen handlers again over stored events, and check what they would do.

* ``mode``: ``ReplayProcessor``, the processor in replay mode: its mode is a
  ``ReplayMode``, the replay forms of the steps ``eventbus.processor.mode.Mode``
  declares (what differs for a handler: ``eventbus.model.rebuild_policy``);
* ``runner``: ``Rebuild``, a rebuild's plan, pages, progress, stored run and report;
* ``command``: ``eventbus rebuild``;
* ``documents``: the stored run and plan documents (the ``rebuilds`` collection);
* ``store``: ``RunStore``, the feature's store protocol, and ``runs_beside``;
* ``mongo`` / ``memory``: ``MongoRunStore`` and ``MemoryRunStore``, beside the event store;
* ``verify/``: ``eventbus verify``, the router run in a sandbox against stored records;
* ``archive/``: the Avro archive a Cloud Storage subscription writes, read back.

May import: the core (``eventbus.model``, ``eventbus.settings``, ``eventbus.store``,
``eventbus.processor``, ``eventbus.guard``, ``eventbus.ops``), ``eventbus.partners``
(the sandbox's breakers); pymongo only in ``mongo``. Importing this package imports
nothing else: each module is imported where it is used.
"""
