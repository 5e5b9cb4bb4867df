package node

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/openai"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// rawCodec sends a request's bytes as they are (to send what a generated
// client would refuse to encode) and decodes answers as protobuf.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// TestCallerInputClipped: what a caller sends is never repeated whole, in
// a status, an HTTP error or the log: a 1 MiB request id (gRPC) or a 512
// KiB batch id (HTTP) is answered NotFound with a short message and logs a
// short line; a page token that is not UTF-8 is
// InvalidArgument naming page_token, not gRPC's Internal (which any
// string field that is not UTF-8 used to cause).
func TestCallerInputClipped(t *testing.T) {
	logs := new(syncBuffer)
	tn := startNode(t, func(o *Options) {
		o.Prefill.Model = tinyModel()
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	ctx := context.Background()
	huge := strings.Repeat("x\xff", 512<<10)
	_, err := kvmeshv1.NewPrefillServiceClient(tn.conn).GetResult(ctx, &kvmeshv1.GetResultRequest{RequestId: strings.ToValidUTF8(huge, "y")})
	if status.Code(err) != codes.NotFound || len(status.Convert(err).Message()) > 2*maxStatusText {
		t.Errorf("GetResult of a 1 MiB id: %v, message of %d bytes", status.Code(err), len(status.Convert(err).Message()))
	}

	req := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte("\xff\xfe"+huge[:100]))
	var resp kvmeshv1.StatsResponse
	err = tn.conn.Invoke(ctx, "/kvmesh.v1.CacheService/Stats", req, &resp, grpc.ForceCodecV2(rawCodec{}))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "page_token") {
		t.Errorf("Stats with a page token that is not UTF-8: %v, want InvalidArgument naming page_token", err)
	}
	// Over HTTP: a 512 KiB batch id is answered 404 with a short message.
	got := callAPI(t, "GET", apiURL(tn.Node, openai.QueuePath+"/"+strings.Repeat("b", 512<<10)), "", nil)
	if got.status != http.StatusNotFound || len(got.body) > 4*maxStatusText {
		t.Errorf("GET of a 512 KiB batch id: %d, %d bytes of answer", got.status, len(got.body))
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if len(line) > 4*maxStatusText {
			t.Errorf("a log line of %d bytes: %.200s…", len(line), line)
		}
	}
}
