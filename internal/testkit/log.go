package testkit

import "sync"

// Log is what fakes were asked, in order, safe for the fakes' goroutines
// and the test's: a fake server adds a line per request, the test takes
// what came since it last looked.
type Log struct {
	mu    sync.Mutex
	lines []string
}

// Add appends a line.
func (l *Log) Add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
}

// Take returns the lines added since the last Take and forgets them.
func (l *Log) Take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}
