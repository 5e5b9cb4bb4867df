package client

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// Sentinel errors, for errors.Is. A node's refusal comes as an *Error, which
// matches the sentinel of its status code (and, for ErrQuota, its reason);
// errors.As reaches the *Error for the reason, the field violations and the
// gRPC status itself.
var (
	// ErrInvalid: the client refused an argument before sending anything,
	// or the node answered InvalidArgument.
	ErrInvalid = errors.New("client: invalid argument")
	// ErrNotFound: the node answered NotFound (BlockInfo of a block that is
	// not cached, GetResult of an unknown request).
	ErrNotFound = errors.New("client: not found")
	// ErrExhausted: the node answered ResourceExhausted: a namespace quota
	// (ErrQuota, which matches this too), a full cache, the node's
	// in-flight budget, the prefill queue. Error.Reason says which; all but
	// a quota pass with time.
	ErrExhausted = errors.New("client: resource exhausted")
	// ErrQuota: the namespace is at its quota on the node (reason
	// QUOTA_EXCEEDED); raise it (SetQuota) or drop blocks.
	ErrQuota = errors.New("client: namespace over its quota")
	// ErrPermission: the node answered PermissionDenied: the token lacks
	// the scope, or names another tenant's namespace.
	ErrPermission = errors.New("client: permission denied")
	// ErrUnauthenticated: the node wants a (valid) bearer token
	// (Options.Token).
	ErrUnauthenticated = errors.New("client: not authenticated")
	// ErrUnavailable: the node could not be reached, or was shutting down,
	// after the retries a safe call is given.
	ErrUnavailable = errors.New("client: node unavailable")
	// ErrPartConflict: a part Put sent (a Prompt's Rank) overlaps what the
	// node already holds of its block with different bytes; the node stored
	// nothing of that part. Ranks that disagree on a block's KV computed different
	// prompts or models under one namespace. It is an invalid argument:
	// it matches ErrInvalid too, and errors.As reaches the
	// *PartConflictError, which names the block and the part.
	ErrPartConflict = errors.New("client: part conflicts with the stored parts of its block")
)

// PartConflictError is a part the node refused because it conflicts with
// the parts of its block already stored (ErrPartConflict).
type PartConflictError struct {
	Key  prefixhash.Key // the block
	Part block.Part     // the part refused; zero: the whole block
}

func (e *PartConflictError) Error() string {
	what := "the whole block"
	if e.Part != (block.Part{}) {
		what = e.Part.String()
	}
	return fmt.Sprintf("block %s, %s: the node holds other bytes for cells of it: refused (part conflict)", e.Key, what)
}

// Is matches ErrPartConflict and ErrInvalid.
func (e *PartConflictError) Is(target error) bool {
	return target == ErrPartConflict || target == ErrInvalid
}

// errTooManyPages ends a listing whose node keeps answering with a next
// page.
var errTooManyPages = errors.New("client: the node's list did not end")

// Error is a call the node refused or failed: its gRPC status, with the
// details the node attached (proto/kvmesh/v1/errors.proto).
type Error struct {
	// Op is the call, as in the message: "put", "stats".
	Op string
	// Code is the status code.
	Code codes.Code
	// Reason is the ErrorInfo reason ("QUOTA_EXCEEDED", see
	// kvmeshv1.ErrorReason), empty when the node sent none.
	Reason string
	// Metadata is the ErrorInfo metadata ("namespace_digest", "limit",
	// "scope"), nil when none.
	Metadata map[string]string
	// Fields are the request fields at fault (BadRequest), for
	// InvalidArgument.
	Fields []FieldViolation
	// Quotas name what ran out (QuotaFailure), for ResourceExhausted.
	Quotas []QuotaViolation

	err error // the status error
}

// FieldViolation is one field of a refused request and what is wrong with it.
type FieldViolation struct {
	Field       string // its path in the request: "block.tokens"
	Description string
}

// QuotaViolation is one limit a refused request ran into.
type QuotaViolation struct {
	Subject     string // "namespace:<digest>", "node:max_inflight_bytes"
	Description string
}

func (e *Error) Error() string {
	return fmt.Sprintf("client: %s: %s: %s", e.Op, e.Code, status.Convert(e.err).Message())
}

// Unwrap returns the gRPC status error.
func (e *Error) Unwrap() error { return e.err }

// GRPCStatus returns the status, so that status.FromError and status.Code
// read an *Error (and errors that wrap one) as the node's status.
func (e *Error) GRPCStatus() *status.Status { return status.Convert(e.err) }

// Is matches the sentinel of e's code (ErrQuota by reason).
func (e *Error) Is(target error) bool {
	switch target {
	case ErrInvalid:
		return e.Code == codes.InvalidArgument
	case ErrNotFound:
		return e.Code == codes.NotFound
	case ErrExhausted:
		return e.Code == codes.ResourceExhausted
	case ErrQuota:
		return e.Code == codes.ResourceExhausted && e.Reason == kvmeshv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED.Reason()
	case ErrPermission:
		return e.Code == codes.PermissionDenied
	case ErrUnauthenticated:
		return e.Code == codes.Unauthenticated
	case ErrUnavailable:
		return e.Code == codes.Unavailable
	}
	return false
}

// callError returns the error of the call op: an *Error for a gRPC status,
// err wrapped with op otherwise.
func callError(op string, err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.OK {
		return fmt.Errorf("client: %s: %w", op, err)
	}
	e := &Error{Op: op, Code: st.Code(), err: err}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == kvmeshv1.ErrorDomain {
				e.Reason, e.Metadata = d.GetReason(), d.GetMetadata()
			}
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.Fields = append(e.Fields, FieldViolation{Field: v.GetField(), Description: v.GetDescription()})
			}
		case *errdetails.QuotaFailure:
			for _, v := range d.GetViolations() {
				e.Quotas = append(e.Quotas, QuotaViolation{Subject: v.GetSubject(), Description: v.GetDescription()})
			}
		}
	}
	return e
}
