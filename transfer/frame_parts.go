package transfer

// The item tables of the part frames (getPartReq, claimReq, claimResp); see
// frame.go for the wire format.

import (
	"encoding/binary"
	"fmt"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func putPartEntry(t []byte, i int, k prefixhash.Key, p block.Part) {
	e := t[i*partEntry:]
	copy(e, k[:])
	e = e[prefixhash.KeySize:]
	binary.LittleEndian.PutUint32(e[0:], uint32(p.L0))
	binary.LittleEndian.PutUint32(e[4:], uint32(p.L1))
	binary.LittleEndian.PutUint32(e[8:], uint32(p.H0))
	binary.LittleEndian.PutUint32(e[12:], uint32(p.H1))
}

// parsePartReq decodes a getPartReq or claimReq table into keys and parts.
// Any u32 is a part here; whether it is a valid part of its block is the
// server's check, item by item.
func parsePartReq(table []byte, keys []prefixhash.Key, parts []block.Part) {
	for i := range keys {
		e := table[i*partEntry:]
		copy(keys[i][:], e)
		e = e[prefixhash.KeySize:]
		parts[i] = block.Part{
			L0: int(binary.LittleEndian.Uint32(e[0:])), L1: int(binary.LittleEndian.Uint32(e[4:])),
			H0: int(binary.LittleEndian.Uint32(e[8:])), H1: int(binary.LittleEndian.Uint32(e[12:])),
		}
	}
}

// checkParts checks, before anything is sent, that parts has one range
// per key and that each fits the wire's u32 fields.
func checkParts(keys []prefixhash.Key, parts []block.Part) error {
	if len(parts) != len(keys) {
		return fmt.Errorf("transfer: %d keys and %d parts", len(keys), len(parts))
	}
	for i, p := range parts {
		for _, v := range [4]int{p.L0, p.L1, p.H0, p.H1} {
			if v < 0 || uint64(v) > 1<<32-1 {
				return fmt.Errorf("transfer: part %d (%s) does not fit the wire: %w", i, p, block.ErrBadPart)
			}
		}
	}
	return nil
}

func putClaimEntry(t []byte, i int, st block.ClaimStatus) { t[i*claimEntry] = byte(st) }

// parseClaimResp decodes a claimResp table into st.
func parseClaimResp(table []byte, st []block.ClaimStatus) error {
	for i := range st {
		e := table[i*claimEntry:]
		if e[0] > byte(block.ClaimClaimed) {
			return corrupt("claim status %d of item %d", e[0], i)
		}
		if e[1]|e[2]|e[3]|e[4]|e[5]|e[6]|e[7] != 0 {
			return corrupt("claim status %d has non-zero reserved bytes", i)
		}
		st[i] = block.ClaimStatus(e[0])
	}
	return nil
}
