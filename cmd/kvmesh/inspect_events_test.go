package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/kvevents"
)

// TestInspectEvents: serve --kv-events-addr publishes, the ready file says
// where, and inspect events tails what a client's puts store.
func TestInspectEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	d := startDaemon(t, t.TempDir(), "--dram", "32MiB", "--nvme", "0", "--max-block-bytes", "1MiB",
		"--kv-events-addr", "tcp://127.0.0.1:0", "--kv-events-replay-addr", "tcp://127.0.0.1:0")
	if !strings.HasPrefix(d.ready.KVEventsAddr, "tcp://127.0.0.1:") || !strings.HasPrefix(d.ready.KVEventsReplayAddr, "tcp://127.0.0.1:") {
		t.Fatalf("ready file: %+v", d.ready)
	}
	c, err := client.Dial(d.grpcAddr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tail := exec.CommandContext(ctx, binary(t), "inspect", "events", "--events", d.ready.KVEventsAddr, "-o", "json", "--count", "2")
	var out, stderr bytes.Buffer
	tail.Stdout, tail.Stderr = &out, &stderr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- tail.Wait() }()
	// A subscription lands a moment after the connection: put fresh
	// prompts until inspect events has printed two events and exited.
	for seed := 1; ; seed++ {
		tokens, payloads := e2ePrompt(seed, 2)
		if _, err := c.Lookup(ctx, e2eNS, client.Prompt{Tokens: tokens}); err != nil { // names the namespace's model
			t.Fatal(err)
		}
		if _, err := c.Put(ctx, e2eNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("inspect events: %v\n%s", err, stderr.String())
			}
		case <-time.After(200 * time.Millisecond):
			continue
		}
		break
	}
	var events []eventJSON
	var lastTopic string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var b batchJSON
		if err := json.Unmarshal(sc.Bytes(), &b); err != nil {
			t.Fatalf("%v: %s", err, sc.Bytes())
		}
		events, lastTopic = append(events, b.Events...), b.Topic
	}
	if len(events) != 2 || events[0].Type != kvevents.TagBlockStored || events[0].Medium != "CPU" || events[0].BlockSize != e2eNS.BlockTokens ||
		events[1].ParentBlockHash != events[0].BlockHashes[0] || lastTopic != "kv@"+d.id+"@"+e2eNS.Model {
		t.Fatalf("inspect events printed %+v on %q\n%s", events, lastTopic, out.String())
	}
}
