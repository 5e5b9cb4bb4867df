package gossiptest_test

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/gossip/gossiptest"
	"github.com/kvmesh/kvmesh/internal/testkit"
)

// TestLinksDraw checks the latency model's draw: the same for a seed and
// both directions, with about the configured share of slow links and a
// median near the configured one.
func TestLinksDraw(t *testing.T) {
	l := gossiptest.Links{Seed: 7}
	l.EnsureDefaults()
	var fast []time.Duration
	slow := 0
	for i := range 200 {
		for j := i + 1; j < 200; j++ {
			a, b := fmt.Sprint("n", i), fmt.Sprint("n", j)
			d := l.RTT(a, b)
			if d != l.RTT(b, a) {
				t.Fatalf("RTT(%s,%s)=%v but RTT(%s,%s)=%v", a, b, d, b, a, l.RTT(b, a))
			}
			if d == l.SlowRTT {
				slow++
			} else {
				fast = append(fast, d)
			}
		}
	}
	pairs := 200 * 199 / 2
	if f := float64(slow) / float64(pairs); f < 0.007 || f > 0.013 {
		t.Errorf("%.4f of links are slow, want about %.2f", f, l.SlowFraction)
	}
	slices.Sort(fast)
	if m := fast[len(fast)/2]; m < 45*time.Microsecond || m > 55*time.Microsecond {
		t.Errorf("median fast link %v, want about %v", m, l.MedianRTT)
	}
	other := gossiptest.Links{Seed: 8}
	other.EnsureDefaults()
	same := 0
	for i := range 100 {
		if l.RTT("a", fmt.Sprint(i)) == other.RTT("a", fmt.Sprint(i)) {
			same++
		}
	}
	if same > 5 {
		t.Errorf("seeds 7 and 8 drew %d of 100 links alike", same)
	}
}

// TestPacketLatency sends packets over a slow link and checks that none
// arrives before the link's one-way latency, and that a lost link delivers
// nothing.
func TestPacketLatency(t *testing.T) {
	n := gossiptest.NewNetwork(gossiptest.Options{Links: gossiptest.Links{MedianRTT: 20 * time.Millisecond, Spread: -1, SlowFraction: -1}})
	defer n.Close()
	a, b := n.NewTransport("a"), n.NewTransport("b")
	sent, err := a.WriteTo([]byte("ping"), b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p := <-b.PacketCh()
	if string(p.Buf) != "ping" || p.From.String() != a.Addr() {
		t.Fatalf("got %q from %v", p.Buf, p.From)
	}
	if got := p.Timestamp.Sub(sent); got < 10*time.Millisecond {
		t.Fatalf("packet arrived %v after it was sent, before the link's one-way 10ms", got)
	}
	n.SetDown("b", true)
	a.WriteTo([]byte("lost"), b.Addr())
	if c := a.Counters(); c.Packets != 2 || c.PacketsLost != 1 || c.PacketBytes != 8 {
		t.Fatalf("counters %+v, want 2 packets of 8 bytes, 1 lost", c)
	}
}

// TestStreamRoundTrip writes both ways on a stream and reads what was
// written, then EOF after the writer closes.
func TestStreamRoundTrip(t *testing.T) {
	n := gossiptest.NewNetwork(gossiptest.Options{})
	defer n.Close()
	a, b := n.NewTransport("a"), n.NewTransport("b")
	c, err := a.DialTimeout(b.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s := <-b.StreamCh()
	c.Write([]byte("hello "))
	c.Write([]byte("there"))
	c.Close()
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "hello there" {
		t.Fatalf("read %q, %v", got, err)
	}
	if _, err := s.Write([]byte("x")); err == nil {
		t.Fatal("write to a closed peer succeeded")
	}
	s.SetReadDeadline(time.Now().Add(-time.Second))
	n.Partition([]string{"a"})
	if _, err := a.DialTimeout(b.Addr(), time.Millisecond); err == nil {
		t.Fatal("dial across a partition succeeded")
	}
}

// TestGossipOverNetwork runs real members on the simulated network: they
// find each other, a partition splits them into the sides, and once it
// heals they are whole again.
func TestGossipOverNetwork(t *testing.T) {
	n := gossiptest.NewNetwork(gossiptest.Options{Seed: 1})
	defer n.Close()
	names := []string{"a", "b", "c", "d", "e"}
	var ms []*gossip.Membership
	for i, name := range names {
		tr := n.NewTransport(name)
		var join []string
		if i > 0 {
			join = []string{ms[0].GossipAddr()}
		}
		m, err := gossip.Start(gossip.Options{NodeID: name, Transport: tr, Join: join, Fast: true,
			Meta: gossip.MemberMeta{GRPCAddr: "x:1", DRAMBytes: 1}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		ms = append(ms, m)
	}
	count := func(m *gossip.Membership) int { s, _ := m.Members(); return len(s) }
	all := func(want func(i int) int) func() bool {
		return func() bool {
			for i, m := range ms {
				if count(m) != want(i) {
					return false
				}
			}
			return true
		}
	}
	testkit.WaitFor(t, "every member sees five", all(func(int) int { return 5 }))
	n.Partition([]string{"a", "b", "c"}, []string{"d", "e"})
	testkit.WaitFor(t, "each side sees itself", all(func(i int) int { return []int{3, 3, 3, 2, 2}[i] }))
	n.Heal()
	testkit.WaitFor(t, "every member sees five again", all(func(int) int { return 5 }))
	for _, name := range names {
		if c := n.Counters(name); c.Packets == 0 || c.Bytes() == 0 || c.Received == 0 {
			t.Errorf("%s: counters %+v, want packets sent and received", name, c)
		}
	}
}
