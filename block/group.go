package block

import (
	"encoding/binary"
	"fmt"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Records of a namespace with groups (hybrid models; see the package doc
// and the byte layout in block.go): which group a header names, the
// group's payload layout, and what a store hangs a record from.

// GroupLayout returns the payload layout of group g's records of ns.
func GroupLayout(ns prefixhash.Namespace, g int) Layout {
	gr := ns.Groups.At(g)
	return Layout{DType: gr.DType, Layers: len(gr.Layers), KVHeads: gr.KVHeads, HeadDim: gr.HeadDim,
		KV: gr.Layout, LatentDim: gr.LatentDim, Scales: gr.Scales, StateBytes: gr.StateBytes}
}

// RecordLayout returns the payload layout of ns's records of group g:
// GroupLayout, or LayoutOf for a namespace without groups (g is then
// ignored).
func RecordLayout(ns prefixhash.Namespace, g int) Layout {
	if ns.Groups.IsZero() {
		return LayoutOf(ns)
	}
	return GroupLayout(ns, g)
}

// GroupRef names the group of a namespace with groups whose record of a
// block a header holds, with what a store needs to know of the group
// without knowing the namespace.
type GroupRef struct {
	// Set is false in a namespace without groups; the rest is then zero.
	Set bool
	// Index is the group's position in the namespace's groups.
	Index int
	Kind  prefixhash.GroupKind
	// Anchor is the group whose record of the same block a sliding or
	// state record hangs from in a store (Groups.Anchor), -1 when the
	// namespace has none or the record is a full or indexer one.
	Anchor int
	// WindowBlocks is a sliding group's window in blocks
	// (Group.WindowBlocks), 0 for other kinds.
	WindowBlocks int
}

// GroupRefOf returns the GroupRef of ns's records of group g; the zero
// GroupRef for a namespace without groups.
func GroupRefOf(ns prefixhash.Namespace, g int) GroupRef {
	if ns.Groups.IsZero() {
		return GroupRef{}
	}
	gr := ns.Groups.At(g)
	r := GroupRef{Set: true, Index: g, Kind: gr.Kind, Anchor: -1, WindowBlocks: gr.WindowBlocks(ns.BlockTokens)}
	if !gr.Kind.EveryBlock() {
		r.Anchor = ns.Groups.Anchor()
	}
	return r
}

// LinkParent returns the key of the record a store hangs this one from,
// so that dropping that one drops this one too, and recency keeps this
// one behind it (zero: none): the parent for a block of a namespace
// without groups; for a full or indexer group's record, the same group's
// record of the parent block; for a sliding or state record, the anchor's
// record of the same block (a window or a state is no use without the
// chain that leads to it), or none without an anchor.
func (h *Header) LinkParent() prefixhash.Key {
	switch {
	case !h.Group.Set:
		return h.Parent
	case h.Group.Kind.EveryBlock():
		return prefixhash.GroupKey(h.Parent, h.Group.Index)
	case h.Group.Anchor >= 0:
		return prefixhash.GroupKey(h.Chain, h.Group.Anchor)
	}
	return prefixhash.Key{}
}

// AppendGroupHeader is AppendPartHeaderExt for group g's record (or its
// part p) of a block of ns, a namespace with groups: payload is the group's
// (prefixhash.Group.RecordBytes, or the part's). The record is keyed
// prefixhash.GroupKey(k, g); the returned link is the block's own (k), which
// the next block chains from. A group ns does not have, or a state of
// another size than the group declares, is an error naming it.
func AppendGroupHeader(dst []byte, tenant uint64, ns prefixhash.Namespace, g int, parent prefixhash.Link, tokens []uint32, extra prefixhash.ExtraKeys, p Part, payload []byte) ([]byte, prefixhash.Link, error) {
	if ns.Groups.IsZero() {
		return dst, prefixhash.Link{}, fmt.Errorf("block: namespace %s has no groups (group %d)", ns, g)
	}
	if g < 0 || g >= ns.Groups.Len() {
		return dst, prefixhash.Link{}, fmt.Errorf("block: group %d: namespace %s has %d groups", g, ns, ns.Groups.Len())
	}
	return appendHeader(dst, tenant, ns, g, parent, tokens, extra, p, payload)
}

// EncodeGroup appends group g's whole encoded record (header and payload)
// of a block of ns to dst (AppendGroupHeader).
func EncodeGroup(dst []byte, tenant uint64, ns prefixhash.Namespace, g int, parent prefixhash.Link, tokens []uint32, extra prefixhash.ExtraKeys, payload []byte) ([]byte, prefixhash.Link, error) {
	if ns.Groups.IsZero() || g < 0 || g >= ns.Groups.Len() {
		return AppendGroupHeader(dst, tenant, ns, g, parent, tokens, extra, Part{}, payload)
	}
	dst, l, err := AppendGroupHeader(dst, tenant, ns, g, parent, tokens, extra, GroupLayout(ns, g).Whole(), payload)
	if err != nil {
		return dst, l, err
	}
	return append(dst, payload...), l, nil
}

// decodeGroup parses and checks the group fields (bytes 59 and 76-79):
// all zero without a group.
func (h *Header) decodeGroup(b []byte) error {
	g, kind, anchor := int(b[59]), int(b[76]), int(b[77])
	window := int(binary.LittleEndian.Uint16(b[78:]))
	if g == 0 {
		if kind != 0 || anchor != 0 || window != 0 {
			return corrupt("group fields set in a record of no group")
		}
		if h.Layout.KV == prefixhash.StateKV {
			return corrupt("a state layout outside a state group")
		}
		return nil
	}
	k := prefixhash.GroupKind(kind - 1)
	switch {
	case g > prefixhash.MaxGroups || anchor > prefixhash.MaxGroups:
		return corrupt("group %d, anchor %d: at most %d groups", g-1, anchor-1, prefixhash.MaxGroups)
	case kind == 0 || kind > int(prefixhash.GroupIndexer)+1:
		return corrupt("group kind %d", kind-1)
	case (k == prefixhash.GroupState) != (h.Layout.KV == prefixhash.StateKV):
		return corrupt("a %s group's record with the %s layout", k, h.Layout.KV)
	case (k == prefixhash.GroupSliding) != (window > 0):
		return corrupt("a %s group's record with a window of %d blocks", k, window)
	case k.EveryBlock() && anchor != 0:
		return corrupt("a %s group's record hanging from group %d", k, anchor-1)
	}
	h.Group = GroupRef{Set: true, Index: g - 1, Kind: k, Anchor: anchor - 1, WindowBlocks: window}
	return nil
}
