package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/gpu/gpumem"
)

// Errors of the package.
var (
	// ErrMissing is wrapped by every error that means a peer (redis-server,
	// fio) is not installed, or cannot run here (no direct I/O). A suite
	// reports it as a skipped column, never as a failure.
	ErrMissing = errors.New("bench: peer not available")
	// ErrUnknownSuite is returned by Select for a name no suite has.
	ErrUnknownSuite = errors.New("bench: unknown suite")
)

// A Suite is one benchmark: `kvmesh bench NAME` runs it. Run measures, fills
// a Result (tables, skipped peers, checks against targets, plots written to
// env.OutDir) and returns it. A peer that is missing is recorded with
// Result.Skip and is not an error; an error means the suite could not measure
// what it is for. Run must stop promptly when ctx is cancelled.
//
// Suites carry their own Options; each Options type documents its defaults
// for a full run and for --quick (env.Quick), and fills them in
// EnsureDefaults(quick).
type Suite interface {
	Name() string
	Run(ctx context.Context, env *Env) (*Result, error)
}

// Env is what every suite of one `kvmesh bench` invocation shares.
type Env struct {
	// Quick selects the small variant of every suite: `kvmesh bench all
	// --quick` runs in well under five minutes on 2 cores.
	Quick bool
	// OutDir is where suites write PNG plots. Empty: no plots.
	OutDir string
	// WorkDir is scratch space (Redis data dirs, fio files). Empty: Run
	// creates a temporary directory and removes it afterwards. fio measures
	// the file system WorkDir is on unless a suite says otherwise.
	WorkDir string
	// Binary is the kvmesh binary suites start nodes with (`kvmesh
	// serve`, one process per node, on free 127.0.0.1 ports). `kvmesh
	// bench` sets it to itself (os.Executable). Empty, and with no Addrs,
	// the suites that need nodes fail with ErrNoBinary.
	Binary string
	// Addrs, when set, are the gRPC addresses of an existing cluster
	// (`--addr`) that the suites use instead of starting nodes. Suites
	// that need separate, unjoined nodes (the trace suite's local-only
	// mode) skip them.
	Addrs []string
	// Progress draws progress bars; nil draws none.
	Progress *Progress
	// Log receives structured logs; nil discards them.
	Log *slog.Logger
}

func (e *Env) log() *slog.Logger {
	if e.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Log
}

// Result is what one suite measured. Its JSON field names say what each
// figure is; rows of Tables are structs whose json tags are the column names
// of both the JSON and the human table.
type Result struct {
	Suite string `json:"suite"`
	// Error is set when the suite failed; the figures it gathered before
	// failing are still reported.
	Error   string   `json:"error,omitempty"`
	Seconds float64  `json:"duration_s"`
	Tables  []Table  `json:"tables"`
	Skipped []Skip   `json:"skipped,omitempty"`
	Checks  []Check  `json:"checks,omitempty"`
	Plots   []string `json:"plots,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

// Table is a titled list of rows. Rows is a slice of structs (or of pointers
// to structs); each exported field with a json tag is a column named by the
// tag. Fields tagged `table:"-"` are in the JSON only, so that the human
// table fits a terminal. Pointer fields that are nil in every row (a ratio
// to a missing peer) are dropped from the human table and, with omitempty,
// from the JSON.
type Table struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	Rows  any    `json:"rows"`
}

// Skip records a peer or measurement that did not run, and why.
type Skip struct {
	What   string `json:"what"`
	Reason string `json:"reason"`
}

// Check compares one figure with its target in DESIGN.md.
type Check struct {
	Name string `json:"name"`
	// Figure names what Value is, e.g. "hit_ratio / ideal_hit_ratio".
	Figure string  `json:"figure"`
	Value  float64 `json:"value"`
	// Op is ">=" or "<=": the figure meets the target when Value Op Target.
	Op     string  `json:"op"`
	Target float64 `json:"target"`
	Met    bool    `json:"met"`
	// Backend is "kvmesh" for a measurement of kvmesh and "simulation" for
	// the in-process model of the trace suite, which is never a kvmesh figure.
	Backend string `json:"backend"`
}

// NewCheck returns a Check with Met computed. op must be ">=" or "<=".
func NewCheck(name, figure string, value float64, op string, target float64, backend string) Check {
	var met bool
	switch op {
	case ">=":
		met = value >= target
	case "<=":
		met = value <= target
	default:
		panic(fmt.Sprintf("bench: NewCheck with op %q", op))
	}
	return Check{Name: name, Figure: figure, Value: value, Op: op, Target: target, Met: met, Backend: backend}
}

// AddTable appends a table; rows must be a slice of structs.
func (r *Result) AddTable(name, title string, rows any) {
	r.Tables = append(r.Tables, Table{Name: name, Title: title, Rows: rows})
}

// Skip records that what did not run because of err.
func (r *Result) Skip(what string, err error) {
	r.Skipped = append(r.Skipped, Skip{What: what, Reason: err.Error()})
}

// Note appends a line of explanation to the report.
func (r *Result) Note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// Report is the outcome of one `kvmesh bench` invocation.
type Report struct {
	Started time.Time `json:"started"`
	Quick   bool      `json:"quick"`
	Machine Machine   `json:"machine"`
	Results []*Result `json:"suites"`
}

// Machine describes where the figures were measured.
type Machine struct {
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	CPUs      int    `json:"cpus"`
}

// Failed returns the names of the suites that reported an error.
func (r *Report) Failed() []string {
	var out []string
	for _, res := range r.Results {
		if res.Error != "" {
			out = append(out, res.Suite)
		}
	}
	return out
}

// Select returns the suites named by names, in the order given, expanding
// "all" to every suite of available but those it leaves out (peers). A name that no suite has is an error
// wrapping ErrUnknownSuite that lists the known names.
func Select(available []Suite, names []string) ([]Suite, error) {
	byName := make(map[string]Suite, len(available))
	var known []string
	for _, s := range available {
		byName[s.Name()] = s
		known = append(known, s.Name())
	}
	var out []Suite
	seen := map[string]bool{}
	add := func(s Suite) {
		if !seen[s.Name()] {
			seen[s.Name()] = true
			out = append(out, s)
		}
	}
	for _, n := range names {
		if n == "all" {
			for _, s := range available {
				if _, out := s.(notInAll); !out {
					add(s)
				}
			}
			continue
		}
		s, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("%w %q (known: %s, all)", ErrUnknownSuite, n, strings.Join(known, ", "))
		}
		add(s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no suite named (known: %s, all)", ErrUnknownSuite, strings.Join(known, ", "))
	}
	return out, nil
}

// Run runs suites one after another with env and returns their report. A
// suite that fails has its Error set and the others still run; the caller
// decides the exit status from Report.Failed. Run returns an error only when
// it cannot start (bad OutDir or WorkDir) or when ctx is cancelled, with the
// report of what completed.
func Run(ctx context.Context, suites []Suite, env Env) (*Report, error) {
	rep := &Report{
		Started: time.Now().UTC(),
		Quick:   env.Quick,
		Machine: Machine{GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU()},
	}
	if env.OutDir != "" {
		if err := os.MkdirAll(env.OutDir, 0o755); err != nil {
			return rep, fmt.Errorf("bench: output directory: %w", err)
		}
	}
	if env.WorkDir == "" {
		dir, err := os.MkdirTemp("", "kvmesh-bench-")
		if err != nil {
			return rep, fmt.Errorf("bench: work directory: %w", err)
		}
		defer os.RemoveAll(dir)
		env.WorkDir = dir
	}
	for _, s := range suites {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		start := time.Now()
		env.log().Info("bench: suite starting", "suite", s.Name(), "quick", env.Quick)
		res, err := s.Run(ctx, &env)
		if res == nil {
			res = &Result{Suite: s.Name()}
		}
		res.Suite = s.Name()
		res.Seconds = time.Since(start).Seconds()
		if err != nil {
			res.Error = err.Error()
		}
		rep.Results = append(rep.Results, res)
		env.log().Info("bench: suite done", "suite", s.Name(), "seconds", res.Seconds, "error", res.Error)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	return rep, nil
}

// SuiteFlags are the options of `kvmesh bench` that single suites take.
type SuiteFlags struct {
	// TracePath is the trace suite's trace (--trace). Default: the bundled
	// conversation trace.
	TracePath string
	// Requests replays only the first Requests requests of it (--requests).
	Requests int
	// Nodes is the trace suite's cluster size (--nodes), and the one size
	// the scale suite simulates. Default 4 (trace), ScaleOptions.Nodes
	// (scale).
	Nodes int
	// ScalePhases are the scale suite's phases (--phases; ScaleOptions.Phases).
	ScalePhases []string
	// ScaleDilation is the scale suite's dilation at every size
	// (--dilation; ScaleOptions.Dilation and LargeDilation). Default 0:
	// ScaleOptions'.
	ScaleDilation float64
	// Routing is the policy the trace suite measures on kvmesh nodes beside
	// session-affinity (--routing). Default random.
	Routing Policy
	// CapacityBlocks is each node's capacity in blocks in the trace suite's
	// comparison of policies (--capacity-blocks). Default: enough for every
	// distinct block of the trace.
	CapacityBlocks int
	// Eviction is the eviction policy of the trace suite's kvmesh nodes
	// (--eviction, `kvmesh serve --eviction`). Default: the node's.
	Eviction string
	// DRAMFraction, when positive, adds the trace suite's NVMe admission
	// sweep: nodes whose DRAM holds this share of their capacity and NVMe
	// the rest (TraceOptions.DRAMFraction).
	DRAMFraction float64
	// NodeSweep is TraceOptions.NodeSweep (nil: its default).
	NodeSweep []float64
	// Speedup replays the trace honouring its timestamps divided by Speedup
	// (--speedup). Default 0: as fast as possible.
	Speedup float64
	// SoakDuration and SoakConcurrency are the soak's length (--duration)
	// and workers (--concurrency). Default: SoakOptions's.
	SoakDuration    time.Duration
	SoakConcurrency int
	// Backlog runs the serve suite's backlog variant with that many queued
	// requests (--backlog; ServeOptions.Backlog). Default 0: the sessions
	// across routing policies.
	Backlog int
	// PrefillDevice is the GPU the prefill suite's engines run on
	// (--backend cuda; PrefillOptions.Device). Default nil: the CPU.
	PrefillDevice gpumem.BLAS
	// PrefillModelDir, PrefillPromptTokens and PrefillDecodeTokens measure
	// a Hugging Face model directory in the prefill suite (--model-dir,
	// --prompt-tokens, --decode-tokens; PrefillOptions).
	PrefillModelDir                          string
	PrefillPromptTokens, PrefillDecodeTokens int
	// Transport is the transfer suite's (--transport; TransferOptions).
	// Default "": tcp.
	Transport string
}

// Suites returns every suite, in the order `all` runs them: transfer,
// store, ranks, lookup, nvme, prefill, trace; and those `all` leaves out: peers
// (every suite measures its own peers), soak (a test of endurance, not a
// figure of speed) and speculate (decoding's speed, not the cache's).
func Suites(f SuiteFlags) []Suite {
	trace := TraceOptions{TracePath: f.TracePath, Requests: f.Requests, Nodes: f.Nodes,
		CapacityBlocks: f.CapacityBlocks, Eviction: f.Eviction, DRAMFraction: f.DRAMFraction, NodeSweep: f.NodeSweep, Replay: ReplayOptions{Speedup: f.Speedup}}
	if f.Routing != "" {
		trace.Routing = []Policy{f.Routing}
		if f.Routing != RoutingSession {
			trace.Routing = append(trace.Routing, RoutingSession)
		}
	}
	scale := ScaleOptions{Phases: f.ScalePhases, Dilation: f.ScaleDilation, LargeDilation: f.ScaleDilation}
	if f.Nodes > 0 {
		scale.Nodes = []int{f.Nodes}
	}
	return []Suite{&TransferSuite{Options: TransferOptions{Transport: f.Transport}}, &StoreSuite{}, &RanksSuite{}, &LookupSuite{}, &NVMeSuite{}, &PrefillSuite{Options: PrefillOptions{Device: f.PrefillDevice,
		ModelDir: f.PrefillModelDir, PromptTokens: f.PrefillPromptTokens, DecodeTokens: f.PrefillDecodeTokens}},
		&TraceSuite{Options: trace}, &PeersSuite{}, &ServeSuite{Options: ServeOptions{Backlog: f.Backlog}},
		&SoakSuite{Options: SoakOptions{Duration: f.SoakDuration, Concurrency: f.SoakConcurrency}}, &SpeculateSuite{},
		&ScaleSuite{Options: scale}}
}

// notInAll is implemented by suites that `all` leaves out.
type notInAll interface{ notInAll() }

func (*PeersSuite) notInAll() {}

// Format is how a report is printed.
type Format string

// The output formats of `-o`.
const (
	FormatTable Format = "table"
	FormatWide  Format = "wide" // the table with every column
	FormatJSON  Format = "json"
)

// ParseFormat parses the value of `-o`.
func ParseFormat(s string) (Format, error) {
	f := Format(strings.ToLower(s))
	if !slices.Contains([]Format{FormatTable, FormatWide, FormatJSON}, f) {
		return "", fmt.Errorf("bench: output format %q: want table, wide or json", s)
	}
	return f, nil
}

// Write prints rep in format f.
func Write(w io.Writer, rep *Report, f Format) error {
	switch f {
	case FormatJSON:
		return WriteJSON(w, rep)
	case FormatWide:
		return WriteWide(w, rep)
	}
	return WriteTable(w, rep)
}
