package node

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
)

// syncBuffer is a log sink safe for the node's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestGossipWrongKey: two nodes share a gossip key; a third, with another
// key, is started with them as its seed. It serves alone and keeps trying
// (the seeds see its messages and cannot decrypt them), never becomes a
// member, and the cluster keeps serving: a prompt put through one node is a
// hit through the other.
func TestGossipWrongKey(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	var seedLog syncBuffer
	nodes := startClusterNodes(t, 2, func(i int, o *Options) {
		o.Cluster.GossipKey = key
		if i == 0 {
			o.Logger = slog.New(slog.NewTextHandler(&seedLog, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	})
	intruder := openClusterNode(t, t.TempDir(), "intruder", []string{nodes[0].GossipAddr()}, func(o *Options) {
		o.Cluster.GossipKey = []byte("fedcba9876543210fedcba9876543210")
	})
	// The seed refuses what it cannot decrypt; the intruder retries every
	// second: wait for two refusals, so that a retry was refused too.
	testkit.WaitFor(t, "the seed to refuse the intruder's gossip twice", func() bool {
		return strings.Count(seedLog.String(), "no installed keys could decrypt the message") >= 2
	})
	for _, n := range nodes {
		ms, _ := n.cluster.members.Members()
		if len(ms) != 2 {
			t.Fatalf("%s sees %v; want the two nodes with the key", n.ID(), ms)
		}
	}
	if ms, _ := intruder.cluster.members.Members(); len(ms) != 1 {
		t.Fatalf("the intruder sees %v; want itself alone", ms)
	}

	ctx := context.Background()
	tokens, payloads := clusterPrompt(7, 12)
	if _, err := nodes[0].client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the prompt to be a hit through the other node", func() bool {
		l, err := nodes[1].client.Lookup(ctx, clusterNS, client.Prompt{Tokens: tokens})
		return err == nil && l.CachedBlocks == len(payloads)
	})
	if l, err := intruder.client.Lookup(ctx, clusterNS, client.Prompt{Tokens: tokens}); err != nil || l.CachedBlocks != 0 {
		t.Fatalf("the intruder found %+v, %v; want nothing", l, err)
	}
}
