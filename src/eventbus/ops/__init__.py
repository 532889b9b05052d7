"""Operations: the operator's read and repair tools, and the ``eventbus`` console script.

* read: ``operations`` (seed 002's queries), ``backoff`` (``eventbus retries``),
  ``cascade`` (``eventbus trace``), ``progress`` (the status table, a
  cascade's progress), ``render`` (escaped text, tables, JSON);
* ``reports``: what the console and the commands show of failed groups and events;
* repair: ``replay``, ``correct`` (edit and retry);
* input: ``specs`` (event specs to publish), ``jsonfile`` (an operator's JSON);
* the console script: ``cli``, ``commands`` (one module per command family),
  ``config`` (the operator settings and the ``.env`` file, read by python-dotenv).

Moved to the rebuild feature (``eventbus.rebuild``), stubs that warn for one release:
``rebuilder`` (now ``eventbus.rebuild.runner``), ``verify`` (``eventbus.rebuild.verify``),
``archive`` (``eventbus.rebuild.archive``); ``partner_ops`` (now ``eventbus.partners.view``).

The long-running sweepers and the dead-letter drain are workers
(``eventbus.workers``); the CLI commands that run them live here.

May import every layer, ``eventbus.workers`` included (for the CLI); reads and
writes events only through the store protocol. Of the other layers only the
web console (the web face of these tools) and ``eventbus.testing`` (the
cascade view) import ``ops``; the workers never do.
"""
