package transfer

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// lookSource is a memSource that answers lookups.
type lookSource struct{ *memSource }

func (l lookSource) Lookup(_ context.Context, runs [][]prefixhash.Key, counts []int) {
	for i, r := range runs {
		for _, k := range r {
			if _, ok := l.get(k); !ok {
				break
			}
			counts[i]++
		}
	}
}

func startLookupServer(t *testing.T, src Source) (*Server, string) {
	t.Helper()
	s, err := NewServer(src, nil, nil, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, addr.String()
}

// TestLookup: runs of any length, empty ones included, are counted as the
// source counts them, in one request up to MaxLookupKeys keys and in several
// beyond.
func TestLookup(t *testing.T) {
	src := newMemSource()
	s, addr := startLookupServer(t, lookSource{src})
	c := newClient(t, addr, nil)
	var keys []prefixhash.Key
	for i := range 100 {
		keys = append(keys, testKey(i))
		if i%7 != 3 {
			src.set(testKey(i), []byte{1})
		}
	}
	runs := [][]prefixhash.Key{keys[0:2], {}, keys[2:10], keys[10:11], keys[11:100], {}}
	got, err := c.Lookup(context.Background(), runs)
	if err != nil {
		t.Fatal(err)
	}
	want := []int{2, 0, 1, 0, 6, 0} // keys 3, 10, 17 are missing
	if len(got) != len(want) {
		t.Fatalf("Lookup = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Lookup = %v, want %v", got, want)
		}
	}
	if st := s.Stats(); st.Lookups != 1 {
		t.Fatalf("%d lookup requests for one lookup", st.Lookups)
	}

	// Beyond MaxLookupKeys: cut between runs.
	const limit = DefaultMaxLookupKeys
	big := make([][]prefixhash.Key, 0, limit/64+2)
	for len(big)*64 <= limit {
		big = append(big, keys[11:75])
	}
	got, err = c.Lookup(context.Background(), big)
	if err != nil || len(got) != len(big) || got[0] != 6 || got[len(got)-1] != 6 {
		t.Fatalf("big lookup: %d counts, %v", len(got), err)
	}
	if st := s.Stats(); st.Lookups != 3 {
		t.Fatalf("%d lookup requests, want 1 + 2 for %d keys", st.Lookups, len(big)*64)
	}

	// A run longer than the limit travels as several runs whose counts
	// add up: held wholly, held up to a key in its second part, and a
	// part after a missing key not counted.
	held := make([]prefixhash.Key, 2*limit+5)
	for i := range held {
		held[i] = testKey(1000 + i)
		src.set(held[i], []byte{1})
	}
	cut := append([]prefixhash.Key(nil), held[:limit+7]...)
	cut = append(cut, testKey(999999))
	cut = append(cut, held[limit+7:]...)
	early := append([]prefixhash.Key{held[0], testKey(999998)}, held[:limit+1]...)
	got, err = c.Lookup(context.Background(), [][]prefixhash.Key{keys[0:2], held, cut, early})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{2, len(held), limit + 7, 1}; !slices.Equal(got, want) {
		t.Fatalf("long runs: counts %v, want %v", got, want)
	}
}

// TestLookupUnsupported: a Source that is no Looker answers lookups with an
// error, and the server goes on serving gets.
func TestLookupUnsupported(t *testing.T) {
	src := newMemSource()
	src.set(testKey(1), []byte("v"))
	_, addr := startLookupServer(t, src)
	c := newClient(t, addr, nil)
	if _, err := c.Lookup(context.Background(), [][]prefixhash.Key{{testKey(1)}}); !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "lookups") {
		t.Fatalf("lookup on a server without lookups: %v", err)
	}
	r, err := c.Get(context.Background(), []prefixhash.Key{testKey(1)})
	if err != nil || r.Hits() != 1 {
		t.Fatalf("get after a refused lookup: %v", err)
	}
	r.Release()
}

// TestLookupCorrupt: a lookup request whose run indices do not follow the
// rules is answered with an error frame.
func TestLookupCorrupt(t *testing.T) {
	_, addr := startLookupServer(t, lookSource{newMemSource()})
	for _, runs := range [][]int{{1}, {0, 2}, {0, 1, 0}} {
		var enc encoder
		tb := enc.begin(typeLookupReq, len(runs))
		for i, r := range runs {
			putLookupEntry(tb, i, testKey(i), r)
		}
		frame := bytes.Clone(enc.finish(header{typ: typeLookupReq, id: 7, count: len(runs)}))
		if msg := errorFrame(t, writeRaw(t, addr, frame)); !strings.Contains(msg, "run") {
			t.Fatalf("runs %v: %q", runs, msg)
		}
	}
}

// FuzzLookupTables: the lookup table decoders never panic, accept only
// well-formed runs and counts within their runs, and what they accept
// re-encodes to the same table.
func FuzzLookupTables(f *testing.F) {
	var enc encoder
	tb := enc.begin(typeLookupReq, 3)
	putLookupEntry(tb, 0, testKey(1), 0)
	putLookupEntry(tb, 1, testKey(2), 0)
	putLookupEntry(tb, 2, testKey(3), 1)
	f.Add(true, bytes.Clone(tb))
	tb = enc.begin(typeLookupResp, 2)
	putCountEntry(tb, 0, 2)
	putCountEntry(tb, 1, 1)
	f.Add(false, bytes.Clone(tb))
	f.Fuzz(func(t *testing.T, req bool, table []byte) {
		var enc encoder
		if req {
			if len(table)%lookupEntry != 0 {
				return
			}
			n := len(table) / lookupEntry
			keys, runOf := make([]prefixhash.Key, n), make([]int, n)
			runs, err := parseLookupReq(table, keys, runOf)
			if err != nil {
				return
			}
			out := enc.begin(typeLookupReq, n)
			for i := range keys {
				if runOf[i] >= runs || i > 0 && runOf[i] < runOf[i-1] {
					t.Fatalf("key %d in run %d of %d", i, runOf[i], runs)
				}
				putLookupEntry(out, i, keys[i], runOf[i])
			}
			if !bytes.Equal(out, table) {
				t.Fatal("accepted lookup request re-encodes differently")
			}
			return
		}
		if len(table)%countEntry != 0 {
			return
		}
		n := len(table) / countEntry
		lens, counts := make([]int, n), make([]int, n)
		for i := range lens {
			lens[i] = 5
		}
		if parseLookupResp(table, lens, counts) != nil {
			return
		}
		out := enc.begin(typeLookupResp, n)
		for i, c := range counts {
			if c > 5 {
				t.Fatalf("count %d of a 5-key run accepted", c)
			}
			putCountEntry(out, i, c)
		}
		if !bytes.Equal(out, table) {
			t.Fatal("accepted lookup answer re-encodes differently")
		}
	})
}
