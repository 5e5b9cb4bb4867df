package node

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/block"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/store"
)

// wantRefusal fails t unless err is a status of code carrying the details
// of its class (errors.proto): an ErrorInfo of domain kvmesh.dev with
// reason (any known one when reason is UNSPECIFIED), and a BadRequest
// (InvalidArgument) or QuotaFailure (ResourceExhausted) violation. It
// returns the ErrorInfo and the violation's field or subject.
func wantRefusal(t testing.TB, err error, code codes.Code, reason kvmeshv1.ErrorReason) (*errdetails.ErrorInfo, string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Fatalf("%v: want a %s status", err, code)
	}
	var (
		info *errdetails.ErrorInfo
		what string
		has  bool
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.BadRequest:
			if len(d.GetFieldViolations()) > 0 {
				what, has = d.GetFieldViolations()[0].GetField(), code == codes.InvalidArgument
			}
		case *errdetails.QuotaFailure:
			if len(d.GetViolations()) > 0 {
				what, has = d.GetViolations()[0].GetSubject(), code == codes.ResourceExhausted
			}
		}
	}
	if info == nil || info.GetDomain() != kvmeshv1.ErrorDomain {
		t.Fatalf("%v: no ErrorInfo of domain %s in %v", err, kvmeshv1.ErrorDomain, st.Details())
	}
	got, known := kvmeshv1.ParseErrorReason(info.GetReason())
	if !known || (reason != kvmeshv1.ErrorReason_ERROR_REASON_UNSPECIFIED && got != reason) {
		t.Fatalf("%v: reason %q, want %q", err, info.GetReason(), reason.Reason())
	}
	if code != codes.PermissionDenied && !has {
		t.Fatalf("%v: no violation of its class in %v", err, st.Details())
	}
	return info, what
}

// TestRefusalDetails: each builder gives its class's details, and
// statusError maps the cache's errors to them.
func TestRefusalDetails(t *testing.T) {
	if _, field := wantRefusal(t, invalid("block.tokens", "3 tokens"), codes.InvalidArgument, kvmeshv1.ErrorReason_ERROR_REASON_INVALID_FIELD); field != "block.tokens" {
		t.Errorf("field %q", field)
	}
	info, subject := wantRefusal(t, statusError(quotaExceeded(0xab, ErrQuota)), codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED)
	if subject != "namespace:00000000000000ab" || info.GetMetadata()["namespace_digest"] != "00000000000000ab" {
		t.Errorf("quota: subject %q, metadata %v", subject, info.GetMetadata())
	}
	wantRefusal(t, statusError(ErrQuota), codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED)
	wantRefusal(t, statusError(ErrFull), codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_CACHE_FULL)
	// A part overlapping stored cells with other bytes, a range that is
	// not a part: the caller's mistake.
	wantRefusal(t, statusError(fmt.Errorf("put: %w", store.ErrPartConflict)), codes.InvalidArgument, kvmeshv1.ErrorReason_ERROR_REASON_INVALID_FIELD)
	wantRefusal(t, statusError(block.ErrBadPart), codes.InvalidArgument, kvmeshv1.ErrorReason_ERROR_REASON_INVALID_FIELD)
	// A status that has its details passes as it is; other codes get none.
	if err := invalid("x", "y"); statusError(err) != err {
		t.Error("statusError rebuilt a status that had its details")
	}
	if st := status.Convert(statusError(ErrNotFound)); st.Code() != codes.NotFound || len(st.Details()) != 0 {
		t.Errorf("NotFound: %v %v", st.Code(), st.Details())
	}
	// Every reason has a name clients can parse back.
	for v := range kvmeshv1.ErrorReason_name {
		r := kvmeshv1.ErrorReason(v)
		if got, ok := kvmeshv1.ParseErrorReason(r.Reason()); (v != 0) != ok || (ok && got != r) || strings.HasPrefix(r.Reason(), "ERROR_REASON") {
			t.Errorf("reason %v: Reason() %q parses to %v, %v", r, r.Reason(), got, ok)
		}
	}
}

// TestRefusalsAreCentral: no file of the package but status.go builds an
// InvalidArgument, ResourceExhausted or PermissionDenied status, so that
// every refusal carries its details.
func TestRefusalsAreCentral(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	bad := regexp.MustCompile(`status\.(Errorf?|New|Newf)\(codes\.(InvalidArgument|ResourceExhausted|PermissionDenied)`)
	for _, f := range files {
		if f == "status.go" || strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range bad.FindAllIndex(src, -1) {
			t.Errorf("%s:%d: builds a refusal without details; use invalid, exhausted or denied (status.go)",
				f, 1+strings.Count(string(src[:m[0]]), "\n"))
		}
	}
}
