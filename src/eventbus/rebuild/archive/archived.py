"""What reading an archive yields: a message, or a problem naming the file and the record.

``ArchivedMessage`` is one message as the Cloud Storage subscription wrote it
(``eventbus.rebuild.archive.layout`` reads it); ``ArchiveProblem`` is why one file,
one record or one run of records could not be read. ``to_delivery`` turns a
message into the ``Delivery`` the processor takes, the same form push and the
pull worker build, and ``archived_event`` validates its body as the receiver
does: a body that is not an event is a problem here, never an exception.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from eventbus.model.content import bounded_text
from eventbus.model.delivery import Delivery
from eventbus.model.errors import EventBusError, InvalidEvent
from eventbus.model.event import Event, parse_event
from eventbus.store.operator_queries import EventQuery

FORM = "archive"
"""``Delivery.form`` (stored as ``pubsub.form``) of a message read back from an archive."""
REASON_CHARS = 300
"""A problem's reason is cut to this many characters: one line an operator reads."""


class ArchiveError(EventBusError):
    """The archive as a whole cannot be read: no such path, a bucket that cannot be listed,
    or the ``archive`` extra (fastavro, google-cloud-storage) not installed."""


@dataclasses.dataclass(frozen=True)
class ArchivedMessage:
    """One message of an archive file, as Pub/Sub published it.

    ``attributes`` are the publisher's attributes (the ``ordering_key`` entry the
    subscription adds to them is taken out into ``ordering_key``); ``file`` names
    the file (a path, or a ``gs://`` URL) and ``index`` the record's place in it,
    from 0, so a report can point at it.
    """

    data: bytes
    attributes: dict[str, str] = dataclasses.field(hash=False)
    message_id: str
    publish_time: dt.datetime
    """Aware (UTC): when Pub/Sub accepted the message."""
    ordering_key: str
    subscription: str
    """The Cloud Storage subscription that wrote the record (``projects/P/subscriptions/S``)."""
    file: str
    index: int


@dataclasses.dataclass(frozen=True)
class ArchiveProblem:
    """Why a file, a record or a run of records of an archive could not be used.

    ``index`` is None when the whole file is unusable (not Avro, another
    layout, unreadable); ``count`` is how many records from ``index`` on the
    problem covers: more than one when a broken record took the rest of its
    block with it, 0 for "from here to the end of the file" (a file cut short).
    ``reason`` is one line, safe to print.
    """

    file: str
    index: int | None
    reason: str
    message_id: str = ""
    count: int = 1

    def __str__(self) -> str:
        if self.index is None:
            where = self.file
        elif self.count == 0:
            where = f"{self.file} from record {self.index}"
        elif self.count > 1:
            where = f"{self.file} records {self.index}..{self.index + self.count - 1}"
        else:
            where = f"{self.file} record {self.index}"
        message = f" (message {self.message_id})" if self.message_id else ""
        return f"{where}{message}: {self.reason}"


def problem(file: str, index: int | None, reason: str, *, message_id: str = "",
            count: int = 1) -> ArchiveProblem:
    """An ``ArchiveProblem`` whose texts are bounded, one line, and storable whatever came in."""
    return ArchiveProblem(file=file, index=index, reason=one_line(reason),
                          message_id=one_line(message_id, 256), count=count)


def one_line(text: str | bytes, limit: int = REASON_CHARS) -> str:
    """``text`` cut to ``limit`` characters, line breaks, NUL and lone surrogates escaped.

    Bytes (a file name as the file system has it) are read as UTF-8, and what is
    not UTF-8 shows as ``\\xff`` escapes.
    """
    return bounded_text(text, limit).replace("\r", "\\r").replace("\n", "\\n")


def archived_event(message: ArchivedMessage) -> Event | ArchiveProblem:
    """The message's event, validated with its attributes as the receiver validates it.

    A body that is not an event (not JSON, no ``event_type``, a bad entity...)
    is an ``ArchiveProblem`` naming the file and the record.
    """
    try:
        return parse_event(message.data, message.attributes)
    except InvalidEvent as exc:
        return problem(message.file, message.index, f"not an event: {exc}",
                       message_id=message.message_id)


def to_delivery(message: ArchivedMessage) -> Delivery | ArchiveProblem:
    """The ``Delivery`` the processor takes for ``message``, or why its body is not an event.

    The same fields the pull worker fills from a pulled message; ``form`` is
    ``"archive"`` and there is no delivery attempt. The body is checked with
    ``archived_event`` first, so what comes back can be run.
    """
    event = archived_event(message)
    if isinstance(event, ArchiveProblem):
        return event
    return Delivery(data=message.data, attributes=dict(message.attributes),
                    message_id=message.message_id,
                    publish_time=message.publish_time.isoformat(),
                    subscription=message.subscription, delivery_attempt=None,
                    ordering_key=message.ordering_key, form=FORM)


def selected(query: EventQuery, event: Event, published: dt.datetime) -> bool:
    """Whether an archived ``event`` falls in an operator's selection: its type, partner and
    entity as asked, and ``since``/``until`` bounding its publish time (an archive has no
    ``created``). The statuses and attempt terms are about stored records and do not apply."""
    entity = event.entity_metadata
    asked = ((query.event_type, event.event_type), (query.partner_id, entity.partner_id),
             (query.entity_type, entity.entity_type), (query.entity_id, entity.entity_id))
    if any(given is not None and given != value for given, value in asked):
        return False
    return (query.since is None or published >= query.since) and \
        (query.until is None or published < query.until)
