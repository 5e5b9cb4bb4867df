package gossip

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// partition is an in-process gossip network (memberlist's MockNetwork)
// whose links can be cut: a member on one side of a cut neither sends to
// nor dials a member on the other, as if the network between them dropped
// everything.
type partition struct {
	mock memberlist.MockNetwork
	mu   sync.Mutex
	cut  map[[2]string]bool // both orders of each cut pair of addresses
}

// cutTransport is one member's end of a partition.
type cutTransport struct {
	memberlist.Transport
	p    *partition
	self string
}

func (c *cutTransport) severed(addr string) bool {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	return c.p.cut[[2]string{c.self, addr}]
}

// WriteTo drops a packet across a cut, as a lossy network does: no error.
func (c *cutTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if c.severed(addr) {
		return time.Now(), nil
	}
	return c.Transport.WriteTo(b, addr)
}

// DialTimeout fails across a cut, as a connection attempt times out.
func (c *cutTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if c.severed(addr) {
		return nil, fmt.Errorf("dial %s: partitioned", addr)
	}
	return c.Transport.DialTimeout(addr, timeout)
}

// transports makes one transport per name. All are made before any member
// starts: MockNetwork's maps are not safe to grow while members use them.
func (p *partition) transports(names ...string) map[string]*cutTransport {
	p.cut = map[[2]string]bool{}
	out := map[string]*cutTransport{}
	for _, n := range names {
		mt := p.mock.NewTransport(n)
		ip, port, err := mt.FinalAdvertiseAddr("", 0)
		if err != nil {
			panic(err)
		}
		out[n] = &cutTransport{Transport: mt, p: p, self: net.JoinHostPort(ip.String(), fmt.Sprint(port))}
	}
	return out
}

// split cuts (or, with heal, restores) every link between side a and side
// b.
func (p *partition) split(a, b []*cutTransport, heal bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			for _, k := range [][2]string{{x.self, y.self}, {y.self, x.self}} {
				if heal {
					delete(p.cut, k)
				} else {
					p.cut[k] = true
				}
			}
		}
	}
}

func startMemberOn(t *testing.T, id string, tr memberlist.Transport, join ...string) *Membership {
	t.Helper()
	m, err := Start(Options{
		NodeID: id, Join: join, Fast: true, Transport: tr,
		Meta:   MemberMeta{GRPCAddr: "127.0.0.1:1", DRAMBytes: 1 << 30},
		Logger: quietLogger(),
	})
	if err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestMembershipPartitionInProcess cuts one member off from two others and
// heals the cut, all in one process: each side sees the other fail, and
// once healed the reconnect loop brings the cluster back to three.
func TestMembershipPartitionInProcess(t *testing.T) {
	var p partition
	tr := p.transports("a", "b", "c")
	a := startMemberOn(t, "a", tr["a"])
	b := startMemberOn(t, "b", tr["b"], a.GossipAddr())
	c := startMemberOn(t, "c", tr["c"], a.GossipAddr())
	for _, m := range []*Membership{a, b, c} {
		waitMembers(t, m, 3)
	}

	p.split([]*cutTransport{tr["a"], tr["b"]}, []*cutTransport{tr["c"]}, false)
	for _, m := range []*Membership{a, b} {
		if ms := waitMembers(t, m, 2); ms[0].ID != "a" || ms[1].ID != "b" {
			t.Fatalf("%s sees %+v during the partition, want a and b", m.LocalID(), ms)
		}
	}
	if ms := waitMembers(t, c, 1); ms[0].ID != "c" {
		t.Fatalf("c sees %+v during the partition, want itself alone", ms)
	}

	p.split([]*cutTransport{tr["a"], tr["b"]}, []*cutTransport{tr["c"]}, true)
	for _, m := range []*Membership{a, b, c} {
		waitMembers(t, m, 3)
	}
}
