"""The archive past retention (opt-in, ``archive: true``): every bus message kept in a bucket
as Avro, and in BigQuery for payload search and audit.

The store keeps events for ``EVENTBUS_RETENTION_DAYS`` and Pub/Sub keeps messages for 31 days
at most, so a rebuild from further back needs a copy of its own. ``stack.build`` calls
``declare`` when ``archive`` is on. It adds:

* a bucket (``archiveBucket``, default ``<project>-<topic>-archive``) in ``archiveLocation``
  (default the region): uniform access, public access prevented, and a lifecycle rule that
  deletes an object ``archiveDays`` days (default 365) after it was written;
* the Cloud Storage subscription ``<topic>-archive`` on the bus topic: Avro with "write
  metadata" (subscription name, message id, publish time and attributes, the ordering key
  among them, beside the data: the layout ``eventbus.rebuild.archive`` reads), not the topic's
  schema, a new file every ``archiveFileSeconds`` (default 300) under ``<topic>/`` with the
  date in its name, so name order is time order. Its ack deadline is that file time: Pub/Sub
  refuses a file duration longer than the ack deadline;
* with ``archiveBigquery`` (default on): a dataset (``archiveDataset``, default
  ``<topic>_archive``, ``_`` for ``-``) and a table ``messages`` partitioned by day of
  ``publish_time`` (partitions expire after ``archiveDays``), and the BigQuery subscription
  ``<topic>-bigquery`` writing to it with metadata and without the topic's schema. ``data``
  is ``BYTES``, so no payload (not JSON, not UTF-8) can stop the subscription, and
  ``attributes`` is ``JSON`` (Pub/Sub writes the attributes and the ordering key as one JSON
  object). The table is deletion-protected: it is the audit trail;
* the Pub/Sub service agent's grants, each on the one resource: ``roles/storage.objectCreator``
  and ``roles/storage.legacyBucketReader`` on the bucket (write files, read the bucket's
  metadata), ``roles/bigquery.dataEditor`` on the table. The subscriptions wait for them:
  Pub/Sub checks its access when a subscription is created;
* ``roles/storage.objectViewer`` on the bucket for the runtime account, so a Cloud Run job can
  run ``eventbus rebuild --from-archive gs://...``;
* an alert per export subscription when its oldest unacknowledged message is older than
  ``backlogAlertSeconds``: the export is failing (a grant removed, the table deleted) and the
  archive is missing what Pub/Sub will drop after ``retentionSeconds``.

The config fields it reads are declared in ``stack.DeployConfig`` (``archive*``);
``config_problems`` holds their rules.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_gcp as gcp
import worker

if TYPE_CHECKING:
    from stack import DeployConfig, _Stack

BUCKET = re.compile(r"^[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]$")
"""A bucket name without dots (dotted names are domain names, which need verification)."""
DATASET = re.compile(r"^[A-Za-z0-9_]{1,1024}$")
TABLE = "messages"
#: Object names: ``<topic>/2024-03-01/12_05_00Z...``; the date first, so name order is time order.
DATETIME_FORMAT = "YYYY-MM-DD/hh_mm_ssZ"
#: The table a BigQuery subscription with metadata and without the topic's schema writes.
TABLE_SCHEMA = [
    {"name": "subscription_name", "type": "STRING", "mode": "NULLABLE"},
    {"name": "message_id", "type": "STRING", "mode": "NULLABLE"},
    {"name": "publish_time", "type": "TIMESTAMP", "mode": "NULLABLE"},
    {"name": "data", "type": "BYTES", "mode": "NULLABLE",
     "description": "The message body: the event's JSON as published"},
    {"name": "attributes", "type": "JSON", "mode": "NULLABLE",
     "description": "The message's attributes and ordering key"},
]
DAY_MS = 24 * 3600 * 1000


# -- config ------------------------------------------------------------------------------------

def bucket_name(c: DeployConfig) -> str:
    """The archive bucket: ``archiveBucket``, else ``<project>-<topic>-archive``."""
    return c.archive_bucket or f"{c.project}-{c.topic}-archive"


def dataset_id(c: DeployConfig) -> str:
    """The BigQuery dataset: ``archiveDataset``, else ``<topic>_archive``."""
    return c.archive_dataset or f"{c.topic.replace('-', '_')}_archive"


def storage_subscription(c: DeployConfig) -> str:
    """The Cloud Storage subscription's name."""
    return f"{c.topic}-archive"


def bigquery_subscription(c: DeployConfig) -> str:
    """The BigQuery subscription's name."""
    return f"{c.topic}-bigquery"


def prefix(c: DeployConfig) -> str:
    """Where in the bucket the files go: one folder per topic."""
    return f"{c.topic}/"


def config_problems(c: DeployConfig) -> list[str]:
    """The rules of the archive's fields; ``stack.config_problems`` adds them to its own."""
    if not c.archive:
        return []
    rules = {
        "archiveDays must be >= 1": c.archive_days >= 1,
        "archiveFileSeconds must be 60..600 (Pub/Sub's file duration)":
            60 <= c.archive_file_seconds <= 600,
        f"archiveBucket {bucket_name(c)!r}: 3..63 lowercase letters, digits, - and _":
            BUCKET.match(bucket_name(c)),
        f"archiveDataset {dataset_id(c)!r}: letters, digits and _ only":
            DATASET.match(dataset_id(c)),
    }
    return [rule for rule, holds in rules.items() if not holds]


def exports(c: DeployConfig) -> dict[str, Any]:
    """What ``pulumi stack output`` adds for the archive: where to read it from."""
    if not c.archive:
        return {}
    out: dict[str, Any] = {"archiveUrl": f"gs://{bucket_name(c)}/{prefix(c)}",
                           "archiveSubscription": storage_subscription(c)}
    if c.archive_bigquery:
        out |= {"archiveTable": f"{c.project}.{dataset_id(c)}.{TABLE}",
                "archiveBigquerySubscription": bigquery_subscription(c)}
    return out


# -- resources ---------------------------------------------------------------------------------

def declare(stack: _Stack) -> None:
    """Declare the bucket, the dataset and table, both export subscriptions and their grants."""
    _Archive(stack).declare()


class _Archive:
    """The archive's resources, added to the stack's own through its helpers."""

    def __init__(self, stack: _Stack) -> None:
        self.s, self.c = stack, stack.c
        self.agent = stack.pubsub_agent()
        self.location = self.c.archive_location or self.c.region

    def declare(self) -> None:
        self.storage()
        if self.c.archive_bigquery:
            self.bigquery()

    def subscription(self, resource: str, grants: list[pulumi.Resource],
                     **export: Any) -> gcp.pubsub.Subscription:
        """An export subscription on the bus topic, created once Pub/Sub's grants exist."""
        c = self.c
        return self.s.add(gcp.pubsub.Subscription(
            resource, project=c.project, topic=self.s.topic.id,
            message_retention_duration=f"{c.retention_seconds}s",
            expiration_policy=gcp.pubsub.SubscriptionExpirationPolicyArgs(ttl=""),
            opts=pulumi.ResourceOptions(depends_on=grants), **export))

    def storage(self) -> None:
        c, s = self.c, self.s
        bucket = s.add(gcp.storage.Bucket(
            "archive-bucket", project=c.project, name=bucket_name(c), location=self.location,
            uniform_bucket_level_access=True, public_access_prevention="enforced",
            lifecycle_rules=[gcp.storage.BucketLifecycleRuleArgs(
                action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=c.archive_days))]))
        grants = [self.bucket_grant("agent-writes-archive", bucket, "roles/storage.objectCreator",
                                    self.agent),
                  self.bucket_grant("agent-reads-archive-bucket", bucket,
                                    "roles/storage.legacyBucketReader", self.agent)]
        self.bucket_grant("runtime-reads-archive", bucket, "roles/storage.objectViewer",
                          s.runtime_sa.member)
        self.subscription(
            "archive-subscription", grants, name=storage_subscription(c),
            ack_deadline_seconds=c.archive_file_seconds,
            cloud_storage_config=gcp.pubsub.SubscriptionCloudStorageConfigArgs(
                bucket=bucket.name, filename_prefix=prefix(c),
                filename_datetime_format=DATETIME_FORMAT,
                max_duration=f"{c.archive_file_seconds}s",
                avro_config=gcp.pubsub.SubscriptionCloudStorageConfigAvroConfigArgs(
                    write_metadata=True, use_topic_schema=False)))
        self.backlog_alert("alert-archive-backlog", storage_subscription(c))

    def bucket_grant(self, name: str, bucket: gcp.storage.Bucket, role: str,
                     member: pulumi.Input[str]) -> gcp.storage.BucketIAMMember:
        return self.s.add(gcp.storage.BucketIAMMember(
            name, bucket=bucket.name, role=role, member=member))

    def bigquery(self) -> None:
        c, s = self.c, self.s
        dataset = s.add(gcp.bigquery.Dataset(
            "archive-dataset", project=c.project, dataset_id=dataset_id(c),
            location=self.location,
            description=f"Every message of the {c.topic} topic, for payload search and audit"))
        table = s.add(gcp.bigquery.Table(
            "archive-table", project=c.project, dataset_id=dataset.dataset_id, table_id=TABLE,
            schema=json.dumps(TABLE_SCHEMA), deletion_protection=True,
            time_partitioning=gcp.bigquery.TableTimePartitioningArgs(
                type="DAY", field="publish_time", expiration_ms=c.archive_days * DAY_MS)))
        grant = s.add(gcp.bigquery.IamMember(
            "agent-writes-archive-table", project=c.project, dataset_id=dataset.dataset_id,
            table_id=table.table_id, role="roles/bigquery.dataEditor", member=self.agent))
        self.subscription(
            "bigquery-subscription", [grant], name=bigquery_subscription(c),
            ack_deadline_seconds=c.ack_deadline_seconds,
            bigquery_config=gcp.pubsub.SubscriptionBigqueryConfigArgs(
                table=pulumi.Output.concat(c.project, ".", dataset.dataset_id, ".",
                                           table.table_id),
                write_metadata=True, use_topic_schema=False))
        self.backlog_alert("alert-bigquery-backlog", bigquery_subscription(c))

    def backlog_alert(self, name: str, subscription: str) -> None:
        c, s = self.c, self.s
        s.alert(name, f"{subscription}: oldest unacked message",
                s.threshold(worker.OLDEST_UNACKED.format(name=subscription), "ALIGN_MAX",
                            c.backlog_alert_seconds),
                f"{subscription} has not exported a message for {c.backlog_alert_seconds} s: "
                "check the Pub/Sub service agent's grants on the archive and the "
                f"subscription's state. Pub/Sub drops what is not exported after "
                f"{c.retention_seconds} s, and the archive then misses it.")
