package transfer

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// The wire format. Every message, on TCP and on the shared-memory unix
// socket alike, is a frame: a fixed 64-byte header, an item table of count
// fixed-size entries, then payload bytes. All integers are little-endian.
//
//	off  size  field
//	  0     4  magic "KVTF"
//	  4     1  version (3)
//	  5     1  frame type
//	  6     1  requests: flags (bit 0: scoped, see below); a shared-memory
//	           client's hello: bit 1, it asks for the DRAM arena; else zero
//	  7     1  error frames: error class (0 request, 1 authentication); else zero
//	  8     8  request id (an answer carries its request's id)
//	 16     4  item count
//	 20     4  get/get-part/put/publish/lookup/reserve/claim requests: milliseconds the requester will wait (0: no deadline); else zero
//	 24     8  payload length in bytes
//	 32     4  get and get-part requests: most value bytes the requester takes in one answer (0: no limit); else zero
//	 36     4  get and get-part requests: largest value the requester takes (0: no limit); else zero
//	 40     8  scoped requests: the tenant tag the request is confined to; else zero
//	 48     8  xxhash64 of the item table
//	 56     8  xxhash64 of bytes [0,56)
//
// A request is scoped when it acts for one tenant: the server serves and
// stores only blocks whose header carries that tenant's tag (auth.Access).
// A tenant's connection is always scoped to its own tag, whatever its frames
// say; only a node-wide principal (a node of the cluster acting for a
// tenant, or a shared-token client) chooses, per request, and an unscoped
// request of such a principal may touch any block.
//
// Item tables, by frame type (entry size in parentheses):
//
//	getReq      (16)  key
//	getResp     (8)   status u8, 3 zero bytes, value length u32
//	putReq      (24)  key, value length u32, 4 zero bytes
//	publishReq  (40)  key, value length u32, 4 zero bytes, chunk key
//	putResp     (8)   status u8, 3 zero bytes, 0 u32
//	shmGetResp  (16)  status u8, 3 zero bytes, value length u32, offset u64:
//	                  in the client's region, or, with bit 63 set, in the
//	                  node's DRAM arena (only to a client given the arena)
//	shmRelease  (8)   request id whose region space, arena leases or open
//	                  reservations the client gives back
//	shmHello    (32)  region size u64, max pending requests u32, the server's
//	                  Limits: MaxItems u32, MaxValueSize u32, arena flags u32
//	                  (bit 0: the arena's descriptor follows the region's;
//	                  bit 1: it is writable, reservations are served),
//	                  MaxBatchBytes u64 (count 1)
//	shmReserve  (56)  key, parent key, chunk key (zero: do not publish),
//	                  encoded block length u32, 4 zero bytes
//	shmCommit   (8)   the id of the reserve request whose slots the client
//	                  filled (count 1)
//	errorMsg    (0)   the payload is a UTF-8 message (count 0)
//	lookupReq   (24)  key, run index u32 (0 for the first key, then equal to
//	                  the previous key's or one more), 4 zero bytes
//	lookupResp  (8)   per run: how many leading keys the peer holds u32,
//	                  4 zero bytes
//	getPartReq  (32)  key, then the part asked for: l0 u32, l1 u32, h0 u32,
//	                  h1 u32 (layers [l0,l1), KV heads [h0,h1); see
//	                  block.Part)
//	claimReq    (32)  as getPartReq (no payload)
//	claimResp   (8)   block.ClaimStatus u8, 3 zero bytes, 0 u32 (no payload)
//	fabricReq   (0)   nothing (count 0): the requester asks for the
//	                  server's Window (one-sided reads, lease.go)
//	fabricResp  (0)   the payload is the window's descriptor (fabric.go),
//	                  or empty: no window for this requester
//	leaseReq    (16)  key
//	leaseResp   (16)  as shmGetResp, offsets in the server's Window; the
//	                  payload is the window's epoch u64, the lease's
//	                  duration in milliseconds u32, 4 zero bytes
//	leaseEnd    (8)   id of a lease request whose lease the client ends
//	leaseEndResp (8)  status u8 (OK: the lease was held until now; miss:
//	                  it had ended), 7 zero bytes
//
// A getPartReq is a getReq for parts of blocks (issue 23: a tensor- or
// pipeline-parallel rank reads its slice): the server takes each whole
// block from its Source and answers, with a getResp (TCP) or a shmGetResp
// (shared memory: copied into the client's region, never read in place),
// the part record of the asked range that it builds from it
// (block.AppendPartRecord: the block's header rewritten for the part, the
// part's payload, its own checksums). A range that is not a valid part of
// the block is answered StatusError for that item, and the connection
// serves on. Its header fields are a getReq's (deadline, requester limits,
// which apply to the part records, scope).
//
// A claimReq asks, per item, whether a part of a block still needs to be
// sent (the latent layout's replicated parts: one rank writes, the others
// see it covered): the server asks its Sink (a Claimer; one that is not is
// answered with an error frame) and answers a claimResp whose statuses are
// block.ClaimWrite (send it: the asker now holds a claim on the range),
// block.ClaimComplete, block.ClaimCovered or block.ClaimClaimed. It needs the write scope.
//
// A publishReq is a putReq from a client that produced the blocks: the
// server stores them as it stores a put's and then queues each stored block
// for the owners of its placement chunk (the chunk key), which a peer's
// putReq (a push or a handoff) must not do. It is answered with a putResp.
// It saves the client a second round trip (a gRPC Publish) per put.
//
// Lookup frames carry no payload; their item count is bounded by
// Limits.MaxLookupKeys rather than MaxItems.
//
//	hello       (1)   the client's bearer token, one byte per item (count 0
//	                  to MaxTokenLen; 0: no token)
//	helloAck    (0)   nothing (count 0)
//
// A TCP connection and a shared-memory connection open with a hello: the
// client sends a hello frame (id 0) and waits for the answer before it sends
// anything else. The TCP server answers with helloAck; the shared-memory
// server with shmHello and the region. A server that refuses the token
// answers with an error frame of class 1 (authentication) and closes the
// connection. A TCP server that requires no token also serves clients that
// skip the hello; one that requires a token refuses them. Over TLS, the
// hello is the first frame inside the TLS stream. Version 2 added the hello
// and the error class; version 1 peers are refused by the version check.
//
// The payload of getResp and putReq is the values in table order, each
// padded with zeros to a multiple of 64 bytes, so that every value lands
// 64-byte aligned in a 64-byte-aligned receive buffer. Only getResp items
// with status OK have a value; the payload length must equal the sum of the
// padded value lengths. The checksums cover the header and the table, not
// the values: values are encoded blocks that the store verifies on arrival.
const (
	headerLen    = 64
	frameMagic   = 0x4654564b // "KVTF"
	wireVersion  = 3
	valueAlign   = 64
	maxErrorMsg  = 1024
	getReqEntry  = prefixhash.KeySize
	getRespEntry = 8
	putReqEntry  = prefixhash.KeySize + 8
	publishEntry = 2*prefixhash.KeySize + 8
	lookupEntry  = prefixhash.KeySize + 8
	countEntry   = 8
	shmRespEntry = 16
	releaseEntry = 8
	reserveEntry = 3*prefixhash.KeySize + 8
	helloEntry   = 32
	tokenEntry   = 1
	partEntry    = prefixhash.KeySize + 16
	claimEntry   = 8
)

type frameType uint8

const (
	typeGetReq frameType = 1 + iota
	typeGetResp
	typePutReq
	typePutResp
	typeShmGetResp
	typeShmRelease
	typeShmHello
	typeError
	typeLookupReq
	typeLookupResp
	typeHello
	typeHelloAck
	typePublishReq
	typeShmReserveReq
	typeShmCommitReq
	typeGetPartReq
	typeClaimReq
	typeClaimResp
	typeFabricReq
	typeFabricResp
	typeLeaseReq
	typeLeaseResp
	typeLeaseEnd
	typeLeaseEndResp
)

// flagScoped marks a request confined to one tenant's blocks; flagArena, a
// shared-memory client's hello that asks for the DRAM arena (clients that
// do not ask, older ones and other languages', keep the copying region).
const (
	flagScoped = 1
	flagArena  = 2
)

// isRequest reports whether frames of type t are requests that act on
// blocks, and so may be scoped to a tenant.
func (t frameType) isRequest() bool {
	switch t {
	case typeGetReq, typePutReq, typePublishReq, typeLookupReq, typeShmReserveReq, typeGetPartReq, typeClaimReq, typeLeaseReq:
		return true
	}
	return false
}

// Error classes of error frames: what the client makes of them.
const (
	classRequest uint32 = 0 // ErrRemote
	classAuth    uint32 = 1 // ErrAuth and ErrRemote
)

func (t frameType) String() string {
	switch t {
	case typeGetReq:
		return "get request"
	case typeGetResp:
		return "get response"
	case typePutReq:
		return "put request"
	case typePutResp:
		return "put response"
	case typeShmGetResp:
		return "shm get response"
	case typeShmRelease:
		return "shm release"
	case typeShmHello:
		return "shm hello"
	case typeError:
		return "error"
	case typeLookupReq:
		return "lookup request"
	case typeLookupResp:
		return "lookup response"
	case typeHello:
		return "hello"
	case typeHelloAck:
		return "hello ack"
	case typePublishReq:
		return "publish request"
	case typeShmReserveReq:
		return "shm reserve request"
	case typeShmCommitReq:
		return "shm commit request"
	case typeGetPartReq:
		return "get part request"
	case typeClaimReq:
		return "claim request"
	case typeClaimResp:
		return "claim response"
	case typeFabricReq:
		return "fabric request"
	case typeFabricResp:
		return "fabric response"
	case typeLeaseReq:
		return "lease request"
	case typeLeaseResp:
		return "lease response"
	case typeLeaseEnd:
		return "lease end"
	case typeLeaseEndResp:
		return "lease end response"
	}
	return fmt.Sprintf("frame type %d", uint8(t))
}

// entryLen returns the size of one item table entry of frames of type t, or
// -1 for an unknown type.
func (t frameType) entryLen() int {
	switch t {
	case typeGetReq, typeLeaseReq:
		return getReqEntry
	case typeGetResp, typePutResp, typeLeaseEndResp:
		return getRespEntry
	case typePutReq:
		return putReqEntry
	case typePublishReq:
		return publishEntry
	case typeShmGetResp, typeLeaseResp:
		return shmRespEntry
	case typeShmRelease, typeShmCommitReq, typeLeaseEnd:
		return releaseEntry
	case typeShmReserveReq:
		return reserveEntry
	case typeShmHello:
		return helloEntry
	case typeError, typeHelloAck, typeFabricReq, typeFabricResp:
		return 0
	case typeLookupReq:
		return lookupEntry
	case typeLookupResp:
		return countEntry
	case typeHello:
		return tokenEntry
	case typeGetPartReq, typeClaimReq:
		return partEntry
	case typeClaimResp:
		return claimEntry
	}
	return -1
}

// header is a decoded frame header.
type header struct {
	typ      frameType
	id       uint64
	count    int
	timeout  uint32 // milliseconds; 0 = none
	payload  int
	maxBatch int    // get requests: most value bytes per answer; 0 = no limit
	maxValue int    // get requests: largest value; 0 = no limit
	class    uint32 // error frames: classRequest or classAuth
	scoped   bool   // requests: confined to the blocks of tenant tag
	arena    bool   // hello: the shared-memory client asks for the arena
	tag      uint64 // scoped requests: the tenant tag
	tableSum uint64
}

// tableLen is the length of the item table that follows h.
func (h *header) tableLen() int { return h.count * h.typ.entryLen() }

func alignUp(n int) int { return (n + valueAlign - 1) &^ (valueAlign - 1) }

// putHeader writes h into b[:headerLen], checksums included. h.tableSum must
// already be the checksum of the table that will follow.
func putHeader(b []byte, h *header) {
	_ = b[headerLen-1]
	binary.LittleEndian.PutUint32(b[0:], frameMagic)
	b[4] = wireVersion
	b[5] = byte(h.typ)
	b[6] = 0
	if h.scoped {
		b[6] = flagScoped
	}
	if h.arena {
		b[6] |= flagArena
	}
	b[7] = byte(h.class)
	binary.LittleEndian.PutUint64(b[8:], h.id)
	binary.LittleEndian.PutUint32(b[16:], uint32(h.count))
	binary.LittleEndian.PutUint32(b[20:], h.timeout)
	binary.LittleEndian.PutUint64(b[24:], uint64(h.payload))
	binary.LittleEndian.PutUint32(b[32:], uint32(h.maxBatch))
	binary.LittleEndian.PutUint32(b[36:], uint32(h.maxValue))
	binary.LittleEndian.PutUint64(b[40:], h.tag)
	binary.LittleEndian.PutUint64(b[48:], h.tableSum)
	binary.LittleEndian.PutUint64(b[56:], xxhash.Sum64(b[:56]))
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// parseHeader decodes and verifies the header in b[:headerLen]: magic,
// version, type, reserved bytes, checksum, and the limits lim puts on the
// item count and payload length. Nothing it accepts makes a reader allocate
// more than lim allows.
func parseHeader(b []byte, lim *Limits) (header, error) {
	var h header
	if len(b) < headerLen {
		return h, corrupt("%d bytes, shorter than a frame header", len(b))
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != frameMagic {
		return h, corrupt("bad magic %#08x", m)
	}
	if b[4] != wireVersion {
		return h, corrupt("wire version %d, this build speaks %d", b[4], wireVersion)
	}
	if sum := xxhash.Sum64(b[:56]); sum != binary.LittleEndian.Uint64(b[56:]) {
		return h, corrupt("header checksum %016x, want %016x", binary.LittleEndian.Uint64(b[56:]), sum)
	}
	h.typ = frameType(b[5])
	if h.typ.entryLen() < 0 {
		return h, corrupt("unknown frame type %d", b[5])
	}
	h.id = binary.LittleEndian.Uint64(b[8:])
	count := binary.LittleEndian.Uint32(b[16:])
	h.timeout = binary.LittleEndian.Uint32(b[20:])
	payload := binary.LittleEndian.Uint64(b[24:])
	maxBatch := uint64(binary.LittleEndian.Uint32(b[32:]))
	h.maxValue = int(binary.LittleEndian.Uint32(b[36:]))
	h.class = uint32(b[7])
	h.scoped = b[6]&flagScoped != 0
	h.arena = b[6]&flagArena != 0
	h.tag = binary.LittleEndian.Uint64(b[40:])
	h.tableSum = binary.LittleEndian.Uint64(b[48:])
	switch {
	case b[6]&^(flagScoped|flagArena) != 0:
		return h, corrupt("unknown header flags %#02x", b[6])
	case h.arena && h.typ != typeHello:
		return h, corrupt("%s frame with the arena flag", h.typ)
	case h.scoped && !h.typ.isRequest():
		return h, corrupt("%s frame with the scoped flag", h.typ)
	case !h.scoped && h.tag != 0:
		return h, corrupt("%s frame with a tenant tag but no scope", h.typ)
	case h.typ != typeError && h.class != 0:
		return h, corrupt("%s frame with an error class", h.typ)
	case h.typ != typeGetReq && h.typ != typeGetPartReq && (maxBatch != 0 || h.maxValue != 0):
		return h, corrupt("%s frame with requester limits", h.typ)
	case !h.typ.isRequest() && h.timeout != 0:
		return h, corrupt("%s frame with a timeout", h.typ)
	}
	h.maxBatch = int(min(maxBatch, maxBatchLimit))

	maxCount, maxPayload := uint64(lim.MaxItems), uint64(0)
	switch h.typ {
	case typeGetResp, typePutReq, typePublishReq:
		maxPayload = uint64(lim.MaxBatchBytes)
	case typeShmHello, typeShmCommitReq:
		maxCount = 1
	case typeError:
		maxCount, maxPayload = 0, maxErrorMsg
	case typeLookupReq, typeLookupResp:
		maxCount = uint64(lim.lookupKeys())
	case typeHello:
		maxCount = MaxTokenLen
	case typeHelloAck, typeFabricReq:
		maxCount = 0
	case typeFabricResp:
		maxCount, maxPayload = 0, maxFabricPayload
	case typeLeaseResp:
		maxPayload = leasePayload
	}
	if uint64(count) > maxCount {
		switch h.typ {
		case typeShmHello, typeShmCommitReq, typeError, typeHelloAck, typeFabricReq, typeFabricResp:
			return h, corrupt("%s frame with %d items", h.typ, count)
		case typeHello:
			return h, fmt.Errorf("%w: hello with a %d-byte token, MaxTokenLen is %d", ErrLimit, count, MaxTokenLen)
		}
		if h.typ == typeLookupReq || h.typ == typeLookupResp {
			return h, fmt.Errorf("%w: %s of %d keys, the limit is %d", ErrLimit, h.typ, count, maxCount)
		}
		return h, fmt.Errorf("%w: %s of %d items, MaxItems is %d", ErrLimit, h.typ, count, lim.MaxItems)
	}
	if (h.typ == typeShmHello || h.typ == typeShmCommitReq) && count != 1 {
		return h, corrupt("%s frame with %d items", h.typ, count)
	}
	if payload > maxPayload {
		if maxPayload == 0 {
			return h, corrupt("%s frame with %d payload bytes", h.typ, payload)
		}
		if h.typ == typeError {
			return h, corrupt("error message of %d bytes", payload)
		}
		return h, fmt.Errorf("%w: %s of %d bytes, MaxBatchBytes is %d", ErrLimit, h.typ, payload, lim.MaxBatchBytes)
	}
	h.count, h.payload = int(count), int(payload)
	return h, nil
}

// answerLimits returns the value and per-answer byte limits for answering
// the get request h: the server's own, narrowed by the requester's. A value
// over the returned value limit cannot be sent to this requester.
func answerLimits(h *header, lim *Limits) (maxValue, maxBatch int) {
	maxValue, maxBatch = lim.MaxValueSize, lim.MaxBatchBytes
	if h.maxBatch > 0 {
		maxBatch = min(maxBatch, h.maxBatch)
	}
	if h.maxValue > 0 {
		maxValue = min(maxValue, h.maxValue)
	}
	if alignUp(maxValue) > maxBatch {
		maxValue = maxBatch &^ (valueAlign - 1)
	}
	return maxValue, maxBatch
}

// checkTable verifies the item table's checksum against the header.
func checkTable(h *header, table []byte) error {
	if len(table) != h.tableLen() {
		return corrupt("item table of %d bytes, want %d", len(table), h.tableLen())
	}
	if sum := xxhash.Sum64(table); sum != h.tableSum {
		return corrupt("item table checksum %016x, want %016x", sum, h.tableSum)
	}
	return nil
}

// An encoder builds a frame's header and item table in one reusable buffer.
// begin sizes it, the put* methods fill entries, finish writes the header.
type encoder struct{ b []byte }

func (e *encoder) begin(typ frameType, count int) []byte {
	n := headerLen + count*typ.entryLen()
	if cap(e.b) < n {
		e.b = make([]byte, n)
	}
	e.b = e.b[:n]
	clear(e.b)
	return e.b[headerLen:]
}

// finish completes the frame begun last with header h (its table checksum
// is computed here) and returns header and table as one slice, valid until
// the next begin.
func (e *encoder) finish(h header) []byte {
	h.tableSum = xxhash.Sum64(e.b[headerLen:])
	putHeader(e.b, &h)
	return e.b
}

// Entry writers. Each takes the table and the entry's index.

func putKeyEntry(t []byte, i int, k prefixhash.Key) { copy(t[i*getReqEntry:], k[:]) }

func putStatusEntry(t []byte, i int, st Status, n int) {
	e := t[i*getRespEntry:]
	e[0] = byte(st)
	binary.LittleEndian.PutUint32(e[4:], uint32(n))
}

func putPutEntry(t []byte, i int, k prefixhash.Key, n int) {
	e := t[i*putReqEntry:]
	copy(e, k[:])
	binary.LittleEndian.PutUint32(e[prefixhash.KeySize:], uint32(n))
}

func putPublishEntry(t []byte, i int, k, chunk prefixhash.Key, n int) {
	e := t[i*publishEntry:]
	copy(e, k[:])
	binary.LittleEndian.PutUint32(e[prefixhash.KeySize:], uint32(n))
	copy(e[prefixhash.KeySize+8:], chunk[:])
}

func putShmEntry(t []byte, i int, st Status, n int, off int64) {
	e := t[i*shmRespEntry:]
	e[0] = byte(st)
	binary.LittleEndian.PutUint32(e[4:], uint32(n))
	binary.LittleEndian.PutUint64(e[8:], uint64(off))
}

// Table decoders. Each verifies what the table promises against the header
// and the limits; none allocates (the caller passes slices of h.count
// elements).

func parseKeys(table []byte, keys []prefixhash.Key) {
	for i := range keys {
		copy(keys[i][:], table[i*getReqEntry:])
	}
}

func parseStatus(b byte, allowRetry bool) (Status, error) {
	st := Status(b)
	switch {
	case st <= StatusError, st == statusRetry && allowRetry:
		return st, nil
	}
	return st, corrupt("item status %d", b)
}

// parseItem decodes the status and value length that open getResp and
// shmGetResp entries.
func parseItem(e []byte, i int, lim *Limits) (Status, int, error) {
	s, err := parseStatus(e[0], true)
	if err != nil {
		return s, 0, err
	}
	if e[1]|e[2]|e[3] != 0 {
		return s, 0, corrupt("reserved bytes of item %d are not zero", i)
	}
	n := int(binary.LittleEndian.Uint32(e[4:]))
	switch {
	case n != 0 && s != StatusOK:
		return s, 0, corrupt("item %d has status %s and a %d-byte value", i, s, n)
	case n > lim.MaxValueSize:
		return s, 0, fmt.Errorf("%w: value %d is %d bytes, MaxValueSize is %d", ErrLimit, i, n, lim.MaxValueSize)
	}
	return s, n, nil
}

// parseGetResp decodes a getResp table into st and lens and checks that the
// padded lengths of the OK values add up to the payload.
func parseGetResp(table []byte, h *header, lim *Limits, st []Status, lens []int) error {
	total := 0
	for i := range st {
		s, n, err := parseItem(table[i*getRespEntry:], i, lim)
		if err != nil {
			return err
		}
		st[i], lens[i] = s, n
		if s == StatusOK {
			total += alignUp(n)
		}
	}
	if total != h.payload {
		return corrupt("values add up to %d bytes, payload is %d", total, h.payload)
	}
	return nil
}

// parsePutResp decodes a putResp table into st.
func parsePutResp(table []byte, st []Status) error {
	for i := range st {
		e := table[i*getRespEntry:]
		s := StatusConflict // a put's answer only
		if Status(e[0]) != StatusConflict {
			var err error
			if s, err = parseStatus(e[0], false); err != nil {
				return err
			}
		}
		if e[1]|e[2]|e[3]|e[4]|e[5]|e[6]|e[7] != 0 {
			return corrupt("put status %d has non-zero reserved bytes", i)
		}
		st[i] = s
	}
	return nil
}

// parsePutReq decodes a putReq or publishReq table into keys and lens (and,
// for a publishReq, chunks) and checks them against the payload.
func parsePutReq(table []byte, h *header, lim *Limits, keys, chunks []prefixhash.Key, lens []int) error {
	total := 0
	entry := h.typ.entryLen()
	for i := range keys {
		e := table[i*entry:]
		copy(keys[i][:], e)
		if h.typ == typePublishReq {
			copy(chunks[i][:], e[prefixhash.KeySize+8:])
		}
		n := int(binary.LittleEndian.Uint32(e[prefixhash.KeySize:]))
		if binary.LittleEndian.Uint32(e[prefixhash.KeySize+4:]) != 0 {
			return corrupt("reserved bytes of item %d are not zero", i)
		}
		if n > lim.MaxValueSize {
			return fmt.Errorf("%w: value %d is %d bytes, MaxValueSize is %d", ErrLimit, i, n, lim.MaxValueSize)
		}
		lens[i] = n
		total += alignUp(n)
	}
	if total != h.payload {
		return corrupt("values add up to %d bytes, payload is %d", total, h.payload)
	}
	return nil
}

// inArena marks a shmGetResp offset in the node's DRAM arena.
const inArena = 1 << 63

// parseShmResp decodes a shmGetResp table. Every OK value must lie inside a
// region of regionSize bytes at a 64-byte-aligned offset, or, marked
// inArena (kept in offs), inside an arena of arenaSize bytes (0: the client
// has no arena, and such an offset is corrupt).
func parseShmResp(table []byte, lim *Limits, regionSize, arenaSize int64, st []Status, lens []int, offs []uint64) error {
	for i := range st {
		e := table[i*shmRespEntry:]
		s, n, err := parseItem(e, i, lim)
		if err != nil {
			return err
		}
		off := binary.LittleEndian.Uint64(e[8:])
		size, where := uint64(regionSize), "region"
		if off&inArena != 0 {
			size, where = uint64(arenaSize), "arena"
		}
		switch at := off &^ inArena; {
		case s != StatusOK && off != 0:
			return corrupt("item %d has status %s and an offset", i, s)
		case at%valueAlign != 0 || at > size || uint64(n) > size-at:
			return corrupt("item %d at [%d, +%d) is outside the %d-byte %s or unaligned", i, at, n, size, where)
		}
		st[i], lens[i], offs[i] = s, n, off
	}
	return nil
}

func putReserveEntry(t []byte, i int, key, parent, chunk prefixhash.Key, n int) {
	e := t[i*reserveEntry:]
	copy(e, key[:])
	copy(e[prefixhash.KeySize:], parent[:])
	copy(e[2*prefixhash.KeySize:], chunk[:])
	binary.LittleEndian.PutUint32(e[3*prefixhash.KeySize:], uint32(n))
}

// reserveItem is one entry of a shmReserve table.
type reserveItem struct {
	key, parent, chunk prefixhash.Key
	n                  int
}

// parseReserve decodes a shmReserve table into items.
func parseReserve(table []byte, lim *Limits, items []reserveItem) error {
	for i := range items {
		e := table[i*reserveEntry:]
		it := &items[i]
		copy(it.key[:], e)
		copy(it.parent[:], e[prefixhash.KeySize:])
		copy(it.chunk[:], e[2*prefixhash.KeySize:])
		it.n = int(binary.LittleEndian.Uint32(e[3*prefixhash.KeySize:]))
		switch {
		case binary.LittleEndian.Uint32(e[3*prefixhash.KeySize+4:]) != 0:
			return corrupt("reserved bytes of item %d are not zero", i)
		case it.n > lim.MaxValueSize:
			return fmt.Errorf("%w: value %d is %d bytes, MaxValueSize is %d", ErrLimit, i, it.n, lim.MaxValueSize)
		}
	}
	return nil
}

func putIDEntry(t []byte, i int, id uint64) { binary.LittleEndian.PutUint64(t[i*releaseEntry:], id) }

func parseIDs(table []byte, ids []uint64) {
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint64(table[i*releaseEntry:])
	}
}

// hello is the first frame the shared-memory server sends, with the region's
// file descriptor: the region's size, how many requests the client may have
// outstanding, and the server's limits, which the client adopts where they
// are tighter than its own.
type hello struct {
	regionSize int64
	maxPending int
	limits     Limits
	arena      uint32 // arenaShared, arenaWritable
}

// Arena flags of the shm hello.
const (
	arenaShared   = 1 // the arena's descriptor follows the region's
	arenaWritable = 2 // it is writable: the server takes reservations
)

func putHello(t []byte, hl hello) {
	binary.LittleEndian.PutUint64(t[0:], uint64(hl.regionSize))
	binary.LittleEndian.PutUint32(t[8:], uint32(hl.maxPending))
	binary.LittleEndian.PutUint32(t[12:], uint32(hl.limits.MaxItems))
	binary.LittleEndian.PutUint32(t[16:], uint32(hl.limits.MaxValueSize))
	binary.LittleEndian.PutUint32(t[20:], hl.arena)
	binary.LittleEndian.PutUint64(t[24:], uint64(hl.limits.MaxBatchBytes))
}

func parseHello(t []byte) (hello, error) {
	if len(t) != helloEntry {
		return hello{}, corrupt("hello table of %d bytes", len(t))
	}
	size := binary.LittleEndian.Uint64(t[0:])
	pending := binary.LittleEndian.Uint32(t[8:])
	lim := Limits{
		MaxItems:      int(binary.LittleEndian.Uint32(t[12:])),
		MaxValueSize:  int(binary.LittleEndian.Uint32(t[16:])),
		MaxBatchBytes: int(min(binary.LittleEndian.Uint64(t[24:]), maxBatchLimit+1)),
		// Not on the wire: a shared-memory server answers no lookups.
		MaxLookupKeys: maxItemsLimit,
	}
	arena := binary.LittleEndian.Uint32(t[20:])
	switch {
	case arena&^(arenaShared|arenaWritable) != 0 || arena == arenaWritable:
		return hello{}, corrupt("arena flags %#x", arena)
	case size == 0 || size > maxRegionSize || size%valueAlign != 0:
		return hello{}, corrupt("region size %d", size)
	case pending == 0 || pending > maxPendingLimit:
		return hello{}, corrupt("max pending %d", pending)
	}
	if err := lim.Validate(); err != nil {
		return hello{}, corrupt("server limits: %v", err)
	}
	return hello{regionSize: int64(size), maxPending: int(pending), limits: lim, arena: arena}, nil
}

// helloFrame builds, in enc, the hello that opens a connection: token is its
// table. The frame is valid until enc's next use.
func helloFrame(enc *encoder, token string) []byte {
	copy(enc.begin(typeHello, len(token)), token)
	return enc.finish(header{typ: typeHello, count: len(token)})
}
