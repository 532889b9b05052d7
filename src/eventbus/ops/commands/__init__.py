"""The operator commands of the ``eventbus`` console script, one module per family.

* ``common``: the tools every command gets, the filter options, output;
* ``queries``: ``failed``, ``history``, ``show``, ``stats``, ``retries``;
* ``repair``: ``replay``, ``dlq drain``;
* ``console``: ``console``, the web console on 127.0.0.1;
* ``public``: ``contracts write|check``, the public contracts' files;
* ``sweepers``: ``redrive`` (the sweeper and its loop are workers':
  ``eventbus.workers.redrive``, ``eventbus.workers.sweeper``).

The features' commands live in their folders (``eventbus.partners.command``,
``eventbus.rebuild.command``, ``eventbus.rebuild.verify.command``).

Each module's ``add(commands)`` registers its sub-commands; each command is
``run(args, tools) -> exit status``.
"""
