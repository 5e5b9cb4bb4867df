package gossip

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/gossip/gossiptest"
	"github.com/kvmesh/kvmesh/internal/testkit"
)

// TestAntiEntropyInterval checks the exchange's schedule: the base interval
// up to 32 members, then in proportion to the members, so that the member
// records a member sends each second (n over the interval) stay those of
// 32 members at 1,024.
func TestAntiEntropyInterval(t *testing.T) {
	base := 30 * time.Second
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{1, base}, {16, base}, {32, base}, {64, time.Minute}, {256, 4 * time.Minute}, {1024, 16 * time.Minute}} {
		got := AntiEntropyInterval(base, c.n)
		if got != c.want {
			t.Errorf("AntiEntropyInterval(%v, %d) = %v, want %v", base, c.n, got, c.want)
		}
		if c.n >= AntiEntropyMembers {
			if rate := float64(c.n) / got.Seconds(); rate != float64(AntiEntropyMembers)/base.Seconds() {
				t.Errorf("%d members: %.3f records a second, want %.3f as at %d", c.n, rate, float64(AntiEntropyMembers)/base.Seconds(), AntiEntropyMembers)
			}
		}
	}
}

// TestAntiEntropyRepairs starts three members on a simulated network whose
// gossip spreads nothing (no gossip fan-out, no probes): c joins a, then b
// joins a, so c never hears of b but through an exchange of member lists.
// Membership's anti-entropy (memberlist's own push-pull is off) brings it.
func TestAntiEntropyRepairs(t *testing.T) {
	net := gossiptest.NewNetwork(gossiptest.Options{Seed: 1})
	defer net.Close()
	// pushPull is the exchange's base interval; 0: none.
	start := func(name string, pushPull time.Duration, join ...string) *Membership {
		tune := func(c *memberlist.Config) {
			c.GossipNodes = 0           // no broadcast reaches anyone
			c.ProbeInterval = time.Hour // no probe suspects anyone
			c.PushPullInterval = pushPull
		}
		m, err := Start(Options{NodeID: name, Transport: net.NewTransport(name), Join: join, Fast: true,
			Meta: MemberMeta{GRPCAddr: name + ":1", DRAMBytes: 1}, Logger: quietLogger(), Tune: tune})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	ids := func(m *Membership) []string {
		ms, _ := m.Members()
		var out []string
		for _, mi := range ms {
			out = append(out, mi.ID)
		}
		return out
	}
	a := start("a", 0)
	c := start("c", 0, a.GossipAddr())
	b := start("b", 0, a.GossipAddr())
	testkit.WaitFor(t, "a and b see all three", func() bool { return len(ids(a)) == 3 && len(ids(b)) == 3 })
	if got := ids(c); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("without exchanges c sees %v, want [a c]: the test's gossip is not off", got)
	}
	// d runs the exchange every 10ms: whichever member it picks, the
	// exchanges carry b to c (a member d exchanges with learns d, and c
	// learns b from d or from a member that has exchanged with it).
	d := start("d", 10*time.Millisecond, a.GossipAddr())
	testkit.WaitFor(t, "c sees b through exchanges", func() bool { return slices.Contains(ids(c), "b") })
	if got := ids(d); len(got) != 4 {
		t.Errorf("d sees %v, want four members", got)
	}
	if s := net.Counters("d").Streams; s < 2 {
		t.Errorf("d dialed %d streams, want its join and at least one exchange", s)
	}
}

// TestReconnectTargetsBounded checks that a node asks every seed that is not
// a member, but only ReconnectBatch of the members that failed, a different
// draw each time, and forgets those failed longer than ReconnectFor ago.
func TestReconnectTargetsBounded(t *testing.T) {
	now := time.Now()
	m := &Membership{seeds: []string{"s1:1", "s2:1", "live:1"}, retryFor: time.Hour}
	m.mu.members = []MemberInfo{{ID: "live", GossipAddr: "live:1"}}
	m.mu.failed = map[string]failedMember{"old": {addr: "old:1", since: now.Add(-2 * time.Hour)}}
	for i := range 20 {
		id := fmt.Sprintf("f%02d", i)
		m.mu.failed[id] = failedMember{addr: id + ":1", since: now.Add(-time.Minute)}
	}
	drawn := map[string]bool{}
	for range 10 {
		got := m.reconnectTargets(now)
		if len(got) != 2+ReconnectBatch || !slices.Equal(got[:2], []string{"s1:1", "s2:1"}) {
			t.Fatalf("targets %v: want s1:1, s2:1 and %d failed members", got, ReconnectBatch)
		}
		for i, a := range got[2:] {
			if a == "old:1" || a == "live:1" || slices.Contains(got[2+i+1:], a) {
				t.Fatalf("targets %v: %s should not be among them, or not twice", got, a)
			}
			drawn[a] = true
		}
	}
	if len(drawn) <= ReconnectBatch {
		t.Errorf("10 draws asked only %v: the failed members are not drawn at random", drawn)
	}
	if _, ok := m.mu.failed["old"]; ok {
		t.Errorf("a member failed 2h ago is still tried (ReconnectFor 1h)")
	}
}
