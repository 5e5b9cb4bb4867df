package client

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// refusal builds a status as a node does (node/status.go).
func refusal(t testing.TB, code codes.Code, reason kvmeshv1.ErrorReason, details ...protoadapt.MessageV1) error {
	t.Helper()
	info := &errdetails.ErrorInfo{Domain: kvmeshv1.ErrorDomain, Reason: reason.Reason(), Metadata: map[string]string{"k": "v"}}
	st, err := status.New(code, "refused").WithDetails(append([]protoadapt.MessageV1{info}, details...)...)
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

func TestErrorMapping(t *testing.T) {
	all := []error{ErrInvalid, ErrNotFound, ErrExhausted, ErrQuota, ErrPermission, ErrUnauthenticated, ErrUnavailable}
	quota := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "namespace:00000000000000ab", Description: "over"}}}
	field := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "block.tokens", Description: "3 tokens"}}}
	for _, tc := range []struct {
		name string
		err  error
		is   []error // the sentinels it matches; it matches no other
	}{
		{"quota", refusal(t, codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED, quota), []error{ErrQuota, ErrExhausted}},
		{"cache full", refusal(t, codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_CACHE_FULL, quota), []error{ErrExhausted}},
		{"exhausted, an older node's (no details)", status.Error(codes.ResourceExhausted, "full"), []error{ErrExhausted}},
		{"invalid field", refusal(t, codes.InvalidArgument, kvmeshv1.ErrorReason_ERROR_REASON_INVALID_FIELD, field), []error{ErrInvalid}},
		{"scope", refusal(t, codes.PermissionDenied, kvmeshv1.ErrorReason_ERROR_REASON_SCOPE_MISSING), []error{ErrPermission}},
		{"no token", status.Error(codes.Unauthenticated, "token"), []error{ErrUnauthenticated}},
		{"not found", status.Error(codes.NotFound, "gone"), []error{ErrNotFound}},
		{"unavailable", status.Error(codes.Unavailable, "down"), []error{ErrUnavailable}},
		{"internal", status.Error(codes.Internal, "bug"), nil},
	} {
		err := callError("op", tc.err)
		for _, s := range all {
			want := false
			for _, w := range tc.is {
				want = want || w == s
			}
			if errors.Is(err, s) != want {
				t.Errorf("%s: errors.Is(%v, %v) = %v", tc.name, err, s, !want)
			}
		}
		var e *Error
		if !errors.As(err, &e) || status.Code(err) != status.Code(tc.err) || e.Op != "op" {
			t.Errorf("%s: %v does not carry its status", tc.name, err)
		}
	}

	var e *Error
	if err := callError("put", refusal(t, codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED, quota)); !errors.As(err, &e) ||
		e.Reason != "QUOTA_EXCEEDED" || e.Metadata["k"] != "v" || len(e.Quotas) != 1 || e.Quotas[0].Subject != "namespace:00000000000000ab" {
		t.Errorf("quota refusal read as %+v", e)
	}
	if err := callError("put", refusal(t, codes.InvalidArgument, kvmeshv1.ErrorReason_ERROR_REASON_INVALID_FIELD, field)); !errors.As(err, &e) ||
		len(e.Fields) != 1 || e.Fields[0] != (FieldViolation{"block.tokens", "3 tokens"}) {
		t.Errorf("field refusal read as %+v", e)
	}
	if err := callError("put", context.Canceled); !errors.Is(err, context.Canceled) || errors.As(err, &e) {
		t.Errorf("a non-status error: %v", err)
	}
}

// refusing fails every call with err.
type refusing struct {
	flaky
	err error
}

func (r *refusing) DropNamespace(context.Context, *kvmeshv1.DropNamespaceRequest) (*kvmeshv1.DropNamespaceResponse, error) {
	return nil, r.err
}

func (r *refusing) Stats(context.Context, *kvmeshv1.StatsRequest) (*kvmeshv1.StatsResponse, error) {
	return nil, r.err
}

// TestErrorsOverTheWire: the details survive gRPC, and an Unavailable
// node is ErrUnavailable once the retries are spent.
func TestErrorsOverTheWire(t *testing.T) {
	quota := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "namespace:1"}}}
	c := serve(t, &refusing{err: refusal(t, codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED, quota)})
	_, err := c.DropNamespace(context.Background(), testNS)
	var e *Error
	if !errors.Is(err, ErrQuota) || !errors.As(err, &e) || len(e.Quotas) != 1 {
		t.Fatalf("DropNamespace refused for quota: %v (%+v)", err, e)
	}
	c = serve(t, &refusing{err: status.Error(codes.Unavailable, "down")})
	if _, err := c.Stats(context.Background()); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Stats of an unavailable node: %v", err)
	}
}

func TestNewRefusesOptions(t *testing.T) {
	if c, err := New(noNode{}, Options{Transport: "carrier pigeon"}); !errors.Is(err, ErrInvalid) || c != nil {
		t.Fatalf("New with an unknown transport = %v, %v; want ErrInvalid", c, err)
	}
	if _, err := Dial("127.0.0.1:1", Options{Transport: "carrier pigeon"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Dial with an unknown transport = %v; want ErrInvalid", err)
	}
	for _, o := range []Options{{Timeout: -1}, {MaxMessageBytes: -1}, {ChunkBytes: -5}, {MaxBatchBlocks: -1}} {
		if _, err := New(noNode{}, o); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%+v) = %v; want ErrInvalid", o, err)
		}
	}
	if c, err := New(noNode{}, Options{MaxRetries: -1}); err != nil || c == nil {
		t.Errorf("New with retries off = %v, %v", c, err)
	}
}

// paging answers Quotas and Members one entry a page.
type paging struct {
	flaky
	digests []uint64
	members []string
}

func (p *paging) Quotas(_ context.Context, req *kvmeshv1.QuotasRequest) (*kvmeshv1.QuotasResponse, error) {
	i := 0
	if req.GetPageToken() != "" {
		i = int(req.GetPageToken()[0] - 'a')
	}
	resp := &kvmeshv1.QuotasResponse{NodeId: "p", DefaultQuota: &kvmeshv1.Quota{DramBytes: 7},
		Namespaces: []*kvmeshv1.NamespaceQuota{{Digest: p.digests[i]}}}
	if i+1 < len(p.digests) {
		resp.NextPageToken = string(rune('a' + i + 1))
	}
	return resp, nil
}

func (p *paging) Members(_ context.Context, req *kvmeshv1.MembersRequest) (*kvmeshv1.MembersResponse, error) {
	i := 0
	if req.GetPageToken() != "" {
		i = int(req.GetPageToken()[0] - 'a')
	}
	resp := &kvmeshv1.MembersResponse{SelfId: p.members[0], ChunkTokens: 64, Members: []*kvmeshv1.Member{{Id: p.members[i]}}}
	if i+1 < len(p.members) && req.GetPageSize() != 1 {
		resp.NextPageToken = string(rune('a' + i + 1))
	}
	return resp, nil
}

// TestFollowsPages: Quotas and Members return every page's entries.
func TestFollowsPages(t *testing.T) {
	p := &paging{digests: []uint64{1, 2, 3}, members: []string{"self", "b", "c"}}
	c := serve(t, p)
	qs, err := c.Quotas(context.Background())
	if err != nil || len(qs.Namespaces) != 3 || qs.Namespaces[2].Digest != 3 || qs.Default.DRAMBytes != 7 {
		t.Fatalf("Quotas = %+v, %v; want the 3 pages' namespaces", qs, err)
	}
	cl, err := c.Members(context.Background())
	if err != nil || len(cl.Members) != 3 || cl.Members[0].ID != "self" || cl.Members[2].ID != "c" || cl.ChunkTokens != 64 {
		t.Fatalf("Members = %+v, %v; want the 3 pages' members", cl, err)
	}
	calls := 0
	if err := pages(func(string) (string, error) { calls++; return "more", nil }); !errors.Is(err, errTooManyPages) || calls != maxPages {
		t.Fatalf("a list without end: %v after %d pages", err, calls)
	}
}
