package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// Namespaces with groups (hybrid models: prefixhash.Groups). A Put writes
// one group's records (Prompt.Group); a Get by Tokens reads exactly what
// resuming at the hit rule's prefix needs, every group's records of it
// (each Block names its Group); a Lookup says what each group allows
// (Lookup.Groups). The verbs are the plain namespaces'.

// GroupLookup is one group's part of a Lookup of a namespace with groups.
type GroupLookup struct {
	Kind prefixhash.GroupKind
	// Blocks is, for a full or indexer group, its leading blocks held; for
	// a sliding or state group, the longest prefix (no longer than any full
	// group's) at which this group alone would let a reader resume.
	Blocks int
}

// GroupsProto converts a hybrid namespace's groups (prefixhash.Groups) for
// the gRPC API; nil for none.
func GroupsProto(gs prefixhash.Groups) []*kvmeshv1.Group {
	var out []*kvmeshv1.Group
	for _, g := range gs.All() {
		pb := &kvmeshv1.Group{Kind: kvmeshv1.GroupKind(g.Kind), Window: uint32(g.Window), KvLayout: kvmeshv1.KVLayout(g.Layout),
			Dtype: kvmeshv1.Dtype(g.DType), KvHeads: uint32(g.KVHeads), HeadDim: uint32(g.HeadDim), LatentDim: uint32(g.LatentDim),
			StateBytes: uint32(g.StateBytes), Scales: kvmeshv1.Scales(g.Scales)}
		for _, l := range g.Layers {
			pb.Layers = append(pb.Layers, uint32(l))
		}
		out = append(out, pb)
	}
	return out
}

// groupsOf converts a namespace's groups from the gRPC API (the inverse
// of GroupsProto).
func groupsOf(pbs []*kvmeshv1.Group) (prefixhash.Groups, error) {
	gs := make([]prefixhash.Group, len(pbs))
	for i, pb := range pbs {
		gs[i] = prefixhash.Group{Kind: prefixhash.GroupKind(pb.GetKind()), Window: int(pb.GetWindow()), Layout: prefixhash.KVLayout(pb.GetKvLayout()),
			DType: prefixhash.DType(pb.GetDtype()), KVHeads: int(pb.GetKvHeads()), HeadDim: int(pb.GetHeadDim()), LatentDim: int(pb.GetLatentDim()),
			StateBytes: int(pb.GetStateBytes()), Scales: prefixhash.Scales(pb.GetScales())}
		for _, l := range pb.GetLayers() {
			gs[i].Layers = append(gs[i].Layers, int(l))
		}
	}
	if len(gs) == 0 {
		return prefixhash.Groups{}, nil
	}
	return prefixhash.NewGroups(gs...)
}

// groupLookups converts a Lookup answer's groups.
func groupLookups(resp *kvmeshv1.LookupResponse) []GroupLookup {
	var out []GroupLookup
	for _, g := range resp.GetGroups() {
		out = append(out, GroupLookup{Kind: prefixhash.GroupKind(g.GetKind()), Blocks: int(g.GetBlocks())})
	}
	return out
}

// promptPart checks p's Group and Rank against ns and returns the part of
// each record the call moves (zero: the whole record) and the group (-1
// outside a namespace with groups).
func promptPart(ns prefixhash.Namespace, p Prompt) (block.Part, int, error) {
	if err := checkNamespace(ns); err != nil {
		return block.Part{}, -1, err
	}
	if ns.Groups.IsZero() {
		if p.Group != 0 {
			return block.Part{}, -1, fmt.Errorf("%w: Prompt.Group %d: namespace %s has no groups", ErrInvalid, p.Group, ns)
		}
		part, err := rankPart(ns, p.Rank)
		return part, -1, err
	}
	if p.Group < 0 || p.Group >= ns.Groups.Len() {
		return block.Part{}, -1, fmt.Errorf("%w: Prompt.Group %d is not a group of %s (0..%d)", ErrInvalid, p.Group, ns, ns.Groups.Len()-1)
	}
	tp, pp := p.Rank.sizes()
	part, err := block.RankGroupPart(ns, p.Group, p.Rank.TPRank, tp, p.Rank.PPRank, pp)
	switch {
	case err != nil:
		return block.Part{}, -1, fmt.Errorf("%w: rank %s: %w", ErrInvalid, p.Rank, err)
	case part.Empty():
		return block.Part{}, -1, fmt.Errorf("%w: rank %s holds none of group %d's layers: it has nothing of it to move", ErrInvalid, p.Rank, p.Group)
	case part == block.GroupLayout(ns, p.Group).Whole():
		part = block.Part{}
	}
	return part, p.Group, nil
}

// itemPart returns the part a put item holds: its own, or the whole record.
func itemPart(ns prefixhash.Namespace, it putItem) block.Part {
	if it.part != (block.Part{}) {
		return it.part
	}
	return block.RecordLayout(ns, it.group).Whole()
}

// recordBytes returns the payload size of ns's largest record: a block's,
// or the largest group's.
func recordBytes(ns prefixhash.Namespace) int {
	if ns.Groups.IsZero() {
		return ns.BlockBytes()
	}
	n := 0
	for g := range ns.Groups.Len() {
		n = max(n, ns.GroupBytes(g))
	}
	return n
}

// checkPayloadLen refuses buf, the i-th of what, unless it is as long as
// t's part of one of its records.
func (t *target) checkPayloadLen(what string, i int, buf []byte) error {
	if t.group < 0 {
		return checkPayloadLen(t.ns, t.part, what, i, buf)
	}
	lay := block.GroupLayout(t.ns, t.group)
	part := t.part
	if part == (block.Part{}) {
		part = lay.Whole()
	}
	if want := lay.PartLen(t.ns.BlockTokens, part); len(buf) != want {
		field := "payload"
		if lay.KV == prefixhash.StateKV {
			field = fmt.Sprintf("groups[%d].state_bytes", t.group)
		}
		return fmt.Errorf("%w: %s: %s[%d] is %d bytes; group %d's records (%s) hold %d", ErrInvalid, field, what, i, len(buf), t.group, part, want)
	}
	return nil
}

// recordLayout returns the layout of a record a BatchGet frame names by
// its group (the index plus one; 0: none), and the group (-1 for none).
func recordLayout(ns prefixhash.Namespace, group uint32) (block.Layout, int, error) {
	switch {
	case group == 0 && ns.Groups.IsZero():
		return block.LayoutOf(ns), -1, nil
	case group == 0 || int(group) > ns.Groups.Len():
		return block.Layout{}, -1, fmt.Errorf("a record of group %d, namespace %s has %d groups", int(group)-1, ns, ns.Groups.Len())
	}
	return block.GroupLayout(ns, int(group)-1), int(group) - 1, nil
}

// getResume reads what resuming t's prompt (by tokens, in a namespace with
// groups) at the hit rule's prefix needs, in one BatchGet: every full and
// indexer group's records of the prefix, each sliding group's window
// before its end, each state group's state at it, block by block, groups
// in order. Each is verified (key, tokens, parent, checksum); a record that
// fails or is missing ends the read at its block (a shorter prefix, never
// other bytes). With each, the blocks go to it as they arrive (valid during
// the call); otherwise they are returned.
func (c *Client) getResume(ctx context.Context, t *target, each func(Block) error) ([]Block, error) {
	if t.p.Parent != nil {
		return nil, fmt.Errorf("%w: a Get by Tokens of a namespace with groups reads the whole prompt: no Parent", ErrInvalid)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	req := &kvmeshv1.BatchGetRequest{Namespace: NamespaceProto(t.ns), Tokens: t.p.Tokens, ExtraKeys: extraKeysProto(t.p.Extra), Resume: true}
	stream, err := c.cache.BatchGet(ctx, req)
	if err != nil {
		return nil, callError("get", err)
	}
	var out []Block
	var cur Block
	var sum uint64
	want, inBlock := 0, false
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errStream, fmt.Sprintf(format, args...))
	}
	for {
		f, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if inBlock {
				return nil, bad("stream ended inside block %d group %d", cur.Index, cur.Group)
			}
			return out, nil
		}
		if err != nil {
			return nil, callError("get", err)
		}
		if !inBlock {
			i, g := int(f.GetIndex()), int(f.GetGroup())-1
			if i >= len(t.keys) || g < 0 || g >= t.ns.Groups.Len() {
				return nil, bad("a frame of block %d group %d", i, g)
			}
			key := prefixhash.GroupKey(t.keys[i], g)
			if string(f.GetKey()) != string(key[:]) {
				return nil, bad("block %d group %d: key %x, want %s", i, g, f.GetKey(), key)
			}
			cur = Block{Index: i, Group: g, Key: key, Found: f.GetFound()}
			if !cur.Found {
				continue // the node lost it since its lookup: the caller sees a shorter hit
			}
			copy(cur.Parent[:], f.GetParent())
			cur.Tokens, cur.Extra = f.GetTokens(), f.GetExtraKeys()
			if !t.holds(cur) {
				c.refused.Add(1)
				return nil, bad("block %d group %d does not hold the prompt's tokens", i, g)
			}
			want = block.GroupLayout(t.ns, g).PayloadLen(t.ns.BlockTokens)
			if f.GetPayloadLen() != uint64(want) {
				return nil, bad("block %d group %d: payload of %d bytes, the group's records hold %d", i, g, f.GetPayloadLen(), want)
			}
			cur.Payload, sum, inBlock = make([]byte, 0, want), f.GetPayloadChecksum(), true
		}
		if f.GetOffset() != uint64(len(cur.Payload)) || len(cur.Payload)+len(f.GetData()) > want {
			return nil, bad("block %d group %d: %d bytes at offset %d", cur.Index, cur.Group, len(f.GetData()), f.GetOffset())
		}
		cur.Payload = append(cur.Payload, f.GetData()...)
		if !f.GetLast() {
			continue
		}
		inBlock = false
		if len(cur.Payload) != want || xxhash.Sum64(cur.Payload) != sum {
			return nil, bad("block %d group %d: payload does not match its checksum", cur.Index, cur.Group)
		}
		if each != nil {
			if err := each(cur); err != nil {
				return nil, err
			}
			continue
		}
		out = append(out, cur)
	}
}
