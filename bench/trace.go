package bench

import (
	"bufio"
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// TraceBlockTokens is the block size of Mooncake-format traces: every hash
// id stands for 512 tokens (the last one of a request for the remainder).
const TraceBlockTokens = 512

// Request is one line of a Mooncake-format trace.
type Request struct {
	// Timestamp is when the request arrives, from the start of the trace.
	Timestamp time.Duration
	// InputLength is the prompt length in tokens, OutputLength the length of
	// the answer (not replayed: the next turn's prompt carries it).
	InputLength, OutputLength int
	// HashIDs names the prompt's blocks of TraceBlockTokens tokens, the last
	// possibly partial: len(HashIDs) = ⌈InputLength/512⌉. Equal ids at the
	// same position mean equal prefixes (the trace's hashes are chained).
	HashIDs []uint64
}

// FullBlocks returns the number of full blocks of the prompt: the blocks a
// prefix cache can hold (a partial tail is never cached).
func (r *Request) FullBlocks() int { return r.InputLength / TraceBlockTokens }

// Trace is a parsed Mooncake-format trace, in arrival order.
type Trace struct {
	Name     string
	Requests []Request
}

// ErrTrace is wrapped by every error about a malformed trace; the message
// names the line.
var ErrTrace = errors.New("bench: bad trace")

// traceLine is the JSON of one line. Pointers tell a missing field from 0.
type traceLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// maxTraceLine bounds one line (a 2M-token prompt has 4k ids).
const maxTraceLine = 16 << 20

// ParseTrace reads a Mooncake-format trace: one JSON object per line with
// timestamp (milliseconds from the start), input_length, output_length and
// hash_ids (one non-negative id per block of 512 tokens, the last block
// possibly partial). Blank lines are skipped and unknown fields ignored.
// Timestamps must not decrease. An error wraps ErrTrace and names the line.
func ParseTrace(r io.Reader, name string) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	t := &Trace{Name: name}
	var prev time.Duration
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: %s line %d: %s", ErrTrace, name, lineNo, fmt.Sprintf(format, args...))
		}
		var l traceLine
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, bad("%v", err)
		}
		switch {
		case l.Timestamp == nil:
			return nil, bad("missing timestamp")
		case l.InputLength == nil:
			return nil, bad("missing input_length")
		case l.HashIDs == nil:
			return nil, bad("missing hash_ids")
		case *l.Timestamp < 0:
			return nil, bad("timestamp %v is negative", *l.Timestamp)
		case *l.InputLength < 1:
			return nil, bad("input_length %d must be at least 1", *l.InputLength)
		case l.OutputLength != nil && *l.OutputLength < 0:
			return nil, bad("output_length %d is negative", *l.OutputLength)
		}
		if want := (*l.InputLength + TraceBlockTokens - 1) / TraceBlockTokens; len(l.HashIDs) != want {
			return nil, bad("%d hash_ids, but input_length %d needs ⌈%d/%d⌉ = %d", len(l.HashIDs),
				*l.InputLength, *l.InputLength, TraceBlockTokens, want)
		}
		ts := time.Duration(*l.Timestamp * float64(time.Millisecond))
		if ts < prev {
			return nil, bad("timestamp %v ms is before the previous request's %v ms: the trace must be sorted by time",
				*l.Timestamp, float64(prev)/float64(time.Millisecond))
		}
		prev = ts
		req := Request{Timestamp: ts, InputLength: *l.InputLength, HashIDs: make([]uint64, len(l.HashIDs))}
		if l.OutputLength != nil {
			req.OutputLength = *l.OutputLength
		}
		for i, id := range l.HashIDs {
			if id < 0 {
				return nil, bad("hash_ids[%d] = %d is negative", i, id)
			}
			req.HashIDs[i] = uint64(id)
		}
		t.Requests = append(t.Requests, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrTrace, name, err)
	}
	if len(t.Requests) == 0 {
		return nil, fmt.Errorf("%w: %s has no requests", ErrTrace, name)
	}
	return t, nil
}

// LoadTrace reads a trace file; a name ending in .gz is gunzipped.
func LoadTrace(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: trace: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrTrace, path, err)
		}
		r = zr
	}
	return ParseTrace(r, path)
}

//go:embed traces/conversation_trace.jsonl.gz
var conversationTraceGz []byte

// ConversationTraceName names the bundled trace in reports.
const ConversationTraceName = "mooncake/conversation_trace.jsonl"

// ConversationTrace returns Mooncake's conversation trace (12031 requests),
// bundled with kvmesh so that the trace suite runs on a fresh machine.
func ConversationTrace() (*Trace, error) {
	zr, err := gzip.NewReader(bytes.NewReader(conversationTraceGz))
	if err != nil {
		return nil, fmt.Errorf("bench: bundled trace: %w", err)
	}
	return ParseTrace(zr, ConversationTraceName)
}

// Head returns a trace of the first n requests (all of them when n ≤ 0 or
// n ≥ len). The requests are shared, not copied.
func (t *Trace) Head(n int) *Trace {
	if n <= 0 || n >= len(t.Requests) {
		return t
	}
	return &Trace{Name: fmt.Sprintf("%s[:%d]", t.Name, n), Requests: t.Requests[:n]}
}

// Ideal is the best any cache can do on a trace: a block hits when its hash
// id appeared in any earlier request (an infinite cache shared by all).
type Ideal struct {
	Requests int `json:"requests"`
	// Blocks counts every hash id of every request, partial tails included;
	// HitBlocks those seen before. HitRatio = HitBlocks / Blocks is the
	// figure Mooncake quotes for its traces (0.366 for the conversation trace).
	Blocks    int     `json:"blocks"`
	HitBlocks int     `json:"hit_blocks" table:"wide"`
	HitRatio  float64 `json:"ideal_hit_ratio"`
	// FullBlocks and FullHitBlocks count only full 512-token blocks, the
	// only ones a block cache can hold.
	FullBlocks        int     `json:"full_blocks" table:"wide"`
	FullHitBlocks     int     `json:"full_hit_blocks" table:"wide"`
	FullBlockHitRatio float64 `json:"ideal_full_block_hit_ratio"`
	// DistinctFullBlocks is the number of different full blocks: a pooled
	// cache this large never evicts anything the trace asks again.
	DistinctFullBlocks int `json:"distinct_full_blocks"`
	// PromptTokens is the sum of input lengths; CachedTokens the tokens of
	// the full blocks an ideal cache hits.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"ideal_cached_tokens"`
}

// Ideal computes the trace's ideal hit ratio from its hash ids.
func (t *Trace) Ideal() Ideal {
	seen := make(map[uint64]struct{})
	full := make(map[uint64]struct{})
	id := Ideal{Requests: len(t.Requests)}
	for i := range t.Requests {
		r := &t.Requests[i]
		nf := r.FullBlocks()
		id.PromptTokens += int64(r.InputLength)
		for j, h := range r.HashIDs {
			_, hit := seen[h]
			id.Blocks++
			if hit {
				id.HitBlocks++
			}
			if j < nf {
				id.FullBlocks++
				full[h] = struct{}{}
				if hit {
					id.FullHitBlocks++
					id.CachedTokens += TraceBlockTokens
				}
			}
		}
		for _, h := range r.HashIDs {
			seen[h] = struct{}{}
		}
	}
	id.DistinctFullBlocks = len(full)
	if id.Blocks > 0 {
		id.HitRatio = float64(id.HitBlocks) / float64(id.Blocks)
	}
	if id.FullBlocks > 0 {
		id.FullBlockHitRatio = float64(id.FullHitBlocks) / float64(id.FullBlocks)
	}
	return id
}

// Sessions returns a session key per request, since Mooncake traces carry no
// session id. A conversation's turns extend the previous turn's prompt, so
// they share every hash id up to the previous turn's end; but requests of
// different conversations share a leading system prompt too (in the
// conversation trace, hash id 0 opens every one of the 12031 requests, so
// the first id would send the whole trace to one node). The key is therefore
// the first hash id that is not part of a prefix common to more than
// sharedFraction of the requests (0 means 0.5): the first block a
// conversation owns. Two requests with the same key share that block and so,
// the trace's ids being chained, everything before it. A request made only
// of common blocks is keyed by its last id.
func (t *Trace) Sessions(sharedFraction float64) []uint64 {
	if sharedFraction <= 0 {
		sharedFraction = 0.5
	}
	// Count, per (position, id), how many requests carry it: ids are chained,
	// so the count at position j is the number of requests sharing the
	// prefix up to j.
	type pos struct {
		j  int
		id uint64
	}
	counts := make(map[pos]int)
	for i := range t.Requests {
		for j, h := range t.Requests[i].HashIDs {
			counts[pos{j, h}]++
		}
	}
	limit := int(sharedFraction * float64(len(t.Requests)))
	keys := make([]uint64, len(t.Requests))
	for i := range t.Requests {
		ids := t.Requests[i].HashIDs
		keys[i] = ids[len(ids)-1]
		for j, h := range ids {
			if counts[pos{j, h}] <= limit {
				keys[i] = h
				break
			}
		}
	}
	return keys
}
