package client

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// Session is whom the node authenticated the client's token as (WhoAmI).
type Session struct {
	// Tenant is the tenant; empty for a node-wide principal (an open node,
	// a shared token, an operator's token).
	Tenant string
	// Scopes are the rights the token holds ("read", "write", ...).
	Scopes []string
	// Salt is the salt the node applies to the tenant's namespaces;
	// Namespace applies it for keys the client computes.
	Salt string
	// Tag is what the tenant's blocks carry in their header.
	Tag uint64
}

// Session returns whom the node authenticates this client as, asking it
// once (later calls answer from memory). A node too old to say is taken
// to apply no salt.
func (c *Client) Session(ctx context.Context) (Session, error) {
	c.session.Lock()
	known, s := c.session.known, c.session.s
	c.session.Unlock()
	if known {
		return s, nil
	}
	var resp *kvmeshv1.WhoAmIResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.WhoAmI(ctx, &kvmeshv1.WhoAmIRequest{})
		return err
	})
	switch {
	case status.Code(err) == codes.Unimplemented:
		resp = &kvmeshv1.WhoAmIResponse{}
	case err != nil:
		return Session{}, callError("who am i", err)
	}
	s = Session{Tenant: resp.GetTenant(), Scopes: resp.GetScopes(), Salt: resp.GetNamespaceSalt(), Tag: resp.GetTenantTag()}
	c.session.Lock()
	c.session.s, c.session.known = s, true
	c.session.Unlock()
	return s, nil
}

// Namespace returns ns as the node keys it for this client: for a tenant,
// with the tenant's salt before ns's own (auth.SaltedWith). Block keys of
// a tenant's prompts are keys of this namespace; the client's calls apply
// it themselves, so callers need it only to compute keys on their own.
func (c *Client) Namespace(ctx context.Context, ns prefixhash.Namespace) (prefixhash.Namespace, error) {
	if err := checkNamespace(ns); err != nil {
		return ns, err
	}
	s, err := c.Session(ctx)
	if err != nil {
		return ns, err
	}
	p := auth.Principal{Tenant: s.Tenant, Salt: s.Salt}
	if s.Salt == "" {
		p.Tenant = "" // nothing to apply
	}
	out, err := p.Namespace(ns)
	if err != nil {
		return ns, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return out, nil
}
