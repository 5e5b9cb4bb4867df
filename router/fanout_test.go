package router

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/openai"
)

// fakeMembers shows the router the members of a fake cluster in place of
// its gossip's (which it keeps, to leave and close).
type fakeMembers struct {
	membership
	mu sync.Mutex
	ms []gossip.MemberInfo
}

func (f *fakeMembers) Members() ([]gossip.MemberInfo, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ms), 1
}

// fakeCluster is n fake nodes that log every request they get ("n7
// lookup", "n7 completion", "n7 queue") and hold the batches in holds.
type fakeCluster struct {
	asked testkit.Log
	holds map[string]string // batch id → node; set before the requests
}

func (c *fakeCluster) node(t *testing.T, name string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var what string
		switch {
		case strings.HasPrefix(r.URL.Path, openai.LookupPath):
			what = "lookup"
		case r.URL.Path == "/v1/completions":
			what = "completion"
		case strings.HasPrefix(r.URL.Path, openai.QueuePath+"/"):
			what = "queue"
		}
		c.asked.Add(name + " " + what)
		holder := c.holds[strings.TrimPrefix(r.URL.Path, openai.QueuePath+"/")]
		switch what {
		case "lookup":
			openai.WriteJSON(w, http.StatusOK, openai.LookupResult{PromptTokens: 8, MaxTokens: 1})
		case "completion":
			openai.WriteJSON(w, http.StatusOK, map[string]any{"object": "text_completion"})
		case "queue":
			if holder != name {
				openai.WriteError(w, http.StatusNotFound, "no such batch", "invalid_request_error", "", "not_found")
				return
			}
			openai.WriteJSON(w, http.StatusOK, map[string]any{"status": "completed"})
		default:
			t.Errorf("node %s asked %s %s", name, r.Method, r.URL.Path)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestRouterAsksFewNodes: with 40 nodes, a completion asks one node's
// lookup and sends the request to one node (two requests whatever the
// cluster's size), and a GET or DELETE of a queued batch goes to the one
// node its id names (none when that node is not in the cluster); an id
// that names no owner is still asked of the nodes in turn.
func TestRouterAsksFewNodes(t *testing.T) {
	r, err := New(Options{HTTPAddr: "127.0.0.1:0", GossipProfile: "local", Join: []string{"127.0.0.1:1"},
		InsecureGossip: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	c := &fakeCluster{holds: map[string]string{}}
	fake := &fakeMembers{membership: r.members}
	for i := range 40 {
		name := fmt.Sprintf("n%d", i)
		fake.ms = append(fake.ms, gossip.MemberInfo{ID: name, State: "alive", Meta: gossip.MemberMeta{HTTPAddr: c.node(t, name)}})
	}
	r.members = fake
	srv := httptest.NewServer(r.http.Handler)
	t.Cleanup(srv.Close)
	do := func(method, path, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	for i := range 20 {
		if code := do("POST", "/v1/completions", fmt.Sprintf(`{"model": "kvmesh", "prompt": "request %d", "max_tokens": 1}`, i)); code != http.StatusOK {
			t.Fatalf("completion %d: %d", i, code)
		}
		asked := c.asked.Take()
		if len(asked) != 2 || !strings.HasSuffix(asked[0], " lookup") || !strings.HasSuffix(asked[1], " completion") {
			t.Fatalf("completion %d asked %v, want one lookup, then one completion", i, asked)
		}
	}

	// A batch whose id names n17, as the format says (package openai's
	// owner.go): the xxhash64 of its member id, in 16 hex digits.
	id := fmt.Sprintf("batch_0123456789abcdef01234567_%016x", xxhash.Sum64String("n17"))
	if owns, named := openai.OwnsBatch("n17", id); !owns || !named {
		t.Fatalf("%s: names n17 %v, names an owner %v", id, owns, named)
	}
	c.holds[id] = "n17"
	for _, method := range []string{"GET", "DELETE"} {
		if code := do(method, openai.QueuePath+"/"+id, ""); code != http.StatusOK {
			t.Errorf("%s of n17's batch: %d", method, code)
		}
		if asked := c.asked.Take(); !slices.Equal(asked, []string{"n17 queue"}) {
			t.Errorf("%s of n17's batch asked %v, want only n17", method, asked)
		}
	}
	fake.mu.Lock()
	fake.ms = slices.DeleteFunc(fake.ms, func(m gossip.MemberInfo) bool { return m.ID == "n17" })
	fake.mu.Unlock()
	if code := do("GET", openai.QueuePath+"/"+id, ""); code != http.StatusNotFound {
		t.Errorf("the batch of n17, gone from the cluster: %d, want 404", code)
	}
	if asked := c.asked.Take(); len(asked) != 0 {
		t.Errorf("the batch of n17, gone from the cluster, asked %v", asked)
	}

	c.holds["batch_0123456789abcdef01234567"] = "n5" // an older id
	if code := do("GET", openai.QueuePath+"/batch_0123456789abcdef01234567", ""); code != http.StatusOK {
		t.Errorf("an older id: %d", code)
	}
	if asked := c.asked.Take(); len(asked) == 0 || asked[len(asked)-1] != "n5 queue" {
		t.Errorf("an older id asked %v, want nodes in turn until n5", asked)
	}
}
