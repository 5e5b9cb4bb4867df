package transfer

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// publishSink is a memSource that takes publish requests: it records the
// chunk key each stored block was published under, and refuses to publish
// the keys in noPublish (stored, reported StatusMiss).
type publishSink struct {
	*memSource
	noPublish map[prefixhash.Key]bool
	mu        sync.Mutex
	published map[prefixhash.Key]prefixhash.Key
}

var _ Publisher = (*publishSink)(nil)

func newPublishSink() *publishSink {
	return &publishSink{memSource: newMemSource(), noPublish: map[prefixhash.Key]bool{}, published: map[prefixhash.Key]prefixhash.Key{}}
}

func (p *publishSink) PutPublish(ctx context.Context, keys, chunkKeys []prefixhash.Key, vals [][]byte, st []Status) {
	p.Put(ctx, keys, vals, st)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, k := range keys {
		switch {
		case st[i] != StatusOK:
		case p.noPublish[k]:
			st[i] = StatusMiss
		default:
			p.published[k] = chunkKeys[i]
		}
	}
}

// publishCase puts blocks through put (a PutPublish) into a publishSink in
// several frames, and checks that each was stored and published under its
// chunk key, or reported a miss where publishing failed. With split, each
// value is sent as a head and the rest.
func publishCase(t *testing.T, p *publishSink, split bool, put func(keys, chunks []prefixhash.Key, heads, vals [][]byte) ([]Status, error)) {
	t.Helper()
	sizes := []int{1, 64 << 10, 65, 100 << 10, 7}
	keys := make([]prefixhash.Key, len(sizes))
	chunks := make([]prefixhash.Key, len(sizes))
	vals := make([][]byte, len(sizes))
	for i, n := range sizes {
		keys[i], chunks[i], vals[i] = testKey(i), testKey(100+i/2), testValue(i, n)
	}
	p.mu.Lock()
	p.noPublish[keys[3]] = true
	p.mu.Unlock()
	var heads, rest [][]byte = nil, vals
	if split {
		heads, rest = make([][]byte, len(vals)), make([][]byte, len(vals))
		for i, v := range vals {
			h := []int{0, 100, 65, 64 << 10, 7}[i] // empty, short, aligned or not, whole
			heads[i], rest[i] = v[:h], v[h:]
		}
	}
	st, err := put(keys, chunks, heads, rest)
	if err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		got, _ := p.get(keys[i])
		if !bytes.Equal(got, vals[i]) {
			t.Fatalf("block %d stored as %d bytes, want %d", i, len(got), len(vals[i]))
		}
		want := StatusOK
		if i == 3 {
			want = StatusMiss
		}
		p.mu.Lock()
		ck, ok := p.published[keys[i]]
		p.mu.Unlock()
		if st[i] != want || ok != (i != 3) || ok && ck != chunks[i] {
			t.Fatalf("block %d: status %s (want %s), published %v under %s (want %s)", i, st[i], want, ok, ck, chunks[i])
		}
	}
}

func TestPutPublish(t *testing.T) {
	p := newPublishSink()
	s, err := NewServer(p, p, nil, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := newClient(t, addr.String(), &ClientOptions{Limits: Limits{MaxItems: 2}})
	for _, split := range []bool{false, true} {
		publishCase(t, p, split, func(keys, chunks []prefixhash.Key, heads, vals [][]byte) ([]Status, error) {
			return c.PutPublish(context.Background(), keys, chunks, heads, vals)
		})
	}
	if _, err := c.PutPublish(context.Background(), testKeys(1), nil, nil, [][]byte{{1}}); err == nil {
		t.Fatal("a publish without chunk keys was sent")
	}
	if _, err := c.PutPublish(context.Background(), testKeys(1), testKeys(1), [][]byte{}, [][]byte{{1}}); err == nil {
		t.Fatal("a publish with too few heads was sent")
	}
}

// A peer's put is never published: only publish requests are.
func TestPutIsNotPublished(t *testing.T) {
	p := newPublishSink()
	_, addr := startServer(t, p.memSource, nil)
	s, err := NewServer(p, p, nil, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, addr := range []string{addr, a.String()} {
		c := newClient(t, addr, nil)
		if st, err := c.Put(context.Background(), testKeys(1), [][]byte{{1}}); err != nil || st[0] != StatusOK {
			t.Fatalf("put: %v %v", st, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.published) != 0 {
		t.Fatalf("puts were published: %v", p.published)
	}
}

func TestPublishWithoutPublisher(t *testing.T) {
	_, addr := startServer(t, newMemSource(), nil)
	c := newClient(t, addr, nil)
	_, err := c.PutPublish(context.Background(), testKeys(1), testKeys(1), nil, [][]byte{{1, 2, 3}})
	if !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "accepts no publish requests") {
		t.Fatalf("publish to a server whose sink does not publish: %v", err)
	}
}

func testKeys(n int) []prefixhash.Key {
	out := make([]prefixhash.Key, n)
	for i := range out {
		out[i] = testKey(i)
	}
	return out
}
