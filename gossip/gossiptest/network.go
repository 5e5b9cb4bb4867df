package gossiptest

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Options configure a Network. Zero fields take the defaults.
type Options struct {
	// Links gives each pair of nodes its round-trip time (a packet takes
	// half of it; a stream's dial a whole one, each write half). Its zero
	// fields take Links' defaults.
	Links Links
	// Dilation multiplies every latency, so that a simulation whose
	// memberlist timings are scaled by the same factor (Dilate) runs
	// slower than real time and the machine's own delays (scheduling, a
	// loaded CPU) weigh Dilation times less against the modelled ones.
	// Default 1.
	Dilation float64
	// Loss is the probability that a packet (not a stream: TCP resends) is
	// lost. Default 0.
	Loss float64
	// Seed draws the losses. Default 0.
	Seed uint64
	// QueuePackets is how many delivered packets wait for a node's
	// memberlist to read them; more are dropped, as a full socket buffer
	// drops datagrams. Default 4096.
	QueuePackets int
}

// Network is a simulated network for memberlist in one process: each node's
// Transport sends packets that arrive after their link's latency (one
// scheduler goroutine delivers them all), may be lost, and never cross a
// partition; streams (memberlist's push-pull and TCP fallbacks) take a round
// trip to dial and half of one per write. It counts what every node sends.
// Make the transports with NewTransport; Close stops the scheduler. Safe for
// concurrent use.
type Network struct {
	opts Options

	mu struct {
		sync.Mutex
		byAddr  map[string]*Transport
		byName  map[string]*Transport
		group   map[string]int  // node name → partition group; absent is 0
		down    map[string]bool // node name → all of its traffic is lost
		rng     *rand.Rand
		nextIP  int
		sched   eventHeap
		stopped bool
	}
	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

// NewNetwork returns a network with no nodes and starts its scheduler.
func NewNetwork(opts Options) *Network {
	opts.Links.EnsureDefaults()
	if opts.Dilation <= 0 {
		opts.Dilation = 1
	}
	if opts.QueuePackets <= 0 {
		opts.QueuePackets = 4096
	}
	n := &Network{opts: opts, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	n.mu.byAddr = map[string]*Transport{}
	n.mu.byName = map[string]*Transport{}
	n.mu.group = map[string]int{}
	n.mu.down = map[string]bool{}
	n.mu.rng = rand.New(rand.NewPCG(opts.Seed, 0x9e3779b97f4a7c15))
	go n.run()
	return n
}

// Close stops delivering packets. The transports' memberlists must be shut
// down first or after; either way nothing blocks.
func (n *Network) Close() {
	n.mu.Lock()
	if n.mu.stopped {
		n.mu.Unlock()
		return
	}
	n.mu.stopped = true
	n.mu.Unlock()
	close(n.stop)
	<-n.done
}

// Links returns the latency model (defaults filled).
func (n *Network) Links() *Links { return &n.opts.Links }

// Dilation returns the factor every latency is multiplied by.
func (n *Network) Dilation() float64 { return n.opts.Dilation }

// NewTransport adds node name to the network, at an address of its own, and
// returns its transport (for gossip.Options.Transport).
func (n *Network) NewTransport(name string) *Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.mu.byName[name] != nil {
		panic(fmt.Sprintf("gossiptest: node %q added twice", name))
	}
	n.mu.nextIP++
	ip := net.IPv4(10, byte(n.mu.nextIP>>16), byte(n.mu.nextIP>>8), byte(n.mu.nextIP))
	t := &Transport{net: n, name: name, addr: &net.UDPAddr{IP: ip, Port: 7946},
		packets: make(chan *memberlist.Packet, n.opts.QueuePackets), streams: make(chan net.Conn, 64),
		shut: make(chan struct{})}
	n.mu.byAddr[t.addr.String()] = t
	n.mu.byName[name] = t
	return t
}

// Counters returns what node name sent so far (zero for an unknown name).
func (n *Network) Counters(name string) Counters {
	n.mu.Lock()
	t := n.mu.byName[name]
	n.mu.Unlock()
	if t == nil {
		return Counters{}
	}
	return t.Counters()
}

// Partition cuts every link between nodes of different groups: group i is
// groups[i]; a node named in no group is in a group of its own with every
// other unnamed node. A later Partition replaces it; Heal removes it.
// Packets across a cut are lost, dials fail after their timeout, and
// writes on an open stream across it are lost (its reader times out).
func (n *Network) Partition(groups ...[]string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.mu.group = map[string]int{}
	for i, g := range groups {
		for _, name := range g {
			n.mu.group[name] = i + 1
		}
	}
}

// Heal removes the partition.
func (n *Network) Heal() { n.Partition() }

// SetDown makes all of node name's traffic, to and from it, lost (a crash as
// the network sees it: the node's memberlist may still run), or restores it.
func (n *Network) SetDown(name string, down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if down {
		n.mu.down[name] = true
	} else {
		delete(n.mu.down, name)
	}
}

// linkedLocked reports whether a and b can reach each other.
func (n *Network) linkedLocked(a, b string) bool {
	return n.mu.group[a] == n.mu.group[b] && !n.mu.down[a] && !n.mu.down[b]
}

// oneWay is the delivery delay from a to b: half the link's round trip,
// dilated.
func (n *Network) oneWay(a, b string) time.Duration {
	return time.Duration(float64(n.opts.Links.RTT(a, b)) / 2 * n.opts.Dilation)
}

// route finds the transport at addr and whether the link from src to it is
// up; a lost packet (Loss) reports the link down.
func (n *Network) route(src *Transport, addr string, packet bool) (*Transport, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	dst := n.mu.byAddr[addr]
	if dst == nil {
		return nil, false
	}
	up := n.linkedLocked(src.name, dst.name)
	if up && packet && n.opts.Loss > 0 && n.mu.rng.Float64() < n.opts.Loss {
		up = false
	}
	return dst, up
}

// after runs fn at time at on the scheduler goroutine (fn must not block).
func (n *Network) after(at time.Time, fn func()) {
	n.mu.Lock()
	if n.mu.stopped {
		n.mu.Unlock()
		return
	}
	heap.Push(&n.mu.sched, event{at: at, fn: fn})
	first := n.mu.sched[0].at.Equal(at)
	n.mu.Unlock()
	if first {
		select {
		case n.wake <- struct{}{}:
		default:
		}
	}
}

// run delivers scheduled events in time order until Close.
func (n *Network) run() {
	defer close(n.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		n.mu.Lock()
		var due []func()
		now := time.Now()
		for len(n.mu.sched) > 0 && !n.mu.sched[0].at.After(now) {
			due = append(due, heap.Pop(&n.mu.sched).(event).fn)
		}
		wait := time.Hour
		if len(n.mu.sched) > 0 {
			wait = n.mu.sched[0].at.Sub(now)
		}
		n.mu.Unlock()
		for _, fn := range due {
			fn()
		}
		if len(due) > 0 {
			continue // time moved while delivering
		}
		t.Reset(wait)
		select {
		case <-n.stop:
			return
		case <-n.wake:
			t.Stop() // since Go 1.23 no stale tick is left to drain
		case <-t.C:
		}
	}
}

type event struct {
	at time.Time
	fn func()
}

type eventHeap []event

func (h eventHeap) Len() int           { return len(h) }
func (h eventHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h eventHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)        { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*h = old[:len(old)-1]
	return e
}

// Counters are what one node sent (or failed to).
type Counters struct {
	Packets      uint64 // packets sent (lost ones included)
	PacketBytes  uint64
	PacketsLost  uint64 // lost to Loss, a partition, a down node or a full queue
	Streams      uint64 // streams dialed
	StreamBytes  uint64 // bytes written on streams, both ends of those it dialed or accepted
	StreamsCut   uint64 // dials refused by a partition or a down node
	Received     uint64 // packets delivered to it
	ReceivedByte uint64
}

// Bytes is every byte the node sent, packets and streams.
func (c Counters) Bytes() uint64 { return c.PacketBytes + c.StreamBytes }

// Add returns c + o, field by field.
func (c Counters) Add(o Counters) Counters {
	return Counters{c.Packets + o.Packets, c.PacketBytes + o.PacketBytes, c.PacketsLost + o.PacketsLost,
		c.Streams + o.Streams, c.StreamBytes + o.StreamBytes, c.StreamsCut + o.StreamsCut,
		c.Received + o.Received, c.ReceivedByte + o.ReceivedByte}
}

// Sub returns c - o, field by field.
func (c Counters) Sub(o Counters) Counters {
	return Counters{c.Packets - o.Packets, c.PacketBytes - o.PacketBytes, c.PacketsLost - o.PacketsLost,
		c.Streams - o.Streams, c.StreamBytes - o.StreamBytes, c.StreamsCut - o.StreamsCut,
		c.Received - o.Received, c.ReceivedByte - o.ReceivedByte}
}

// Transport is one node's memberlist.Transport on a Network.
type Transport struct {
	net     *Network
	name    string
	addr    *net.UDPAddr
	packets chan *memberlist.Packet
	streams chan net.Conn
	shut    chan struct{}
	once    sync.Once

	c struct {
		packets, packetBytes, lost, streams, streamBytes, cut, recv, recvBytes atomic.Uint64
	}
}

var _ memberlist.Transport = (*Transport)(nil)

// Name is the node's name on the network.
func (t *Transport) Name() string { return t.name }

// Addr is the node's gossip address (what a join names).
func (t *Transport) Addr() string { return t.addr.String() }

// Counters returns what the node sent so far.
func (t *Transport) Counters() Counters {
	return Counters{t.c.packets.Load(), t.c.packetBytes.Load(), t.c.lost.Load(), t.c.streams.Load(),
		t.c.streamBytes.Load(), t.c.cut.Load(), t.c.recv.Load(), t.c.recvBytes.Load()}
}

// FinalAdvertiseAddr returns the node's address whatever memberlist asks.
func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.addr.IP, t.addr.Port, nil
}

// WriteTo sends a packet; it arrives after the link's one-way latency,
// unless lost. A lost packet is no error, as with UDP.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	now := time.Now()
	t.c.packets.Add(1)
	t.c.packetBytes.Add(uint64(len(b)))
	dst, up := t.net.route(t, addr, true)
	if dst == nil {
		t.c.lost.Add(1)
		return now, fmt.Errorf("gossiptest: no node at %s", addr)
	}
	if !up {
		t.c.lost.Add(1)
		return now, nil
	}
	buf := append([]byte(nil), b...)
	at := now.Add(t.net.oneWay(t.name, dst.name))
	t.net.after(at, func() {
		select {
		case dst.packets <- &memberlist.Packet{Buf: buf, From: t.addr, Timestamp: at}:
			dst.c.recv.Add(1)
			dst.c.recvBytes.Add(uint64(len(buf)))
		default:
			t.c.lost.Add(1)
		}
	})
	return now, nil
}

// PacketCh delivers the packets sent to the node.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// ErrCut is the error of a dial across a partition or to a down node.
var ErrCut = errors.New("gossiptest: no route (partitioned or down)")

// DialTimeout opens a stream to addr after a round trip of the link, or
// fails after timeout when the link is cut.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	dst, up := t.net.route(t, addr, false)
	if dst == nil {
		return nil, fmt.Errorf("gossiptest: no node at %s", addr)
	}
	if !up {
		t.c.cut.Add(1)
		select {
		case <-time.After(timeout):
		case <-t.shut:
		}
		return nil, fmt.Errorf("dial %s: %w", addr, ErrCut)
	}
	oneWay := t.net.oneWay(t.name, dst.name)
	select {
	case <-time.After(2 * oneWay): // the handshake
	case <-t.shut:
		return nil, net.ErrClosed
	}
	t.c.streams.Add(1)
	mine, theirs := newPipe(t, dst, oneWay)
	select {
	case dst.streams <- theirs:
		return mine, nil
	case <-dst.shut:
	case <-t.shut:
	case <-time.After(timeout):
	}
	mine.Close()
	return nil, fmt.Errorf("dial %s: not accepted", addr)
}

// StreamCh delivers the streams dialed to the node.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown stops the transport: pending dials end. Packets still in flight
// to it are dropped when its queue is full.
func (t *Transport) Shutdown() error {
	t.once.Do(func() { close(t.shut) })
	return nil
}
