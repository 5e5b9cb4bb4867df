package transfer

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// scopeSource is a memSource that records the access each request was
// granted.
type scopeSource struct {
	*memSource
	mu   sync.Mutex
	seen []auth.Access
}

func (s *scopeSource) note(ctx context.Context) {
	s.mu.Lock()
	s.seen = append(s.seen, auth.AccessFrom(ctx))
	s.mu.Unlock()
}

func (s *scopeSource) last(t *testing.T) auth.Access {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) == 0 {
		t.Fatal("the source saw no request")
	}
	return s.seen[len(s.seen)-1]
}

func (s *scopeSource) Acquire(ctx context.Context, keys []prefixhash.Key, vals [][]byte, st []Status) func() {
	s.note(ctx)
	return s.memSource.Acquire(ctx, keys, vals, st)
}

func (s *scopeSource) Put(ctx context.Context, keys []prefixhash.Key, vals [][]byte, st []Status) {
	s.note(ctx)
	s.memSource.Put(ctx, keys, vals, st)
}

// TestRequestScope: a tenant's connection is confined to its tenant's tag
// whatever its frames say; a node-wide principal's request is confined
// when its frame is scoped (a node acting for a tenant) and unscoped
// otherwise; a token without the write scope cannot put. Over TCP and
// shared memory alike.
func TestRequestScope(t *testing.T) {
	acme := auth.Principal{Tenant: "acme", Scopes: auth.Read, Tag: auth.TagOf("acme")}
	creds, _ := auth.Shared("node")
	creds = append(creds, auth.Credential{Sum: sha("acme"), Principal: acme})
	tokens, err := auth.NewCredentials(creds)
	if err != nil {
		t.Fatal(err)
	}
	src := &scopeSource{memSource: newMemSource()}
	keys := fill(src.memSource, []int{100})
	srv, addr := startScopeServer(t, src, tokens)
	_ = srv
	shmPath := startShmScopeServer(t, src, tokens)

	beta := auth.Access{Scoped: true, Tag: auth.TagOf("beta")}
	type getter func(context.Context, []prefixhash.Key) (*Result, error)
	dialers := map[string]func(token string) (getter, func(context.Context, []prefixhash.Key, [][]byte) ([]Status, error)){
		"tcp": func(token string) (getter, func(context.Context, []prefixhash.Key, [][]byte) ([]Status, error)) {
			c := newClient(t, addr, &ClientOptions{Token: token})
			return c.Get, c.Put
		},
		"shm": func(token string) (getter, func(context.Context, []prefixhash.Key, [][]byte) ([]Status, error)) {
			c, err := DialShm(context.Background(), shmPath, &ShmClientOptions{Token: token})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c.Get, c.Put
		},
	}
	for name, dial := range dialers {
		ctx := context.Background()
		get, put := dial("acme")
		for _, c := range []context.Context{ctx, auth.WithAccess(ctx, beta), auth.WithAccess(ctx, auth.Access{})} {
			r, err := get(c, keys)
			if err != nil {
				t.Fatalf("%s: tenant get: %v", name, err)
			}
			r.Release()
			if a := src.last(t); a != acme.Access() {
				t.Errorf("%s: a tenant's request ran with access %+v, want its own %+v", name, a, acme.Access())
			}
		}
		if _, err := put(ctx, keys, [][]byte{make([]byte, 10)}); !errors.Is(err, ErrAuth) {
			t.Errorf("%s: a read-only tenant's put: %v, want ErrAuth", name, err)
		}
		get, put = dial("node")
		for _, want := range []auth.Access{{}, beta} {
			r, err := get(auth.WithAccess(ctx, want), keys)
			if err != nil {
				t.Fatalf("%s: node get: %v", name, err)
			}
			r.Release()
			if a := src.last(t); a != want {
				t.Errorf("%s: a node-wide request scoped %+v ran with %+v", name, want, a)
			}
		}
		if _, err := put(auth.WithAccess(ctx, beta), keys, [][]byte{make([]byte, 10)}); err != nil {
			t.Fatalf("%s: node put: %v", name, err)
		}
		if a := src.last(t); a != beta {
			t.Errorf("%s: a scoped put ran with %+v", name, a)
		}
	}
}

func sha(s string) [32]byte {
	creds, _ := auth.Shared(s)
	return creds[0].Sum
}

func startScopeServer(t *testing.T, src *scopeSource, tokens *auth.Tokens) (*Server, string) {
	t.Helper()
	srv, err := NewServer(src, src, &ServerOptions{Tokens: tokens}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, ln.String()
}

func startShmScopeServer(t *testing.T, src *scopeSource, tokens *auth.Tokens) string {
	t.Helper()
	srv, err := NewShmServer(src, src, &ShmServerOptions{Tokens: tokens}, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/shm.sock"
	if err := srv.Listen(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return path
}
