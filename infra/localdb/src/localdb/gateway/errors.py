"""MongoDB error codes, the engine's SQLSTATE table, and the error the gateway replies with.

DocumentDB raises PostgreSQL errors whose SQLSTATE encodes a MongoDB error
(class "M"); in per-statement write errors the same SQLSTATE arrives packed
into an int32 the way PostgreSQL's MAKE_SQLSTATE packs it. Standard
PostgreSQL states (unique violation, serialization failure, ...) are mapped
to the MongoDB code a driver expects for the same situation.
"""

from __future__ import annotations

import enum
from typing import Any


class Code(enum.IntEnum):
    """MongoDB error codes the gateway can produce; member names are the codeName."""

    InternalError = 1
    BadValue = 2
    GraphContainsCycle = 5
    HostUnreachable = 6
    FailedToParse = 9
    UserNotFound = 11
    Unauthorized = 13
    TypeMismatch = 14
    Overflow = 15
    InvalidLength = 16
    AuthenticationFailed = 18
    IllegalOperation = 20
    InvalidBSON = 22
    AlreadyInitialized = 23
    LockTimeout = 24
    NamespaceNotFound = 26
    IndexNotFound = 27
    PathNotViable = 28
    RoleNotFound = 31
    CannotBackfillArray = 34
    ConflictingUpdateOperators = 40
    CursorNotFound = 43
    NamespaceExists = 48
    MaxTimeMSExpired = 50
    DollarPrefixedFieldName = 52
    CanNotBeTypeArray = 53
    NotSingleValueField = 54
    EmptyFieldName = 56
    DottedFieldName = 57
    CommandNotFound = 59
    ShardKeyNotFound = 61
    ImmutableField = 66
    CannotCreateIndex = 67
    IndexAlreadyExists = 68
    InvalidOptions = 72
    InvalidNamespace = 73
    IndexOptionsConflict = 85
    IndexKeySpecsConflict = 86
    ShutdownInProgress = 91
    NotExactValueField = 111
    WriteConflict = 112
    CommandNotSupported = 115
    ConflictingOperationInProgress = 117
    NamespaceNotSharded = 118
    DocumentValidationFailure = 121
    FailedToSatisfyReadPreference = 133
    CursorInUse = 143
    ExceededMemoryLimit = 146
    DurationOverflow = 159
    ViewDepthLimitExceeded = 165
    CommandNotSupportedOnView = 166
    OptionNotSupportedOnView = 167
    AmbiguousIndexKeyPattern = 181
    ClientMetadataCannotBeMutated = 186
    InvalidIndexSpecificationOption = 197
    CannotBuildIndexKeys = 201
    QueryFeatureNotAllowed = 224
    TransactionTooOld = 225
    MaxSubPipelineDepthExceeded = 232
    ConversionFailure = 241
    NoSuchTransaction = 251
    TransactionCommitted = 256
    TooManyLogicalSessions = 261
    OperationNotSupportedInTransaction = 263
    IndexBuildAborted = 276
    UnableToFindIndex = 291
    UnsupportedOpQueryCommand = 352
    CollectionUUIDMismatch = 361
    ReauthenticationRequired = 391
    InvalidPassword = 392
    NotWritablePrimary = 10107
    BSONObjectTooLarge = 10334
    DuplicateKey = 11000
    BackgroundOperationInProgressForNamespace = 12587
    MergeStageNoMatchingDocument = 13113
    DbAlreadyExists = 13297
    OutOfDiskSpace = 14031
    DocumentAfterUpdateLargerThanMaxSize = 17419
    DocumentToUpsertLargerThanMaxSize = 17420
    UnrecognizedCommand = 40324
    UnknownBsonField = 40415
    ChangeStreamBadResumeToken = 40647
    InsufficientPrivilege = 42501
    NotARetryableWriteCommand = 50768


def code_name(code: int) -> str:
    """The codeName drivers show for `code` (MongoDB names unnamed codes LocationNNN)."""
    try:
        return Code(code).name
    except ValueError:
        return f"Location{code}"


# The engine's SQLSTATEs for the named MongoDB errors. Codes without a name
# ("LocationNNNN", mostly expression-argument checks) are not listed: they
# fall back to BadValue, and their message still says what went wrong.
ENGINE_SQLSTATES: dict[str, Code] = {
    "M0000": Code.InternalError, "M0001": Code.BadValue, "M0002": Code.GraphContainsCycle,
    "M00EU": Code.HostUnreachable, "M0003": Code.FailedToParse, "M00ER": Code.Unauthorized,
    "M0004": Code.TypeMismatch, "M0005": Code.Overflow, "M00DO": Code.InvalidLength,
    "M00EV": Code.AuthenticationFailed, "M0006": Code.IllegalOperation,
    "M0007": Code.AlreadyInitialized, "M00EW": Code.LockTimeout,
    "M0008": Code.NamespaceNotFound, "M0009": Code.IndexNotFound, "M000A": Code.PathNotViable,
    "M000B": Code.RoleNotFound, "M000C": Code.CannotBackfillArray,
    "M000D": Code.ConflictingUpdateOperators, "M000E": Code.CursorNotFound,
    "M000F": Code.NamespaceExists, "M00EX": Code.MaxTimeMSExpired,
    "M000G": Code.DollarPrefixedFieldName, "M000H": Code.CanNotBeTypeArray,
    "M000I": Code.NotSingleValueField, "M000J": Code.EmptyFieldName,
    "M000K": Code.DottedFieldName, "M00EY": Code.CommandNotFound,
    "M000L": Code.ShardKeyNotFound, "M000M": Code.ImmutableField,
    "M000N": Code.CannotCreateIndex, "M000O": Code.IndexAlreadyExists,
    "M000P": Code.InvalidOptions, "M000Q": Code.InvalidNamespace,
    "M000R": Code.IndexOptionsConflict, "M000S": Code.IndexKeySpecsConflict,
    "M00F0": Code.ShutdownInProgress, "M000T": Code.NotExactValueField,
    "M00F1": Code.WriteConflict, "M000U": Code.CommandNotSupported,
    "M00F2": Code.ConflictingOperationInProgress, "M000V": Code.NamespaceNotSharded,
    "M00CO": Code.DocumentValidationFailure, "M00EZ": Code.FailedToSatisfyReadPreference,
    "M00EL": Code.CursorInUse, "M000W": Code.ExceededMemoryLimit,
    "M000X": Code.DurationOverflow, "M000Y": Code.ViewDepthLimitExceeded,
    "M000Z": Code.CommandNotSupportedOnView, "M0010": Code.OptionNotSupportedOnView,
    "M0011": Code.AmbiguousIndexKeyPattern, "M00F3": Code.ClientMetadataCannotBeMutated,
    "M0012": Code.InvalidIndexSpecificationOption, "M00F4": Code.CannotBuildIndexKeys,
    "M0013": Code.QueryFeatureNotAllowed, "M00F5": Code.TransactionTooOld,
    "M0014": Code.MaxSubPipelineDepthExceeded, "M0015": Code.ConversionFailure,
    "M00F6": Code.NoSuchTransaction, "M00F7": Code.TransactionCommitted,
    "M00F8": Code.TooManyLogicalSessions, "M0016": Code.OperationNotSupportedInTransaction,
    "M0017": Code.IndexBuildAborted, "M0018": Code.UnableToFindIndex,
    "M0019": Code.CollectionUUIDMismatch, "M00F9": Code.ReauthenticationRequired,
    "M00E8": Code.NotWritablePrimary, "M001B": Code.BSONObjectTooLarge,
    "M001C": Code.DuplicateKey, "M001D": Code.BackgroundOperationInProgressForNamespace,
    "M001H": Code.MergeStageNoMatchingDocument, "M001I": Code.DbAlreadyExists,
    "M003A": Code.DocumentAfterUpdateLargerThanMaxSize,
    "M003B": Code.DocumentToUpsertLargerThanMaxSize, "M007U": Code.UnrecognizedCommand,
    "M0088": Code.UnknownBsonField, "M008Z": Code.ChangeStreamBadResumeToken,
    "M00E7": Code.InsufficientPrivilege, "M00FB": Code.NotARetryableWriteCommand,
}

# Standard PostgreSQL states, and the MongoDB error a driver expects instead.
POSTGRES_SQLSTATES: dict[str, Code] = {
    "23505": Code.DuplicateKey,  # unique_violation (the _id primary key)
    "23P01": Code.DuplicateKey,  # exclusion_violation (DocumentDB's unique indexes)
    "40001": Code.WriteConflict,  # serialization_failure
    "40P01": Code.WriteConflict,  # deadlock_detected
    "55P03": Code.WriteConflict,  # lock_not_available: a transaction's lock_timeout
    "25P02": Code.NoSuchTransaction,  # in_failed_sql_transaction
    "57014": Code.MaxTimeMSExpired,  # query_canceled (statement_timeout)
    "57P01": Code.ShutdownInProgress,  # admin_shutdown
    "42P01": Code.NamespaceNotFound,  # undefined_table
    "0A000": Code.CommandNotSupported,  # feature_not_supported
    "42501": Code.Unauthorized,  # insufficient_privilege
    "28P01": Code.InvalidPassword,
    "22P02": Code.BadValue,  # invalid_text_representation
    "22023": Code.BadValue,  # invalid_parameter_value
    "53300": Code.HostUnreachable,  # too_many_connections
}

# Errors after which retrying the whole transaction may succeed.
TRANSIENT_IN_TRANSACTION = frozenset(
    {Code.WriteConflict, Code.LockTimeout, Code.NoSuchTransaction, Code.HostUnreachable}
)
TRANSIENT_LABEL = "TransientTransactionError"


def sqlstate_from_int(value: int) -> str:
    """Unpack a SQLSTATE packed as PostgreSQL's MAKE_SQLSTATE does (6 bits per char)."""
    chars = []
    for _ in range(5):
        chars.append(chr((value & 0x3F) + ord("0")))
        value >>= 6
    return "".join(chars)


def code_for_sqlstate(state: str) -> Code:
    """The MongoDB code for an engine or PostgreSQL SQLSTATE."""
    if state in ENGINE_SQLSTATES:
        return ENGINE_SQLSTATES[state]
    if state in POSTGRES_SQLSTATES:
        return POSTGRES_SQLSTATES[state]
    if state.startswith("08"):  # connection_exception: the engine went away
        return Code.HostUnreachable
    # An unlisted engine state is a rejected request, not a server fault.
    return Code.BadValue if state.startswith("M") else Code.InternalError


def code_for_engine_int(value: int) -> int:
    """Map a write error's code from the engine: packed SQLSTATEs become MongoDB codes.

    A value that unpacks to no known SQLSTATE and is below 2**24 (no packed
    state with a non-zero last character is) is already a MongoDB code.
    """
    state = sqlstate_from_int(value)
    if state in ENGINE_SQLSTATES or state in POSTGRES_SQLSTATES or value >= 1 << 24:
        return int(code_for_sqlstate(state))
    return value


class MongoError(Exception):
    """A command failure, answered as {ok: 0, errmsg, code, codeName, ...}."""

    def __init__(self, code: int, message: str, labels: tuple[str, ...] = (),
                 **extra: Any):
        super().__init__(message)
        self.code = int(code)
        self.message = message
        self.labels = list(labels)
        self.extra = extra  # e.g. keyPattern / keyValue for DuplicateKey

    def add_label(self, label: str) -> None:
        """Attach an error label once (drivers retry on some of them)."""
        if label not in self.labels:
            self.labels.append(label)

    def to_document(self) -> dict[str, Any]:
        """The reply document a driver turns into an exception."""
        doc: dict[str, Any] = {"ok": 0.0, "errmsg": self.message, "code": self.code,
                               "codeName": code_name(self.code)}
        doc.update(self.extra)
        if self.labels:
            doc["errorLabels"] = list(self.labels)
        return doc


def command_not_found(name: str) -> MongoError:
    """The error for a command the gateway does not implement."""
    return MongoError(Code.CommandNotFound, f"no such command: '{name}'")
