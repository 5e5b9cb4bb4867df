package transfer

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
)

// MaxTokenLen is the longest bearer token, in bytes.
const MaxTokenLen = 4096

// Tokens is the set of bearer tokens a server accepts. A client presents one
// token in the hello that opens each connection (ClientOptions.Token); the
// server serves nothing on a connection until the token matched. Set swaps
// the whole set atomically, so tokens rotate without a restart: add the new
// token, move clients to it, then drop the old one. Connections already
// authenticated stay open. Tokens is safe for concurrent use.
//
// Only SHA-256 digests of the tokens are kept, and Check compares the
// digest of the presented token with every one of them in constant time,
// so neither the time a check takes nor the memory of the process gives
// away a token or how much of one a guess got right.
type Tokens struct {
	sums atomic.Pointer[[][sha256.Size]byte]
}

// NewTokens returns a set of the given tokens (at least one).
func NewTokens(tokens ...string) (*Tokens, error) {
	t := new(Tokens)
	if err := t.Set(tokens...); err != nil {
		return nil, err
	}
	return t, nil
}

// Set replaces the set by tokens: at least one, each of 1 to MaxTokenLen
// bytes. On error the set is unchanged.
func (t *Tokens) Set(tokens ...string) error {
	if len(tokens) == 0 {
		return errors.New("transfer: a token set needs at least one token")
	}
	sums := make([][sha256.Size]byte, len(tokens))
	for i, tok := range tokens {
		if len(tok) == 0 || len(tok) > MaxTokenLen {
			return fmt.Errorf("transfer: token %d is %d bytes, want 1 to %d", i, len(tok), MaxTokenLen)
		}
		sums[i] = sha256.Sum256([]byte(tok))
	}
	t.sums.Store(&sums)
	return nil
}

// Check reports whether token is in the set.
func (t *Tokens) Check(token []byte) bool {
	sums := t.sums.Load()
	if sums == nil || len(token) == 0 {
		return false
	}
	sum := sha256.Sum256(token)
	ok := 0
	for i := range *sums {
		ok |= subtle.ConstantTimeCompare(sum[:], (*sums)[i][:])
	}
	return ok == 1
}

// ReadTokenFile reads bearer tokens from a file, one a line. Surrounding
// blanks are trimmed; empty lines and lines starting with '#' are skipped.
// A file with no token is an error. A node accepts every token of its file
// (Tokens) and presents the first one to its peers (ClientOptions.Token).
func ReadTokenFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("transfer: token file: %w", err)
	}
	var tokens []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 2*MaxTokenLen)
	for line := 1; sc.Scan(); line++ {
		tok := strings.TrimSpace(sc.Text())
		switch {
		case tok == "" || strings.HasPrefix(tok, "#"):
			continue
		case len(tok) > MaxTokenLen:
			return nil, fmt.Errorf("transfer: token file %s: line %d: token of %d bytes, the most is %d", path, line, len(tok), MaxTokenLen)
		}
		tokens = append(tokens, tok)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("transfer: token file %s: %w", path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("transfer: token file %s holds no token", path)
	}
	return tokens, nil
}

// authError is an ErrAuth error: why the connection was refused, and by
// whom (err is ErrRemote when the peer refused, or the TLS error that made
// this end refuse).
type authError struct {
	reason string
	err    error
}

func (e *authError) Error() string {
	if e.err != nil && e.err != ErrRemote {
		return ErrAuth.Error() + ": " + e.reason + ": " + e.err.Error()
	}
	return ErrAuth.Error() + ": " + e.reason
}

func (e *authError) Unwrap() []error {
	if e.err == nil {
		return []error{ErrAuth}
	}
	return []error{ErrAuth, e.err}
}

func refused(format string, args ...any) error {
	return &authError{reason: fmt.Sprintf(format, args...)}
}

// checkHello decides a connection's hello (h, with the token as table):
// nil when tokens is nil (no token required) or holds the token.
func checkHello(tokens *Tokens, table []byte) error {
	switch {
	case tokens == nil:
		return nil
	case len(table) == 0:
		return refused("this server requires a bearer token and the client sent none")
	case !tokens.Check(table):
		return refused("bearer token not accepted")
	}
	return nil
}
