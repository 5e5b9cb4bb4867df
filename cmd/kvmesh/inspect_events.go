package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/kvevents"
)

// eventJSON is one KV event in inspect events' JSON lines: vLLM's field
// names, hashes in hex.
type eventJSON struct {
	Type            string   `json:"type"`
	BlockHashes     []string `json:"block_hashes,omitempty"`
	ParentBlockHash string   `json:"parent_block_hash,omitempty"`
	TokenIDs        []uint32 `json:"token_ids,omitempty"`
	BlockSize       int      `json:"block_size,omitempty"`
	LoRAID          *int     `json:"lora_id,omitempty"`
	LoRAName        *string  `json:"lora_name,omitempty"`
	Medium          string   `json:"medium,omitempty"`
	GroupIdx        *int     `json:"group_idx,omitempty"`
	SpecKind        string   `json:"kv_cache_spec_kind,omitempty"`
	ExtraKeys       [][]any  `json:"extra_keys,omitempty"`
}

// batchJSON is one line of inspect events -o json: a batch, a gap in the
// sequence numbers (batches the subscriber did not get), or a batch that
// did not decode.
type batchJSON struct {
	Topic  string      `json:"topic,omitempty"`
	Seq    uint64      `json:"seq"`
	TS     float64     `json:"ts,omitempty"`
	Events []eventJSON `json:"events,omitempty"`
	Error  string      `json:"error,omitempty"`
	// Missed, on a gap's line, counts the batches between the last one
	// received and this one (Seq).
	Missed uint64 `json:"missed,omitempty"`
	Replay bool   `json:"replay,omitempty"`
}

func eventsCmd(f *inspectFlags) *cobra.Command {
	var (
		addr, replayAddr, topic string
		from                    int64
		count                   int
		duration                time.Duration
	)
	c := &cobra.Command{
		Use:   "events --events tcp://HOST:PORT",
		Short: "Tail KV events (vLLM's format) of a node or an engine",
		Long: `Subscribe to the KV events published at --events (a kvmesh node's
--kv-events-addr, or a vLLM engine's kv-events endpoint) and print them as
they come: one line per event in a table, one JSON object per batch with
-o json. A gap in the sequence numbers after the first batch received
(batches dropped at the publisher's high-water mark) prints as a gap line.

With --replay (the publisher's replay endpoint, --kv-events-replay-addr) and
--from SEQ, the batches the publisher still holds from SEQ on are printed
first, then the live ones.

--count stops after that many events, --duration after that long (0: until
interrupted).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.prepare(cmd); err != nil {
				return err
			}
			if !strings.HasPrefix(addr, "tcp://") {
				return fmt.Errorf("--events %q: want tcp://HOST:PORT", addr)
			}
			if from >= 0 && replayAddr == "" {
				return errors.New("--from needs --replay, the publisher's replay endpoint")
			}
			ctx := cmd.Context()
			if duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
			}
			t := &eventTail{w: cmd.OutOrStdout(), json: f.output == "json", left: count}
			if from >= 0 {
				err := kvevents.Replay(ctx, replayAddr, uint64(from), func(m kvevents.Message) bool { return t.print(m, true) })
				if err != nil {
					return t.end(ctx, fmt.Errorf("--replay %s: %w", replayAddr, err))
				}
				if t.done() {
					return nil
				}
			}
			err := kvevents.Subscribe(ctx, addr, topic, func(m kvevents.Message) bool { return t.print(m, false) })
			return t.end(ctx, err)
		},
	}
	fl := c.Flags()
	fl.StringVar(&addr, "events", "", "ZMQ PUB endpoint of the KV events, tcp://HOST:PORT (required)")
	fl.StringVar(&replayAddr, "replay", "", "the publisher's replay endpoint (ROUTER), tcp://HOST:PORT, for --from")
	fl.Int64Var(&from, "from", -1, "replay the buffered batches from this sequence number on before the live ones (needs --replay)")
	fl.StringVar(&topic, "topic", "", "only batches whose topic starts with this (default: all)")
	fl.IntVar(&count, "count", 0, "stop after this many events (0: no limit)")
	fl.DurationVar(&duration, "duration", 0, "stop after this long (0: until interrupted)")
	_ = c.MarkFlagRequired("events")
	return c
}

// eventTail prints batches as inspect events does, and tracks sequence
// numbers to show gaps.
type eventTail struct {
	w       io.Writer
	json    bool
	left    int // events still to print; 0: no limit
	limited bool
	header  bool
	last    uint64
	any     bool
}

func (t *eventTail) done() bool { return t.limited && t.left <= 0 }

// print prints one message; false once --count is reached.
func (t *eventTail) print(m kvevents.Message, replay bool) bool {
	if t.left > 0 {
		t.limited = true
	}
	if m.Err == nil && t.any && m.Seq > t.last+1 {
		t.emit(batchJSON{Seq: m.Seq, Missed: m.Seq - t.last - 1, Replay: replay})
	}
	if m.Err == nil {
		if t.any && m.Seq <= t.last {
			return true // a batch the replay already printed
		}
		t.last, t.any = m.Seq, true
	}
	b := batchJSON{Topic: m.Topic, Seq: m.Seq, TS: m.Batch.TS, Replay: replay}
	if m.Err != nil {
		b.Error = m.Err.Error()
	}
	for _, e := range m.Batch.Events {
		b.Events = append(b.Events, toEventJSON(e))
	}
	if t.limited && len(b.Events) > t.left {
		b.Events = b.Events[:t.left]
	}
	t.emit(b)
	if t.limited {
		t.left -= len(b.Events)
		return t.left > 0
	}
	return true
}

func toEventJSON(e kvevents.Event) eventJSON {
	j := eventJSON{Type: e.Tag, TokenIDs: e.TokenIDs, BlockSize: e.BlockSize, LoRAID: e.LoRAID, LoRAName: e.LoRAName,
		Medium: e.Medium, GroupIdx: e.GroupIdx, SpecKind: e.KVCacheSpecKind, ExtraKeys: e.ExtraKeys}
	for _, h := range e.BlockHashes {
		j.BlockHashes = append(j.BlockHashes, hex.EncodeToString(h))
	}
	if e.ParentBlockHash != nil {
		j.ParentBlockHash = hex.EncodeToString(e.ParentBlockHash)
	}
	return j
}

func (t *eventTail) emit(b batchJSON) {
	if t.json {
		line, _ := json.Marshal(b)
		fmt.Fprintf(t.w, "%s\n", line)
		return
	}
	if !t.header {
		fmt.Fprintf(t.w, "%-8s %-18s %-7s %-6s %-10s %-18s %s\n", "SEQ", "EVENT", "MEDIUM", "TOKENS", "PARENT", "HASH", "TOPIC")
		t.header = true
	}
	switch {
	case b.Missed > 0:
		fmt.Fprintf(t.w, "%-8d gap: %d batches missed\n", b.Seq, b.Missed)
	case b.Error != "":
		fmt.Fprintf(t.w, "%-8d bad batch: %s\n", b.Seq, b.Error)
	}
	for _, e := range b.Events {
		hash, parent := "-", "-"
		if len(e.BlockHashes) > 0 {
			hash = short(e.BlockHashes[0], 16)
			if len(e.BlockHashes) > 1 {
				hash += fmt.Sprintf(" +%d", len(e.BlockHashes)-1)
			}
		}
		if e.ParentBlockHash != "" {
			parent = short(e.ParentBlockHash, 8)
		}
		tokens := "-"
		if e.Type == kvevents.TagBlockStored {
			tokens = fmt.Sprint(len(e.TokenIDs))
		}
		medium := e.Medium
		if medium == "" {
			medium = "-"
		}
		fmt.Fprintf(t.w, "%-8d %-18s %-7s %-6s %-10s %-18s %s\n", b.Seq, e.Type, medium, tokens, parent, hash, b.Topic)
	}
}

func short(h string, n int) string {
	if len(h) <= n {
		return h
	}
	return h[:n] + "…"
}

// end turns the subscription's end into the command's result: a deadline
// (--duration) or interrupt is a normal end.
func (t *eventTail) end(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil
	}
	return err
}
