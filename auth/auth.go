package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Scope is a set of rights.
type Scope uint8

// The scopes a token may hold.
const (
	Read    Scope = 1 << iota // lookups, gets, exists, block info, stats
	Write                     // puts, publishes, prefills that publish
	Admin                     // quotas and drops
	Cluster                   // node to node: the peer service, unscoped data-plane requests

	All = Read | Write | Admin | Cluster
)

var scopeNames = [...]string{"read", "write", "admin", "cluster"}

// String returns the scopes as a comma-separated list ("read,write").
func (s Scope) String() string {
	var names []string
	for i, n := range scopeNames {
		if s&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

// ParseScope parses one scope name.
func ParseScope(name string) (Scope, error) {
	for i, n := range scopeNames {
		if strings.EqualFold(name, n) {
			return 1 << i, nil
		}
	}
	return 0, fmt.Errorf("auth: unknown scope %q (want read, write, admin or cluster)", name)
}

// Principal is who a caller authenticated as.
type Principal struct {
	// Tenant is the tenant's name; empty for a node-wide principal (open
	// mode, a shared token, an operator or a node of the cluster).
	Tenant string
	// Scopes are the caller's rights.
	Scopes Scope
	// Tag is TagOf(Tenant): what the tenant's blocks carry in their header.
	Tag uint64
	// Salt is the namespace salt the node derives for the tenant (see
	// Namespace); empty for a node-wide principal.
	Salt string
}

// Open is the principal of every caller of a node that asks for no token.
var Open = Principal{Scopes: All}

// Can reports whether p holds every scope in s.
func (p Principal) Can(s Scope) bool { return p.Scopes&s == s }

// Scoped reports whether p is a tenant, confined to its own namespaces.
func (p Principal) Scoped() bool { return p.Tenant != "" }

// Access returns what p's requests may touch: its tenant's blocks; for a
// node-wide principal that holds the cluster scope (the nodes themselves,
// open mode, a shared token), every block; for any other node-wide
// principal (an operator's or a worker's token of a tokens file), node-wide
// blocks only (tag 0). A tenant can write blocks under any key it can
// compute, node-wide keys included (they are not salted), so a node-wide
// reader that took every block could be served a tenant's bytes for its
// own prompt.
func (p Principal) Access() Access {
	switch {
	case p.Scoped():
		return Access{Scoped: true, Tag: p.Tag}
	case p.Can(Cluster):
		return Access{}
	}
	return NodeWide
}

// NodeWide is the access of node-wide data alone: blocks no tenant wrote.
var NodeWide = Access{Scoped: true, Tag: 0}

// String is the principal as logs show it: "tenant acme (read,write)" or
// "node-wide (read,write,admin,cluster)".
func (p Principal) String() string {
	if p.Scoped() {
		return "tenant " + p.Tenant + " (" + p.Scopes.String() + ")"
	}
	return "node-wide (" + p.Scopes.String() + ")"
}

// saltSep separates the node's tenant salt from the caller's own salt in a
// tenant's namespace salt.
const saltSep = ":"

// Namespace returns ns as the node stores it for p: for a tenant, its
// salt is the tenant's salt, then the caller's own (SaltedWith), so a
// tenant may split its data further but never reach another's. A client
// that computes keys itself applies the same rule with the salt the node's
// WhoAmI returned, and may send the namespace salted or not: the rule
// leaves a salted namespace as it is. For a node-wide principal ns is
// unchanged.
func (p Principal) Namespace(ns prefixhash.Namespace) (prefixhash.Namespace, error) {
	if !p.Scoped() {
		return ns, nil
	}
	salted := SaltedWith(p.Salt, ns.TenantSalt)
	if len(salted) > prefixhash.MaxSaltLen {
		return ns, fmt.Errorf("auth: tenant_salt: %d bytes with the tenant's salt, the limit is %d", len(salted), prefixhash.MaxSaltLen)
	}
	ns.TenantSalt = salted
	return ns, nil
}

// SaltedWith returns the namespace salt of a tenant whose node-derived salt
// is tenantSalt and whose own salt is own: tenantSalt + ":" + own, or own
// when it already starts with tenantSalt + ":" (so applying it twice
// changes nothing), or own alone when tenantSalt is empty.
func SaltedWith(tenantSalt, own string) string {
	if tenantSalt == "" || strings.HasPrefix(own, tenantSalt+saltSep) {
		return own
	}
	return tenantSalt + saltSep + own
}

// TagOf returns the tag that blocks of tenant carry: a 64-bit digest of its
// name, never 0, which stands for "no tenant". Tags are not secret: what
// keeps a tenant's keys out of reach is its salt.
func TagOf(tenant string) uint64 {
	if tenant == "" {
		return 0
	}
	sum := sha256.Sum256([]byte("kvmesh/tenant-tag/v1\x00" + tenant))
	return max(binary.LittleEndian.Uint64(sum[:8]), 1)
}

// saltLen is the length of a derived salt in bytes (it is hex: twice that
// in characters).
const saltLen = 16

// SaltOf derives tenant's namespace salt from the cluster's secret: HMAC-
// SHA-256, 128 bits in hex. Without the secret no one can compute another
// tenant's namespaces, so keys never give one tenant's prompts away to
// another, even a tenant that guesses the prompt.
func SaltOf(secret []byte, tenant string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("kvmesh/tenant-salt/v1\x00" + tenant))
	return hex.EncodeToString(m.Sum(nil)[:saltLen])
}

// Access is what one request may touch: with Scoped, only blocks whose tag
// is Tag (0: node-wide blocks, NodeWide); without, any block (the cluster's
// principals and in-process callers).
type Access struct {
	Scoped bool
	Tag    uint64
}

// Allows reports whether a block with tag may be served to, or stored by,
// a request with access a.
func (a Access) Allows(tag uint64) bool { return !a.Scoped || a.Tag == tag }

type accessKey struct{}
type principalKey struct{}

// WithAccess returns ctx carrying a. Requests of a node-wide principal on
// behalf of a tenant (a node serving a tenant's read from its peers) carry
// the tenant's access, so the peers check it too.
func WithAccess(ctx context.Context, a Access) context.Context {
	return context.WithValue(ctx, accessKey{}, a)
}

// AccessFrom returns the access ctx carries. A context that carries none
// is an in-process caller's: unscoped. Every network entry point of a node
// sets it.
func AccessFrom(ctx context.Context) Access {
	a, _ := ctx.Value(accessKey{}).(Access)
	return a
}

// WithPrincipal returns ctx carrying p and p's access.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return WithAccess(context.WithValue(ctx, principalKey{}, p), p.Access())
}

// PrincipalFrom returns the principal ctx carries, Open when none.
func PrincipalFrom(ctx context.Context) Principal {
	if p, ok := ctx.Value(principalKey{}).(Principal); ok {
		return p
	}
	return Open
}
