package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Names resolves a namespace digest to the namespace, as far as the node
// knows it (from the requests that named it): the model names a batch's
// topic, the LoRA its events' lora_name, the root where a chain starts.
// The node implements it.
type Names interface {
	Namespace(digest uint64) (prefixhash.Namespace, bool)
}

// Options configure a Publisher. Zero fields take the defaults.
type Options struct {
	// Addr is the PUB endpoint the publisher binds, "tcp://HOST:PORT"
	// (port 0: any free one; Publisher.Addr says which). Required.
	Addr string
	// ReplayAddr is the ROUTER endpoint that answers replay requests
	// (vLLM's replay protocol: a start sequence number, 8 bytes big-endian,
	// answered with every buffered batch from it on and an end marker).
	// Empty: no replay socket.
	ReplayAddr string
	// Topic is every batch's topic; "{model}" in it is replaced by the
	// model of the batch's namespace ("" when the node does not know it).
	// Default "kv@" + NodeID + "@{model}", the form llm-d's subscriber
	// parses (pod, model).
	Topic  string
	NodeID string
	// QueueEvents bounds the events waiting to be published; events past
	// it are dropped and counted (the node never waits). Default 65536.
	QueueEvents int
	// BatchEvents and BatchInterval: a batch goes when it holds
	// BatchEvents events, or BatchInterval after its first. Defaults 512
	// and 10 ms.
	BatchEvents   int
	BatchInterval time.Duration
	// ReplayBatches is how many past batches the replay socket keeps.
	// Default 10000 (vLLM's buffer_steps).
	ReplayBatches int
	// HWM is the PUB socket's high-water mark in batches: past it a slow
	// subscriber's batches are dropped by the socket (and recovered by a
	// replay). Default 100000 (vLLM's).
	HWM int
	// MaxTracked bounds how many blocks of vllm-scheme namespaces have
	// their 32-byte hash remembered, for their removal events (a removal
	// knows only the 16-byte key). Past it, removals of untracked blocks
	// are not published, and counted. Default 1 << 20 (about 64 MiB).
	MaxTracked int
	// Names resolves namespace digests (optional).
	Names Names
	// Now is the clock of the batches' timestamps. Default time.Now.
	Now func() time.Time
}

func (o *Options) ensureDefaults() {
	if o.Topic == "" {
		o.Topic = "kv@" + o.NodeID + "@{model}"
	}
	if o.QueueEvents == 0 {
		o.QueueEvents = 1 << 16
	}
	if o.BatchEvents == 0 {
		o.BatchEvents = 512
	}
	if o.BatchInterval == 0 {
		o.BatchInterval = 10 * time.Millisecond
	}
	if o.ReplayBatches == 0 {
		o.ReplayBatches = 10000
	}
	if o.HWM == 0 {
		o.HWM = 100000
	}
	if o.MaxTracked == 0 {
		o.MaxTracked = 1 << 20
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

func (o *Options) validate() error {
	switch {
	case !strings.HasPrefix(o.Addr, "tcp://"):
		return fmt.Errorf("kvevents: options: Addr %q: want tcp://HOST:PORT", o.Addr)
	case o.ReplayAddr != "" && !strings.HasPrefix(o.ReplayAddr, "tcp://"):
		return fmt.Errorf("kvevents: options: ReplayAddr %q: want tcp://HOST:PORT", o.ReplayAddr)
	case o.QueueEvents < 1 || o.BatchEvents < 1 || o.ReplayBatches < 1 || o.HWM < 1 || o.MaxTracked < 1:
		return errors.New("kvevents: options: QueueEvents, BatchEvents, ReplayBatches, HWM and MaxTracked must be positive")
	case o.BatchInterval <= 0:
		return fmt.Errorf("kvevents: options: BatchInterval %v must be positive", o.BatchInterval)
	}
	return nil
}

// Stats count what a Publisher did.
type Stats struct {
	Events  uint64 // events published
	Batches uint64 // batches published
	Dropped uint64 // events dropped: the queue was full
	// Replays counts replay requests answered; ReplaysBad the malformed
	// ones, ignored.
	Replays, ReplaysBad uint64
	// Untracked counts removals of vllm-scheme blocks whose hash was not
	// remembered (MaxTracked), not published.
	Untracked uint64
}

type itemKind uint8

const (
	itemStored itemKind = iota
	itemRemoved
	itemCleared
)

// item is what the store's calls queue: the header of a block stored (a
// copy), or the key of one removed.
type item struct {
	kind   itemKind
	medium string
	hdr    []byte
	key    prefixhash.Key
	digest uint64
}

// Publisher publishes the KV events of a node's store in vLLM's format:
// ZMQ PUB of [topic, sequence number (8 bytes big-endian), msgpack
// KVEventBatch] per batch, and a ROUTER socket that replays buffered
// batches. It implements store.Events: the store's calls only queue (or
// drop and count) and return. All methods are safe for concurrent use.
type Publisher struct {
	opts   Options
	q      chan item
	pub    zmq4.Socket
	replay zmq4.Socket
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	seq uint64 // the next batch's; owned by the publishing goroutine

	// full remembers the second half of the 32-byte hash of each
	// vllm-scheme block published as stored (its key is the first
	// half); owned by the publishing goroutine.
	full map[prefixhash.Key][16]byte

	ring struct {
		sync.Mutex
		seqs     []uint64
		payloads [][]byte
		next     int
	}

	c struct {
		events, batches, dropped, replays, replaysBad, untracked atomic.Uint64
	}
}

// New binds the publisher's sockets and starts it. Close stops it.
func New(opts Options) (*Publisher, error) {
	opts.ensureDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{opts: opts, q: make(chan item, opts.QueueEvents), ctx: ctx, cancel: cancel,
		full: make(map[prefixhash.Key][16]byte)}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.SetOption(zmq4.OptionHWM, opts.HWM); err != nil {
		cancel()
		return nil, fmt.Errorf("kvevents: PUB high-water mark: %w", err)
	}
	if err := p.pub.Listen(opts.Addr); err != nil {
		cancel()
		p.pub.Close()
		return nil, fmt.Errorf("kvevents: listen on %s: %w", opts.Addr, err)
	}
	if opts.ReplayAddr != "" {
		p.replay = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("kvmesh-replay")))
		if err := p.replay.Listen(opts.ReplayAddr); err != nil {
			cancel()
			p.pub.Close()
			p.replay.Close()
			return nil, fmt.Errorf("kvevents: listen on %s: %w", opts.ReplayAddr, err)
		}
		p.wg.Add(1)
		go p.serveReplays()
	}
	p.wg.Add(1)
	go p.run()
	return p, nil
}

// Addr returns the PUB endpoint bound, tcp://HOST:PORT.
func (p *Publisher) Addr() string { return "tcp://" + p.pub.Addr().String() }

// ReplayAddr returns the ROUTER endpoint bound, or "".
func (p *Publisher) ReplayAddr() string {
	if p.replay == nil {
		return ""
	}
	return "tcp://" + p.replay.Addr().String()
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() Stats {
	return Stats{Events: p.c.events.Load(), Batches: p.c.batches.Load(), Dropped: p.c.dropped.Load(),
		Replays: p.c.replays.Load(), ReplaysBad: p.c.replaysBad.Load(), Untracked: p.c.untracked.Load()}
}

// Close publishes what is queued, stops the publisher and closes its
// sockets.
func (p *Publisher) Close() error {
	p.cancel()
	p.wg.Wait()
	err := p.pub.Close()
	if p.replay != nil {
		err = errors.Join(err, p.replay.Close())
	}
	return err
}

func (p *Publisher) offer(it item) {
	select {
	case p.q <- it:
	default:
		p.c.dropped.Add(1)
	}
}

// BlockStored queues a BlockStored event of the block whose encoded bytes
// (header first) are record (store.Events).
func (p *Publisher) BlockStored(medium string, record []byte) {
	if len(record) < block.FixedHeaderLen {
		return
	}
	hl := int(binary.LittleEndian.Uint32(record[8:]))
	if hl < block.FixedHeaderLen || hl > len(record) {
		return
	}
	p.offer(item{kind: itemStored, medium: medium, hdr: append([]byte(nil), record[:hl]...)})
}

// BlockRemoved queues a BlockRemoved event (store.Events).
func (p *Publisher) BlockRemoved(medium string, key prefixhash.Key, digest uint64) {
	p.offer(item{kind: itemRemoved, medium: medium, key: key, digest: digest})
}

// AllBlocksCleared queues an AllBlocksCleared event on the namespace's
// topic (store.Events).
func (p *Publisher) AllBlocksCleared(digest uint64) {
	p.offer(item{kind: itemCleared, digest: digest})
}

// pending is a batch being gathered for one topic.
type pending struct {
	topic  string
	events []Event
}

// run turns queued items into events and publishes them in batches, per
// topic, until Close; then it publishes what is left.
func (p *Publisher) run() {
	defer p.wg.Done()
	var batches []*pending
	byTopic := map[string]*pending{}
	var first time.Time
	tick := time.NewTicker(p.opts.BatchInterval)
	defer tick.Stop()
	flush := func() {
		for _, b := range batches {
			p.publish(b.topic, b.events)
		}
		batches, first = batches[:0], time.Time{}
		clear(byTopic)
	}
	add := func(it item) {
		topic, ev, ok := p.event(it)
		if !ok {
			return
		}
		b := byTopic[topic]
		if b == nil {
			b = &pending{topic: topic}
			byTopic[topic] = b
			batches = append(batches, b)
		}
		b.events = append(b.events, ev)
		if first.IsZero() {
			first = time.Now()
		}
		if len(b.events) >= p.opts.BatchEvents {
			flush()
		}
	}
	for {
		select {
		case it := <-p.q:
			add(it)
		case <-tick.C:
			if !first.IsZero() && time.Since(first) >= p.opts.BatchInterval {
				flush()
			}
		case <-p.ctx.Done():
			for {
				select {
				case it := <-p.q:
					add(it)
					continue
				default:
				}
				break
			}
			flush()
			return
		}
	}
}

// event turns an item into an event and its topic; ok is false for one
// that is not published (a header that does not decode, a removal of an
// untracked vllm-scheme block).
func (p *Publisher) event(it item) (topic string, ev Event, ok bool) {
	var ns prefixhash.Namespace
	known := false
	digest := it.digest
	if it.kind == itemStored {
		h, err := block.DecodeHeader(it.hdr, 0)
		if err != nil || h.Kind != block.KindBlock {
			return "", ev, false
		}
		digest = h.Namespace
		if p.opts.Names != nil {
			ns, known = p.opts.Names.Namespace(digest)
		}
		ev = Event{Tag: TagBlockStored, Medium: it.medium, TokenIDs: append([]uint32(nil), h.Tokens...), BlockSize: len(h.Tokens)}
		var self, parent []byte
		if h.Scheme == prefixhash.SchemeVLLM {
			link := prefixhash.BlockLink(h.Scheme, h.ParentLink, h.Tokens, h.Extra)
			self = link[:]
			if _, have := p.full[h.Key]; have || len(p.full) < p.opts.MaxTracked {
				p.full[h.Key] = [16]byte(link[prefixhash.KeySize:])
			}
			if !known || h.ParentLink != ns.RootLink() {
				parent = append([]byte(nil), h.ParentLink[:]...)
			}
		} else {
			self = append([]byte(nil), h.Key[:]...)
			if !known || h.Parent != ns.Root() {
				parent = append([]byte(nil), h.Parent[:]...)
			}
		}
		ev.BlockHashes, ev.ParentBlockHash = [][]byte{self}, parent
		if known && ns.LoRA != "" {
			l := ns.LoRA
			ev.LoRAName = &l
		}
		if len(h.Extra) > 0 {
			// vLLM publishes its extra keys as the values they are (a
			// LoRA name, a multimodal identifier and offset); a
			// vllm-scheme block holds them as the CBOR its hash covered.
			// A kvmesh-scheme block's extra keys are opaque bytes.
			items := make([]any, len(h.Extra))
			for i, k := range h.Extra {
				items[i] = append([]byte(nil), k...)
				if h.Scheme == prefixhash.SchemeVLLM {
					if v, ok := vllmExtraValue(k); ok {
						items[i] = v
					}
				}
			}
			ev.ExtraKeys = [][]any{items}
		}
	} else {
		if p.opts.Names != nil {
			ns, known = p.opts.Names.Namespace(digest)
		}
		switch it.kind {
		case itemRemoved:
			h := append([]byte(nil), it.key[:]...)
			if tail, have := p.full[it.key]; have {
				h = append(h, tail[:]...)
				delete(p.full, it.key)
			} else if known && ns.Scheme == prefixhash.SchemeVLLM {
				p.c.untracked.Add(1)
				return "", ev, false
			}
			ev = Event{Tag: TagBlockRemoved, BlockHashes: [][]byte{h}, Medium: it.medium}
		case itemCleared:
			ev = Event{Tag: TagAllBlocksCleared}
		}
	}
	return strings.ReplaceAll(p.opts.Topic, "{model}", ns.Model), ev, true
}

// publish sends one batch and keeps it for replays.
func (p *Publisher) publish(topic string, events []Event) {
	payload, err := Encode(nil, &Batch{TS: float64(p.opts.Now().UnixNano()) / 1e9, Events: events})
	if err != nil {
		return // a bug of Encode's: counted as dropped
	}
	seq := p.seq
	p.seq++
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(topic), sb[:], payload)); err != nil {
		p.c.dropped.Add(uint64(len(events)))
	} else {
		p.c.events.Add(uint64(len(events)))
		p.c.batches.Add(1)
	}
	r := &p.ring
	r.Lock()
	if len(r.seqs) < p.opts.ReplayBatches {
		r.seqs, r.payloads = append(r.seqs, seq), append(r.payloads, payload)
	} else {
		r.seqs[r.next], r.payloads[r.next] = seq, payload
		r.next = (r.next + 1) % len(r.seqs)
	}
	r.Unlock()
}

// endSeq marks the end of a replay: -1 as 8 bytes big-endian.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplays answers replay requests until Close: [identity, "", start
// sequence (8 bytes big-endian)] is answered with [identity, "", seq,
// payload] for each buffered batch from start on, then [identity, "", -1,
// ""]. A malformed request is counted and ignored.
func (p *Publisher) serveReplays() {
	defer p.wg.Done()
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			continue
		}
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			p.c.replaysBad.Add(1)
			continue
		}
		id, start := f[0], binary.BigEndian.Uint64(f[2])
		var seqs []uint64
		var payloads [][]byte
		r := &p.ring
		r.Lock()
		for k := range r.seqs {
			j := (r.next + k) % len(r.seqs) // oldest first
			if r.seqs[j] >= start {
				seqs, payloads = append(seqs, r.seqs[j]), append(payloads, r.payloads[j])
			}
		}
		r.Unlock()
		p.c.replays.Add(1)
		for k, s := range seqs {
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], s)
			if p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, sb[:], payloads[k])) != nil {
				break
			}
		}
		_ = p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, endSeq, nil))
	}
}
