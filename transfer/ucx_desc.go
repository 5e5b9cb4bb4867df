package transfer

import (
	"encoding/binary"
	"fmt"
)

// ucxDesc is UCX's descriptor of a registered region (Region.Descriptor of
// the ucx build's fabric): what a reader needs to create an endpoint to the
// owner's worker and read the region with ucp_get_nbx. It is parsed here,
// in every build, so that it is fuzzed without UCX; what it carries is
// UCX's own encoding, opaque to kvmesh:
//
//	off  size  field
//	  0     8  the region's base address in the owner's process
//	  8     4  the owner's UCX version: major << 16 | minor << 8 | release
//	 12     4  length a of the worker address, 1 to maxUCXBlob
//	 16     4  length r of the packed remote key, 1 to maxUCXBlob
//	 20     4  zero
//	 24     a  the owner worker's address (ucp_worker_get_address)
//	24+a    r  the region's packed remote key (ucp_rkey_pack)
//
// UCX trusts the addresses and keys it unpacks: a worker address that does
// not parse fails an assertion and aborts the process. So a reader hands
// UCX only what an owner running the same UCX version packed: the window
// descriptor around this one is checksummed (fabric.go), and a version
// other than the reader's makes the peer a TCP peer.
type ucxDesc struct {
	base    uint64
	version uint32
	worker  []byte
	rkey    []byte
}

const ucxDescFixed = 24

const maxUCXBlob = 16 << 10

// ucxVersionString spells a version as ucxDesc carries it.
func ucxVersionString(v uint32) string {
	return fmt.Sprintf("%d.%d.%d", v>>16, v>>8&0xff, v&0xff)
}

func encodeUCXDesc(d ucxDesc) []byte {
	b := make([]byte, ucxDescFixed+len(d.worker)+len(d.rkey))
	binary.LittleEndian.PutUint64(b[0:], d.base)
	binary.LittleEndian.PutUint32(b[8:], d.version)
	binary.LittleEndian.PutUint32(b[12:], uint32(len(d.worker)))
	binary.LittleEndian.PutUint32(b[16:], uint32(len(d.rkey)))
	copy(b[ucxDescFixed:], d.worker)
	copy(b[ucxDescFixed+len(d.worker):], d.rkey)
	return b
}

// parseUCXDesc decodes a UCX descriptor; the slices it returns alias b.
func parseUCXDesc(b []byte) (ucxDesc, error) {
	if len(b) < ucxDescFixed {
		return ucxDesc{}, corrupt("UCX descriptor of %d bytes", len(b))
	}
	a, r := uint64(binary.LittleEndian.Uint32(b[12:])), uint64(binary.LittleEndian.Uint32(b[16:]))
	switch {
	case binary.LittleEndian.Uint32(b[20:]) != 0:
		return ucxDesc{}, corrupt("UCX descriptor reserved bytes are not zero")
	case a == 0 || a > maxUCXBlob:
		return ucxDesc{}, corrupt("UCX worker address of %d bytes", a)
	case r == 0 || r > maxUCXBlob:
		return ucxDesc{}, corrupt("UCX remote key of %d bytes", r)
	case ucxDescFixed+a+r != uint64(len(b)):
		return ucxDesc{}, corrupt("UCX descriptor of %d bytes holds %d", len(b), ucxDescFixed+a+r)
	}
	return ucxDesc{base: binary.LittleEndian.Uint64(b[0:]), version: binary.LittleEndian.Uint32(b[8:]),
		worker: b[ucxDescFixed : ucxDescFixed+a], rkey: b[ucxDescFixed+a:]}, nil
}
