"""The archive in the stack (archive.py) under Pulumi's mocks: opt-in, least privilege, the
layout the reader reads, and the settings that cannot work refused.

``test_stack.py`` checks every piece of the archive's wiring is there (``archive_checks``) and
that removing any one of its resources is noticed; these pin what must not be there.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest
from siblings import sibling

_t = sibling("test_stack")
AGENT, ARCHIVE, BOTH, RUN = _t.AGENT, _t.ARCHIVE, _t.BOTH, _t.RUN
check_wiring, inputs, member, of_type = _t.check_wiring, _t.inputs, _t.member, _t.of_type
recorded, stack = _t.recorded, _t.stack
archive = stack.archive
pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated in favor of:DeprecationWarning")
ARCHIVE_RESOURCES = {"archive-bucket", "agent-writes-archive", "agent-reads-archive-bucket",
                     "runtime-reads-archive", "archive-subscription", "alert-archive-backlog",
                     "archive-dataset", "archive-table", "agent-writes-archive-table",
                     "bigquery-subscription", "alert-bigquery-backlog"}


def names(resources: list[Any]) -> set[str]:
    return {r.name for r in resources}


def grants(resources: list[Any], who: str) -> set[tuple[str, str, str]]:
    """(kind, the resource granted on, role) of every grant to ``who`` on the archive."""
    found = set()
    for r in resources:
        if r.inputs.get("member") == who and ("bucket" in r.inputs or "tableId" in r.inputs
                                              or "datasetId" in r.inputs):
            target = r.inputs.get("bucket") or \
                f"{r.inputs['datasetId']}.{r.inputs.get('tableId', '*')}"
            found.add((r.type.split(":")[-1], target, r.inputs["role"]))
    return found


def test_without_archive_nothing_of_it_is_declared() -> None:
    for config in (RUN, BOTH):
        resources = recorded(config)
        assert names(resources) & ARCHIVE_RESOURCES == set()
        assert not [r for r in resources if r.type.startswith("gcp:bigquery/")]
        assert archive.exports(config) == {}


def test_archive_adds_only_its_own_resources_and_leaves_the_rest_as_it_was() -> None:
    assert names(recorded(ARCHIVE)) - names(recorded(RUN)) == ARCHIVE_RESOURCES
    assert check_wiring(recorded(ARCHIVE), RUN) == []


def test_pubsub_may_write_the_archive_and_nothing_more_of_it() -> None:
    bucket = "acme-prod-partner-events-archive"
    assert grants(recorded(ARCHIVE), AGENT) == {
        ("BucketIAMMember", bucket, "roles/storage.objectCreator"),
        ("BucketIAMMember", bucket, "roles/storage.legacyBucketReader"),
        ("IamMember", "partner_events_archive.messages", "roles/bigquery.dataEditor")}


def test_the_runtime_may_read_the_files_and_nothing_else_of_the_archive() -> None:
    runtime = member(RUN.runtime_service_account_id, RUN)
    assert grants(recorded(ARCHIVE), runtime) == {
        ("BucketIAMMember", "acme-prod-partner-events-archive", "roles/storage.objectViewer")}


def test_the_files_are_the_layout_the_reader_reads() -> None:
    config = inputs(recorded(ARCHIVE), "archive-subscription")["cloudStorageConfig"]
    # eventbus.rebuild.archive reads Avro records with metadata (PubsubMessageWithMetadata);
    # the topic's schema or text files would be another layout.
    assert config["avroConfig"] == {"writeMetadata": True, "useTopicSchema": False}
    assert "textConfig" not in config
    # The date leads the name under the topic's folder: name order is time order.
    assert config["filenamePrefix"] == "partner-events/"
    assert config["filenameDatetimeFormat"].startswith("YYYY-MM-DD")


def test_the_table_has_the_columns_a_subscription_with_metadata_writes() -> None:
    table = inputs(recorded(ARCHIVE), "archive-table")
    columns = {f["name"]: f["type"] for f in json.loads(table["schema"])}
    assert columns == {"subscription_name": "STRING", "message_id": "STRING",
                       "publish_time": "TIMESTAMP", "data": "BYTES", "attributes": "JSON"}
    assert table["timePartitioning"] == {"type": "DAY", "field": "publish_time",
                                         "expirationMs": 365 * 86_400_000}
    bigquery = inputs(recorded(ARCHIVE), "bigquery-subscription")["bigqueryConfig"]
    assert bigquery == {"table": "acme-prod.partner_events_archive.messages",
                        "writeMetadata": True, "useTopicSchema": False}


def test_archive_days_and_file_seconds_reach_the_bucket_and_the_subscription() -> None:
    config = replace(ARCHIVE, archive_days=40, archive_file_seconds=120,
                     archive_bucket="acme-bus-archive", archive_location="EU")
    resources = recorded(config)
    assert check_wiring(resources, config) == []
    bucket = inputs(resources, "archive-bucket")
    assert (bucket["name"], bucket["location"]) == ("acme-bus-archive", "EU")
    assert bucket["lifecycleRules"][0]["condition"] == {"age": 40}
    subscription = inputs(resources, "archive-subscription")
    assert subscription["ackDeadlineSeconds"] == 120
    assert subscription["cloudStorageConfig"]["maxDuration"] == "120s"


def test_bigquery_can_be_left_out() -> None:
    config = replace(ARCHIVE, archive_bigquery=False)
    resources = recorded(config)
    assert check_wiring(resources, config) == []
    assert not [r for r in resources if r.type.startswith("gcp:bigquery/")]
    assert "bigquery-subscription" not in names(resources)
    assert "archiveTable" not in archive.exports(config)


def test_the_outputs_say_where_to_read_the_archive() -> None:
    out = stack.exports(ARCHIVE, {"service": _Service()})
    assert out["archiveUrl"] == "gs://acme-prod-partner-events-archive/partner-events/"
    assert out["archiveSubscription"] == "partner-events-archive"
    assert out["archiveTable"] == "acme-prod.partner_events_archive.messages"
    assert out["archiveBigquerySubscription"] == "partner-events-bigquery"


class _Service:
    uri = "https://example"


@pytest.mark.parametrize(("change", "rule"), [
    ({"archive_days": 0}, "archiveDays must be >= 1"),
    ({"archive_file_seconds": 30}, "archiveFileSeconds must be 60..600"),
    ({"archive_file_seconds": 601}, "archiveFileSeconds must be 60..600"),
    ({"archive_bucket": "Acme_Archive!"}, "archiveBucket 'Acme_Archive!'"),
    ({"archive_bucket": "acme.example.com"}, "archiveBucket 'acme.example.com'"),
    ({"project": "a-very-long-project-name-30", "topic": "a-very-long-topic-name-for-events"},
     "archiveBucket 'a-very-long-project-name-30-a-very-long-topic-name-for-events-archive'"),
    ({"archive_dataset": "bad-name"}, "archiveDataset 'bad-name'"),
])
def test_an_archive_setting_that_cannot_work_is_refused(change: dict[str, Any],
                                                        rule: str) -> None:
    with pytest.raises(ValueError, match=re.escape(rule)):
        replace(ARCHIVE, **change)
    replace(RUN, **change)  # the same settings are nobody's business without the archive


def test_archive_is_set_from_pulumi_config() -> None:
    settings = {"project": "p", "region": "r", "image": "i", "archive": "true",
                "archiveDays": "30", "archiveBigquery": "false"}
    config = stack.from_getter(settings.get)
    assert (config.archive, config.archive_days, config.archive_bigquery) == (True, 30, False)
    with pytest.raises(ValueError, match="archive must be true or false"):
        stack.from_getter({**settings, "archive": "yes"}.get)
