package auth

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"

	"go.yaml.in/yaml/v3"
)

// MaxTokenLen is the longest bearer token, in bytes.
const MaxTokenLen = 4096

// Credential is one accepted token: its SHA-256 and whom it authenticates.
type Credential struct {
	Sum       [sha256.Size]byte
	Principal Principal
}

// Tokens is the set of bearer tokens a server accepts, each mapped to a
// principal. Set swaps the whole set atomically, so tokens rotate without
// a restart: add the new token, move clients to it, then drop the old one.
// Tokens is safe for concurrent use.
//
// Only SHA-256 digests of the tokens are kept, and Lookup compares the
// digest of the presented token with every one of them in constant time,
// so neither the time a check takes nor the memory of the process gives
// away a token or how much of one a guess got right.
type Tokens struct {
	creds atomic.Pointer[[]Credential]
}

// NewTokens returns a set of shared tokens (at least one): each
// authenticates a node-wide principal with every scope. This is the
// single-tenant mode.
func NewTokens(tokens ...string) (*Tokens, error) {
	t := new(Tokens)
	if err := t.Set(tokens...); err != nil {
		return nil, err
	}
	return t, nil
}

// NewCredentials returns a set of the given credentials (at least one).
func NewCredentials(creds []Credential) (*Tokens, error) {
	t := new(Tokens)
	if err := t.SetCredentials(creds); err != nil {
		return nil, err
	}
	return t, nil
}

// Set replaces the set by shared tokens: at least one, each of 1 to
// MaxTokenLen bytes, each a node-wide principal with every scope. On error
// the set is unchanged.
func (t *Tokens) Set(tokens ...string) error {
	creds, err := Shared(tokens...)
	if err != nil {
		return err
	}
	return t.SetCredentials(creds)
}

// Shared returns the credentials of shared tokens (see NewTokens).
func Shared(tokens ...string) ([]Credential, error) {
	if len(tokens) == 0 {
		return nil, errors.New("auth: a token set needs at least one token")
	}
	creds := make([]Credential, len(tokens))
	for i, tok := range tokens {
		if len(tok) == 0 || len(tok) > MaxTokenLen {
			return nil, fmt.Errorf("auth: token %d is %d bytes, want 1 to %d", i, len(tok), MaxTokenLen)
		}
		creds[i] = Credential{Sum: sha256.Sum256([]byte(tok)), Principal: Principal{Scopes: All}}
	}
	return creds, nil
}

// SetCredentials replaces the set by creds (at least one).
func (t *Tokens) SetCredentials(creds []Credential) error {
	if len(creds) == 0 {
		return errors.New("auth: a token set needs at least one token")
	}
	c := append([]Credential(nil), creds...)
	t.creds.Store(&c)
	return nil
}

// Lookup returns the principal token authenticates, and whether it is in
// the set. It takes the same time whichever entry matches.
func (t *Tokens) Lookup(token []byte) (Principal, bool) {
	if len(token) == 0 {
		return Principal{}, false
	}
	return t.LookupSum(sha256.Sum256(token))
}

// LookupSum is Lookup of the token whose SHA-256 is sum: what a server that
// keeps a connection's credential (never the token itself) uses to decide,
// after the set changed, whether the connection may stay.
func (t *Tokens) LookupSum(sum [sha256.Size]byte) (Principal, bool) {
	creds := t.creds.Load()
	if creds == nil {
		return Principal{}, false
	}
	found := -1
	for i := range *creds {
		if subtle.ConstantTimeCompare(sum[:], (*creds)[i].Sum[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Principal{}, false
	}
	return (*creds)[found].Principal, true
}

// Check reports whether token is in the set.
func (t *Tokens) Check(token []byte) bool {
	_, ok := t.Lookup(token)
	return ok
}

// ReadTokenList reads shared bearer tokens from a file, one a line.
// Surrounding blanks are trimmed; empty lines and lines starting with '#'
// are skipped. A file with no token is an error.
func ReadTokenList(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: token file: %w", err)
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
			return nil, fmt.Errorf("auth: token file %s: line %d: token of %d bytes, the most is %d", path, line, len(tok), MaxTokenLen)
		}
		tokens = append(tokens, tok)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth: token file %s: %w", path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("auth: token file %s holds no token", path)
	}
	return tokens, nil
}

// File is a parsed tokens file (the multi-tenant mode).
type File struct {
	// Credentials are the accepted tokens.
	Credentials []Credential
	// ClusterToken is the token the node presents to its peers: the first
	// entry with the cluster scope given as a token (not a digest).
	ClusterToken string
	// Tenants lists the tenant names, in the order of the file.
	Tenants []string
	// LabelKey keys the namespace digests a node shows in its metrics
	// (which need no token to read), so that no one learns a tenant's
	// digest from them. It is derived from the secret: the same on every
	// node and across restarts, so dashboards keep their series.
	LabelKey []byte
	// peerKey signs what a node vouches for toward its peers (Vouch),
	// derived from the secret.
	peerKey []byte
	secret  []byte
}

// Derive returns a key for label derived from the file's secret, the same
// on every node of the cluster; nil when the file has no secret of
// MinSecretLen bytes (it names no tenant).
func (f *File) Derive(label string) []byte {
	if len(f.secret) < MinSecretLen {
		return nil
	}
	m := hmac.New(sha256.New, f.secret)
	m.Write([]byte("kvmesh/derive/v1\x00" + label))
	return m.Sum(nil)
}

// MinSecretLen is the shortest secret a tokens file may hold.
const MinSecretLen = 32

var tenantName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// fileYAML is the tokens file as written:
//
//	secret: "at least 32 characters, the same on every node"
//	tokens:
//	  - token: "the token itself"      # or
//	    sha256: "its SHA-256 in hex"   # so the file holds no usable token
//	    tenant: acme                   # omitted: a node-wide principal
//	    scopes: [read, write]          # read, write, admin, cluster
type fileYAML struct {
	Secret string `yaml:"secret"`
	Tokens []struct {
		Token  string   `yaml:"token"`
		SHA256 string   `yaml:"sha256"`
		Tenant string   `yaml:"tenant"`
		Scopes []string `yaml:"scopes"`
	} `yaml:"tokens"`
}

// ReadFile reads and checks a tokens file. See ParseFile.
func ReadFile(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: tokens file: %w", err)
	}
	f, err := ParseFile(b)
	if err != nil {
		return nil, fmt.Errorf("auth: tokens file %s: %w", path, err)
	}
	return f, nil
}

// ParseFile parses a tokens file (YAML; see the package doc and docs/SECURITY.md
// for an example). Every entry needs a token or its SHA-256 and at least
// one scope; a tenant's entry may not hold the cluster scope; the file
// needs a secret of at least MinSecretLen bytes when it names a tenant,
// and one cluster-scoped entry given as a token, which the node presents
// to its peers.
func ParseFile(b []byte) (*File, error) {
	var y fileYAML
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&y); err != nil {
		return nil, fmt.Errorf("not a tokens file: %w", err)
	}
	f := &File{}
	seen := map[[sha256.Size]byte]bool{}
	tenants := map[string]bool{}
	for i, e := range y.Tokens {
		at := fmt.Sprintf("tokens[%d]", i)
		var c Credential
		switch {
		case e.Token != "" && e.SHA256 != "":
			return nil, fmt.Errorf("%s: give token or sha256, not both", at)
		case e.Token != "":
			if len(e.Token) > MaxTokenLen {
				return nil, fmt.Errorf("%s: token of %d bytes, the most is %d", at, len(e.Token), MaxTokenLen)
			}
			c.Sum = sha256.Sum256([]byte(e.Token))
		case e.SHA256 != "":
			sum, err := hex.DecodeString(e.SHA256)
			if err != nil || len(sum) != sha256.Size {
				return nil, fmt.Errorf("%s: sha256 must be 64 hex digits", at)
			}
			copy(c.Sum[:], sum)
		default:
			return nil, fmt.Errorf("%s: needs a token or its sha256", at)
		}
		if seen[c.Sum] {
			return nil, fmt.Errorf("%s: the same token is listed twice", at)
		}
		seen[c.Sum] = true
		if len(e.Scopes) == 0 {
			return nil, fmt.Errorf("%s: needs scopes (read, write, admin, cluster)", at)
		}
		for _, s := range e.Scopes {
			sc, err := ParseScope(s)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", at, err)
			}
			c.Principal.Scopes |= sc
		}
		if e.Tenant != "" {
			if !tenantName.MatchString(e.Tenant) {
				return nil, fmt.Errorf("%s: tenant %q: want 1 to 64 letters, digits, '.', '_' or '-'", at, e.Tenant)
			}
			if c.Principal.Can(Cluster) {
				return nil, fmt.Errorf("%s: tenant %s may not hold the cluster scope: it is for nodes", at, e.Tenant)
			}
			c.Principal.Tenant = e.Tenant
			c.Principal.Tag = TagOf(e.Tenant)
			if !tenants[e.Tenant] {
				tenants[e.Tenant] = true
				f.Tenants = append(f.Tenants, e.Tenant)
			}
		}
		if c.Principal.Can(Cluster) && e.Token != "" && f.ClusterToken == "" {
			f.ClusterToken = e.Token
		}
		f.Credentials = append(f.Credentials, c)
	}
	switch {
	case len(f.Credentials) == 0:
		return nil, errors.New("no tokens")
	case len(f.Tenants) > 0 && len(y.Secret) < MinSecretLen:
		return nil, fmt.Errorf("secret: %d bytes, want at least %d (it derives every tenant's namespace salt; keep it the same on every node)", len(y.Secret), MinSecretLen)
	case f.ClusterToken == "":
		return nil, errors.New("no entry with the cluster scope given as a token: the node needs one to present to its peers")
	}
	f.LabelKey = []byte(SaltOf([]byte(y.Secret), "\x00metrics-labels"))
	f.peerKey = []byte(SaltOf([]byte(y.Secret), "\x00peer-vouch"))
	f.secret = []byte(y.Secret)
	for i := range f.Credentials {
		if p := &f.Credentials[i].Principal; p.Scoped() {
			p.Salt = SaltOf([]byte(y.Secret), p.Tenant)
		}
	}
	return f, nil
}
