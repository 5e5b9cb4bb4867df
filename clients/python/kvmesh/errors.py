"""Typed exceptions for the node's gRPC status codes.

Every error a node returns reaches the caller as a subclass of KVMeshError
carrying the node's message (``str(e)``) and the status code name
(``e.code``). Bad arguments found before any call (a tensor of the wrong
shape, dtype or layout) are ValueError, as in numpy and torch.
"""
import grpc


class KVMeshError(Exception):
    """An error answered by a node (or the channel to it)."""

    code = "UNKNOWN"

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class NotFound(KVMeshError):
    code = "NOT_FOUND"


class Unavailable(KVMeshError):
    code = "UNAVAILABLE"


class InvalidArgument(KVMeshError, ValueError):
    code = "INVALID_ARGUMENT"


class PermissionDenied(KVMeshError):
    """The token is missing, unknown, or lacks the scope (UNAUTHENTICATED too)."""
    code = "PERMISSION_DENIED"


class ResourceExhausted(KVMeshError):
    code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(KVMeshError, TimeoutError):
    code = "DEADLINE_EXCEEDED"


_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def from_rpc(e):
    """The KVMeshError for a grpc.RpcError (or grpc.aio.AioRpcError)."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    cls = _BY_CODE.get(code, KVMeshError)
    details = e.details() if callable(getattr(e, "details", None)) else str(e)
    return cls(details or code.name, code.name)
