package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// A cluster of real nodes in one process: Open (store.Local over the DRAM
// and NVMe tiers), memberlist on loopback, the TCP and shared-memory data
// planes, the gRPC API, every port picked by the kernel.

type clusterNode struct {
	*Node
	client *client.Client
	cancel context.CancelFunc
	done   chan error
	dir    string
}

// clusterNS has 2 KiB blocks of 16 tokens.
var clusterNS = prefixhash.Namespace{Model: "test/cluster", DType: prefixhash.Float16, BlockTokens: 16,
	Layers: 2, KVHeads: 2, HeadDim: 8}

// startClusterNodes starts n nodes, each joining the first, and waits until
// every node sees all n. mod may adjust each node's options.
func startClusterNodes(t testing.TB, n int, mod func(i int, o *Options)) []*clusterNode {
	t.Helper()
	var nodes []*clusterNode
	for i := range n {
		var join []string
		if i > 0 {
			join = []string{nodes[0].GossipAddr()}
		}
		cn := openClusterNode(t, t.TempDir(), fmt.Sprintf("n%d", i), join, func(o *Options) {
			if mod != nil {
				mod(i, o)
			}
		})
		nodes = append(nodes, cn)
	}
	waitClusterSize(t, nodes, n)
	return nodes
}

func openClusterNode(t testing.TB, dir, id string, join []string, mod func(*Options)) *clusterNode {
	t.Helper()
	opts := Options{
		NodeID:  id,
		DataDir: dir,
		Listen:  ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0", ShmRegionBytes: 16 * MiB},
		Cluster: ClusterOptions{GossipAddr: "127.0.0.1:0", Join: join, GossipProfile: "local",
			ChunkTokens: 64}, // 4 blocks of clusterNS per chunk
		Tiers:  TierOptions{DRAMBytes: 32 * MiB, NVMeBytes: 128 * MiB},
		Limits: LimitOptions{MaxBlockBytes: 1 * MiB},
		Logger: slog.New(slog.DiscardHandler),
	}
	if testing.Verbose() && os.Getenv("KVMESH_TEST_LOGS") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", id)
	}
	if mod != nil {
		mod(&opts)
	}
	n, err := Open(opts)
	if err != nil {
		t.Fatalf("Open %s: %v", id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cn := &clusterNode{Node: n, cancel: cancel, done: make(chan error, 1), dir: dir}
	go func() { cn.done <- n.Serve(ctx) }()
	if cn.client, err = client.Dial(n.GRPCAddr(), client.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cn.stop(t) })
	return cn
}

// stop shuts the node down gracefully (once): handoff, leave, close.
func (cn *clusterNode) stop(t testing.TB) {
	t.Helper()
	cn.client.Close()
	cn.cancel()
	if err, ok := <-cn.done; ok {
		close(cn.done)
		if err != nil {
			t.Errorf("%s: Serve: %v", cn.ID(), err)
		}
	}
}

// crash stops a node the way kill -9 would look to the others: no handoff,
// no leave; its ports close.
func (cn *clusterNode) crash(t testing.TB) {
	t.Helper()
	cn.client.Close()
	cn.cluster.stop() // gossip and data plane gone without a word
	cn.cancel()
	<-cn.done
	close(cn.done)
}

// waitClusterSize waits until every node sees want members.
func waitClusterSize(t testing.TB, nodes []*clusterNode, want int) {
	t.Helper()
	testkit.WaitFor(t, fmt.Sprintf("%d members everywhere", want), func() bool {
		for _, n := range nodes {
			if ms, _ := n.cluster.members.Members(); len(ms) != want {
				return false
			}
		}
		return true
	})
}

// clusterPrompt returns a prompt of blocks full blocks (and a 5-token tail)
// under clusterNS, and its payloads, derived from seed.
func clusterPrompt(seed, blocks int) ([]uint32, [][]byte) {
	tokens := make([]uint32, blocks*clusterNS.BlockTokens+5)
	for i := range tokens {
		tokens[i] = uint32(seed*100000 + i)
	}
	payloads := make([][]byte, blocks)
	for i := range payloads {
		p := make([]byte, clusterNS.BlockBytes())
		for j := range p {
			p[j] = byte(seed*31 + i*7 + j)
		}
		payloads[i] = p
	}
	return tokens, payloads
}

// waitHit waits until a lookup through c finds want blocks of tokens.
func waitHit(t testing.TB, c *client.Client, tokens []uint32, want int) client.Lookup {
	t.Helper()
	var l client.Lookup
	testkit.WaitFor(t, fmt.Sprintf("a lookup finding %d blocks", want), func() bool {
		var err error
		l, err = c.Lookup(context.Background(), clusterNS, client.Prompt{Tokens: tokens})
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		return l.CachedBlocks == want
	})
	return l
}

// TestClusterPutOnAHitOnC: a prompt put through node A is found and read,
// byte for byte, through node C; blocks that A does not own reached their
// owners, and C's lookup says where each block is.
func TestClusterPutOnAHitOnC(t *testing.T) {
	nodes := startClusterNodes(t, 3, nil)
	a, c := nodes[0], nodes[2]
	ctx := context.Background()
	const blocks = 24                            // 6 chunks
	tokens, payloads := clusterPrompt(3, blocks) // key format 3: this prompt's chunks land on every node
	keys, err := a.client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads)
	if err != nil || len(keys) != blocks {
		t.Fatalf("Put through A: %d keys, %v", len(keys), err)
	}
	l := waitHit(t, c.client, tokens, blocks)
	located := map[string]int{}
	cb := c.cluster.ChunkBlocks(clusterNS.BlockTokens)
	for i, b := range l.Blocks() {
		if b.Key != keys[i] {
			t.Fatalf("lookup block %d: key %s, want %s", i, b.Key, keys[i])
		}
		// Found on its chunk's owner (C holds its own), never on the
		// producer A unless A owns it.
		if owner := c.cluster.cluster.Owners(prefixhash.ChunkKey(keys, i, cb))[0]; b.NodeID != owner {
			t.Fatalf("lookup block %d located on %s; its owner is %s", i, b.NodeID, owner)
		}
		if (b.NodeID == c.ID()) != (b.Tier != "") {
			t.Fatalf("lookup block %d on %s has tier %q: want a tier for C's own blocks only", i, b.NodeID, b.Tier)
		}
		located[b.NodeID]++
	}
	if len(located) != 3 {
		t.Fatalf("blocks located on %v: the test wants chunks on every node", located)
	}

	got, err := c.client.Get(ctx, clusterNS, client.Prompt{Tokens: tokens})
	if err != nil || len(got) != blocks {
		t.Fatalf("Get through C: %d blocks, %v", len(got), err)
	}
	for i, b := range got {
		if !bytes.Equal(b.Payload, payloads[i]) || b.Key != keys[i] {
			t.Fatalf("block %d read through C differs from what was put through A", i)
		}
	}
	// By key alone (no chunk keys): the node asks every member.
	n := 0
	err = c.client.GetKeys(ctx, clusterNS, []prefixhash.Key{keys[blocks-1], keys[0]}, func(b client.Block) error {
		want := payloads[blocks-1]
		if b.Index == 1 {
			want = payloads[0]
		}
		if !b.Found || !bytes.Equal(b.Payload, want) {
			return fmt.Errorf("GetKeys block %d: found %v", b.Index, b.Found)
		}
		n++
		return nil
	})
	if err != nil || n != 2 {
		t.Fatalf("GetKeys through C: %d, %v", n, err)
	}
	present, err := c.client.Exists(ctx, []prefixhash.Key{keys[5], prefixhash.BlockKey(keys[5], make([]uint32, 16))})
	if err != nil || !present[0] || present[1] {
		t.Fatalf("Exists through C = %v, %v; want [true false]", present, err)
	}

	m, err := c.client.Members(ctx)
	if err != nil || len(m.Members) != 3 || m.SelfID != c.ID() || m.Members[0].ID != c.ID() {
		t.Fatalf("Members through C = %+v, %v", m, err)
	}
	for _, mb := range m.Members {
		if mb.State != "alive" || mb.GRPCAddr == "" || mb.DataAddr == "" || mb.GossipAddr == "" || len(mb.Tiers) != 2 {
			t.Fatalf("member %+v lacks its state, addresses or tiers", mb)
		}
	}
	if self := m.Members[0]; self.ShmSocket != c.ShmSocket() || self.HostID == "" || self.Tiers[0].UsedBytes == 0 {
		t.Fatalf("self %v: want its shared-memory socket, host id and tier usage", self)
	}
}

// TestClusterClientTransports: on the node's host the client moves blocks
// through shared memory; told to use TCP or gRPC, it gets the same answers.
func TestClusterClientTransports(t *testing.T) {
	nodes := startClusterNodes(t, 2, nil)
	a := nodes[0]
	ctx := context.Background()
	for i, tr := range []string{client.TransportAuto, client.TransportTCP, client.TransportGRPC} {
		c, err := client.Dial(a.GRPCAddr(), client.Options{Transport: tr, VerifySharedMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		shmBefore, tcpBefore := a.cluster.shm.Stats(), a.cluster.data.Stats()
		tokens, payloads := clusterPrompt(10+i, 12)
		if _, err := c.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
			t.Fatalf("%s: Put: %v", tr, err)
		}
		got, err := c.Get(ctx, clusterNS, client.Prompt{Tokens: tokens})
		if err != nil || len(got) != len(payloads) {
			t.Fatalf("%s: Get: %d blocks, %v", tr, len(got), err)
		}
		for j, b := range got {
			if !bytes.Equal(b.Payload, payloads[j]) {
				t.Fatalf("%s: block %d differs", tr, j)
			}
		}
		// A view: on the node's host, the node's own memory under a lease
		// until Release.
		sns, err := c.Namespace(ctx, clusterNS)
		if err != nil {
			t.Fatal(err)
		}
		view, err := c.GetView(ctx, clusterNS, prefixhash.Keys(sns, tokens))
		if err != nil || len(view.Blocks) != len(payloads) {
			t.Fatalf("%s: GetView: %v", tr, err)
		}
		for j, b := range view.Blocks {
			if !b.Found || !bytes.Equal(b.Payload, payloads[j]) {
				t.Fatalf("%s: viewed block %d differs", tr, j)
			}
		}
		if l := a.cluster.shm.Stats().Leases; tr == client.TransportAuto && l != 1 {
			t.Fatalf("auto: %d leases while a view is held, want 1", l)
		}
		view.Release()
		testkit.WaitFor(t, "leases and reservations to end", func() bool {
			s := a.cluster.shm.Stats()
			return s.Leases == 0 && s.Reservations == 0
		})
		// Puts and Hits are counted before the server answers.
		shm, tcp := a.cluster.shm.Stats(), a.cluster.data.Stats()
		usedShm, usedTCP := shm.Puts > shmBefore.Puts && shm.Hits > shmBefore.Hits, tcp.Puts > tcpBefore.Puts && tcp.Hits > tcpBefore.Hits
		switch {
		case tr == client.TransportAuto && !usedShm:
			t.Fatalf("auto on the node's host did not use shared memory: %+v", shm)
		case tr == client.TransportTCP && (!usedTCP || shm.Puts != shmBefore.Puts):
			t.Fatalf("tcp: shm %+v, tcp %+v", shm, tcp)
		case tr == client.TransportGRPC && (shm.Puts != shmBefore.Puts || shm.Hits != shmBefore.Hits):
			t.Fatalf("grpc used shared memory: %+v", shm)
		}
		// Published: the other node finds every block.
		waitHit(t, nodes[1].client, tokens, len(payloads))
	}
}

// TestClusterDeadPeerIsAMiss: a node that vanishes without a word turns into
// misses at once — no errors, no waiting — and the cluster goes on.
func TestClusterDeadPeerIsAMiss(t *testing.T) {
	nodes := startClusterNodes(t, 3, func(_ int, o *Options) { o.Cluster.LookupTimeout, o.Cluster.GetTimeout = time.Second, 2*time.Second })
	a, b, c := nodes[0], nodes[1], nodes[2]
	ctx := context.Background()
	const blocks = 40
	tokens, payloads := clusterPrompt(2, blocks)
	if _, err := a.client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	waitHit(t, c.client, tokens, blocks)
	b.crash(t)
	for i := range 20 {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := c.client.Lookup(cctx, clusterNS, client.Prompt{Tokens: tokens})
		if err != nil {
			t.Fatalf("lookup %d with B dead: %v", i, err)
		}
		got, err := c.client.Get(cctx, clusterNS, client.Prompt{Tokens: tokens})
		cancel()
		if err != nil {
			t.Fatalf("get %d with B dead: %v", i, err)
		}
		if len(got) > l.CachedBlocks+4 { // a chunk may come back between the two calls
			t.Fatalf("get returned %d blocks, lookup %d", len(got), l.CachedBlocks)
		}
		for j, blk := range got {
			if !bytes.Equal(blk.Payload, payloads[j]) {
				t.Fatalf("block %d wrong with B dead", j)
			}
		}
	}
	waitClusterSize(t, []*clusterNode{a, c}, 2)
	// With B gone from the membership its chunks have new owners: a new
	// put is a full hit again.
	tokens2, payloads2 := clusterPrompt(3, blocks)
	if _, err := a.client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens2}, payloads2); err != nil {
		t.Fatal(err)
	}
	waitHit(t, c.client, tokens2, blocks)
}

// TestClusterGracefulLeave: a node stopped gracefully hands its blocks to
// their next owners before it leaves, so prompts stay full hits.
func TestClusterGracefulLeave(t *testing.T) {
	nodes := startClusterNodes(t, 3, nil)
	a, b, c := nodes[0], nodes[1], nodes[2]
	const blocks = 32
	tokens, payloads := clusterPrompt(4, blocks)
	if _, err := a.client.Put(context.Background(), clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	l := waitHit(t, c.client, tokens, blocks)
	onB := 0
	for _, blk := range l.Blocks() {
		if blk.NodeID == b.ID() {
			onB++
		}
	}
	if onB == 0 {
		t.Fatal("B owns none of the prompt: the test proves nothing")
	}
	b.stop(t)
	waitClusterSize(t, []*clusterNode{a, c}, 2)
	l = waitHit(t, c.client, tokens, blocks)
	for _, blk := range l.Blocks() {
		if blk.NodeID == b.ID() {
			t.Fatalf("block %s still located on B after it left", blk.Key)
		}
	}
}

// TestClientFallsBack: when the node's shared memory goes away the client
// moves to its TCP data plane, and when that goes too, to gRPC, with no
// error on the way.
func TestClientFallsBack(t *testing.T) {
	n := startClusterNodes(t, 1, nil)[0]
	ctx := context.Background()
	read := func(seed int, tokens []uint32, payloads [][]byte) {
		t.Helper()
		got, err := n.client.Get(ctx, clusterNS, client.Prompt{Tokens: tokens})
		if err != nil || len(got) != len(payloads) {
			t.Fatalf("Get %d: %d blocks, %v", seed, len(got), err)
		}
		for i, b := range got {
			if !bytes.Equal(b.Payload, payloads[i]) {
				t.Fatalf("Get %d: block %d differs", seed, i)
			}
		}
	}
	tokens, payloads := clusterPrompt(30, 8)
	if _, err := n.client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	read(1, tokens, payloads)
	if st := n.cluster.shm.Stats(); st.Hits == 0 {
		t.Fatalf("the first read did not use shared memory: %+v", st)
	}

	n.cluster.shm.Close()
	read(2, tokens, payloads)
	if st := n.cluster.data.Stats(); st.Hits == 0 {
		t.Fatalf("with shared memory gone, the read did not use TCP: %+v", st)
	}

	n.cluster.data.Close()
	read(3, tokens, payloads)
	tokens2, payloads2 := clusterPrompt(31, 4)
	if _, err := n.client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens2}, payloads2); err != nil {
		t.Fatalf("Put with no data plane: %v", err)
	}
	read(4, tokens2, payloads2)
}

//lint:file-ignore SA1019 the node's tests call the client's deprecated methods, kept one release (client/deprecated.go).
