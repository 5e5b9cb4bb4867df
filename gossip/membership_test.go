package gossip

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startMember(t *testing.T, id string, key []byte, join ...string) *Membership {
	t.Helper()
	m, err := Start(Options{
		NodeID: id, GossipAddr: "127.0.0.1:0", Join: join, SecretKey: key, Fast: true,
		Meta:   MemberMeta{GRPCAddr: "127.0.0.1:1", DRAMBytes: 1 << 30, RDMA: nil},
		Logger: quietLogger(),
	})
	if err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// waitMembers waits until m sees exactly want members, or fails after
// testkit.WaitLimit.
func waitMembers(t *testing.T, m *Membership, want int) []MemberInfo {
	t.Helper()
	ch := m.Subscribe()
	deadline := time.After(testkit.WaitLimit)
	for {
		ms, _ := m.Members()
		if len(ms) == want {
			return ms
		}
		select {
		case <-ch:
		case <-time.After(100 * time.Millisecond): // memberlist may have changed before we subscribed
		case <-deadline:
			t.Fatalf("%s sees %d members, want %d", m.LocalID(), len(ms), want)
		}
	}
}

func TestMembershipJoinAndLeave(t *testing.T) {
	a := startMember(t, "a", nil)
	b := startMember(t, "b", nil, a.GossipAddr())
	c := startMember(t, "c", nil, a.GossipAddr())
	for _, m := range []*Membership{a, b, c} {
		ms := waitMembers(t, m, 3)
		for i, id := range []string{"a", "b", "c"} {
			if ms[i].ID != id || ms[i].State != "alive" || ms[i].Meta.GRPCAddr != "127.0.0.1:1" || ms[i].Weight() != 1<<30 {
				t.Fatalf("%s sees member %d = %+v", m.LocalID(), i, ms[i])
			}
		}
	}
	_, v1 := a.Members()
	if err := b.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Membership{a, c} {
		ms := waitMembers(t, m, 2)
		if ms[0].ID != "a" || ms[1].ID != "c" {
			t.Fatalf("after b left, %s sees %+v", m.LocalID(), ms)
		}
	}
	if _, v2 := a.Members(); v2 <= v1 {
		t.Fatalf("version did not advance: %d -> %d", v1, v2)
	}
}

func TestMembershipEncryption(t *testing.T) {
	key := []byte("0123456789abcdef")
	a := startMember(t, "a", key)
	b := startMember(t, "b", key, a.GossipAddr())
	waitMembers(t, b, 2)
	waitMembers(t, a, 2) // a learns of b by gossip, a moment after b's join returns

	_, err := Start(Options{NodeID: "intruder", GossipAddr: "127.0.0.1:0", Fast: true,
		Join: []string{a.GossipAddr()}, SecretKey: []byte("fedcba9876543210"), Logger: quietLogger()})
	if !errors.Is(err, ErrJoin) {
		t.Fatalf("a node with the wrong key joined: err = %v", err)
	}
	_, err = Start(Options{NodeID: "plain", GossipAddr: "127.0.0.1:0", Fast: true,
		Join: []string{a.GossipAddr()}, Logger: quietLogger()})
	if !errors.Is(err, ErrJoin) {
		t.Fatalf("a node without a key joined an encrypted cluster: err = %v", err)
	}
	if ms, _ := a.Members(); len(ms) != 2 {
		t.Fatalf("members after rejected joins: %+v", ms)
	}
	if _, err := Start(Options{SecretKey: []byte("short")}); !errors.Is(err, ErrSecretKey) {
		t.Fatalf("short key: %v", err)
	}
}

func TestMembershipDetectsFailure(t *testing.T) {
	a := startMember(t, "a", nil)
	b := startMember(t, "b", nil, a.GossipAddr())
	waitMembers(t, a, 2)
	b.Close() // no leave: a must detect the failure
	ms := waitMembers(t, a, 1)
	if ms[0].ID != "a" {
		t.Fatal(fmt.Sprint(ms))
	}
}

// TestMembershipBacklog: a backlog one member advertises reaches the
// others, and back to 0 is dropped; it changes neither the members nor
// the snapshot's version (placement does not rebuild for it). A member
// that leaves takes its backlog with it.
func TestMembershipBacklog(t *testing.T) {
	a := startMember(t, "a", nil)
	b := startMember(t, "b", nil, a.GossipAddr())
	c := startMember(t, "c", nil, a.GossipAddr())
	for _, m := range []*Membership{a, b, c} {
		waitMembers(t, m, 3)
	}
	before, v := a.Members()
	if err := b.SetBacklog(4); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Membership{a, c} {
		testkit.WaitFor(t, m.LocalID()+" sees b's backlog of 4", func() bool { return m.Backlogs()["b"] == 4 })
	}
	if after, v2 := a.Members(); v2 != v || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a backlog changed the members: version %d -> %d, %v -> %v", v, v2, before, after)
	}
	if err := b.SetBacklog(0); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "a no longer sees b's backlog", func() bool { _, ok := a.Backlogs()["b"]; return !ok })
	if err := c.SetBacklog(1); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "a sees c's backlog", func() bool { return a.Backlogs()["c"] == 1 })
	if err := c.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, a, 2)
	if got := a.Backlogs(); len(got) != 0 {
		t.Errorf("after c left, a sees backlogs %v", got)
	}
}
