"""One archive file: the Avro a Cloud Storage subscription writes, read with fastavro.

With output format Avro and "write metadata" on, the subscription writes one
record per message in this layout (Pub/Sub's documentation, "Create Cloud
Storage subscriptions"; ``SUBSCRIPTION_SCHEMA``)::

    record com.google.pubsub.PubsubMessageWithMetadata
      subscription_name  string
      message_id         string
      publish_time       long, logicalType timestamp-micros
      attributes         map<string>   (every message property but data: the
                                        publisher's attributes, and the
                                        ordering_key when there is one)
      data               bytes

``attributes`` written as a JSON object in a string (as a BigQuery subscription
writes its ``attributes`` column) is read too; ``publish_time`` as
``timestamp-millis`` as well. Anything else is another layout: a file without
metadata (only ``data``) or written with the topic's schema is refused as a
whole, with the reason.

Hand-written on purpose, beside fastavro: fastavro decodes the file, but a
decoding error ends its reader, so one hostile record would hide every record
after it. This module reads block by block (``fastavro.block_reader``): a
record that cannot be decoded costs the rest of its block (reported with how
many records that is), the next block is read, and a file cut short or
corrupt past some point is reported from there. Text is decoded with
``surrogateescape`` so that invalid UTF-8 becomes a problem of its record, not
of its block, and every value is checked here, record by record.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping
from typing import IO, Any

from eventbus.model.content import error_text
from eventbus.pubsub.message import MAX_ATTRIBUTES
from eventbus.rebuild.archive.archived import ArchivedMessage, ArchiveError, ArchiveProblem, problem
from eventbus.settings import PUBSUB_MAX_DATA_BYTES

SUBSCRIPTION_SCHEMA: dict[str, Any] = {
    "type": "record",
    "namespace": "com.google.pubsub",
    "name": "PubsubMessageWithMetadata",
    "fields": [
        {"name": "subscription_name", "type": "string"},
        {"name": "message_id", "type": "string"},
        {"name": "publish_time", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "attributes", "type": {"type": "map", "values": "string"}},
        {"name": "data", "type": "bytes"},
    ],
}
"""The Avro schema of a Cloud Storage subscription's records with "write metadata" on."""
ORDERING_KEY = "ordering_key"
"""The attributes-map entry the subscription writes a message's ordering key under."""
# Field -> the writer types read as that field (fastavro's parsed form: a name, or
# ("map", values) / (type, logicalType)).
ACCEPTED: dict[str, tuple[Any, ...]] = {
    "subscription_name": ("string",),
    "message_id": ("string",),
    "publish_time": (("long", "timestamp-micros"), ("long", "timestamp-millis")),
    "attributes": (("map", "string"), "string"),
    "data": ("bytes",),
}


def read_file(stream: IO[bytes], name: str) -> Iterator[ArchivedMessage | ArchiveProblem]:
    """Every record of one archive file as a message or a problem; never raises for content.

    ``name`` is how problems and messages name the file. Whatever the stream
    or fastavro raises while reading is a problem of this file, from the
    record it reached on.
    """
    fastavro = avro()
    try:
        blocks = fastavro.block_reader(stream, handle_unicode_errors="surrogateescape")
        refused = schema_problem(blocks.writer_schema)
    except Exception as exc:  # whatever a non-Avro file makes the header parser raise
        yield problem(name, None, f"not an Avro file: {why(exc)}")
        return
    if refused:
        yield problem(name, None, refused)
        return
    index = 0
    try:
        for block in blocks:
            yield from _block(block, name, index)
            index += block.num_records
    except Exception as exc:  # a cut or corrupt file: what was read before still counts
        where = "cut short or corrupt from here" if index else "unreadable past its header"
        yield problem(name, index, f"{where}: {why(exc)}", count=0)


def _block(block: Any, name: str, first: int) -> Iterator[ArchivedMessage | ArchiveProblem]:
    index = first
    try:
        for record in block:
            yield message(record, name, index)
            index += 1
    except Exception as exc:  # the record cannot be decoded; its block's rest is lost
        lost = max(1, first + block.num_records - index)
        yield problem(name, index, f"cannot be decoded: {why(exc)}", count=lost)


def why(exc: BaseException) -> str:
    """What an exception says, bounded; its type when it says nothing (``EOFError()``)."""
    return error_text(exc, 200) or type(exc).__name__


def schema_problem(schema: Any) -> str | None:
    """Why a writer schema is not the subscription's layout, or None when it is."""
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        return "not a Cloud Storage subscription's Avro layout: the records are not Avro records"
    fields = {f.get("name"): f.get("type") for f in schema.get("fields") or ()
              if isinstance(f, Mapping)}
    if set(fields) == {"data"}:
        return ("written without metadata (the subscription's write_metadata is off): "
                "no message ids, publish times or attributes")
    missing = [name for name in ACCEPTED if name not in fields]
    if missing:
        return f"not a Cloud Storage subscription's Avro layout: no field {', '.join(missing)}"
    wrong = [name for name, accepted in ACCEPTED.items() if _kind(fields[name]) not in accepted]
    if wrong:
        return ("not a Cloud Storage subscription's Avro layout: unexpected type of "
                + ", ".join(f"{name} ({_shown(fields[name])})" for name in wrong))
    return None


def message(record: Any, name: str, index: int) -> ArchivedMessage | ArchiveProblem:
    """One decoded record as a message, or the problem that keeps it from being one."""
    try:
        return _message(record, name, index)
    except _Bad as bad:
        message_id = record.get("message_id") if isinstance(record, Mapping) else None
        return problem(name, index, str(bad),
                       message_id=message_id if isinstance(message_id, str) else "")


class _Bad(Exception):
    """A value of one record that the archive cannot give as a message."""


def _message(record: Any, name: str, index: int) -> ArchivedMessage:
    if not isinstance(record, Mapping):
        raise _Bad(f"not a record but {type(record).__name__}")
    message_id = _text(record.get("message_id"), "message_id")
    if not message_id:
        raise _Bad("message_id is empty")
    attributes = _attributes(record.get("attributes"))
    ordering_key = attributes.pop(ORDERING_KEY, "")
    if len(attributes) > MAX_ATTRIBUTES:
        raise _Bad(f"{len(attributes)} attributes; Pub/Sub carries at most {MAX_ATTRIBUTES}")
    data = record.get("data")
    if not isinstance(data, bytes):
        raise _Bad(f"data is {type(data).__name__}, not bytes")
    size = len(data) + len(ordering_key.encode()) + sum(
        len(text.encode()) for pair in attributes.items() for text in pair)
    if size > PUBSUB_MAX_DATA_BYTES:
        raise _Bad(f"{size} bytes; larger than Pub/Sub carries ({PUBSUB_MAX_DATA_BYTES})")
    return ArchivedMessage(
        data=data, attributes=attributes, message_id=message_id,
        publish_time=_time(record.get("publish_time")), ordering_key=ordering_key,
        subscription=_text(record.get("subscription_name"), "subscription_name"),
        file=name, index=index)


def _text(value: Any, what: str) -> str:
    """A text field: valid Unicode (no lone surrogates: invalid UTF-8 decodes to them), no NUL."""
    if not isinstance(value, str):
        raise _Bad(f"{what} is {type(value).__name__}, not text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Bad(f"{what} is not valid UTF-8 (or holds a lone surrogate)") from None
    if "\x00" in value:
        raise _Bad(f"{what} holds NUL")
    return value


def _attributes(value: Any) -> dict[str, str]:
    if isinstance(value, str):  # a JSON object in a string
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise _Bad("attributes are not JSON") from None
        if not isinstance(value, dict):
            raise _Bad(f"attributes are a JSON {type(value).__name__}, not an object")
    if not isinstance(value, Mapping):
        raise _Bad(f"attributes are {type(value).__name__}, not a map")
    return {_text(key, "an attribute name"): _text(text, f"attribute {_shown(key)}")
            for key, text in value.items()}


def _time(value: Any) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise _Bad(f"publish_time is {type(value).__name__}, not a timestamp")
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def _kind(avro_type: Any) -> Any:
    """A writer field type in ``ACCEPTED``'s terms: a name, or a pair for a map or logical type."""
    if isinstance(avro_type, Mapping):
        if avro_type.get("type") == "map":
            return ("map", _kind(avro_type.get("values")))
        if avro_type.get("logicalType"):
            return (avro_type.get("type"), avro_type.get("logicalType"))
        return _kind(avro_type.get("type"))
    return avro_type if isinstance(avro_type, str) else repr(avro_type)


def _shown(value: Any) -> str:
    return repr(value)[:80]


def avro() -> Any:
    """The fastavro module, or ``ArchiveError`` saying how to install it."""
    # The archive extra is optional: the service and the other commands run without it.
    try:
        import fastavro
    except ImportError:
        raise ArchiveError("reading an archive needs fastavro: "
                           "pip install 'eventbus[archive]'") from None
    return fastavro
