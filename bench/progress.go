package bench

import (
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Progress draws progress bars for steps that take more than a few seconds.
// A nil *Progress draws nothing, so suites call it unconditionally.
type Progress struct {
	w io.Writer
	// finished, when set (tests), replaces drawing: each bar reports its
	// total and what was added to it when it finishes, so that a test
	// can hold a suite's total to what it ran.
	finished func(desc string, total, added int64)
}

// NewProgress returns a Progress drawing on w, or nil (no bars) when
// enabled is false.
func NewProgress(w io.Writer, enabled bool) *Progress {
	if !enabled || w == nil {
		return nil
	}
	return &Progress{w: w}
}

// ProgressFor returns the Progress `kvmesh bench` uses: bars on stderr when
// stderr is a terminal and the output is not JSON, none otherwise.
func ProgressFor(stderr *os.File, f Format) *Progress {
	return NewProgress(stderr, f != FormatJSON && stderr != nil && term.IsTerminal(int(stderr.Fd())))
}

// Bar is one progress bar. Its methods are safe for concurrent use and a
// no-op on a nil *Progress's bars.
type Bar interface {
	// Add advances the bar by n units.
	Add(n int64)
	// Describe changes the text shown before the bar.
	Describe(desc string)
	// Finish completes the bar and ends its line.
	Finish()
}

// Bar starts a bar of total units.
func (p *Progress) Bar(total int64, desc string) Bar {
	if p != nil && p.finished != nil {
		return &countBar{desc: desc, total: total, finished: p.finished}
	}
	if p == nil || total <= 0 {
		return nopBar{}
	}
	return &bar{pb: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(p.w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetWidth(30),
		progressbar.OptionClearOnFinish(),
	)}
}

type bar struct{ pb *progressbar.ProgressBar }

// Errors from drawing on the terminal are ignored: a bar must never fail
// a benchmark.
func (b *bar) Add(n int64)          { _ = b.pb.Add64(n) }
func (b *bar) Describe(desc string) { b.pb.Describe(desc) }
func (b *bar) Finish()              { _ = b.pb.Finish() }

// countBar counts instead of drawing.
type countBar struct {
	desc         string
	total, added int64
	mu           sync.Mutex
	done         bool
	finished     func(desc string, total, added int64)
}

func (b *countBar) Add(n int64) {
	b.mu.Lock()
	b.added += n
	b.mu.Unlock()
}
func (b *countBar) Describe(string) {}
func (b *countBar) Finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done {
		b.done = true
		b.finished(b.desc, b.total, b.added)
	}
}

type nopBar struct{}

func (nopBar) Add(int64)       {}
func (nopBar) Describe(string) {}
func (nopBar) Finish()         {}
