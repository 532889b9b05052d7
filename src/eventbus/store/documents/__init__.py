"""Pure functions that build ``partner_events`` documents, filters and updates, by job.

Nothing here talks to MongoDB: ``eventbus.store.mongo`` sends what these
functions build, and the unit tests check them without a server.

* ``records``: a record's fields as first stored (statuses, seed times, audit);
* ``claims``: the claim rule, in Python and as the claim's pipeline;
* ``updates``: renew, succeed, fail, reject, redrive, abandon;
* ``entries``: outbox entries in their parent's record;
* ``entities``: entity records of ordered handlers (applied position, holder);
* ``side_effects``: the side-effect guard's records;
* ``summaries``: what operator views read of each event;
* ``refusals``: which store errors mean "this content cannot be stored".

Each name is importable from here too (``documents.bson_time``), the one
import the stores and the processor need.
"""

from eventbus.store.documents.claims import (
    claim_pipeline,
    claimable,
    conflicts,
    is_new,
    is_rejected,
    lease_expired,
    next_attempt,
    redoes,
)
from eventbus.store.documents.entities import (
    NOT_ENTITY,
    entity_free,
    held_record,
    hold_filter,
    hold_update,
    holder_filter,
    is_entity,
    release_update,
    take_pipeline,
    taken_fields,
)
from eventbus.store.documents.entries import (
    entry_filter,
    entry_pending,
    failed_update,
    pending_filter,
    publish_failed_fields,
    published_fields,
    published_update,
)
from eventbus.store.documents.records import (
    AUDIT_FIELDS,
    EPOCH,
    FAILED,
    MAX_ERROR_MESSAGE,
    MINIMAL_FIELDS,
    PENDING,
    PROCESSING,
    PUBLISHED,
    REJECTED,
    REJECTION_FIELDS,
    STATUSES,
    SUCCESS,
    UNKNOWN_TYPE,
    bson_time,
    epoch_ms,
    error_document,
    event_day_id,
    event_fields,
    expire_at,
    insert_fields,
    new_record,
    refused_fields,
    seed_metadata,
)
from eventbus.store.documents.refusals import (
    CONTENT_ERROR_CODES,
    refuses_content,
)
from eventbus.store.documents.side_effects import (
    guard_finish_update,
    guard_owner_filter,
    guard_take_filter,
    guard_take_update,
    guard_takeable,
)
from eventbus.store.documents.summaries import (
    SUMMARY_FIELDS,
    SUMMARY_OUTBOX_FIELDS,
    cascade_filter,
    summary,
)
from eventbus.store.documents.updates import (
    ABANDON_UNSET,
    abandon_filter,
    abandon_update,
    abandonable,
    fail_fields,
    fail_update,
    finish_update,
    key_filter,
    owner_filter,
    redrivable,
    redrive_filter,
    redriven_filter,
    redriven_update,
    reject_update,
    renew_update,
    succeed_update,
    unclaim_update,
)

__all__ = [
    "ABANDON_UNSET",
    "AUDIT_FIELDS",
    "CONTENT_ERROR_CODES",
    "EPOCH",
    "FAILED",
    "MAX_ERROR_MESSAGE",
    "MINIMAL_FIELDS",
    "NOT_ENTITY",
    "PENDING",
    "PROCESSING",
    "PUBLISHED",
    "REJECTED",
    "REJECTION_FIELDS",
    "STATUSES",
    "SUCCESS",
    "SUMMARY_FIELDS",
    "SUMMARY_OUTBOX_FIELDS",
    "UNKNOWN_TYPE",
    "abandon_filter",
    "abandon_update",
    "abandonable",
    "bson_time",
    "cascade_filter",
    "claim_pipeline",
    "claimable",
    "conflicts",
    "entity_free",
    "entry_filter",
    "entry_pending",
    "epoch_ms",
    "error_document",
    "event_day_id",
    "event_fields",
    "expire_at",
    "fail_fields",
    "fail_update",
    "failed_update",
    "finish_update",
    "guard_finish_update",
    "guard_owner_filter",
    "guard_take_filter",
    "guard_take_update",
    "guard_takeable",
    "held_record",
    "hold_filter",
    "hold_update",
    "holder_filter",
    "insert_fields",
    "is_entity",
    "is_new",
    "is_rejected",
    "key_filter",
    "lease_expired",
    "new_record",
    "next_attempt",
    "owner_filter",
    "pending_filter",
    "publish_failed_fields",
    "published_fields",
    "published_update",
    "redoes",
    "redrivable",
    "redrive_filter",
    "redriven_filter",
    "redriven_update",
    "refused_fields",
    "refuses_content",
    "reject_update",
    "release_update",
    "renew_update",
    "seed_metadata",
    "succeed_update",
    "summary",
    "take_pipeline",
    "taken_fields",
    "unclaim_update",
]
