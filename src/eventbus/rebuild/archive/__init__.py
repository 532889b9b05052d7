"""The archive past retention: messages a Cloud Storage subscription wrote, read back.

The stack's opt-in archive (``archive: true``, ``infra/deploy/pulumi/archive.py``)
is a Cloud Storage subscription on the bus topic that writes every message to
a bucket as Avro with metadata. ``read_archive`` reads those files from a local
directory (``gcloud storage cp -r``) or straight from ``gs://bucket/prefix``,
and yields each message (``ArchivedMessage``) or, for whatever cannot be read,
an ``ArchiveProblem`` naming the file and the record: a hostile or broken file
never stops the others and never raises. ``to_delivery`` turns a message into
the ``Delivery`` the processor runs (push and the pull worker build the same),
so a rebuild runs archived events through the one pipeline.

* ``archived``: the message and problem types, ``to_delivery``, ``archived_event``;
* ``layout``: one file, in the subscription's Avro layout (``SUBSCRIPTION_SCHEMA``);
* ``sources``: listing a directory or a bucket prefix, in name order.

Needs the ``archive`` extra (fastavro, google-cloud-storage), imported only
when a file is read, so the rest of ``eventbus.ops`` runs without it.
"""

from eventbus.rebuild.archive.archived import (
    FORM,
    ArchivedMessage,
    ArchiveError,
    ArchiveProblem,
    archived_event,
    selected,
    to_delivery,
)
from eventbus.rebuild.archive.layout import SUBSCRIPTION_SCHEMA, read_file
from eventbus.rebuild.archive.sources import Blob, StorageClient, read_archive

__all__ = [
    "FORM",
    "SUBSCRIPTION_SCHEMA",
    "ArchiveError",
    "ArchiveProblem",
    "ArchivedMessage",
    "Blob",
    "StorageClient",
    "archived_event",
    "read_archive",
    "read_file",
    "selected",
    "to_delivery",
]
