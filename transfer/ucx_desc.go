package transfer

import (
	"encoding/binary"
)

// ucxDesc is UCX's descriptor of a registered region (Region.Descriptor of
// the ucx build's fabric): what a reader needs to create an endpoint to the
// owner's worker and read the region with ucp_get_nbx. It is parsed here,
// in every build, so that it is fuzzed without UCX; what it carries is
// UCX's own encoding, opaque to kvmesh:
//
//	off  size  field
//	  0     8  the region's base address in the owner's process
//	  8     4  length a of the worker address, 1 to maxUCXBlob
//	 12     4  length r of the packed remote key, 1 to maxUCXBlob
//	 16     a  the owner worker's address (ucp_worker_get_address)
//	16+a    r  the region's packed remote key (ucp_rkey_pack)
//
// The window descriptor around it is checksummed (fabric.go), so a blob
// that reaches UCX is one an owner packed: UCX trusts the keys it unpacks.
type ucxDesc struct {
	base   uint64
	worker []byte
	rkey   []byte
}

const maxUCXBlob = 16 << 10

func encodeUCXDesc(d ucxDesc) []byte {
	b := make([]byte, 16+len(d.worker)+len(d.rkey))
	binary.LittleEndian.PutUint64(b[0:], d.base)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(d.worker)))
	binary.LittleEndian.PutUint32(b[12:], uint32(len(d.rkey)))
	copy(b[16:], d.worker)
	copy(b[16+len(d.worker):], d.rkey)
	return b
}

// parseUCXDesc decodes a UCX descriptor; the slices it returns alias b.
func parseUCXDesc(b []byte) (ucxDesc, error) {
	if len(b) < 16 {
		return ucxDesc{}, corrupt("UCX descriptor of %d bytes", len(b))
	}
	a, r := uint64(binary.LittleEndian.Uint32(b[8:])), uint64(binary.LittleEndian.Uint32(b[12:]))
	switch {
	case a == 0 || a > maxUCXBlob:
		return ucxDesc{}, corrupt("UCX worker address of %d bytes", a)
	case r == 0 || r > maxUCXBlob:
		return ucxDesc{}, corrupt("UCX remote key of %d bytes", r)
	case 16+a+r != uint64(len(b)):
		return ucxDesc{}, corrupt("UCX descriptor of %d bytes holds %d", len(b), 16+a+r)
	}
	return ucxDesc{base: binary.LittleEndian.Uint64(b[0:]), worker: b[16 : 16+a], rkey: b[16+a:]}, nil
}
