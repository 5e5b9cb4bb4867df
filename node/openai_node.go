package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/openai"
)

// openaiNode is the node as the OpenAI-compatible API sees it.
type openaiNode struct{ n *Node }

var _ openai.Node = openaiNode{}

func (a openaiNode) ID() string { return a.n.opts.NodeID }

func (a openaiNode) Stopping() bool { return a.n.stopping.Load() }

func (a openaiNode) Foreground() (done func()) { return a.n.foreground() }

// Authorize checks HTTP credentials as the gRPC API's guard checks a call's.
func (a openaiNode) Authorize(header []string, what string, need auth.Scope) (auth.Principal, error) {
	who, err := a.n.guard.authorize(header, what, need)
	switch {
	case err == nil:
		return who, nil
	case status.Code(err) == codes.PermissionDenied:
		return who, &openai.AuthError{Forbidden: true, Msg: status.Convert(err).Message()}
	case len(header) == 0:
		// In HTTP's terms: the guard's own message speaks of gRPC metadata.
		return who, &openai.AuthError{Msg: `this node requires an API key: send the header "Authorization: Bearer <token>" ` +
			`(OpenAI SDKs: api_key=<token>, or the OPENAI_API_KEY variable)`}
	}
	return who, &openai.AuthError{Msg: `the API key (the "Authorization: Bearer" token) is not accepted by this node`}
}

// Flush waits for the cluster's pushes to owners; a node alone has none.
func (a openaiNode) Flush(ctx context.Context) error {
	if a.n.cluster == nil {
		return nil
	}
	return a.n.cluster.cluster.Flush(ctx)
}

// Peers returns the ids and HTTP addresses of the live members that run an
// engine, this node excepted, in random order.
func (a openaiNode) Peers() []openai.Peer {
	var out []openai.Peer
	for _, m := range a.enginePeers() {
		out = append(out, openai.Peer{ID: m.ID, Addr: m.Meta.HTTPAddr})
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// enginePeers returns the live members that run an engine, this node
// excepted.
func (a openaiNode) enginePeers() []gossip.MemberInfo {
	n := a.n
	if n.cluster == nil || n.cluster.members == nil {
		return nil
	}
	ms, _ := n.cluster.members.Members()
	self := n.cluster.members.LocalID()
	var out []gossip.MemberInfo
	for _, m := range ms {
		if m.ID != self && runsEngine(m) {
			out = append(out, m)
		}
	}
	return out
}

// Lenders returns the engine peers that advertise a backlog in gossip.
func (a openaiNode) Lenders() []openai.Lender {
	n := a.n
	if n.cluster == nil || n.cluster.members == nil {
		return nil
	}
	backlogs := n.cluster.members.Backlogs()
	if len(backlogs) == 0 {
		return nil
	}
	self := n.cluster.members.LocalID()
	var out []openai.Lender
	for id, b := range backlogs {
		m, ok := n.cluster.members.Member(id)
		if !ok || id == self || b <= 0 || !runsEngine(m) {
			continue
		}
		out = append(out, openai.Lender{Addr: m.Meta.HTTPAddr, Backlog: b})
	}
	return out
}

// runsEngine reports whether member m serves the OpenAI API with an engine.
func runsEngine(m gossip.MemberInfo) bool {
	return m.Meta.HTTPAddr != "" && m.Meta.Role != gossip.RoleRouter && m.Meta.Role != gossip.RoleStore
}

// AdvertiseBacklog gossips this node's backlog; a node alone has nobody
// to tell.
func (a openaiNode) AdvertiseBacklog(b int) {
	n := a.n
	if n.cluster == nil || n.cluster.members == nil {
		return
	}
	if err := n.cluster.members.SetBacklog(b); err != nil {
		n.log.Warn("queue: cannot advertise the backlog", "err", err)
	}
}

// Vouch vouches for p toward a peer with the tokens file in force; "" in
// open or shared-token mode, where the cluster credential is all a peer
// needs (there are no tenants).
func (a openaiNode) Vouch(p auth.Principal, what string) string {
	f := a.n.guard.file.Load()
	if f == nil {
		return ""
	}
	return f.Vouch(p, what, time.Now())
}

// Vouched checks a peer's vouch with the tokens file in force.
func (a openaiNode) Vouched(v, what string) (auth.Principal, error) {
	f := a.n.guard.file.Load()
	if f == nil {
		return auth.Principal{}, fmt.Errorf("%w: this node has no tokens file", auth.ErrVouch)
	}
	return f.Vouched(v, what, time.Now())
}

// Tenant returns the tenant's principal from the tokens file in force.
func (a openaiNode) Tenant(name string) (auth.Principal, bool) {
	f := a.n.guard.file.Load()
	if f == nil || name == "" {
		return auth.Principal{}, false
	}
	for _, c := range f.Credentials {
		if c.Principal.Tenant == name {
			return c.Principal, true
		}
	}
	return auth.Principal{}, false
}
