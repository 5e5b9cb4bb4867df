package router

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/openai"
)

func TestParseEngineEvents(t *testing.T) {
	for _, c := range []struct {
		in   string
		want EngineEvents
		bad  bool
	}{
		{in: "tcp://10.0.0.5:5557", want: EngineEvents{Addr: "tcp://10.0.0.5:5557"}},
		{in: "tcp://h:1?replay=tcp://h:2&member=node-a", want: EngineEvents{Addr: "tcp://h:1", ReplayAddr: "tcp://h:2", Member: "node-a"}},
		{in: "10.0.0.5:5557", bad: true},
		{in: "tcp://", bad: true},
		{in: "tcp://h:1?replay=h:2", bad: true},
		{in: "tcp://h:1?topic=x", bad: true},
	} {
		got, err := ParseEngineEvents(c.in)
		if (err != nil) != c.bad || !c.bad && got != c.want {
			t.Errorf("ParseEngineEvents(%q) = %+v, %v", c.in, got, err)
		}
	}
}

func hash(i byte) []byte { b := make([]byte, 32); b[0], b[31] = i, 0xee; return b }

func stored(medium string, hs ...[]byte) kvevents.Event {
	return kvevents.Event{Tag: kvevents.TagBlockStored, BlockHashes: hs, BlockSize: 16, Medium: medium}
}

func lookupOf(prompt, cached int, blocks ...byte) openai.LookupResult {
	l := openai.LookupResult{PromptTokens: prompt, CachedTokens: cached, BlockTokens: 16}
	for _, b := range blocks {
		l.BlockKeys = append(l.BlockKeys, hex.EncodeToString(hash(b)[:16]))
	}
	return l
}

func testIndex() *eventIndex {
	return newEventIndex(Options{Logger: slog.New(slog.DiscardHandler), EngineEventsTTL: time.Minute, MaxIndexedBlocks: 100, Weights: DefaultWeights})
}

// TestEventIndexCosts: a node's cost of a prompt is what is left after
// the leading blocks its engine holds in GPU memory, then the store's
// cached prefix weighed by tier.
func TestEventIndexCosts(t *testing.T) {
	x := testIndex()
	x.apply("a", "kv@a@m", &kvevents.Batch{Events: []kvevents.Event{stored("GPU", hash(1), hash(2), hash(3))}})
	x.apply("b", "kv@b@m", &kvevents.Batch{Events: []kvevents.Event{stored("GPU", hash(1)), stored("", hash(3))}})
	// The store (a kvmesh node's events) holds block 2 on NVMe.
	x.apply("n", "kv@n@m", &kvevents.Batch{Events: []kvevents.Event{stored("DISK", hash(2))}})
	cands := []backend{{id: "a"}, {id: "b"}, {id: "c"}}
	// 4 blocks and a tail of 6; the store's prefix is 2 blocks.
	look := lookupOf(70, 32, 1, 2, 3, 4)
	// a: 3 blocks in GPU (48 tokens). b: block 1 in GPU, then block 2
	// from NVMe (0.5 of 16); its GPU block 3 is past a gap, no use.
	// c: the store's 2 blocks, block 1 at the CPU weight (no tier said),
	// block 2 at the disk weight.
	want := []int{70 - 48, 70 - 16 - 8, 70 - 13 - 8}
	if got := x.costs(cands, look); !reflect.DeepEqual(got, want) {
		t.Fatalf("costs %v, want %v", got, want)
	}
	// A removal from GPU and a namespace cleared.
	x.apply("a", "kv@a@m", &kvevents.Batch{Events: []kvevents.Event{{Tag: kvevents.TagBlockRemoved, BlockHashes: [][]byte{hash(2)}, Medium: "GPU"}}})
	x.apply("b", "kv@b@m", &kvevents.Batch{Events: []kvevents.Event{{Tag: kvevents.TagAllBlocksCleared}}})
	want = []int{70 - 16 - 8, 70 - 13 - 8, 70 - 13 - 8}
	if got := x.costs(cands, look); !reflect.DeepEqual(got, want) {
		t.Fatalf("after removals: costs %v, want %v", got, want)
	}
	// Without block keys (a node that does not send them): no costs.
	if got := x.costs(cands, openai.LookupResult{PromptTokens: 70}); got != nil {
		t.Fatalf("costs without keys: %v", got)
	}
	// Members gone past the TTL age out; live ones stay.
	x.age(map[string]bool{"a": true}, time.Now().Add(2*time.Minute))
	x.mu.RLock()
	_, hasA := x.mu.members["a"]
	_, hasB := x.mu.members["b"]
	n := x.mu.blocks
	x.mu.RUnlock()
	if !hasA || hasB || n != 2 {
		t.Fatalf("after aging: a %v b %v blocks %d", hasA, hasB, n)
	}
	// The bound: past MaxIndexedBlocks, stores are counted, not kept.
	var many []kvevents.Event
	for i := range 200 {
		many = append(many, stored("GPU", hash(byte(i))))
	}
	x.apply("a", "kv@a@m", &kvevents.Batch{Events: many})
	if x.mu.blocks > 100 || x.c.overflow.Load() == 0 {
		t.Fatalf("blocks %d, overflow %d", x.mu.blocks, x.c.overflow.Load())
	}
}

// fakePublisher is an engine's publisher whose sequence numbers the test
// chooses: a ZMQ PUB and a replay ROUTER answering from what it sent.
type fakePublisher struct {
	pub, replay zmq4.Socket
	mu          sync.Mutex
	sent        map[uint64][]byte
}

func newFakePublisher(t *testing.T) *fakePublisher {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakePublisher{pub: zmq4.NewPub(ctx), replay: zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("r"))), sent: map[uint64][]byte{}}
	if err := f.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := f.replay.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := f.replay.Recv()
			if err != nil {
				return
			}
			id, from := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
			for s := from; ; s++ {
				f.mu.Lock()
				p, ok := f.sent[s]
				f.mu.Unlock()
				if !ok {
					break
				}
				f.replay.SendMulti(zmq4.NewMsgFrom(id, nil, binary.BigEndian.AppendUint64(nil, s), p))
			}
			f.replay.SendMulti(zmq4.NewMsgFrom(id, nil, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, nil))
		}
	}()
	t.Cleanup(func() { cancel(); f.pub.Close(); f.replay.Close(); <-done })
	return f
}

func (f *fakePublisher) addrs() EngineEvents {
	return EngineEvents{Addr: "tcp://" + f.pub.Addr().String(), ReplayAddr: "tcp://" + f.replay.Addr().String()}
}

// record keeps a batch for replays without sending it; send sends it too.
func (f *fakePublisher) record(t *testing.T, seq uint64, evs ...kvevents.Event) []byte {
	p, err := kvevents.Encode(nil, &kvevents.Batch{TS: 1, Events: evs})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.sent[seq] = p
	f.mu.Unlock()
	return p
}

func (f *fakePublisher) send(t *testing.T, topic string, seq uint64, evs ...kvevents.Event) {
	p := f.record(t, seq, evs...)
	if err := f.pub.SendMulti(zmq4.NewMsgFrom([]byte(topic), binary.BigEndian.AppendUint64(nil, seq), p)); err != nil {
		t.Fatal(err)
	}
}

func (x *eventIndex) holds(member string, h []byte) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	m := x.mu.members[member]
	if m == nil {
		return false
	}
	for _, blocks := range m.topics {
		if blocks[keyOf(h)] != 0 {
			return true
		}
	}
	return false
}

// TestEventIndexSubscribes: batches sent before the subscription landed
// and batches missed in a gap come from the replay endpoint; a publisher
// whose sequence numbers start over loses what it had published.
func TestEventIndexSubscribes(t *testing.T) {
	f := newFakePublisher(t)
	x := testIndex()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); x.subscribe(ctx, f.addrs()) }()
	defer func() { cancel(); <-done }()

	f.record(t, 0, stored("GPU", hash(1))) // before the subscription
	seq := uint64(1)
	testkit.WaitFor(t, "the subscription", func() bool {
		f.send(t, "kv@e1@m", seq, stored("GPU", hash(2)))
		seq++
		return x.holds("e1", hash(2))
	})
	testkit.WaitFor(t, "batch 0 replayed", func() bool { return x.holds("e1", hash(1)) })
	// A gap: seq+1 is only in the replay buffer.
	f.record(t, seq, stored("GPU", hash(3)))
	f.send(t, "kv@e1@m", seq+1, stored("GPU", hash(4)))
	testkit.WaitFor(t, "the gap's batch replayed", func() bool { return x.holds("e1", hash(4)) && x.holds("e1", hash(3)) })
	if x.c.gaps.Load() != 1 || x.c.replays.Load() != 2 {
		t.Fatalf("gaps %d replays %d", x.c.gaps.Load(), x.c.replays.Load())
	}
	// The publisher restarts: sequence numbers from 0 again.
	f.mu.Lock()
	clear(f.sent)
	f.mu.Unlock()
	f.send(t, "kv@e1@m", 0, stored("GPU", hash(5)))
	testkit.WaitFor(t, "the restart", func() bool { return x.holds("e1", hash(5)) })
	if x.holds("e1", hash(1)) || x.c.restarts.Load() != 1 {
		t.Fatalf("after a restart: holds block 1 %v, restarts %d", x.holds("e1", hash(1)), x.c.restarts.Load())
	}
}

// TestEventIndexForgetsDeadPublisher: an engine whose publisher dies (its
// connection lost, nothing sent for EngineEventsTTL) loses its GPU blocks,
// so its member falls back to the store's view; a live publisher that
// sends nothing keeps its own.
func TestEventIndexForgetsDeadPublisher(t *testing.T) {
	x := newEventIndex(Options{Logger: slog.New(slog.DiscardHandler), EngineEventsTTL: 100 * time.Millisecond, MaxIndexedBlocks: 100, Weights: DefaultWeights})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	pubs := map[string]zmq4.Socket{}
	for _, e := range []string{"dead", "live"} {
		pub := zmq4.NewPub(ctx)
		if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		pubs[e] = pub
		wg.Add(1)
		go func() { defer wg.Done(); x.subscribe(ctx, EngineEvents{Addr: "tcp://" + pub.Addr().String()}) }()
		p, err := kvevents.Encode(nil, &kvevents.Batch{TS: 1, Events: []kvevents.Event{stored("GPU", hash(1))}})
		if err != nil {
			t.Fatal(err)
		}
		seq := uint64(0)
		testkit.WaitFor(t, "the subscription to "+e, func() bool {
			pub.SendMulti(zmq4.NewMsgFrom([]byte("kv@"+e+"@m"), binary.BigEndian.AppendUint64(nil, seq), p))
			seq++
			return x.holds(e, hash(1))
		})
	}
	defer pubs["live"].Close()
	pubs["dead"].Close()
	testkit.WaitFor(t, "the dead publisher's blocks dropped", func() bool { return !x.holds("dead", hash(1)) })
	if !x.holds("live", hash(1)) || x.c.agedOut.Load() != 1 {
		t.Fatalf("live publisher's block held: %v; aged out %d, want 1", x.holds("live", hash(1)), x.c.agedOut.Load())
	}
}
