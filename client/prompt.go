package client

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Prompt says which blocks a call (Lookup, Get, View, Put) is about, and
// which data of each: the full blocks of a prompt's tokens, or blocks by
// key; the whole of each block, or a rank's part of it. What a call does
// with them, beyond its verb, is a CallOption. As the data model grows
// (a model's KV-cache groups, objects under names), Prompt gains a field;
// the Client gains no method.
type Prompt struct {
	// Tokens are the prompt's token ids. Its full blocks are the blocks the
	// call is about (the tail after the last full block is never cached);
	// a read by tokens reads the longest cached prefix and checks every
	// block holds the prompt's tokens and parent. At most one of Tokens and
	// Keys is set.
	Tokens []uint32
	// Extra are extra keys of the prompt's blocks (prefixhash.ExtraKeys,
	// such as a multimodal input's hash and offset): Extra[i] are block
	// i's, which its key covers; Extra may be shorter than the blocks, and
	// nil entries have none. Equal tokens with other extra keys are other
	// blocks. Tokens only.
	Extra []prefixhash.ExtraKeys
	// Parent, when not nil, is the chain Tokens continue: the blocks of a
	// conversation's earlier turns, hashed once (prefixhash.NewChain of
	// the namespace Client.Namespace returns, extended by whole blocks).
	// The call is then about Tokens' blocks, which are hashed, counted,
	// indexed and placed in the cluster as blocks Parent.Len() on of the
	// whole prompt; Lookup counts one of them only when every block before
	// it, Parent's included, is cached. Tokens only. A Chain keys blocks
	// without extra keys: Extra are Tokens' blocks' alone.
	Parent *prefixhash.Chain
	// Keys name blocks by key instead of by tokens (a Lookup's Keys, for
	// example). Get and View read each of them, misses included, and
	// verify each block against its key; Lookup takes them as a prompt's
	// chain from its first block. Put needs Tokens.
	Keys []prefixhash.Key
	// Rank is the parallel rank of a model instance spread over GPUs whose
	// part of each block the call reads or writes (its KV heads, its
	// layers: Rank.Part). The zero Rank is the whole block. Lookup counts
	// complete blocks whatever the Rank.
	Rank Rank
	// Names name objects instead of blocks: values of the caller's under
	// names of the caller's (1 to prefixhash.MaxObjectName bytes of UTF-8)
	// in the namespace, beside its blocks (object.go). Put stores them
	// (Retention, Upsert, PieceBytes), Get reads them (Into, Each), Remove
	// removes them, Retain pins or leases them; Lookup and View do not
	// take them. Not with Tokens or Keys.
	Names []string
	// Group, in a namespace with groups (a hybrid model's cache:
	// prefixhash.Groups), is the group whose records a Put writes: its
	// payloads are the group's records of the prompt's blocks (with Rank,
	// the rank's part of them: block.RankGroupPart). Get and Lookup by
	// Tokens answer for every group (the hit rule), whatever Group; by Keys
	// the keys are records' keys already (prefixhash.GroupKey). 0 outside
	// such a namespace.
	Group int
}

// A CallOption changes how one call does its work, in grpc-go's style:
// Get(ctx, ns, p, client.Into(bufs)). An option a verb does not take is
// ErrInvalid, before anything is sent.
type CallOption struct {
	name  string
	verbs string // the verbs that take it, for the error
	apply func(*callOptions)
}

// callOptions are a call's options, applied.
type callOptions struct {
	into       [][]byte // Get: the caller's buffers, with intoSet
	intoSet    bool
	each       func(Block) error // Get: the caller's callback
	sendTokens bool              // Lookup: send the tokens, not the chain
	// Put of objects (Prompt.Names).
	retention  block.Retention
	upsert     bool
	pieceBytes int
}

// Into makes Get read into buffers the caller owns: block i's payload (or
// the Prompt's Rank's part of it) into dst[i], which must be that long
// (ns.BlockBytes(), or the part's block.Layout.PartLen). Get then reads at
// most len(dst) blocks, writes into dst only during the call and keeps no
// reference to it, and the Blocks it returns have their Payload in dst.
// Blocks are copied into dst from the transport's own buffer (or the node's
// shared memory), so a worker that reads every prompt into the same buffers
// allocates nothing per block. Buffers past the blocks returned hold
// unspecified bytes.
func Into(dst [][]byte) CallOption {
	return CallOption{name: "Into", verbs: "get", apply: func(o *callOptions) { o.into, o.intoSet = dst, true }}
}

// Each makes Get hand each block to fn as it arrives, in order, instead of
// returning them: b.Payload and b.Tokens are valid only during fn (they
// may alias a buffer reused for the next block, or the node's shared
// memory); copy what must outlive it. A read of many blocks then holds one
// at a time, and an error from fn ends it (Get returns the error). Get
// returns no blocks. Not with Into.
func Each(fn func(b Block) error) CallOption {
	return CallOption{name: "Each", verbs: "get", apply: func(o *callOptions) { o.each = fn }}
}

// SendTokens makes Lookup send the prompt's tokens, as the node's API first
// had it and as clients that cannot hash do: the node hashes them and lists
// every cached block, so the answer's Keys are the cached prefix's only.
// It costs several times the default (the chain, 16 bytes a block, and
// counts back) for long prompts; it serves comparisons (kvmesh bench
// lookup) and checks of a node's hashing against the client's. Tokens
// without Parent only.
func SendTokens() CallOption {
	return CallOption{name: "SendTokens", verbs: "lookup", apply: func(o *callOptions) { o.sendTokens = true }}
}

// applyOptions applies opts to a call of verb, refusing those it does not
// take.
func applyOptions(verb string, opts []CallOption) (callOptions, error) {
	var o callOptions
	for _, opt := range opts {
		if opt.apply == nil {
			return o, fmt.Errorf("%w: the zero CallOption", ErrInvalid)
		}
		if opt.verbs != verb {
			return o, fmt.Errorf("%w: option %s is for %s, not %s", ErrInvalid, opt.name, opt.verbs, verb)
		}
		opt.apply(&o)
	}
	return o, nil
}

// target is a Prompt made ready to send: its namespace as the node keys it
// for this client, its blocks' keys and the part of each block.
type target struct {
	p    Prompt
	ns   prefixhash.Namespace // Client.Namespace of the caller's
	part block.Part           // zero: the whole block
	// keys are the blocks': Prompt.Keys, or the keys of Tokens' full blocks.
	keys []prefixhash.Key
	// parent is what Tokens' first block chains from: the namespace's root
	// or Parent's last block.
	parent prefixhash.Link
	// before are Parent's keys (none without Parent).
	before []prefixhash.Key
	// links are the links of the blocks by tokens (what each one's child
	// chains from), when newTarget was asked for them.
	links []prefixhash.Link
	// group is Prompt.Group in a namespace with groups, -1 outside one.
	group int
}

// byTokens reports whether the prompt names its blocks by tokens.
func (t *target) byTokens() bool { return t.p.Keys == nil }

// newTarget checks p (and ns, and the rank) before any I/O but the
// namespace's salt (Client.Namespace, asked once), and computes its keys,
// and its links when withLinks is set (a put's).
func (c *Client) newTarget(ctx context.Context, ns prefixhash.Namespace, p Prompt, withLinks bool) (*target, error) {
	part, group, err := promptPart(ns, p)
	if err != nil {
		return nil, err
	}
	switch {
	case p.Names != nil:
		return nil, fmt.Errorf("%w: a Prompt's Names (objects) are for Get, Put, Remove and Retain", ErrInvalid)
	case p.Keys != nil && p.Tokens != nil:
		return nil, fmt.Errorf("%w: Prompt has Tokens and Keys; name its blocks one way", ErrInvalid)
	case p.Keys != nil && (p.Extra != nil || p.Parent != nil):
		return nil, fmt.Errorf("%w: Prompt.Extra and Parent go with Tokens, not Keys", ErrInvalid)
	}
	ns, err = c.Namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	t := &target{p: p, ns: ns, part: part, parent: ns.RootLink(), group: group}
	if p.Keys != nil {
		t.keys = p.Keys
		return t, nil
	}
	if len(p.Extra) > len(p.Tokens)/ns.BlockTokens {
		return nil, fmt.Errorf("%w: %d blocks have extra keys, the prompt has %d full blocks", ErrInvalid, len(p.Extra), len(p.Tokens)/ns.BlockTokens)
	}
	for i, e := range p.Extra {
		if err := ns.CheckExtra(e); err != nil {
			return nil, fmt.Errorf("%w: block %d: %w", ErrInvalid, i, err)
		}
	}
	if p.Parent != nil {
		if err := t.continueParent(); err != nil {
			return nil, err
		}
	}
	if !withLinks && ns.Scheme == prefixhash.SchemeKVMesh && noExtra(p.Extra) {
		// The fast path: no link but the key.
		t.keys = prefixhash.AppendKeys(make([]prefixhash.Key, 0, len(p.Tokens)/ns.BlockTokens), t.parent.Key(), ns.BlockTokens, p.Tokens)
		return t, nil
	}
	if t.links, err = t.chainLinks(); err != nil {
		return nil, err
	}
	t.keys = make([]prefixhash.Key, len(t.links))
	for i, l := range t.links {
		t.keys[i] = l.Key()
	}
	return t, nil
}

// continueParent checks that Parent is a chain of t's namespace that ends
// at a block boundary, and chains t's blocks from it.
func (t *target) continueParent() error {
	ch := t.p.Parent
	switch {
	case ch.Root() != t.ns.Root():
		return fmt.Errorf("%w: Prompt.Parent is a chain of another namespace than %s (build it from the namespace Client.Namespace returns)", ErrInvalid, t.ns)
	case ch.Tokens() != ch.Len()*t.ns.BlockTokens:
		return fmt.Errorf("%w: Prompt.Parent ends in a partial block (%d tokens in blocks of %d)", ErrInvalid, ch.Tokens(), t.ns.BlockTokens)
	}
	t.parent, t.before = ch.Last(), ch.Keys()
	return nil
}

// chainLinks returns the links of t's blocks by tokens.
func (t *target) chainLinks() ([]prefixhash.Link, error) {
	ns, b := t.ns, t.ns.BlockTokens
	if t.p.Parent == nil {
		links, err := prefixhash.LinksExtra(ns, t.p.Tokens, t.p.Extra)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return links, nil
	}
	out := make([]prefixhash.Link, 0, len(t.p.Tokens)/b)
	link := t.parent
	for i := 0; (i+1)*b <= len(t.p.Tokens); i++ {
		var e prefixhash.ExtraKeys
		if i < len(t.p.Extra) {
			e = t.p.Extra[i]
		}
		link = prefixhash.BlockLink(ns.Scheme, link, t.p.Tokens[i*b:(i+1)*b], ns.BlockExtra(len(t.before)+i == 0, e))
		out = append(out, link)
	}
	return out, nil
}

// chain returns the whole prompt's chain from its first block: Parent's keys,
// then t's.
func (t *target) chain() []prefixhash.Key {
	if len(t.before) == 0 {
		return t.keys
	}
	return append(slices.Clip(t.before), t.keys...)
}

// chunkKeys returns the chunk key of each of t's blocks (nil when unknown:
// the node then asks every member). Blocks named by key have none: they
// need not be a prompt's chain.
func (c *Client) chunkKeysOf(ctx context.Context, t *target) []prefixhash.Key {
	if !t.byTokens() {
		return nil
	}
	cks := c.chunkKeys(ctx, t.ns, t.chain())
	if cks == nil {
		return nil
	}
	return cks[len(t.before):]
}

// holds reports whether b, read as block b.Index of t's prompt by tokens,
// holds the prompt's tokens of that block and chains from its parent.
func (t *target) holds(b Block) bool {
	parent := t.parent.Key()
	if b.Index > 0 {
		parent = t.keys[b.Index-1]
	}
	bt := t.ns.BlockTokens
	return b.Parent == parent && slices.Equal(b.Tokens, t.p.Tokens[b.Index*bt:(b.Index+1)*bt])
}

func noExtra(extra []prefixhash.ExtraKeys) bool {
	for _, e := range extra {
		if len(e) > 0 {
			return false
		}
	}
	return true
}
