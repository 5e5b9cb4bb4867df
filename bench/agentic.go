package bench

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// AgenticOptions configures GenerateAgentic, a Mooncake-format trace of
// agent sessions: a workload the eviction policies are measured on beside
// the recorded traces. Zero fields take the defaults documented on each.
type AgenticOptions struct {
	// Seed makes the trace: the same options and seed give the same trace
	// on every machine. Default 1.
	Seed uint64
	// Sessions is the number of sessions. Default 3000.
	Sessions int
	// Duration is the span over which sessions start (a Poisson process).
	// Default 10m.
	Duration time.Duration
	// Agents is the number of agent templates: each a system prompt and a
	// tool list that all its sessions start with, picked with Zipf
	// popularity (the first agent most often). Default 12.
	Agents int
}

// EnsureDefaults fills zero fields with their defaults.
func (o *AgenticOptions) EnsureDefaults() {
	o.Seed = cmp.Or(o.Seed, 1)
	o.Sessions = cmp.Or(o.Sessions, 3000)
	o.Duration = cmp.Or(o.Duration, 10*time.Minute)
	o.Agents = cmp.Or(o.Agents, 12)
}

// Validate names the first field that is out of range.
func (o *AgenticOptions) Validate() error {
	switch {
	case o.Sessions < 1 || o.Sessions > 1<<20:
		return fmt.Errorf("bench: agentic: sessions %d is outside 1..%d", o.Sessions, 1<<20)
	case o.Duration <= 0:
		return fmt.Errorf("bench: agentic: duration %v must be positive", o.Duration)
	case o.Agents < 1 || o.Agents > 1<<10:
		return fmt.Errorf("bench: agentic: agents %d is outside 1..1024", o.Agents)
	}
	return nil
}

// AgenticTraceName is the prefix of a TracePath that asks for a generated
// agentic trace instead of a file: "agentic" or "agentic:SEED".
const AgenticTraceName = "agentic"

// ParseAgenticPath reports whether path names a generated agentic trace
// ("agentic", "agentic:SEED") and returns its options.
func ParseAgenticPath(path string) (AgenticOptions, bool, error) {
	rest, ok := strings.CutPrefix(path, AgenticTraceName)
	if !ok || (rest != "" && rest[0] != ':') {
		return AgenticOptions{}, false, nil
	}
	var o AgenticOptions
	if rest != "" {
		seed, err := strconv.ParseUint(rest[1:], 10, 64)
		if err != nil || seed == 0 {
			return o, true, fmt.Errorf("bench: trace %q: want agentic:SEED with a positive integer seed", path)
		}
		o.Seed = seed
	}
	return o, true, nil
}

// Generated agentic sessions. Every session starts with a platform preamble
// all agents share, then its agent's system prompt and tool list (both
// block-aligned, so every session of an agent shares those blocks), then
// the user's task. It runs an agent loop: each step is a request whose
// prompt is the previous one plus the model's output (a tool call) and the
// tool's result, after the tool's latency (seconds, lognormal, sometimes a
// minute). A user turn ends with an answer; the user replies after a
// think time (minutes, lognormal) or the session ends. A step may start
// sub-agents: sessions of their own under the sub-agent template, run while
// the parent waits. A prompt past the context limit is compacted: the
// session starts a new chain from its agent's prefix and a summary, and
// the old chain is never used again.
const (
	agenticPlatformBlocks = 2     // preamble every agent starts with
	agenticContextTokens  = 96000 // compaction threshold
)

type agenticGen struct {
	rng    *rand.Rand
	nextID uint64
	agents [][]uint64 // each agent's prefix block ids, platform preamble first
	sub    []uint64   // the sub-agent template's prefix
	out    []timedRequest
}

type timedRequest struct {
	at      time.Duration
	session int
	Request
}

// GenerateAgentic returns a trace of agent sessions under o (see the
// constants above for the shape). Its name is "agentic:SEED".
func GenerateAgentic(o AgenticOptions) (*Trace, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	g := &agenticGen{rng: rand.New(rand.NewPCG(o.Seed, 0x6167656e746963))}
	platform := g.ids(agenticPlatformBlocks)
	for range o.Agents {
		g.agents = append(g.agents, slices.Concat(platform, g.ids(2+g.rng.IntN(22))))
	}
	g.sub = slices.Concat(platform, g.ids(3))
	zipf := rand.NewZipf(g.rng, 1.2, 1, uint64(o.Agents-1))
	rate := float64(o.Sessions) / o.Duration.Seconds()
	var at float64
	for s := range o.Sessions {
		at += g.rng.ExpFloat64() / rate
		g.session(s, secs(at), g.agents[zipf.Uint64()], false)
	}
	slices.SortStableFunc(g.out, func(a, b timedRequest) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.session, b.session))
	})
	t := &Trace{Name: fmt.Sprintf("%s:%d", AgenticTraceName, o.Seed)}
	for _, r := range g.out {
		r.Timestamp = r.at.Truncate(time.Millisecond)
		t.Requests = append(t.Requests, r.Request)
	}
	return t, nil
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// ids returns n fresh block ids.
func (g *agenticGen) ids(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = g.nextID
		g.nextID++
	}
	return out
}

// lognormal draws exp(N(ln median, sigma²)).
func (g *agenticGen) lognormal(median, sigma float64) float64 {
	return median * math.Exp(sigma*g.rng.NormFloat64())
}

// chain is one session's prompt: full blocks (ids) and a partial tail.
type chain struct {
	blocks []uint64
	tail   int // tokens past the last full block
}

// extend appends n tokens: the tail and the new tokens fill fresh blocks.
func (g *agenticGen) extend(c *chain, n int) {
	c.tail += n
	for c.tail >= TraceBlockTokens {
		c.blocks = append(c.blocks, g.ids(1)[0])
		c.tail -= TraceBlockTokens
	}
}

// request records the prompt c as a request at time at.
func (g *agenticGen) request(session int, at time.Duration, c *chain) {
	ids := slices.Clone(c.blocks)
	if c.tail > 0 {
		ids = append(ids, g.ids(1)[0]) // a partial block is never shared
	}
	g.out = append(g.out, timedRequest{at: at, session: session, Request: Request{
		InputLength: len(c.blocks)*TraceBlockTokens + c.tail, HashIDs: ids,
		OutputLength: 50 + g.rng.IntN(400)}})
}

// session generates one session of agent prefix from time start, and
// returns when it ends. A sub-agent runs a single user turn.
func (g *agenticGen) session(id int, start time.Duration, prefix []uint64, subagent bool) time.Duration {
	c := &chain{blocks: slices.Clone(prefix)}
	task := int(g.lognormal(300, 1))
	if !subagent && g.rng.Float64() < 0.2 {
		task += int(g.lognormal(12000, 0.6)) // an attached document
	}
	g.extend(c, task)
	now := start
	turns := 1
	if !subagent {
		turns = 1 + int(g.rng.ExpFloat64()*1.2)
	}
	for turn := range turns {
		steps := 1 + int(g.rng.ExpFloat64()*2.5)
		if subagent {
			steps = 1 + g.rng.IntN(6)
		}
		for step := range steps {
			g.request(id, now, c)
			if len(c.blocks)*TraceBlockTokens+c.tail > agenticContextTokens {
				// Compaction: a new chain from the agent's prefix and a summary.
				c = &chain{blocks: slices.Clone(prefix)}
				g.extend(c, int(g.lognormal(1500, 0.4)))
			}
			if step == steps-1 {
				g.extend(c, int(g.lognormal(500, 0.8))) // the answer
				break
			}
			g.extend(c, int(g.lognormal(120, 0.6))) // the tool call
			latency := g.lognormal(2, 1.2)
			if !subagent && g.rng.Float64() < 0.03 {
				// Sub-agents: the parent waits for the slowest.
				n := 2 + g.rng.IntN(3)
				var end time.Duration
				for k := range n {
					end = max(end, g.session(id*16+k+1<<30, now+secs(0.2), g.sub, true))
				}
				latency = (end - now).Seconds() + 0.5
			}
			now += secs(max(latency, 0.05))
			g.extend(c, int(g.lognormal(700, 1.1))) // the tool's result
		}
		if turn < turns-1 {
			now += secs(g.lognormal(120, 1.2)) // the user reads and replies
			g.extend(c, int(g.lognormal(150, 1)))
		}
	}
	return now
}
