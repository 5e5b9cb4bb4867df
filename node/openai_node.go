package node

import (
	"context"
	"math/rand/v2"

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
	if err != nil {
		return who, &openai.AuthError{Forbidden: status.Code(err) == codes.PermissionDenied, Msg: status.Convert(err).Message()}
	}
	return who, nil
}

// Flush waits for the cluster's pushes to owners; a node alone has none.
func (a openaiNode) Flush(ctx context.Context) error {
	if a.n.cluster == nil {
		return nil
	}
	return a.n.cluster.cluster.Flush(ctx)
}

// Peers returns the HTTP addresses of the live members that run an
// engine, this node excepted, in random order.
func (a openaiNode) Peers() []string {
	n := a.n
	if n.cluster == nil || n.cluster.members == nil {
		return nil
	}
	ms, _ := n.cluster.members.Members()
	self := n.cluster.members.LocalID()
	var out []string
	for _, m := range ms {
		if m.ID == self || m.Meta.HTTPAddr == "" || m.Meta.Role == gossip.RoleRouter || m.Meta.Role == gossip.RoleStore {
			continue
		}
		out = append(out, m.Meta.HTTPAddr)
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}
