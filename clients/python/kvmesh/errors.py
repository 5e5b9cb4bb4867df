"""Typed exceptions for the node's gRPC statuses and the details it attaches.

Every error a node returns reaches the caller as a subclass of KVMeshError
carrying the node's message (``str(e)``) and the status code name
(``e.code``). Bad arguments found before any call (a tensor of the wrong
shape, dtype or layout) are ValueError, as in numpy and torch.

A node's INVALID_ARGUMENT, RESOURCE_EXHAUSTED and PERMISSION_DENIED carry a
google.rpc.ErrorInfo with a stable reason (proto/kvmesh/v1/errors.proto):
``e.reason`` ("QUOTA_EXCEEDED"), ``e.metadata``, and by class
``e.field_violations`` (BadRequest: [(field, description)]) or
``e.quota_violations`` (QuotaFailure: [(subject, description)]). The reason
picks the most specific class (QuotaExceeded is a ResourceExhausted, so
``except ResourceExhausted`` still catches it); a reason this version does
not know, or a node that sent none, gives the class of the code alone.
"""
import grpc

from .v1 import errors_pb2

#: ErrorInfo.domain of kvmesh's reasons.
DOMAIN = "kvmesh.dev"

#: The trailer in which gRPC carries a status's details (a google.rpc.Status).
_DETAILS_KEY = "grpc-status-details-bin"


class KVMeshError(Exception):
    """An error answered by a node (or the channel to it)."""

    code = "UNKNOWN"

    def __init__(self, message, code=None, *, reason=None, metadata=None, field_violations=(), quota_violations=()):
        super().__init__(message)
        if code is not None:
            self.code = code
        #: The ErrorInfo reason ("QUOTA_EXCEEDED"), None when the node sent none.
        self.reason = reason
        #: The ErrorInfo metadata ({"namespace_digest": ...}).
        self.metadata = dict(metadata or {})
        #: BadRequest: [(field, description)] of the request fields at fault.
        self.field_violations = list(field_violations)
        #: QuotaFailure: [(subject, description)] of what ran out.
        self.quota_violations = list(quota_violations)


class NotFound(KVMeshError):
    code = "NOT_FOUND"


class Unavailable(KVMeshError):
    code = "UNAVAILABLE"


class InvalidArgument(KVMeshError, ValueError):
    code = "INVALID_ARGUMENT"


class TooManyBlocks(InvalidArgument):
    """More blocks in one request than the node's max_batch_blocks (metadata "limit")."""


class BlockTooLarge(InvalidArgument):
    """The namespace's blocks exceed the node's max_block_bytes (metadata "limit")."""


class BlockCorrupt(InvalidArgument):
    """A block's bytes do not match its header or checksum."""


class BadPart(InvalidArgument):
    """A part range or parallel rank layout that does not fit the namespace's blocks (block.ErrBadPart):
    the message names the valid ranges. Raised before any call."""


class PartConflict(InvalidArgument):
    """A part that overlaps what the node already holds of the block with different bytes
    (store.ErrPartConflict, put status 4): nothing of it was stored."""


class InvalidPageToken(InvalidArgument):
    """A page_token the node did not issue for that call."""


class PermissionDenied(KVMeshError):
    """The token is missing, unknown, or lacks the scope (UNAUTHENTICATED too)."""
    code = "PERMISSION_DENIED"


class Unauthenticated(PermissionDenied):
    """No token, or one the node does not accept."""
    code = "UNAUTHENTICATED"


class ScopeMissing(PermissionDenied):
    """The token lacks the scope the call needs (metadata "scope", "method")."""


class NamespaceForbidden(PermissionDenied):
    """A tenant named a namespace digest that is not its own (metadata "namespace_digest")."""


class ResourceExhausted(KVMeshError):
    code = "RESOURCE_EXHAUSTED"


class QuotaExceeded(ResourceExhausted):
    """The namespace is at its quota on the node (metadata "namespace_digest")."""


class CacheFull(ResourceExhausted):
    """The node's tiers are full of blocks in use; retry later."""


class Busy(ResourceExhausted):
    """The node's in-flight budget or its prefill queue is full; retry later."""


class DeadlineExceeded(KVMeshError, TimeoutError):
    code = "DEADLINE_EXCEEDED"


_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}

_BY_REASON = {
    "TOO_MANY_BLOCKS": TooManyBlocks,
    "BLOCK_TOO_LARGE": BlockTooLarge,
    "BLOCK_CORRUPT": BlockCorrupt,
    "INVALID_PAGE_TOKEN": InvalidPageToken,
    "QUOTA_EXCEEDED": QuotaExceeded,
    "CACHE_FULL": CacheFull,
    "NODE_BUSY": Busy,
    "QUEUE_FULL": Busy,
    "SCOPE_MISSING": ScopeMissing,
    "NAMESPACE_FORBIDDEN": NamespaceForbidden,
}


def known_reason(reason):
    """Whether reason is one of errors.proto's ErrorReason names (without ERROR_REASON_)."""
    try:
        return errors_pb2.ErrorReason.Value("ERROR_REASON_" + reason) != 0
    except ValueError:
        return False


# The details travel as a serialized google.rpc.Status. Its messages are not
# among the protobuf runtime's own (googleapis-common-protos is no dependency
# of this package), so the few fields read here are decoded by hand:
#   Status        3: repeated google.protobuf.Any details
#   Any           1: type_url, 2: value
#   ErrorInfo     1: reason, 2: domain, 3: map<string, string> metadata
#   BadRequest    1: repeated FieldViolation {1: field, 2: description}
#   QuotaFailure  1: repeated Violation {1: subject, 2: description}
# A field of another wire type is skipped; bytes that do not parse give no
# details (the code alone still types the error).

def _varint(b, i):
    v = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ValueError("truncated varint")
        x = b[i]
        i += 1
        v |= (x & 0x7F) << shift
        if x < 0x80:
            return v, i
        shift += 7


def _fields(b):
    """(field number, value) of each field of message bytes b; value is bytes for
    length-delimited fields, an int for varints; other wire types are skipped."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
            yield num, v
        elif wt == 2:
            n, i = _varint(b, i)
            if i + n > len(b):
                raise ValueError("truncated field")
            yield num, bytes(b[i:i + n])
            i += n
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wt}")
    if i != len(b):
        raise ValueError("truncated message")


def _pairs(b):
    """Fields 1 and 2 of b, as strings (FieldViolation, Violation, a map entry)."""
    out = ["", ""]
    for num, v in _fields(b):
        if num in (1, 2) and isinstance(v, bytes):
            out[num - 1] = v.decode("utf-8", "replace")
    return tuple(out)


def parse_details(raw):
    """The kvmesh details in a grpc-status-details-bin trailer: a dict with reason,
    domain, metadata, field_violations and quota_violations (empty when none parse)."""
    d = {"reason": None, "domain": None, "metadata": {}, "field_violations": [], "quota_violations": []}
    try:
        for num, anyb in _fields(raw):
            if num != 3 or not isinstance(anyb, bytes):
                continue
            type_url, value = "", b""
            for n, v in _fields(anyb):
                if n == 1 and isinstance(v, bytes):
                    type_url = v.decode("utf-8", "replace")
                elif n == 2 and isinstance(v, bytes):
                    value = v
            kind = type_url.rsplit("/", 1)[-1]
            if kind == "google.rpc.ErrorInfo":
                info = {"metadata": {}}
                for n, v in _fields(value):
                    if n == 1 and isinstance(v, bytes):
                        info["reason"] = v.decode("utf-8", "replace")
                    elif n == 2 and isinstance(v, bytes):
                        info["domain"] = v.decode("utf-8", "replace")
                    elif n == 3 and isinstance(v, bytes):
                        k, val = _pairs(v)
                        info["metadata"][k] = val
                if info.get("domain") == DOMAIN:
                    d["reason"], d["domain"], d["metadata"] = info.get("reason"), DOMAIN, info["metadata"]
            elif kind == "google.rpc.BadRequest":
                d["field_violations"] += [_pairs(v) for n, v in _fields(value) if n == 1 and isinstance(v, bytes)]
            elif kind == "google.rpc.QuotaFailure":
                d["quota_violations"] += [_pairs(v) for n, v in _fields(value) if n == 1 and isinstance(v, bytes)]
    except ValueError:
        return {"reason": None, "domain": None, "metadata": {}, "field_violations": [], "quota_violations": []}
    return d


def _details_trailer(e):
    md = e.trailing_metadata() if callable(getattr(e, "trailing_metadata", None)) else None
    for k, v in md or ():
        if k == _DETAILS_KEY:
            return v
    return None


def from_rpc(e):
    """The KVMeshError for a grpc.RpcError (or grpc.aio.AioRpcError)."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    cls = _BY_CODE.get(code, KVMeshError)
    message = e.details() if callable(getattr(e, "details", None)) else str(e)
    raw = _details_trailer(e)
    d = parse_details(raw) if raw else parse_details(b"")
    sub = _BY_REASON.get(d["reason"])
    if sub is not None and issubclass(sub, cls):
        cls = sub
    return cls(message or code.name, code.name, reason=d["reason"], metadata=d["metadata"],
               field_violations=d["field_violations"], quota_violations=d["quota_violations"])
