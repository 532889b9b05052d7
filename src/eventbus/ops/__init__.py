"""Operations: the operator's read and repair tools, and the ``eventbus`` console script.

* read: ``operations`` (seed 002's queries), ``backoff`` (``eventbus retries``),
  ``cascade`` (``eventbus trace``), ``progress`` (the status table, a
  cascade's progress), ``render`` (escaped text, tables, JSON);
* repair: ``replay``, ``correct`` (edit and retry), ``archive`` (the messages a
  Cloud Storage subscription archived, read back as deliveries);
* input: ``specs`` (event specs to publish), ``jsonfile`` (an operator's JSON);
* the console script: ``cli``, ``commands`` (one module per command family),
  ``config`` (the operator settings and the ``.env`` file, read by python-dotenv).

The long-running sweepers and the dead-letter drain are workers
(``eventbus.workers``); the CLI commands that run them live here.

May import every layer, ``eventbus.workers`` included (for the CLI); reads and
writes events only through the store protocol. Of the other layers only the
web console (the web face of these tools) and ``eventbus.testing`` (the
cascade view) import ``ops``; the workers never do.
"""
