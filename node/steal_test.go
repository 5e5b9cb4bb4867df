package node

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/openai"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/router"
)

// internalQueuePath is the owner's side of work stealing, and lentBatch a
// claim's answer, as ARCHITECTURE.md documents the wire.
const internalQueuePath = "/internal/queue/"

type lentBatch struct {
	RequestID string                  `json:"request_id"`
	Owner     struct{ Tenant string } `json:"owner"`
	Done      int                     `json:"done"`
	Requests  [][]byte                `json:"requests"`
}

// TestQueueStealing: a batch stored by a node that runs no queued work
// (Batch.Share negative) is pulled and completed by its peer, with the
// answers of a cold engine; a claimer that vanished after its claim (a
// ghost, never answering) delays it only until its lease lapses, and its
// late answer is refused, so no request completes twice. The status reads
// the same through either node and through a router.
func TestQueueStealing(t *testing.T) {
	c := tinyModel()
	owner := openClusterNode(t, t.TempDir(), "owner", nil, func(o *Options) {
		o.Prefill.Model = c
		o.Prefill.Batch.Share = -1 // stores batches, runs none
		o.Prefill.Batch.LeaseTTL = 300 * time.Millisecond
	})
	prompt := strings.Repeat("stolen work ", 12)
	req := map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": 8, "temperature": 0}
	a := submitBatch(t, owner.Node, "", map[string]any{"requests": []any{req, req, req}})

	// A ghost claims it and is never heard of again.
	ghost := callAPI(t, "POST", apiURL(owner.Node, internalQueuePath+"claim"), "", map[string]any{"node": "ghost"})
	var lent lentBatch
	if ghost.status != http.StatusOK || !jsonInto(ghost.body, &lent) || lent.RequestID != a || lent.Done != 0 || len(lent.Requests) != 3 {
		t.Fatalf("claim: %d %s", ghost.status, ghost.body)
	}
	if got := callAPI(t, "POST", apiURL(owner.Node, internalQueuePath+"claim"), "", map[string]any{"node": "ghost2"}); got.status != http.StatusNoContent {
		t.Errorf("a second claim of the only batch: %d %s, want 204", got.status, got.body)
	}
	if s := pollBatch(t, owner.Node, "", a); s.Status != "running" {
		t.Errorf("a lent batch is %s, want running", s.Status)
	}
	// Bad calls: no claimer, an answer out of order, another peer's lease.
	wantAPIError(t, "claim without a node", callAPI(t, "POST", apiURL(owner.Node, internalQueuePath+"claim"), "", map[string]any{}), 400)
	wantAPIError(t, "answer out of order", callAPI(t, "POST", apiURL(owner.Node, internalQueuePath+a+"/answer"), "",
		map[string]any{"node": "ghost", "index": 1, "response": map[string]any{}}), 409)
	wantAPIError(t, "answer by another peer", callAPI(t, "POST", apiURL(owner.Node, internalQueuePath+a+"/answer"), "",
		map[string]any{"node": "ghost2", "index": 0, "response": map[string]any{}}), 409)

	// The peer joins; once the ghost's lease lapsed it pulls the batch.
	peer := openClusterNode(t, t.TempDir(), "peer", []string{owner.GossipAddr()}, func(o *Options) {
		o.Prefill.Model = c
		o.Prefill.Batch.StealInterval = 20 * time.Millisecond
	})
	waitClusterSize(t, []*clusterNode{owner, peer}, 2)
	done := waitBatch(t, owner.Node, "", a)
	want := coldText(t, c, prompt, prefill.GenerateOptions{MaxTokens: 8})
	if done.Status != "completed" || len(done.Responses) != 3 {
		t.Fatalf("stolen batch: %+v", done)
	}
	for i, r := range done.Responses {
		if got := parseCompletion(t, apiCall{status: 200, body: r}, false); got.Text != want {
			t.Errorf("response %d: %q, cold %q", i, got.Text, want)
		}
	}
	// The ghost's late answer is refused; the batch stays as it was.
	wantAPIError(t, "the ghost's late answer", callAPI(t, "POST", apiURL(owner.Node, internalQueuePath+a+"/answer"), "",
		map[string]any{"node": "ghost", "index": 0, "response": map[string]any{"x": 1}}), 409)
	if again := pollBatch(t, owner.Node, "", a); string(again.Responses[0]) != string(done.Responses[0]) {
		t.Errorf("a late answer replaced a stored one: %s", again.Responses[0])
	}
	// Readable through the peer, which does not hold it, and a router.
	if via := pollBatch(t, peer.Node, "", a); via.Status != "completed" || len(via.Responses) != 3 || string(via.Responses[2]) != string(done.Responses[2]) {
		t.Errorf("through the peer: %+v", via)
	}
	r := startRouter(t, owner.GossipAddr(), router.PolicyTokens)
	waitRouterNodes(t, r, 2)
	if got := callAPI(t, "GET", "http://"+r.HTTPAddr()+openai.QueuePath+"/"+a, "", nil); got.status != 200 || !strings.Contains(string(got.body), `"completed"`) {
		t.Errorf("through the router: %d %s", got.status, got.body)
	}
	wantAPIError(t, "an unknown id through the peer", callAPI(t, "GET", apiURL(peer.Node, openai.QueuePath+"/batch_nope"), "", nil), 404)
	// Counted on both sides, and the peer's answers only once each.
	om, pm := scrape(t, owner.HTTPAddr()), scrape(t, peer.HTTPAddr())
	if v := metricValue(om, `kvmesh_queue_steals_total{direction="lent"}`); v != 2 {
		t.Errorf("owner lent %v batches, want 2 (the ghost, the peer)", v)
	}
	if v := metricValue(pm, `kvmesh_queue_steals_total{direction="borrowed"}`); v != 1 {
		t.Errorf("peer borrowed %v batches, want 1", v)
	}
	if v := metricValue(om, `kvmesh_queue_requests_total{outcome="completed"}`); v > 0 {
		t.Errorf("the owner, which runs no queued work, completed %v requests", v)
	}
	if v := metricValue(pm, `kvmesh_queue_requests_total{outcome="completed"}`); v != 3 {
		t.Errorf("peer completed %v requests, want 3", v)
	}
	// The polls of the owner's batch through the peer and the router were
	// passed to the owner, which its id names, never to the peer.
	if v := metricValue(pm, `kvmesh_control_requests_total{kind="queue_forwarded"}`); v != 0 {
		t.Errorf("the peer was passed %v polls, want 0: the batch's id names the owner", v)
	}
	if v := metricValue(om, `kvmesh_control_requests_total{kind="queue_forwarded"}`); v < 2 {
		t.Errorf("the owner was passed %v polls, want the peer's and the router's at least", v)
	}
	if v := metricValue(om, `kvmesh_control_requests_total{kind="claim"}`); v < 1 {
		t.Errorf("the owner counted %v claims, want the peer's at least", v)
	}
}

// TestQueueShare: Batch.Share (at most 1) sets how many workers run
// queued batches (openai's TestBatchWorkers), and a queued request runs as
// background work of the engine (prefill.GenerateOptions.Background),
// which gives way to synchronous requests between chunks and decode steps
// (prefill's TestBackgroundGenerateYields shows the preemption).
func TestQueueShare(t *testing.T) {
	bad := PrefillOptions{Batch: openai.BatchOptions{Share: 1.5}}
	bad.EnsureDefaults()
	if err := bad.Validate(1 << 30); err == nil || !strings.Contains(err.Error(), "Share") {
		t.Errorf("a share of 1.5: %v", err)
	}
	n := startQueueNode(t, t.TempDir(), func(o *Options) { o.Prefill.Concurrency, o.Prefill.Batch.Share = 2, 1 })
	req := map[string]any{"model": "kvmesh", "prompt": "in the background", "max_tokens": 4, "temperature": 0}
	a := submitBatch(t, n.Node, "acme-rw", map[string]any{"requests": []any{req, req}})
	b := submitBatch(t, n.Node, "acme-rw", map[string]any{"requests": []any{req}})
	for _, id := range []string{a, b} {
		if got := waitBatch(t, n.Node, "acme-rw", id); got.Status != "completed" {
			t.Fatalf("batch %s: %+v", id, got)
		}
	}
	if st := n.prefill.engine.Stats(); st.Background != 3 {
		t.Errorf("engine stats %+v: want the 3 queued requests run as background work", st)
	}
}

// TestQueueClaimNeedsCluster: the internal queue API answers only the
// cluster credential: no token, a tenant's or an operator's is refused and
// lends nothing; the cluster token claims the batch.
func TestQueueClaimNeedsCluster(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), func(o *Options) { o.Prefill.Batch.Share = -1 })
	req := map[string]any{"model": "kvmesh", "prompt": "guarded", "max_tokens": 2}
	id := submitBatch(t, n.Node, "acme-rw", map[string]any{"requests": []any{req}})
	claim := map[string]any{"node": "peer"}
	for _, tok := range []string{"", "acme-rw", "ops", "not-a-token"} {
		if got := callAPI(t, "POST", apiURL(n.Node, internalQueuePath+"claim"), tok, claim); got.status != http.StatusForbidden {
			t.Errorf("claim with %q: %d %s, want 403", tok, got.status, got.body)
		}
	}
	if s := pollBatch(t, n.Node, "acme-rw", id); s.Status != "queued" {
		t.Errorf("after refused claims the batch is %s", s.Status)
	}
	got := callAPI(t, "POST", apiURL(n.Node, internalQueuePath+"claim"), "node-to-node", claim)
	var lent lentBatch
	if got.status != http.StatusOK || !jsonInto(got.body, &lent) || lent.RequestID != id || lent.Owner.Tenant != "acme" {
		t.Fatalf("claim with the cluster token: %d %s", got.status, got.body)
	}
}

// TestQueuePeersVouched: a tenant's callback key is the same on every node;
// a node asked for a batch it does not hold asks
// its peers with the cluster credential and a vouch for the caller, never
// with the caller's bearer token (a member that records what it is sent
// sees the cluster token and the vouch only); the owner answers the batch's
// tenant and refuses another tenant vouched for, and a vouch that was
// forged or made for another request is refused (403).
func TestQueuePeersVouched(t *testing.T) {
	key := []byte("fedcba9876543210fedcba9876543210")
	mod := func(o *Options) {
		o.Security.TokensFile, o.Cluster.GossipKey, o.Prefill.Model = tenantsFile(t), key, tinyModel()
		o.Prefill.Batch.Share = -1 // the batch stays queued on its owner
	}
	owner := openClusterNode(t, t.TempDir(), "owner", nil, mod)
	asker := openClusterNode(t, t.TempDir(), "asker", []string{owner.GossipAddr()}, mod)
	var mu sync.Mutex
	var seen []http.Header
	spy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		http.NotFound(w, r)
	}))
	defer spy.Close()
	member, err := gossip.Start(gossip.Options{NodeID: "spy", GossipAddr: "127.0.0.1:0", Join: []string{owner.GossipAddr()}, SecretKey: key,
		Fast: true, Meta: gossip.MemberMeta{HTTPAddr: strings.TrimPrefix(spy.URL, "http://"), Role: gossip.RoleBoth},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer member.Close()
	testkit.WaitFor(t, "the asker to see the owner and the spy", func() bool {
		ms, _ := asker.cluster.members.Members()
		return len(ms) == 3
	})

	// The callback key is the cluster's: the same through either node.
	key1 := callAPI(t, "GET", apiURL(owner.Node, openai.QueuePath+"/callback-key"), "acme-rw", nil).json(t)["key"]
	key2 := callAPI(t, "GET", apiURL(asker.Node, openai.QueuePath+"/callback-key"), "acme-rw", nil).json(t)["key"]
	if key1 == nil || key1 != key2 {
		t.Errorf("acme's callback key differs between nodes: %v, %v", key1, key2)
	}
	prompt := map[string]any{"model": "kvmesh", "prompt": "vouched", "max_tokens": 2}
	id := submitBatch(t, owner.Node, "acme-rw", map[string]any{"requests": []any{prompt}})
	if got := pollBatch(t, asker.Node, "acme-rw", id); got.Status != "queued" {
		t.Errorf("acme's batch through the asker: %+v", got)
	}
	wantAPIError(t, "beta asking for acme's batch", callAPI(t, "GET", apiURL(asker.Node, openai.QueuePath+"/"+id), "beta-rw", nil), 404)
	wantAPIError(t, "an unknown batch", callAPI(t, "GET", apiURL(asker.Node, openai.QueuePath+"/batch_nope"), "acme-rw", nil), 404)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 {
		t.Fatal("the asker never asked the spy")
	}
	for _, h := range seen {
		if a := h.Get("Authorization"); a != "Bearer node-to-node" || h.Get(openai.VouchHeader) == "" {
			t.Errorf("a peer was sent Authorization %q, vouch %q; want the cluster token and a vouch", a, h.Get(openai.VouchHeader))
		}
	}
	// The owner refuses what a holder of the cluster token alone could
	// make up, and a vouch replayed for another request.
	wantAPIError(t, "a forged vouch", callAPI(t, "GET", apiURL(owner.Node, openai.QueuePath+"/"+id), "node-to-node", nil,
		openai.VouchHeader, "eyJ0IjoiYWNtZSIsInMiOjEsInciOiJHRVQiLCJlIjo5OTk5OTk5OTk5fQ.AAAA"), 403)
	replay := seen[0].Get(openai.VouchHeader)
	wantAPIError(t, "a vouch for another request", callAPI(t, "DELETE", apiURL(owner.Node, openai.QueuePath+"/"+id), "node-to-node", nil,
		openai.VouchHeader, replay), 403)
}

// TestQueueStealingTenant: a tenant's batch lent to a peer crosses the
// network with the tenant's name and tag, never its namespace salt (the
// claimer derives it from its own tokens file), and the peer completes it.
func TestQueueStealingTenant(t *testing.T) {
	key := []byte("fedcba9876543210fedcba9876543210")
	tf := tenantsFile(t)
	var salt string
	for _, c := range tf.Credentials {
		if c.Principal.Tenant == "acme" {
			salt = c.Principal.Salt
		}
	}
	owner := openClusterNode(t, t.TempDir(), "owner", nil, func(o *Options) {
		o.Security.TokensFile, o.Cluster.GossipKey, o.Prefill.Model = tf, key, tinyModel()
		o.Prefill.Batch.Share = -1
		o.Prefill.Batch.LeaseTTL = 300 * time.Millisecond
	})
	req := map[string]any{"model": "kvmesh", "prompt": "a tenant's stolen work", "max_tokens": 4, "temperature": 0}
	id := submitBatch(t, owner.Node, "acme-rw", map[string]any{"requests": []any{req, req}})
	ghost := callAPI(t, "POST", apiURL(owner.Node, internalQueuePath+"claim"), "node-to-node", map[string]any{"node": "ghost"})
	if ghost.status != http.StatusOK || !strings.Contains(string(ghost.body), id) {
		t.Fatalf("claim: %d %s", ghost.status, ghost.body)
	}
	if salt == "" || strings.Contains(string(ghost.body), salt) {
		t.Fatalf("the lent batch carries the tenant's salt: %s", ghost.body)
	}
	peer := openClusterNode(t, t.TempDir(), "peer", []string{owner.GossipAddr()}, func(o *Options) {
		o.Security.TokensFile, o.Cluster.GossipKey, o.Prefill.Model = tf, key, tinyModel()
		o.Prefill.Batch.StealInterval = 20 * time.Millisecond
	})
	waitClusterSize(t, []*clusterNode{owner, peer}, 2)
	if done := waitBatch(t, owner.Node, "acme-rw", id); done.Status != "completed" || len(done.Responses) != 2 {
		t.Fatalf("the tenant's batch run by the peer: %+v", done)
	}
}
