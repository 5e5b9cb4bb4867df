package node

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// grpcurl runs grpcurl against addr with stdin as its request data and
// returns its stdout, stderr and whether it succeeded. It skips the test
// when grpcurl is not on PATH.
func grpcurl(t *testing.T, stdin string, args ...string) (string, string, bool) {
	t.Helper()
	path, err := exec.LookPath("grpcurl")
	if err != nil {
		t.Skip("grpcurl is not on PATH: go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4 (.ci/run does)")
	}
	cmd := exec.Command(path, append([]string{"-plaintext"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err == nil
}

// nsJSON is testNS as grpcurl's JSON.
const nsJSON = `{"model":"test/tiny","dtype":"DTYPE_FLOAT32","blockTokens":4,"layers":2,"kvHeads":2,"headDim":8}`

// TestGRPCurl drives the node the way an operator would with grpcurl and
// server reflection: no .proto files at hand.
func TestGRPCurl(t *testing.T) {
	tn := startNode(t, nil)
	addr := tn.GRPCAddr()

	out, errs, ok := grpcurl(t, "", addr, "list")
	if !ok {
		t.Fatalf("grpcurl list: %s", errs)
	}
	for _, svc := range []string{"kvmesh.v1.CacheService", "kvmesh.v1.AdminService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !strings.Contains(out, svc) {
			t.Errorf("grpcurl list lacks %s:\n%s", svc, out)
		}
	}
	out, errs, ok = grpcurl(t, "", "-d", `{"service":"kvmesh.v1.CacheService"}`, addr, "grpc.health.v1.Health/Check")
	if !ok || !strings.Contains(out, `"SERVING"`) {
		t.Fatalf("health check: %s %s", out, errs)
	}

	// Put two blocks in one client stream; the second chains from the first.
	tokens, payloads := prompt(9, 9)
	var stream strings.Builder
	for i, p := range payloads {
		ns := ""
		if i == 0 {
			ns = `"namespace":` + nsJSON + `,`
		}
		toks, _ := json.Marshal(tokens[4*i : 4*i+4])
		fmt.Fprintf(&stream, `{%s"block":{"tokens":%s,"payloadLen":"%d"},"data":"%s"}`+"\n",
			ns, toks, len(p), base64.StdEncoding.EncodeToString(p))
	}
	out, errs, ok = grpcurl(t, stream.String(), "-d", "@", addr, "kvmesh.v1.CacheService/BatchPut")
	if !ok || !strings.Contains(out, `"stored": 2`) {
		t.Fatalf("BatchPut: %s %s", out, errs)
	}
	keys := prefixhash.Keys(testNS, tokens)
	if !strings.Contains(out, base64.StdEncoding.EncodeToString(keys[1][:])) {
		t.Fatalf("BatchPut answered keys %s, want %s second", out, keys[1])
	}

	toks, _ := json.Marshal(tokens)
	out, errs, ok = grpcurl(t, "", "-d", `{"namespace":`+nsJSON+`,"tokens":`+string(toks)+`}`, addr, "kvmesh.v1.CacheService/Lookup")
	if !ok || !strings.Contains(out, `"cachedTokens": "8"`) || !strings.Contains(out, `"promptTokens": "9"`) {
		t.Fatalf("Lookup: %s %s", out, errs)
	}

	out, errs, ok = grpcurl(t, "", "-d", `{"namespace":`+nsJSON+`,"tokens":`+string(toks)+`,"prefix":true}`, addr, "kvmesh.v1.CacheService/BatchGet")
	if !ok {
		t.Fatalf("BatchGet: %s", errs)
	}
	got := map[int][]byte{}
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var f struct {
			Index int
			Found bool
			Data  []byte
		}
		if err := dec.Decode(&f); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("BatchGet output: %v\n%s", err, out)
		}
		got[f.Index] = append(got[f.Index], f.Data...)
	}
	for i, p := range payloads {
		if !bytes.Equal(got[i], p) {
			t.Fatalf("BatchGet block %d: %d bytes differ from the %d put", i, len(got[i]), len(p))
		}
	}

	// Malformed requests: InvalidArgument naming the field.
	for _, tc := range []struct{ method, data, want string }{
		{"kvmesh.v1.CacheService/BatchPut", `{"namespace":` + nsJSON + `,"block":{"tokens":[1,2,3],"payloadLen":"1024"}}`, "block.tokens"},
		{"kvmesh.v1.CacheService/Lookup", `{"namespace":{"model":"m","dtype":"DTYPE_FLOAT32","blockTokens":0,"layers":1,"kvHeads":1,"headDim":1}}`, "block_tokens"},
		{"kvmesh.v1.CacheService/Exists", `{"keys":["AAEC"]}`, "keys[0]"},
	} {
		_, errs, ok := grpcurl(t, "", "-d", tc.data, addr, tc.method)
		if ok || !strings.Contains(errs, "Code: InvalidArgument") || !strings.Contains(errs, tc.want) {
			t.Errorf("%s with %s: ok=%v\n%s\nwant InvalidArgument naming %s", tc.method, tc.data, ok, errs, tc.want)
		}
	}
	if _, errs, ok := grpcurl(t, "", addr, "kvmesh.v1.CacheService/Stats"); !ok {
		t.Fatalf("Stats after malformed requests: %s", errs)
	}
}
