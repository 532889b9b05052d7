"""Where archive files are: a local file or directory, or a ``gs://bucket/prefix`` URL.

``read_archive`` lists the files first (a directory recursively; objects under a
prefix, as ``gcloud storage ls`` takes it), sorts them by name, and reads each in
turn with ``layout.read_file``. The subscription names its objects after the
time they were written (its filename prefix and date-time format), so name
order is the order in which they were written. A source that cannot be listed
raises ``ArchiveError`` at once; a file that cannot be opened or read is a
problem of that file, and the next one is read.

The Cloud Storage client is injected (``storage_client``), so tests and callers
with their own credentials pass one; without it, ``google.cloud.storage.Client()``
is made with the application default credentials.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

from eventbus.model.content import error_text
from eventbus.rebuild.archive.archived import (
    ArchivedMessage,
    ArchiveError,
    ArchiveProblem,
    one_line,
    problem,
)
from eventbus.rebuild.archive.layout import avro, read_file, why

GS = "gs://"
NAME_CHARS = 1024
"""A file's name as messages and problems give it is cut to this many characters."""


class Blob(Protocol):
    """The part of ``google.cloud.storage.Blob`` the reader uses; a test passes a fake."""

    @property
    def name(self) -> str:
        """The object's name inside its bucket."""
        ...

    def open(self, mode: str = "r") -> IO[bytes]:
        """A file object reading the object (``"rb"``: a ``BlobReader``, read in chunks)."""
        ...


class StorageClient(Protocol):
    """The part of ``google.cloud.storage.Client`` the reader uses; a test passes a fake."""

    def list_blobs(self, bucket_or_name: Any, prefix: str | None = None) -> Iterable[Blob]:
        """Every object of the bucket whose name starts with ``prefix``."""
        ...


@dataclasses.dataclass(frozen=True)
class _File:
    """One file to read: its name as reported, and how to open it."""

    name: str
    open: Callable[[], IO[bytes]]


def read_archive(source: str | os.PathLike[str], *,
                 storage_client: StorageClient | None = None,
                 ) -> Iterator[ArchivedMessage | ArchiveProblem]:
    """Every message of the archive at ``source``, in file-name and record order, or a problem.

    ``source`` is a local Avro file, a directory of them (read recursively), or
    ``gs://bucket/prefix``. Raises ``ArchiveError`` at once when the source
    cannot be listed; after that, whatever a file holds is a message or an
    ``ArchiveProblem`` naming the file (and the record), and the rest is read.
    The archive is at-least-once, as the subscription writes it: the same
    message may appear twice, and the idempotency key makes it one event.
    """
    avro()  # the extra is there, or one line says how to install it, before any listing
    text = os.fspath(source)
    problems: list[ArchiveProblem] = []
    if text.startswith(GS):
        files = _cloud_files(text, storage_client)
    elif "://" in text:
        raise ArchiveError(f"{one_line(text, NAME_CHARS)}: an archive is a local path or "
                           "a gs://bucket/prefix URL")
    else:
        files, problems = _local_files(Path(text))
    return _read(files, problems)


def _read(files: list[_File],
          problems: list[ArchiveProblem]) -> Iterator[ArchivedMessage | ArchiveProblem]:
    yield from problems
    for file in files:
        try:
            with file.open() as stream:
                yield from read_file(stream, file.name)
        except Exception as exc:  # opening or closing it: the file's problem, not the run's
            yield problem(file.name, None, f"cannot be read: {why(exc)}")


def _local_files(root: Path) -> tuple[list[_File], list[ArchiveProblem]]:
    """The regular files under ``root`` by relative name, and what could not be listed."""
    shown = _shown(root)
    if root.is_file():
        return [_local(root)], []
    if not root.is_dir():
        raise ArchiveError(f"{shown}: no such file or directory")
    unlisted: list[OSError] = []
    found: list[Path] = []
    for folder, _dirs, names in os.walk(root, onerror=unlisted.append):
        found += (Path(folder) / name for name in names)
    found.sort(key=lambda path: path.relative_to(root).as_posix())
    problems = [problem(_shown(exc.filename or root), None,
                        f"cannot be listed: {why(exc)}") for exc in unlisted]
    # A FIFO or a device would block or never end: only regular files are read.
    problems += [problem(_shown(path), None, "not a regular file")
                 for path in found if not path.is_file()]
    return [_local(path) for path in found if path.is_file()], problems


def _local(path: Path) -> _File:
    return _File(_shown(path), lambda: path.open("rb"))


def _shown(path: str | os.PathLike[str]) -> str:
    """A local path as reported: its bytes as UTF-8, anything else escaped, one line."""
    return one_line(os.fsencode(path), NAME_CHARS)


def _cloud_files(url: str, client: StorageClient | None) -> list[_File]:
    bucket, _, prefix = url[len(GS):].partition("/")
    if not bucket:
        raise ArchiveError(f"{one_line(url, NAME_CHARS)}: no bucket (gs://bucket/prefix)")
    storage = client if client is not None else _default_client()
    try:
        blobs = sorted((blob for blob in storage.list_blobs(bucket, prefix=prefix or None)
                        if not blob.name.endswith("/")),  # a "folder" placeholder
                       key=lambda blob: blob.name)
    except Exception as exc:  # not found, forbidden, offline: nothing of it can be read
        raise ArchiveError(f"{one_line(url, NAME_CHARS)} cannot be listed: "
                           f"{error_text(exc, 300)}") from None
    return [_File(one_line(f"{GS}{bucket}/{blob.name}", NAME_CHARS),
                  functools.partial(blob.open, "rb")) for blob in blobs]


def _default_client() -> StorageClient:
    # The archive extra is optional: the service and the other commands run without it.
    try:
        from google.cloud import storage
    except ImportError:
        raise ArchiveError("reading gs:// needs google-cloud-storage: "
                           "pip install 'eventbus[archive]'") from None
    try:
        client: StorageClient = storage.Client()
    except Exception as exc:  # no credentials or project: one line for the operator
        raise ArchiveError(f"cannot make a Cloud Storage client: {error_text(exc, 300)}") \
            from None
    return client
