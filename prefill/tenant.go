package prefill

import (
	"context"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Tenant is whose prompt a prefill runs: its blocks are looked up, read and
// published in the engine's namespace salted for the tenant
// (auth.SaltedWith), and published with the tenant's tag, so that two
// tenants' prompts never share a block. The zero Tenant is none.
type Tenant struct {
	Salt string // the salt the node derives for the tenant (auth.Principal.Salt)
	Tag  uint64 // the tag its blocks carry (auth.TagOf)
}

type tenantKey struct{}

// WithTenant returns ctx for a prefill run for tenant t. The node sets it
// from the caller's credentials; the cache the engine reads through must
// confine reads to the tenant too (the node's does, by the access its
// request context carries).
func WithTenant(ctx context.Context, t Tenant) context.Context {
	return context.WithValue(ctx, tenantKey{}, t)
}

// scope is the namespace and tag one prefill's blocks are keyed and
// written under.
type scope struct {
	ns   prefixhash.Namespace
	root prefixhash.Key // ns.Root()
	tag  uint64
}

func (e *Engine) scopeOf(ctx context.Context) scope {
	t, _ := ctx.Value(tenantKey{}).(Tenant)
	if t.Salt == "" {
		return scope{ns: e.ns, root: e.root, tag: t.Tag}
	}
	ns := e.ns
	ns.TenantSalt = auth.SaltedWith(t.Salt, ns.TenantSalt)
	return scope{ns: ns, root: ns.Root(), tag: t.Tag}
}

// RunAs returns ctx for a run on behalf of p: a tenant's prompt is keyed in
// its salted namespace and published with its tag (WithTenant), and the
// cache is asked with the tenant's access (auth.WithAccess), so that it
// reads the tenant's blocks only. A node-wide principal runs unsalted and
// reads node-wide blocks only (auth.NodeWide).
func RunAs(ctx context.Context, p auth.Principal) context.Context {
	if !p.Scoped() {
		// Node-wide: node-wide blocks only, never what a tenant wrote
		// under a node-wide key (node-wide keys are not salted).
		return auth.WithAccess(ctx, auth.NodeWide)
	}
	ctx = auth.WithAccess(ctx, p.Access())
	return WithTenant(ctx, Tenant{Salt: p.Salt, Tag: p.Tag})
}
