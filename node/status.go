package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/kvmesh/kvmesh/block"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/store"
)

// This file builds every status with which the node refuses a request. An
// INVALID_ARGUMENT, RESOURCE_EXHAUSTED or PERMISSION_DENIED status carries
// a google.rpc.ErrorInfo (domain kvmeshv1.ErrorDomain, a stable reason of
// kvmeshv1.ErrorReason) and, by class, a google.rpc.BadRequest or
// QuotaFailure (proto/kvmesh/v1/errors.proto), so that clients map it to a
// typed error without reading the message. No other file builds a status
// of those codes (TestRefusalsAreCentral).

// refusal returns a status of code with an ErrorInfo of reason (its
// metadata meta, which may be nil) and the details given.
func refusal(code codes.Code, reason kvmeshv1.ErrorReason, meta map[string]string, msg string, details ...protoadapt.MessageV1) error {
	st := status.New(code, clipText(msg))
	info := &errdetails.ErrorInfo{Reason: reason.Reason(), Domain: kvmeshv1.ErrorDomain, Metadata: meta}
	withDetails, err := st.WithDetails(append([]protoadapt.MessageV1{info}, details...)...)
	if err != nil {
		panic(fmt.Sprintf("node: status details do not marshal: %v", err))
	}
	return withDetails.Err()
}

// invalid returns an InvalidArgument status naming the field at fault.
func invalid(field, format string, args ...any) error {
	return invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_INVALID_FIELD, nil, field, format, args...)
}

// invalidFor is invalid with another reason than INVALID_FIELD.
func invalidFor(reason kvmeshv1.ErrorReason, meta map[string]string, field, format string, args ...any) error {
	desc := clipText(fmt.Sprintf(format, args...))
	msg := desc
	if field != "" {
		msg = field + ": " + desc
	}
	return refusal(codes.InvalidArgument, reason, meta, msg,
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: desc}}})
}

// exhausted returns a ResourceExhausted status; subject names what ran out
// (see errors.proto).
func exhausted(reason kvmeshv1.ErrorReason, meta map[string]string, subject, format string, args ...any) error {
	msg := clipText(fmt.Sprintf(format, args...))
	return refusal(codes.ResourceExhausted, reason, meta, msg,
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: subject, Description: msg}}})
}

// denied returns a PermissionDenied status.
func denied(reason kvmeshv1.ErrorReason, meta map[string]string, format string, args ...any) error {
	return refusal(codes.PermissionDenied, reason, meta, fmt.Sprintf(format, args...))
}

// quotaExceeded refuses a write to the namespace digest, at its quota.
func quotaExceeded(digest uint64, err error) error {
	subject, meta := "namespace", map[string]string(nil)
	if digest != 0 {
		subject, meta = "namespace:"+digestString(digest), map[string]string{"namespace_digest": digestString(digest)}
	}
	return exhausted(kvmeshv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED, meta, subject,
		"%s; raise the namespace's quota (AdminService.SetQuota, kvmesh serve --quota-dram/--quota-nvme) or drop some of its blocks",
		strings.TrimPrefix(err.Error(), ErrFull.Error()+": "))
}

// limitMeta is the metadata of a refusal by a node limit.
func limitMeta(limit int) map[string]string { return map[string]string{"limit": strconv.Itoa(limit)} }

// maxStatusText is the most bytes of a status message (or of one of its
// details' descriptions): messages quote what callers sent (an id, a model
// name), and each refusal is logged, so a caller's megabyte must not become
// a megabyte of log and of response header.
const maxStatusText = 1 << 10

// clipText returns s as a status message or log value may carry it: valid
// UTF-8 (gRPC would answer a message that is not with Internal), at most
// maxStatusText bytes, saying how much was cut.
func clipText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxStatusText {
		return s
	}
	cut := maxStatusText - 32
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d bytes cut)", len(s)-cut)
}

// statusError maps the errors handlers return to gRPC statuses (mapError)
// and clips their messages (clipText), details kept.
func statusError(err error) error {
	err = mapError(err)
	if st, ok := status.FromError(err); ok && err != nil {
		if msg := st.Message(); len(msg) > maxStatusText || !utf8.ValidString(msg) {
			p := st.Proto()
			p.Message = clipText(msg)
			return status.FromProto(p).Err()
		}
	}
	return err
}

// mapError: statuses pass through; cache and context errors get the code a
// client can act on.
func mapError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, ErrQuota):
		return quotaExceeded(0, err)
	case errors.Is(err, ErrFull):
		return exhausted(kvmeshv1.ErrorReason_ERROR_REASON_CACHE_FULL, nil, "node:cache",
			"cache full: %v; retry later or give the node more --dram/--nvme", err)
	case errors.Is(err, block.ErrTooLarge):
		return invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_BLOCK_TOO_LARGE, nil, "block", "%v", err)
	case errors.Is(err, block.ErrCorrupt):
		return invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_BLOCK_CORRUPT, nil, "block", "%v", err)
	case errors.Is(err, store.ErrPartConflict), errors.Is(err, block.ErrBadPart):
		return invalid("block", "%v", err)
	case errors.Is(err, ErrClosed):
		return status.Errorf(codes.Unavailable, "node is shutting down: %v", err)
	case errors.Is(err, ErrNotFound):
		return status.Errorf(codes.NotFound, "%v", err)
	}
	return status.Errorf(codes.Internal, "%v", err)
}
