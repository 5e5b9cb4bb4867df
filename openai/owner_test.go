package openai

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

// queuePeers are fake peers that log the queue requests they are asked
// and answer 200 for the batches they hold, 404 for the rest; a peer in
// failing answers 503.
type queuePeers struct {
	asked testkit.Log
	mu    sync.Mutex
	holds map[string]string // batch id → the peer that holds it
	fail  string
}

func (q *queuePeers) peer(t *testing.T, name string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := strings.CutPrefix(r.URL.Path, QueuePath+"/")
		if !ok || r.Header.Get(ForwardedHeader) == "" {
			t.Errorf("peer %s asked %s %s (forwarded %q)", name, r.Method, r.URL.Path, r.Header.Get(ForwardedHeader))
		}
		q.asked.Add(name)
		q.mu.Lock()
		holder, failing := q.holds[id], q.fail
		q.mu.Unlock()
		switch {
		case name == failing:
			WriteError(w, http.StatusServiceUnavailable, "stopping", "server_error", "", "")
		case holder == name:
			WriteJSON(w, http.StatusOK, batchStatus{RequestID: id, Status: "completed"})
		default:
			WriteError(w, http.StatusNotFound, "no such batch", "invalid_request_error", "", "not_found")
		}
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestQueueAsksOwner: of 40 engine peers, a GET or DELETE of a batch this
// node does not hold goes to the one peer its id names, and to nobody when
// it names this node or a node not in the cluster; an id that names no
// owner (an older node's) is still asked of every peer in turn until one
// holds it. A named owner that fails is a 503 to retry, not a 404.
func TestQueueAsksOwner(t *testing.T) {
	q := &queuePeers{holds: map[string]string{}}
	n := &clusterNode{id: "self"}
	for i := range 40 {
		name := string(rune('A'+i%26)) + string(rune('a'+i/26))
		n.peers = append(n.peers, Peer{ID: name, Addr: q.peer(t, name)})
	}
	a := startTestAPIOn(t, n, BatchOptions{Share: -1})
	named := func(owner string) string { return "batch_0123456789abcdef01234567_" + ownerTag(owner) }
	q.holds[named("Ka")] = "Ka"
	q.holds["batch_0123456789abcdef01234567"] = "Pa" // an id of an older node: no owner named
	call := func(method, id string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, a.srv.URL+QueuePath+"/"+id, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}

	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		if resp := call(method, named("Ka")); resp.StatusCode != http.StatusOK {
			t.Errorf("%s of Ka's batch: %d, want 200 (Ka's answer)", method, resp.StatusCode)
		}
		if asked := q.asked.Take(); !slices.Equal(asked, []string{"Ka"}) {
			t.Errorf("%s of Ka's batch asked %v, want only Ka", method, asked)
		}
	}
	for what, id := range map[string]string{"this node's own": named("self"), "a node not in the cluster's": named("gone")} {
		if resp := call(http.MethodGet, id); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s unknown batch: %d, want 404", what, resp.StatusCode)
		}
		if asked := q.asked.Take(); len(asked) != 0 {
			t.Errorf("%s unknown batch asked %v, want nobody", what, asked)
		}
	}

	if resp := call(http.MethodGet, "batch_0123456789abcdef01234567"); resp.StatusCode != http.StatusOK {
		t.Errorf("an older id held by Pa: %d, want 200", resp.StatusCode)
	}
	if asked := q.asked.Take(); len(asked) == 0 || asked[len(asked)-1] != "Pa" || len(asked) > 40 {
		t.Errorf("an older id asked %v, want peers in turn until Pa", asked)
	}
	if resp := call(http.MethodGet, "batch_nope"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown older id: %d, want 404", resp.StatusCode)
	}
	if asked := q.asked.Take(); len(asked) != 40 {
		t.Errorf("an unknown older id asked %d peers, want all 40", len(asked))
	}

	q.mu.Lock()
	q.fail = "Ka"
	q.mu.Unlock()
	if resp := call(http.MethodGet, named("Ka")); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("Ka's batch while Ka fails: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if asked := q.asked.Take(); !slices.Equal(asked, []string{"Ka"}) {
		t.Errorf("Ka's batch while Ka fails asked %v, want only Ka", asked)
	}

	// What this node accepts names it, and it answers from its own store.
	m, err := a.batches.submit(queueOwner{}, [][]byte{[]byte(`t{"model": "kvmesh", "prompt": "mine", "max_tokens": 1}`)}, "")
	if err != nil {
		t.Fatal(err)
	}
	if owns, ok := OwnsBatch("self", m.ID); !owns || !ok {
		t.Errorf("the id %q of a batch accepted by self: owns %v, named %v", m.ID, owns, ok)
	}
	if owns, _ := OwnsBatch("Ka", m.ID); owns {
		t.Errorf("the id %q names Ka too", m.ID)
	}
	if resp := call(http.MethodGet, m.ID); resp.StatusCode != http.StatusOK {
		t.Errorf("GET of its own batch: %d", resp.StatusCode)
	}
	if asked := q.asked.Take(); len(asked) != 0 {
		t.Errorf("GET of its own batch asked %v", asked)
	}
}

// TestBatchTag: which ids name an owner.
func TestBatchTag(t *testing.T) {
	tag := ownerTag("n1")
	if len(tag) != 16 {
		t.Fatalf("ownerTag(n1) = %q, want 16 hex digits", tag)
	}
	for id, want := range map[string]bool{
		"batch_0123456789abcdef01234567_" + tag:                 true,
		"batch_0123456789abcdef01234567":                        false, // an older node's
		"batch_nope":                                            false,
		"batch_x_" + strings.ToUpper(tag):                       false,
		"batch_0123456789abcdef01234567_" + tag[:15]:            false,
		"cmpl_0123456789abcdef01234567_" + tag:                  false,
		"batch_0123456789abcdef01234567_" + tag[:15] + "g":      false,
		"batch_0123456789abcdef01234567_x_" + ownerTag("other"): true,
	} {
		if _, got := batchTag(id); got != want {
			t.Errorf("batchTag(%q) names an owner: %v, want %v", id, got, want)
		}
	}
}
