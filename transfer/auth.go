package transfer

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/auth"
)

// MaxTokenLen is the longest bearer token, in bytes.
const MaxTokenLen = auth.MaxTokenLen

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

// checkHello decides a connection's hello (with the token as table): the
// principal the token authenticates, auth.Open when tokens is nil (no
// token required), or an ErrAuth error.
func checkHello(tokens *auth.Tokens, table []byte) (auth.Principal, error) {
	if tokens == nil {
		return auth.Open, nil
	}
	if len(table) == 0 {
		return auth.Principal{}, refused("this server requires a bearer token and the client sent none")
	}
	p, ok := tokens.Lookup(table)
	if !ok {
		return auth.Principal{}, refused("bearer token not accepted")
	}
	return p, nil
}

// requestScope returns ctx carrying who and the access request h is
// granted, or an ErrAuth error when who may not make it. A tenant's request
// is confined to its own blocks whatever its frame says; a node-wide
// principal's to node-wide blocks without the cluster scope, and with it,
// only when the frame is scoped (a node acting for a tenant).
func requestScope(ctx context.Context, who auth.Principal, h *header) (context.Context, error) {
	if err := checkScope(who, h); err != nil {
		return ctx, err
	}
	return confine(auth.WithPrincipal(ctx, who), who, h), nil
}

// checkScope is requestScope's check: an ErrAuth error when who may not
// make request h.
func checkScope(who auth.Principal, h *header) error {
	need := auth.Read
	if h.typ == typePutReq || h.typ == typePublishReq || h.typ == typeShmReserveReq || h.typ == typeClaimReq {
		need = auth.Write
	}
	if !who.Can(need) {
		return refused("a %s needs the %s scope, and this token has %s", h.typ, need, who.Scopes)
	}
	return nil
}

// confine returns ctx, which carries who, confined to the tenant of a
// scoped frame when who is a node acting for that tenant (node-wide, with
// the cluster scope). Any other principal keeps its own access whatever its
// frame says: a tenant its blocks, a node-wide principal without the
// cluster scope node-wide blocks (auth.Principal.Access), so that no frame
// widens what a token may read.
func confine(ctx context.Context, who auth.Principal, h *header) context.Context {
	if !who.Scoped() && who.Can(auth.Cluster) && h.scoped {
		ctx = auth.WithAccess(ctx, auth.Access{Scoped: true, Tag: h.tag})
	}
	return ctx
}
