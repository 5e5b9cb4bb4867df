package transfer

import (
	"bytes"
	"errors"
	"github.com/kvmesh/kvmesh/auth"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func defaultLimits() Limits {
	var l Limits
	l.EnsureDefaults()
	return l
}

func TestHeaderRoundTrip(t *testing.T) {
	lim := defaultLimits()
	for _, h := range []header{
		{typ: typeGetReq, id: 1, count: 3, timeout: 250, maxBatch: 1 << 20, maxValue: 4096},
		{typ: typeGetResp, id: 1<<64 - 1, count: lim.MaxItems, payload: lim.MaxBatchBytes},
		{typ: typePutReq, id: 9, count: 1, timeout: 1, payload: 64},
		{typ: typePublishReq, id: 10, count: 2, timeout: 1, payload: 128},
		{typ: typePutResp, id: 9, count: 1},
		{typ: typeShmGetResp, id: 2, count: 7},
		{typ: typeShmRelease, count: 2},
		{typ: typeShmHello, count: 1},
		{typ: typeError, id: 5, payload: maxErrorMsg},
		{typ: typeError, payload: 10, class: classAuth},
		{typ: typeHello, count: MaxTokenLen},
		{typ: typeHello},
		{typ: typeHelloAck, id: 3},
		{typ: typeGetPartReq, id: 4, count: 2, timeout: 30, maxBatch: 1 << 20, maxValue: 4096, scoped: true, tag: 7},
		{typ: typeClaimReq, id: 5, count: 3, timeout: 30},
		{typ: typeClaimResp, id: 5, count: 3},
	} {
		var b [headerLen]byte
		h.tableSum = 0x1234
		putHeader(b[:], &h)
		got, err := parseHeader(b[:], &lim)
		if err != nil {
			t.Fatalf("%s: %v", h.typ, err)
		}
		if got != h {
			t.Fatalf("%s: decoded %+v, want %+v", h.typ, got, h)
		}
	}
}

func TestHeaderRejects(t *testing.T) {
	lim := Limits{MaxItems: 10, MaxValueSize: 1000, MaxBatchBytes: 4096}
	for _, tc := range []struct {
		name string
		h    header
		want error
	}{
		{"too many items", header{typ: typeGetReq, count: 11}, ErrLimit},
		{"payload over the batch limit", header{typ: typeGetResp, payload: 4097}, ErrLimit},
		{"payload on a get request", header{typ: typeGetReq, payload: 1}, ErrCorrupt},
		{"long error message", header{typ: typeError, payload: maxErrorMsg + 1}, ErrCorrupt},
		{"error with items", header{typ: typeError, count: 1}, ErrCorrupt},
		{"hello without its item", header{typ: typeShmHello}, ErrCorrupt},
		{"limits on an answer", header{typ: typeGetResp, maxBatch: 1}, ErrCorrupt},
		{"timeout on an answer", header{typ: typePutResp, timeout: 1}, ErrCorrupt},
		{"unknown type", header{typ: 99}, ErrCorrupt},
		{"error class on a request", header{typ: typeGetReq, class: classAuth}, ErrCorrupt},
		{"token over MaxTokenLen", header{typ: typeHello, count: MaxTokenLen + 1}, ErrLimit},
		{"payload on a hello", header{typ: typeHello, count: 1, payload: 64}, ErrCorrupt},
		{"items in a hello ack", header{typ: typeHelloAck, count: 1}, ErrCorrupt},
		{"payload on a get-part request", header{typ: typeGetPartReq, count: 1, payload: 64}, ErrCorrupt},
		{"too many parts", header{typ: typeGetPartReq, count: 11}, ErrLimit},
		{"payload on a claim", header{typ: typeClaimReq, count: 1, payload: 64}, ErrCorrupt},
		{"limits on a claim", header{typ: typeClaimReq, maxValue: 1}, ErrCorrupt},
		{"timeout on a claim answer", header{typ: typeClaimResp, timeout: 1}, ErrCorrupt},
		{"scope on a claim answer", header{typ: typeClaimResp, scoped: true}, ErrCorrupt},
	} {
		var b [headerLen]byte
		putHeader(b[:], &tc.h)
		if _, err := parseHeader(b[:], &lim); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestAnswerLimits(t *testing.T) {
	lim := Limits{MaxItems: 10, MaxValueSize: 1000, MaxBatchBytes: 4096}
	for _, tc := range []struct {
		h              header
		value, ofBatch int
	}{
		{header{}, 1000, 4096},
		{header{maxBatch: 1 << 30, maxValue: 1 << 30}, 1000, 4096},
		{header{maxBatch: 2048, maxValue: 100}, 100, 2048},
		{header{maxBatch: 500}, 448, 500},
	} {
		v, b := answerLimits(&tc.h, &lim)
		if v != tc.value || b != tc.ofBatch {
			t.Errorf("requester %d/%d: got %d/%d, want %d/%d", tc.h.maxValue, tc.h.maxBatch, v, b, tc.value, tc.ofBatch)
		}
	}
}

// FuzzHeader: parseHeader never panics, and what it accepts re-encodes to
// the same bytes.
func FuzzHeader(f *testing.F) {
	lim := defaultLimits()
	for _, h := range []header{
		{typ: typeGetReq, id: 1, count: 3, timeout: 9, maxBatch: 1 << 20},
		{typ: typeGetResp, id: 1, count: 3, payload: 192},
		{typ: typeError, payload: 10},
		{typ: typeError, payload: 10, class: classAuth},
		{typ: typeHello, count: 32},
		{typ: typeHelloAck},
	} {
		var b [headerLen]byte
		putHeader(b[:], &h)
		f.Add(b[:])
	}
	f.Add(make([]byte, headerLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b, &lim)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrLimit) {
				t.Fatalf("error %v is neither ErrCorrupt nor ErrLimit", err)
			}
			return
		}
		if h.count > lim.MaxItems || h.payload > lim.MaxBatchBytes || h.tableLen() < 0 {
			t.Fatalf("accepted %+v beyond the limits", h)
		}
		var out [headerLen]byte
		putHeader(out[:], &h)
		if !bytes.Equal(out[:], b[:headerLen]) {
			t.Fatalf("re-encoding %+v gave different bytes", h)
		}
	})
}

// FuzzTable: the item table decoders never panic, never accept what breaks
// the limits or the payload length, and what they accept re-encodes to the
// same table.
func FuzzTable(f *testing.F) {
	lim := Limits{MaxItems: 64, MaxValueSize: 1 << 20, MaxBatchBytes: 4 << 20}
	var enc encoder
	t := enc.begin(typeGetResp, 3)
	putStatusEntry(t, 0, StatusOK, 100)
	putStatusEntry(t, 1, StatusMiss, 0)
	putStatusEntry(t, 2, statusRetry, 0)
	f.Add(uint8(typeGetResp), 128, bytes.Clone(t))
	t = enc.begin(typePutReq, 2)
	putPutEntry(t, 0, testKey(1), 64)
	putPutEntry(t, 1, testKey(2), 0)
	f.Add(uint8(typePutReq), 64, bytes.Clone(t))
	t = enc.begin(typePublishReq, 2)
	putPublishEntry(t, 0, testKey(1), testKey(3), 64)
	putPublishEntry(t, 1, testKey(2), testKey(3), 0)
	f.Add(uint8(typePublishReq), 64, bytes.Clone(t))
	t = enc.begin(typeShmGetResp, 2)
	putShmEntry(t, 0, StatusOK, 100, 4096)
	putShmEntry(t, 1, StatusError, 0, 0)
	f.Add(uint8(typeShmGetResp), 0, bytes.Clone(t))
	const region = 1 << 20
	t = enc.begin(typeShmGetResp, 1)
	putShmEntry(t, 0, StatusOK, 100, arenaOff(2*region))
	f.Add(uint8(typeShmGetResp), 0, bytes.Clone(t))
	t = enc.begin(typeShmReserveReq, 1)
	putReserveEntry(t, 0, prefixhash.Key{1}, prefixhash.Key{2}, prefixhash.Key{3}, 4096)
	f.Add(uint8(typeShmReserveReq), 0, bytes.Clone(t))
	t = enc.begin(typeShmHello, 1)
	putHello(t, hello{regionSize: 1 << 20, maxPending: 8, limits: defaultLimits(), arena: arenaShared | arenaWritable})
	f.Add(uint8(typeShmHello), 0, bytes.Clone(t))
	t = enc.begin(typeShmHello, 1)
	putHello(t, hello{regionSize: 1 << 20, maxPending: 8, limits: defaultLimits()})
	f.Add(uint8(typeShmHello), 0, bytes.Clone(t))
	t = enc.begin(typeGetPartReq, 2)
	putPartEntry(t, 0, testKey(1), block.Part{L0: 0, L1: 4, H0: 2, H1: 4})
	putPartEntry(t, 1, testKey(2), block.Part{L0: 1<<32 - 1, L1: 0, H0: 5, H1: 1})
	f.Add(uint8(typeGetPartReq), 0, bytes.Clone(t))
	t = enc.begin(typeClaimReq, 1)
	putPartEntry(t, 0, testKey(1), block.Part{L0: 0, L1: 61, H0: 0, H1: 1})
	f.Add(uint8(typeClaimReq), 0, bytes.Clone(t))
	t = enc.begin(typeClaimResp, 4)
	for i, s := range []block.ClaimStatus{block.ClaimWrite, block.ClaimComplete, block.ClaimCovered, block.ClaimClaimed} {
		putClaimEntry(t, i, s)
	}
	f.Add(uint8(typeClaimResp), 0, bytes.Clone(t))
	t = enc.begin(typePutResp, 2)
	putStatusEntry(t, 0, StatusConflict, 0)
	putStatusEntry(t, 1, StatusOK, 0)
	f.Add(uint8(typePutResp), 0, bytes.Clone(t))
	f.Add(uint8(typeHello), 0, []byte("s3cret"))
	f.Add(uint8(typeHello), 0, []byte{})
	tokens, err := auth.NewTokens("s3cret")
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, typ uint8, payload int, table []byte) {
		ft := frameType(typ)
		el := ft.entryLen()
		if el <= 0 || len(table)%el != 0 || len(table)/el > lim.MaxItems {
			return
		}
		n := len(table) / el
		h := header{typ: ft, count: n, payload: payload}
		var enc encoder
		out := enc.begin(ft, n)
		switch ft {
		case typeGetResp:
			st, lens := make([]Status, n), make([]int, n)
			if parseGetResp(table, &h, &lim, st, lens) != nil {
				return
			}
			total := 0
			for i := range st {
				if lens[i] > lim.MaxValueSize || (st[i] != StatusOK && lens[i] != 0) {
					t.Fatalf("item %d: accepted status %s with %d bytes", i, st[i], lens[i])
				}
				if st[i] == StatusOK {
					total += alignUp(lens[i])
				}
				putStatusEntry(out, i, st[i], lens[i])
			}
			if total != payload {
				t.Fatalf("accepted %d value bytes for a payload of %d", total, payload)
			}
		case typePutResp:
			st := make([]Status, n)
			if parsePutResp(table, st) != nil {
				return
			}
			for i := range st {
				if st[i] > StatusConflict || st[i] == statusRetry {
					t.Fatalf("item %d: accepted put status %d", i, st[i])
				}
				putStatusEntry(out, i, st[i], 0)
			}
		case typePutReq:
			keys, lens := make([]prefixhash.Key, n), make([]int, n)
			if parsePutReq(table, &h, &lim, keys, nil, lens) != nil {
				return
			}
			for i := range keys {
				putPutEntry(out, i, keys[i], lens[i])
			}
		case typePublishReq:
			keys, chunks, lens := make([]prefixhash.Key, n), make([]prefixhash.Key, n), make([]int, n)
			if parsePutReq(table, &h, &lim, keys, chunks, lens) != nil {
				return
			}
			for i := range keys {
				putPublishEntry(out, i, keys[i], chunks[i], lens[i])
			}
		case typeShmGetResp:
			st, lens, offs := make([]Status, n), make([]int, n), make([]uint64, n)
			const arenaSize = 3 * region
			if parseShmResp(table, &lim, region, arenaSize, st, lens, offs) != nil {
				return
			}
			for i := range st {
				size, at := uint64(region), offs[i]&^inArena
				if offs[i]&inArena != 0 {
					size = arenaSize
				}
				if at+uint64(lens[i]) > size || at%valueAlign != 0 {
					t.Fatalf("item %d: accepted [%d, +%d) outside the region or arena", i, offs[i], lens[i])
				}
				putShmEntry(out, i, st[i], lens[i], int64(offs[i]))
			}
		case typeShmReserveReq:
			items := make([]reserveItem, n)
			if parseReserve(table, &lim, items) != nil {
				return
			}
			for i, it := range items {
				if it.n > lim.MaxValueSize {
					t.Fatalf("item %d: accepted a %d-byte reservation", i, it.n)
				}
				putReserveEntry(out, i, it.key, it.parent, it.chunk, it.n)
			}
		case typeShmHello:
			hl, err := parseHello(table)
			if err != nil {
				return
			}
			putHello(out, hl)
		case typeGetReq:
			keys := make([]prefixhash.Key, n)
			parseKeys(table, keys)
			for i, k := range keys {
				putKeyEntry(out, i, k)
			}
		case typeGetPartReq, typeClaimReq:
			keys, parts := make([]prefixhash.Key, n), make([]block.Part, n)
			parsePartReq(table, keys, parts)
			for i := range keys {
				putPartEntry(out, i, keys[i], parts[i])
			}
		case typeClaimResp:
			st := make([]block.ClaimStatus, n)
			if parseClaimResp(table, st) != nil {
				return
			}
			for i, s := range st {
				if s > block.ClaimClaimed {
					t.Fatalf("item %d: accepted claim status %d", i, s)
				}
				putClaimEntry(out, i, s)
			}
		case typeHello:
			if len(table) > MaxTokenLen {
				return
			}
			_, err := checkHello(tokens, table)
			if (err == nil) != (string(table) == "s3cret") || (err != nil && !errors.Is(err, ErrAuth)) {
				t.Fatalf("token %q: %v", table, err)
			}
			copy(out, table)
		case typeShmRelease:
			ids := make([]uint64, n)
			parseIDs(table, ids)
			for i, id := range ids {
				putIDEntry(out, i, id)
			}
		default:
			return
		}
		if !bytes.Equal(out, table) {
			t.Fatalf("%s table re-encodes differently", ft)
		}
	})
}
