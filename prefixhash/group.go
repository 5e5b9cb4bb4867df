package prefixhash

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// GroupKind is what one group of a hybrid model's cache holds, and so what
// a reader needs of it to resume a prompt. The numeric values are part of
// the canonical namespace encoding: never renumber them.
type GroupKind uint8

const (
	// GroupFull is full attention: every block of a prefix is needed.
	GroupFull GroupKind = iota
	// GroupSliding is sliding-window attention over the last Window
	// tokens: only the blocks that cover the last Window tokens before the
	// resume point are needed.
	GroupSliding
	// GroupState is a fixed-size recurrent state (linear attention,
	// state-space layers): only the state at the resume point is needed.
	// Its record for block i is the state after the last token of block i.
	GroupState
	// GroupIndexer is a per-token side cache every prefix needs, like the
	// lightning indexer's keys of DeepSeek's sparse attention: every block
	// of a prefix is needed, as for GroupFull.
	GroupIndexer
	numKinds
)

var kindNames = [...]string{"full", "sliding", "state", "indexer"}

// String returns the kind's canonical name ("full", "sliding", "state",
// "indexer").
func (k GroupKind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ParseGroupKind parses a canonical kind name as returned by String.
func ParseGroupKind(s string) (GroupKind, error) {
	for i, n := range kindNames {
		if strings.EqualFold(s, n) {
			return GroupKind(i), nil
		}
	}
	return 0, fmt.Errorf("prefixhash: unknown group kind %q (want one of %s)", s, strings.Join(kindNames[:], ", "))
}

// EveryBlock reports whether a prefix needs every block of the group
// (full attention and indexers), rather than its trailing ones.
func (k GroupKind) EveryBlock() bool { return k == GroupFull || k == GroupIndexer }

// Limits on groups.
const (
	// MaxGroups bounds the groups of a namespace; block headers name a
	// group in one byte.
	MaxGroups = 32
	// MaxWindowBlocks bounds a sliding group's window in blocks
	// (⌈Window/BlockTokens⌉): block headers carry it in 16 bits.
	MaxWindowBlocks = 1<<16 - 1
	// MaxStateBytes bounds one head's state in one layer.
	MaxStateBytes = 1 << 30
)

// A Group is one part of a hybrid model's cache: the layers of one kind,
// with one layout. A namespace with groups (Namespace.Groups) stores, for
// block i of a prompt, one record per group under GroupKey(k_i, g), holding
// that group's layers only.
type Group struct {
	// Kind says what a prefix needs of the group.
	Kind GroupKind
	// Window is the sliding window in tokens (GroupSliding only, where it
	// is required).
	Window int
	// Layers are the model's layers the group holds (indexes into
	// [0, Namespace.Layers)), ascending and distinct; no layer is in two
	// groups. A record's payload holds them in this order.
	Layers []int
	// Layout is SplitKV or LatentKV for attention and indexer groups,
	// StateKV for state groups (and only there).
	Layout KVLayout
	// DType is the element type of the group's tensors. Required.
	DType DType
	// KVHeads and HeadDim size a split group (required there). KVHeads is
	// also the number of heads a state is split into for tensor
	// parallelism (at least 1) in a state group.
	KVHeads, HeadDim int
	// LatentDim sizes a latent group (required there).
	LatentDim int
	// StateBytes is the size of one head's state in one layer (StateKV
	// only, where it is required; a multiple of the dtype's size).
	StateBytes int
	// Scales as Namespace.Scales, per group (not with StateKV).
	Scales Scales
}

// asNamespace returns g as a namespace of its own, for the rules and sizes the
// two share.
func (g Group) asNamespace() Namespace {
	return Namespace{DType: g.DType, Layers: len(g.Layers), KVHeads: g.KVHeads, HeadDim: g.HeadDim,
		Layout: g.Layout, LatentDim: g.LatentDim, Scales: g.Scales}
}

// RecordBytes returns the payload size of one whole record of the group
// for blocks of blockTokens tokens: its KV bytes and scales as a
// namespace's (BlockBytes), or layers × heads × StateBytes for a state.
func (g Group) RecordBytes(blockTokens int) int {
	if g.Layout == StateKV {
		return len(g.Layers) * g.KVHeads * g.StateBytes
	}
	ns := g.asNamespace()
	ns.BlockTokens = blockTokens
	return ns.BlockBytes()
}

// WindowBlocks returns the blocks that cover the window of a sliding group
// for blocks of blockTokens tokens: ⌈Window/blockTokens⌉; 0 for other kinds.
func (g Group) WindowBlocks(blockTokens int) int {
	if g.Kind != GroupSliding || blockTokens < 1 {
		return 0
	}
	return (g.Window + blockTokens - 1) / blockTokens
}

// Groups is a namespace's list of groups, held in its canonical encoding so
// that a Namespace stays a comparable value. The zero value is no groups.
// Build one with NewGroups; read it with Len and At.
type Groups struct{ enc string }

// NewGroups returns the groups gs in order. It checks only what the
// encoding needs (the count, the layer lists' size); Namespace.Validate
// checks the rest.
func NewGroups(gs ...Group) (Groups, error) {
	if len(gs) == 0 {
		return Groups{}, nil
	}
	if len(gs) > MaxGroups {
		return Groups{}, fmt.Errorf("%w: groups: %d groups, the limit is %d", ErrInvalidNamespace, len(gs), MaxGroups)
	}
	b := []byte{byte(len(gs))}
	for i, g := range gs {
		if len(g.Layers) > MaxLayers {
			return Groups{}, fmt.Errorf("%w: groups[%d].layers: %d layers, the limit is %d", ErrInvalidNamespace, i, len(g.Layers), MaxLayers)
		}
		b = appendGroup(b, g)
	}
	return Groups{enc: string(b)}, nil
}

// MustGroups is NewGroups that panics on an error: for groups written in
// the program.
func MustGroups(gs ...Group) Groups {
	g, err := NewGroups(gs...)
	if err != nil {
		panic(err)
	}
	return g
}

// appendGroup appends the canonical encoding of one group: u8 kind ‖ u32
// window ‖ u8 layout ‖ u8 dtype ‖ u8 scales ‖ u32 kv_heads ‖ u32 head_dim ‖
// u32 latent_dim ‖ u32 state_bytes ‖ u32 layer count ‖ u32 per layer.
func appendGroup(b []byte, g Group) []byte {
	b = append(b, byte(g.Kind))
	b = binary.LittleEndian.AppendUint32(b, uint32(g.Window))
	b = append(b, byte(g.Layout), byte(g.DType), byte(g.Scales))
	for _, v := range [...]int{g.KVHeads, g.HeadDim, g.LatentDim, g.StateBytes, len(g.Layers)} {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	for _, l := range g.Layers {
		b = binary.LittleEndian.AppendUint32(b, uint32(l))
	}
	return b
}

const groupFixedLen = 1 + 4 + 3 + 5*4

// Len returns the number of groups.
func (gs Groups) Len() int {
	if gs.enc == "" {
		return 0
	}
	return int(gs.enc[0])
}

// IsZero reports whether there are no groups.
func (gs Groups) IsZero() bool { return gs.enc == "" }

// At returns group i (0 ≤ i < Len). Its Layers are a fresh slice.
func (gs Groups) At(i int) Group {
	if i < 0 || i >= gs.Len() {
		panic(fmt.Sprintf("prefixhash: group %d of %d", i, gs.Len()))
	}
	off := 1
	for ; i > 0; i-- {
		off += groupFixedLen + 4*u32At(gs.enc, off+groupFixedLen-4)
	}
	return gs.decode(off)
}

func (gs Groups) decode(off int) Group {
	s := gs.enc[off:]
	u32 := func(at int) int { return u32At(s, at) }
	g := Group{Kind: GroupKind(s[0]), Window: u32(1), Layout: KVLayout(s[5]), DType: DType(s[6]), Scales: Scales(s[7]),
		KVHeads: u32(8), HeadDim: u32(12), LatentDim: u32(16), StateBytes: u32(20)}
	n := u32(24)
	g.Layers = make([]int, n)
	for j := range g.Layers {
		g.Layers[j] = u32(groupFixedLen + 4*j)
	}
	return g
}

// u32At reads the little-endian uint32 at s[at:].
func u32At(s string, at int) int {
	return int(uint32(s[at]) | uint32(s[at+1])<<8 | uint32(s[at+2])<<16 | uint32(s[at+3])<<24)
}

// All returns every group, in order.
func (gs Groups) All() []Group {
	out := make([]Group, gs.Len())
	off := 1
	for i := range out {
		out[i] = gs.decode(off)
		off += groupFixedLen + 4*len(out[i].Layers)
	}
	return out
}

// String lists the groups briefly: kind, window, layer count and layout.
func (gs Groups) String() string {
	var parts []string
	for _, g := range gs.All() {
		s := g.Kind.String()
		if g.Kind == GroupSliding {
			s += fmt.Sprintf("(%d)", g.Window)
		}
		s += fmt.Sprintf(":%dl:%s", len(g.Layers), g.Layout)
		parts = append(parts, s)
	}
	return strings.Join(parts, ",")
}

// Anchor returns the group whose records the others' hang from in a store
// (the first full group, else the first indexer; -1 if there is none): a
// sliding block or a state is of no use without the full chain before it,
// so a store drops them with the anchor's record of their block.
func (gs Groups) Anchor() int {
	all := gs.All()
	for _, k := range [...]GroupKind{GroupFull, GroupIndexer} {
		for i, g := range all {
			if g.Kind == k {
				return i
			}
		}
	}
	return -1
}

// validateGroups checks ns's groups against ns: the error names the field
// (groups[i].window, ...).
func (ns Namespace) validateGroups(bad func(field, format string, args ...any) error) error {
	if ns.Groups.IsZero() {
		return nil
	}
	switch {
	case ns.KVHeads != 0 || ns.HeadDim != 0 || ns.LatentDim != 0 || ns.Layout != SplitKV:
		return bad("kv_heads", "the namespace's own KV shape (kv_heads %d, head_dim %d, kv_layout %s, latent_dim %d) must be unset with groups: each group has its own",
			ns.KVHeads, ns.HeadDim, ns.Layout, ns.LatentDim)
	case ns.Scales != NoScales:
		return bad("scales", "set on a namespace with groups: each group has its own")
	}
	owner := make(map[int]int) // layer → the attention or state group holding it
	idx := make(map[int]int)   // layer → the indexer holding it
	all := ns.Groups.All()
	for i, g := range all {
		f := func(name string) string { return fmt.Sprintf("groups[%d].%s", i, name) }
		switch {
		case g.Kind >= numKinds:
			return bad(f("kind"), "unknown kind %d (want full, sliding, state or indexer)", uint8(g.Kind))
		case g.Kind == GroupSliding && g.Window < 1:
			return bad(f("window"), "%d: a sliding group's window is at least 1 token", g.Window)
		case g.Kind == GroupSliding && g.WindowBlocks(ns.BlockTokens) > MaxWindowBlocks:
			return bad(f("window"), "%d tokens is %d blocks of %d, the limit is %d blocks", g.Window, g.WindowBlocks(ns.BlockTokens), ns.BlockTokens, MaxWindowBlocks)
		case g.Kind != GroupSliding && g.Window != 0:
			return bad(f("window"), "%d set on a %s group (only sliding groups have a window)", g.Window, g.Kind)
		case len(g.Layers) == 0:
			return bad(f("layers"), "a group holds at least one layer")
		case g.DType == DTypeInvalid || g.DType.Size() == 0:
			return bad(f("dtype"), "unknown dtype %d", uint8(g.DType))
		case g.Kind == GroupState && g.Layout != StateKV:
			return bad(f("kv_layout"), "a state group's layout is state, not %s", g.Layout)
		case g.Kind != GroupState && g.Layout == StateKV:
			return bad(f("kv_layout"), "the state layout on a %s group (only state groups have it)", g.Kind)
		}
		for j, l := range g.Layers {
			switch {
			case l < 0 || l >= ns.Layers:
				return bad(f("layers"), "layer %d is outside the model's [0,%d)", l, ns.Layers)
			case j > 0 && l <= g.Layers[j-1]:
				return bad(f("layers"), "layers must ascend without repeats (%d after %d)", l, g.Layers[j-1])
			}
			// An indexer caches a side tensor of layers that also have
			// attention (DeepSeek's sparse attention): it may share a full
			// group's layers, never another indexer's or any other group's.
			mine, other := owner, idx
			if g.Kind == GroupIndexer {
				mine, other = idx, owner
			}
			if o, ok := mine[l]; ok {
				return bad(f("layers"), "layer %d is already in groups[%d]: groups' layers must not overlap", l, o)
			}
			mine[l] = i
			if o, ok := other[l]; ok && all[o].Kind != GroupFull && g.Kind != GroupFull {
				return bad(f("layers"), "layer %d is already in groups[%d]: only an indexer and a full group may share layers", l, o)
			}
		}
		if g.Layout == StateKV {
			switch {
			case g.KVHeads < 1 || g.KVHeads > 1<<20:
				return bad(f("kv_heads"), "%d: a state is split into 1..%d heads", g.KVHeads, 1<<20)
			case g.StateBytes < 1 || g.StateBytes > MaxStateBytes:
				return bad(f("state_bytes"), "%d is outside 1..%d", g.StateBytes, MaxStateBytes)
			case g.StateBytes%g.DType.Size() != 0:
				return bad(f("state_bytes"), "%d is not a whole number of %s elements", g.StateBytes, g.DType)
			case g.HeadDim != 0 || g.LatentDim != 0 || g.Scales != NoScales:
				return bad(f("head_dim"), "head_dim, latent_dim and scales are unset in a state group (state_bytes sizes it)")
			}
			continue
		}
		if g.StateBytes != 0 {
			return bad(f("state_bytes"), "%d set on a %s group (only state groups have it)", g.StateBytes, g.Kind)
		}
		if err := g.asNamespace().validateShape(bad, f("")); err != nil {
			return err
		}
	}
	return nil
}

// groupMasks[g] is M_g: zero for group 0, trunc128(SHA-256("kvmesh/group/v1"
// ‖ u32 g)) for the others.
var groupMasks = func() (m [MaxGroups]Key) {
	for g := 1; g < len(m); g++ {
		msg := binary.LittleEndian.AppendUint32([]byte("kvmesh/group/v1"), uint32(g))
		sum := sha256.Sum256(msg)
		m[g] = Key(sum[:KeySize])
	}
	return m
}()

// GroupKey returns the key group g's record of the block with chain key k
// is stored under: k XOR M_g, with M_0 = 0 and, for g > 0, M_g =
// trunc128(SHA-256("kvmesh/group/v1" ‖ u32 g)). The chain stays one per
// prompt (k_i is a prompt's key as in a namespace without groups); each
// group's record of block i lives under GroupKey(k_i, g), so a reader that
// knows the chain knows every group's keys at the cost of an XOR, and
// GroupKey(GroupKey(k, g), g) = k. Group 0's records live under the chain
// keys themselves: with the full-attention group first (Groups.Anchor 0),
// looking up its prefix is exactly a plain namespace's lookup.
//
// Finding two (k, g) ≠ (k', g') with equal GroupKeys means finding two
// chain keys whose XOR is M_g XOR M_g' (nonzero for g ≠ g'), as hard as a
// collision of the truncated SHA-256; and k commits to the namespace, whose
// encoding holds the groups, so no namespace without groups shares a key
// with one that has them.
func GroupKey(k Key, g int) Key {
	m := &groupMasks[g]
	binary.LittleEndian.PutUint64(k[:8], binary.LittleEndian.Uint64(k[:8])^binary.LittleEndian.Uint64(m[:8]))
	binary.LittleEndian.PutUint64(k[8:], binary.LittleEndian.Uint64(k[8:])^binary.LittleEndian.Uint64(m[8:]))
	return k
}

// GroupKeys returns GroupKey(chain[i], g) for every key of chain, appended
// to dst.
func GroupKeys(dst []Key, chain []Key, g int) []Key {
	m := &groupMasks[g]
	lo, hi := binary.LittleEndian.Uint64(m[:8]), binary.LittleEndian.Uint64(m[8:])
	n := len(dst)
	dst = slices.Grow(dst, len(chain))[:n+len(chain)]
	for i, k := range chain {
		o := &dst[n+i]
		binary.LittleEndian.PutUint64(o[:8], binary.LittleEndian.Uint64(k[:8])^lo)
		binary.LittleEndian.PutUint64(o[8:], binary.LittleEndian.Uint64(k[8:])^hi)
	}
	return dst
}

// groupJSON is a group in JSON, as testdata/groups.json and the command
// line's --groups write it.
type groupJSON struct {
	Kind       string `json:"kind"`
	Window     int    `json:"window,omitempty"`
	Layers     []int  `json:"layers"`
	Layout     string `json:"kv_layout,omitempty"`
	DType      string `json:"dtype,omitempty"`
	KVHeads    int    `json:"kv_heads,omitempty"`
	HeadDim    int    `json:"head_dim,omitempty"`
	LatentDim  int    `json:"latent_dim,omitempty"`
	StateBytes int    `json:"state_bytes,omitempty"`
	Scales     string `json:"scales,omitempty"`
}

// ParseGroupsJSON parses groups written as a JSON list of objects with the
// fields kind, window, layers, kv_layout (default split; state for a state
// group), dtype (default dtype), kv_heads (a state's default 1), head_dim,
// latent_dim, state_bytes and scales:
//
//	[{"kind":"full","layers":[5],"kv_heads":8,"head_dim":128},
//	 {"kind":"sliding","window":1024,"layers":[0,1,2,3,4],"kv_heads":8,"head_dim":128}]
//
// Namespace.Validate checks the groups with the rest.
func ParseGroupsJSON(b []byte, dtype DType) (Groups, error) {
	var in []groupJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return Groups{}, fmt.Errorf("%w: groups: %w", ErrInvalidNamespace, err)
	}
	gs := make([]Group, len(in))
	for i, j := range in {
		g := Group{Window: j.Window, Layers: j.Layers, DType: dtype, KVHeads: j.KVHeads, HeadDim: j.HeadDim,
			LatentDim: j.LatentDim, StateBytes: j.StateBytes}
		var err error
		if g.Kind, err = ParseGroupKind(j.Kind); err != nil {
			return Groups{}, fmt.Errorf("%w: groups[%d].kind: %w", ErrInvalidNamespace, i, err)
		}
		switch {
		case j.Layout != "":
			g.Layout, err = ParseKVLayout(j.Layout)
		case g.Kind == GroupState:
			g.Layout = StateKV
		}
		if err != nil {
			return Groups{}, fmt.Errorf("%w: groups[%d].kv_layout: %w", ErrInvalidNamespace, i, err)
		}
		if j.DType != "" {
			if g.DType, err = ParseDType(j.DType); err != nil {
				return Groups{}, fmt.Errorf("%w: groups[%d].dtype: %w", ErrInvalidNamespace, i, err)
			}
		}
		if j.Scales != "" {
			if g.Scales, err = ParseScales(j.Scales); err != nil {
				return Groups{}, fmt.Errorf("%w: groups[%d].scales: %w", ErrInvalidNamespace, i, err)
			}
		}
		if g.Kind == GroupState && g.KVHeads == 0 {
			g.KVHeads = 1
		}
		gs[i] = g
	}
	return NewGroups(gs...)
}
