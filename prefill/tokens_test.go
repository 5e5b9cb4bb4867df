package prefill

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestFetchComparesTokens: a well-formed block of other tokens planted under
// the key of a prompt's block is refused because its tokens are not the
// prompt's (checked before the key), and the prompt recomputes from there.
func TestFetchComparesTokens(t *testing.T) {
	var mu sync.Mutex
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cache := newMemCache()
	e := newTinyEngine(t, cache, func(o *Options) { o.Logger = logger })
	c := tinyConfig()
	tokens := randTokens(rand.New(rand.NewPCG(5, 5)), 4*c.BlockTokens, c.Vocab)
	run(t, e, tokens)
	flush(t, e)
	keys := prefixhash.Keys(e.Namespace(), tokens)
	blk, err := block.Decode(cache.get(keys[2]), 0)
	if err != nil {
		t.Fatal(err)
	}
	other := append([]uint32(nil), blk.Tokens...)
	other[len(other)-1] ^= 0xffffffff
	planted, _, err := block.Encode(nil, e.Namespace(), keys[1], other, blk.Payload)
	if err != nil {
		t.Fatal(err)
	}
	cache.set(keys[2], planted)
	if res := run(t, e, tokens); res.Usage.CachedTokens != 2*c.BlockTokens {
		t.Fatalf("cached_tokens %d, want %d: the planted block must be a miss", res.Usage.CachedTokens, 2*c.BlockTokens)
	}
	if st := e.Stats(); st.CorruptBlocks != 1 {
		t.Fatalf("stats %+v: want the planted block counted", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "stored tokens differ") {
		t.Fatalf("the planted block was not refused for its tokens: %s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
