"""``eventbus verify``: does the current code emit what the store recorded for old events?

Child keys derive from the parent key, the child's type and its index
(``eventbus.model.keys.child_key``), so a deploy that renames a step or emits
children in another order changes them, and a redrive or replay after it
emits **new** children for old events. ``verify`` runs stored events through
the current router in a sandbox and compares, event by event, the children
and public-topic forwards it would emit with the parent's stored outbox.

* ``sandbox``: the in-memory store the events run on (``SandboxStore``), and
  what it may read of the real records (``Lookups``: read-only);
* ``compare``: what an outbox emits (``Emitted``) and how two differ
  (``Difference``);
* ``runner``: ``Verifier`` (one ``Verdict`` per record) and ``Report``;
* ``sample``: the recorded sample file (JSON lines), read and written;
* ``from_archive``: ``--from-archive``: an archive's events, each against its
  stored record while there is one, else against the children the archive holds;
* ``command``: ``eventbus verify`` itself (its options, its report).

The input is any iterable of stored-record-like mappings (``Verifier.verify``):
the store's records, a sample file's, or an archive's stand-ins (``from_archive``).

May import every layer below ``ops`` (the processor, the memory store, the
model, ``eventbus.workers.original``), ``eventbus.ops.render``,
``eventbus.ops.jsonfile`` and ``eventbus.rebuild.archive``; never the web layer.
Reads the real store only through ``get``, ``get_many``, ``guard_get`` and
``find_events``.
"""

from eventbus.rebuild.verify.compare import Difference, Emitted, compare, emitted
from eventbus.rebuild.verify.runner import Report, Verdict, Verifier
from eventbus.rebuild.verify.sample import BadInput, Sample, parse_sample, sample_lines
from eventbus.rebuild.verify.sandbox import Lookups, MappingLookups, SandboxStore, StoreLookups

__all__ = ["BadInput", "Difference", "Emitted", "Lookups", "MappingLookups", "Report",
           "Sample", "SandboxStore", "StoreLookups", "Verdict", "Verifier", "compare",
           "emitted", "parse_sample", "sample_lines"]
