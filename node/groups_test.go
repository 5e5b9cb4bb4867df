package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// hybridPrompt is a prompt of a namespace with groups and its records'
// payloads, [block][group].
type hybridPrompt struct {
	ns       prefixhash.Namespace
	tokens   []uint32
	chain    []prefixhash.Key
	payloads [][][]byte
}

func newHybridPrompt(seed uint64, blocks int) *hybridPrompt {
	ns := blocktest.Hybrid()
	rng := rand.New(rand.NewPCG(seed, 31))
	p := &hybridPrompt{ns: ns, tokens: make([]uint32, blocks*ns.BlockTokens+1)}
	for i := range p.tokens {
		p.tokens[i] = rng.Uint32()
	}
	p.chain = prefixhash.Keys(ns, p.tokens)
	for range blocks {
		var recs [][]byte
		for g := range ns.Groups.Len() {
			b := make([]byte, ns.GroupBytes(g))
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			recs = append(recs, b)
		}
		p.payloads = append(p.payloads, recs)
	}
	return p
}

// put streams the records keep accepts (block, group) through c: block by
// block, groups in order, parents and chunk keys left for the node to
// derive, unless explicit (then every record names them, with chunkBlocks
// blocks per chunk).
func (p *hybridPrompt) put(ctx context.Context, c kvmeshv1.CacheServiceClient, explicit bool, chunkBlocks int, keep func(i, g int) bool) error {
	stream, err := c.BatchPut(ctx)
	if err != nil {
		return err
	}
	first := true
	for i := range p.payloads {
		for g, payload := range p.payloads[i] {
			if !keep(i, g) {
				continue
			}
			m := &kvmeshv1.BatchPutRequest{Block: &kvmeshv1.BlockHeader{Tokens: p.tokens[i*p.ns.BlockTokens : (i+1)*p.ns.BlockTokens],
				PayloadLen: uint64(len(payload)), Group: uint32(g + 1)}, Data: payload}
			if explicit {
				parent := p.ns.Root()
				if i > 0 {
					parent = p.chain[i-1]
				}
				ck := prefixhash.ChunkKey(p.chain, i, chunkBlocks)
				m.Block.Parent, m.Block.ChunkKey = parent[:], ck[:]
			}
			if first {
				m.Namespace, first = client.NamespaceProto(p.ns), false
			}
			if err := stream.Send(m); err != nil {
				break
			}
		}
	}
	_, err = stream.CloseAndRecv()
	return err
}

func lookupGroups(ctx context.Context, c kvmeshv1.CacheServiceClient, p *hybridPrompt) (*kvmeshv1.LookupResponse, error) {
	return c.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: client.NamespaceProto(p.ns), Tokens: p.tokens, Summary: true})
}

func groupBlocks(r *kvmeshv1.LookupResponse) []int {
	var out []int
	for _, g := range r.GetGroups() {
		out = append(out, int(g.GetBlocks()))
	}
	return out
}

// readResume streams a resume read and returns the records found, by
// (block, group), and the misses.
func readResume(ctx context.Context, c kvmeshv1.CacheServiceClient, p *hybridPrompt) (map[[2]int][]byte, int, error) {
	s, err := c.BatchGet(ctx, &kvmeshv1.BatchGetRequest{Namespace: client.NamespaceProto(p.ns), Tokens: p.tokens, Resume: true})
	if err != nil {
		return nil, 0, err
	}
	got := map[[2]int][]byte{}
	misses := 0
	var cur [2]int
	for {
		f, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return got, misses, nil
		}
		if err != nil {
			return nil, 0, err
		}
		if len(f.GetKey()) > 0 {
			cur = [2]int{int(f.GetIndex()), int(f.GetGroup()) - 1}
			if cur[1] < 0 {
				return nil, 0, fmt.Errorf("a frame of block %d names no group", cur[0])
			}
			if !f.GetFound() {
				misses++
				continue
			}
		}
		got[cur] = append(got[cur], f.GetData()...)
	}
}

// wantResume returns the records a reader resuming at n blocks needs.
func wantResume(p *hybridPrompt, n int) map[[2]int][]byte {
	want := map[[2]int][]byte{}
	for _, r := range resumeRecords(p.ns.Groups.All(), p.ns.BlockTokens, n) {
		want[[2]int{r.i, r.g}] = p.payloads[r.i][r.g]
	}
	return want
}

func sameRecords(got, want map[[2]int][]byte) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d records, want %d", len(got), len(want))
	}
	for k, w := range want {
		if !bytes.Equal(got[k], w) {
			return fmt.Errorf("block %d group %d: %d bytes, not the record put", k[0], k[1], len(got[k]))
		}
	}
	return nil
}

// TestGroupsCluster: a hybrid prompt put through node A, group by group,
// is found through node C by the hit rule, with each group's part; a
// missing state or window block is a shorter hit naming the group; the
// resume read returns exactly the records a reader needs; and when the
// only node holding the newest state is killed, the hit is shorter
// (the state before it), never wrong.
func TestGroupsCluster(t *testing.T) {
	// Each group's records are a size class of their own: the DRAM tier
	// needs a slab (16 MiB) for each.
	nodes := startClusterNodes(t, 3, func(_ int, o *Options) { o.Tiers.DRAMBytes = 5 * 17 * MiB })
	a, c := nodes[0], nodes[2]
	ctx := context.Background()
	ra, rc := rawAPI(t, a.GRPCAddr()).cache, rawAPI(t, c.GRPCAddr()).cache
	const n = 20
	p := newHybridPrompt(1, n)
	cb := a.cluster.cluster.ChunkBlocks(p.ns.BlockTokens)
	// Every record but the state of the last block and the sliding window's
	// block 17.
	if err := p.put(ctx, ra, false, cb, func(i, g int) bool { return !(g == 2 && i == n-1) && !(g == 1 && i == 17) }); err != nil {
		t.Fatal(err)
	}
	// Each group alone: full n; sliding n (the window before n is there);
	// state n-1; indexer n. Together: at n-1 the window misses block 17,
	// and so it does down to 17.
	var l *kvmeshv1.LookupResponse
	testkit.WaitFor(t, "the prompt's records at their owners", func() bool {
		var err error
		l, err = lookupGroups(ctx, rc, p)
		return err == nil && fmt.Sprint(groupBlocks(l)) == fmt.Sprint([]int{n, n, n - 1, n})
	})
	if l.GetCachedBlocks() != 17 || l.GetGroups()[1].GetKind() != kvmeshv1.GroupKind_GROUP_KIND_SLIDING {
		t.Fatalf("%d blocks, groups %v; want 17", l.GetCachedBlocks(), l.GetGroups())
	}
	got, misses, err := readResume(ctx, rc, p)
	if err != nil || misses != 0 {
		t.Fatalf("resume read: %v, %d misses", err, misses)
	}
	if err := sameRecords(got, wantResume(p, 17)); err != nil {
		t.Fatalf("resume read at 17: %v", err)
	}

	// Block info describes a group's record: its group, kind and shape.
	ca, err := client.Dial(a.GRPCAddr(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	info, err := ca.BlockInfo(ctx, prefixhash.GroupKey(p.chain[3], 2))
	if err != nil {
		t.Fatal(err)
	}
	if info.Group != 2 || info.GroupKind != prefixhash.GroupState || info.KVLayout != prefixhash.StateKV || info.StateBytes != 16 ||
		info.KVHeads != 2 || info.Layers != 1 || info.Chain != p.chain[3] || info.PayloadLen != p.ns.GroupBytes(2) {
		t.Fatalf("block info of block 3's state: %+v", info)
	}
	if info, err := ca.BlockInfo(ctx, prefixhash.GroupKey(p.chain[3], 1)); err != nil || info.Group != 1 || info.WindowBlocks != 2 {
		t.Fatalf("block info of block 3's window block: %+v, %v", info, err)
	}

	// The missing window block, through A; then the newest state through
	// the owner of the last chunk only.
	if err := p.put(ctx, ra, true, cb, func(i, g int) bool { return g == 1 && i == 17 }); err != nil {
		t.Fatal(err)
	}
	owner := a.cluster.cluster.Owners(prefixhash.ChunkKey(p.chain, n-1, cb))[0]
	var x *clusterNode
	for _, cn := range nodes {
		if cn.ID() == owner && cn != a {
			x = cn
		}
	}
	if x == nil {
		t.Fatalf("the last chunk's owner is %s, the writer: pick another prompt", owner)
	}
	if err := p.put(ctx, rawAPI(t, x.GRPCAddr()).cache, true, cb, func(i, g int) bool { return g == 2 && i == n-1 }); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "a full hit", func() bool {
		l, err = lookupGroups(ctx, ra, p)
		return err == nil && l.GetCachedBlocks() == n
	})
	if got, misses, err := readResume(ctx, ra, p); err != nil || misses != 0 || sameRecords(got, wantResume(p, n)) != nil {
		t.Fatalf("resume read at %d: %v, %d misses, %v", n, err, misses, sameRecords(got, wantResume(p, n)))
	}

	x.crash(t)
	testkit.WaitFor(t, "a shorter hit after the state's node died", func() bool {
		l, err = lookupGroups(ctx, ra, p)
		return err == nil && l.GetCachedBlocks() < n
	})
	if l.GetCachedBlocks() != n-1 || l.GetGroups()[2].GetBlocks() != n-1 {
		t.Fatalf("after the kill: %d blocks, groups %v; want %d (the state before the lost one)", l.GetCachedBlocks(), groupBlocks(l), n-1)
	}
	got, misses, err = readResume(ctx, ra, p)
	if err != nil {
		t.Fatal(err)
	}
	// Records of the killed node's chunks that A holds no copy of are
	// misses, never other bytes: whatever was found is what was put.
	for k, b := range got {
		if !bytes.Equal(b, p.payloads[k[0]][k[1]]) {
			t.Fatalf("block %d group %d: other bytes after the kill", k[0], k[1])
		}
	}
	if misses != 0 {
		t.Fatalf("%d misses among the records of a hit the writer holds", misses)
	}
}

// TestGroupsInvalid: bad groups, records of unknown groups and states of
// the wrong size are InvalidArgument naming the field; the node keeps
// serving.
func TestGroupsInvalid(t *testing.T) {
	tn := startNode(t, nil)
	ctx := context.Background()
	p := newHybridPrompt(2, 2)
	bad := func(mod func(gs []*kvmeshv1.Group)) *kvmeshv1.Namespace {
		pb := client.NamespaceProto(p.ns)
		mod(pb.Groups)
		return pb
	}
	put := func(ns *kvmeshv1.Namespace, h *kvmeshv1.BlockHeader, data []byte) error {
		stream, err := tn.raw.BatchPut(ctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&kvmeshv1.BatchPutRequest{Namespace: ns, Block: h, Data: data}); err == nil {
			_, err = stream.CloseAndRecv()
			return err
		}
		_, err = stream.CloseAndRecv()
		return err
	}
	tok := p.tokens[:p.ns.BlockTokens]
	for _, tc := range []struct {
		name, field string
		err         error
	}{
		{"overlapping layers", "groups[1].layers", put(bad(func(gs []*kvmeshv1.Group) { gs[1].Layers = []uint32{1, 2} }), nil, nil)},
		{"window 0", "groups[1].window", put(bad(func(gs []*kvmeshv1.Group) { gs[1].Window = 0 }), nil, nil)},
		{"state size", "groups[2].state_bytes", put(client.NamespaceProto(p.ns),
			&kvmeshv1.BlockHeader{Tokens: tok, PayloadLen: uint64(p.ns.GroupBytes(2) + 4), Group: 3}, nil)},
		{"unknown group", "block.group", put(client.NamespaceProto(p.ns),
			&kvmeshv1.BlockHeader{Tokens: tok, PayloadLen: 64, Group: 9}, nil)},
		{"no group", "block.group", put(client.NamespaceProto(p.ns), &kvmeshv1.BlockHeader{Tokens: tok, PayloadLen: 64}, nil)},
		{"read by tokens without resume", "resume", func() error {
			_, _, err := batchGet(ctx, tn.raw, &kvmeshv1.BatchGetRequest{Namespace: client.NamespaceProto(p.ns), Tokens: p.tokens})
			return err
		}()},
	} {
		if status.Code(tc.err) != codes.InvalidArgument || !strings.Contains(status.Convert(tc.err).Message(), tc.field) {
			t.Errorf("%s: %v, want InvalidArgument naming %s", tc.name, tc.err, tc.field)
		}
	}
	// Still serving: the prompt goes in and resumes whole.
	if err := p.put(ctx, tn.raw, false, 4, func(int, int) bool { return true }); err != nil {
		t.Fatal(err)
	}
	l, err := lookupGroups(ctx, tn.raw, p)
	if err != nil || l.GetCachedBlocks() != 2 {
		t.Fatalf("after the refusals: %v, %v", l, err)
	}
}
