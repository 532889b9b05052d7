"""Archive files as a Cloud Storage subscription writes them, written by the tests themselves.

``SCHEMA`` is Pub/Sub's documented Avro schema for output format Avro with "write
metadata" on (docs "Create Cloud Storage subscriptions"), copied here on its own so
that a mistake in ``eventbus.rebuild.archive.layout`` cannot hide behind a shared constant.
``record`` builds one record (the ordering key goes into the attributes map, as the
subscription puts it), ``write_archive`` writes records to a file with fastavro,
and ``disguised`` writes values the layout's own writer refuses to write (bytes that
are not UTF-8 where the layout says string, a publish time past year 9999) under the
layout's header, as a damaged or forged file would hold them.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import fastavro

from eventbus.pubsub.message import build_event, build_message

SCHEMA: dict[str, Any] = {
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
SUBSCRIPTION = "projects/acme-prod/subscriptions/partner-events-archive"
PUBLISHED = dt.datetime(2024, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
SYNC = b"archive-sync-16b"
"""The files' sync marker, fixed so ``disguised`` can find where the header ends."""


def event_message(number: int, event_type: str = "OR_MGMT", partner: str = "p-1"
                  ) -> tuple[bytes, dict[str, str]]:
    """The data and attributes the library's publisher sends for one event."""
    event = build_event(event_type, {"n": number}, entity={
        "partnerId": partner, "entity_id": f"o-{number}", "entity_type": "Order"})
    return build_message(event, key=f"k-{number}")


def record(data: bytes, attributes: Mapping[str, str] | None = None, *, message_id: str = "1",
           published: dt.datetime | int = PUBLISHED, ordering_key: str = "",
           subscription: str = SUBSCRIPTION) -> dict[str, Any]:
    """One record as the subscription writes it: the ordering key is an attributes entry."""
    attrs = dict(attributes or {})
    if ordering_key:
        attrs["ordering_key"] = ordering_key
    return {"subscription_name": subscription, "message_id": message_id,
            "publish_time": published, "attributes": attrs, "data": data}


def avro_bytes(records: Iterable[Mapping[str, Any]], schema: Mapping[str, Any] = SCHEMA,
               *, sync_interval: int = 16000, codec: str = "null") -> bytes:
    """An Avro container file of ``records`` under ``schema``, as fastavro writes it."""
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(dict(schema)), list(records), codec=codec,
                    sync_interval=sync_interval, sync_marker=SYNC)
    return out.getvalue()


def write_archive(path: Path, records: Iterable[Mapping[str, Any]], **options: Any) -> Path:
    """Write ``records`` to ``path`` (parents made) in the subscription's layout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(avro_bytes(records, **options))
    return path


def raw_schema(**types: Any) -> dict[str, Any]:
    """``SCHEMA`` with some field types replaced (``message_id="bytes"``...)."""
    schema = json.loads(json.dumps(SCHEMA))
    for field in schema["fields"]:
        field["type"] = types.get(field["name"], field["type"])
    return schema


def disguised(records: Iterable[Mapping[str, Any]], schema: Mapping[str, Any],
              **options: Any) -> bytes:
    """``records`` written under ``schema`` but headed by the layout's ``SCHEMA``.

    Avro encodes ``string`` and ``bytes`` alike, and a ``timestamp-micros`` is a
    ``long``: written with ``bytes`` or plain ``long`` fields, the blocks read as the
    layout's, holding what its writer never would.
    """
    body = avro_bytes([_conformed(r, schema) for r in records], schema, **options)
    header = avro_bytes([], SCHEMA)
    return header + body[body.index(SYNC) + len(SYNC):]


def _conformed(record: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with text encoded where ``schema`` says bytes, so one record list fits both."""
    types = {field["name"]: field["type"] for field in schema["fields"]}
    out = dict(record)
    for name, value in record.items():
        kind = types.get(name)
        if kind == "bytes" and isinstance(value, str):
            out[name] = value.encode()
        elif kind == {"type": "map", "values": "bytes"} and isinstance(value, Mapping):
            out[name] = {k: v.encode() if isinstance(v, str) else v for k, v in value.items()}
        elif kind == "long" and isinstance(value, dt.datetime):
            out[name] = (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(
                microseconds=1)
    return out
