package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestQueueScenarios runs the scripts under testdata/queue: the persistent
// prefill queue's states (queued, running, done, failed, expired) through
// enqueues, takes, finishes, crashes and the passing of time on a fake
// clock. -rewrite regenerates the expected output.
//
// Commands:
//
//	open capacity=<n> max-results=<n> ttl=<dur> max-runs=<n> [max-bytes=<n>]   a fresh queue
//	reopen                         close and open the same directory (a restart: nothing is finished on the way down)
//	enqueue <name> [tenant=<t>] [tokens=<n>]   a request (3 tokens, node-wide by default); ok or the error
//	take                           the request the worker would run next, or none
//	finish <name> [fail=<why>]     the worker finishes the request it took (why: one word)
//	tick <dur>                     the clock moves on; expired results go
//	state <name>...                each request's state as a client reads it
//	depth                          pending requests and kept results
func TestQueueScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/queue", func(t *testing.T, path string) {
		s := &queueScenario{ids: map[string]string{}, names: map[string]string{}, taken: map[string]*queueRecord{},
			now: time.Unix(1700000000, 0)}
		defer s.close(t)
		datadriven.RunTest(t, path, s.run)
	})
}

type queueScenario struct {
	q     *queue
	dir   string
	opts  queueOptions
	now   time.Time
	ids   map[string]string // name -> id
	names map[string]string // id -> name
	taken map[string]*queueRecord
}

func (s *queueScenario) close(t *testing.T) {
	if s.q != nil {
		if err := s.q.close(); err != nil {
			t.Errorf("close: %v", err)
		}
		s.q = nil
	}
}

func (s *queueScenario) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "open":
		s.close(t)
		var ttl string
		s.opts = queueOptions{now: func() time.Time { return s.now }, log: slog.New(slog.DiscardHandler)}
		d.ScanArgs(t, "capacity", &s.opts.capacity)
		d.ScanArgs(t, "max-results", &s.opts.maxResults)
		d.ScanArgs(t, "ttl", &ttl)
		d.ScanArgs(t, "max-runs", &s.opts.maxRuns)
		s.opts.maxBytes = 1 << 30
		d.MaybeScanArgs(t, "max-bytes", &s.opts.maxBytes)
		var err error
		if s.opts.ttl, err = time.ParseDuration(ttl); err != nil {
			t.Fatalf("%s: %v", d.Pos, err)
		}
		s.dir = t.TempDir()
		s.q = openTestQueue(t, s.dir, s.opts)
		return ""
	case "reopen":
		s.close(t)
		s.taken = map[string]*queueRecord{}
		s.q = openTestQueue(t, s.dir, s.opts)
		return ""
	case "enqueue":
		name := d.CmdArgs[0].Key
		var owner queueOwner
		d.MaybeScanArgs(t, "tenant", &owner.Tenant)
		tokens := 3
		d.MaybeScanArgs(t, "tokens", &tokens)
		r, err := s.q.enqueue(make([]uint32, tokens), name, false, owner)
		if err != nil {
			return err.Error()
		}
		s.ids[name], s.names[r.ID] = r.ID, name
		return "ok"
	case "take":
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // nothing to wait for: the answer is what is queued now
		r, err := s.q.take(ctx)
		if errors.Is(err, context.Canceled) {
			return "none queued"
		}
		if err != nil {
			return err.Error()
		}
		name := s.names[r.ID]
		s.taken[name] = r
		return fmt.Sprintf("%s (run %d)", name, r.Runs)
	case "finish":
		name := d.CmdArgs[0].Key
		r, ok := s.taken[name]
		if !ok {
			t.Fatalf("%s: %s was not taken", d.Pos, name)
		}
		delete(s.taken, name)
		var why string
		d.MaybeScanArgs(t, "fail", &why)
		if why != "" {
			s.q.finish(r, nil, errors.New(why))
		} else {
			s.q.finish(r, &queueOutcome{PromptTokens: 3}, nil)
		}
		return ""
	case "tick":
		dur, err := time.ParseDuration(d.CmdArgs[0].Key)
		if err != nil {
			t.Fatalf("%s: %v", d.Pos, err)
		}
		s.now = s.now.Add(dur)
		s.q.expire()
		return ""
	case "state":
		var out []string
		for _, a := range d.CmdArgs {
			r, ok, err := s.q.get(s.ids[a.Key])
			switch {
			case err != nil:
				out = append(out, fmt.Sprintf("%s: %v", a.Key, err))
			case !ok:
				out = append(out, a.Key+": unknown (expired)")
			default:
				st := strings.ToLower(strings.TrimPrefix(r.State.String(), "PREFILL_STATE_"))
				if r.Err != "" {
					st += ": " + r.Err
				}
				if r.Finished.IsZero() {
					out = append(out, a.Key+": "+st) // the index keeps no run count
				} else {
					out = append(out, fmt.Sprintf("%s: %s (runs %d)", a.Key, st, r.Runs))
				}
			}
		}
		return strings.Join(out, "\n")
	case "depth":
		p, r := s.q.depth()
		return fmt.Sprintf("%d pending, %d results", p, r)
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
		return ""
	}
}
