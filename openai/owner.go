package openai

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// A queued batch's id names the node that accepted it, the only node that
// stores it: "batch_" + 24 random hex digits + "_" + the 16 hex digits of
// xxhash64 of that node's id (ownerTag). A node or router asked for a batch
// it does not hold sends the request to that node alone, rather than
// asking every node in turn (issue 35: that cost a request N/2 calls on
// average, and N-1 for an unknown id). Ids without the tag, stored before
// it (`batch_` + 24 hex digits), are still asked of every node.

// ownerTag is the tag that names a node in the ids of the batches it
// accepts: the id is hashed, so a tag has a fixed length whatever the
// node's id holds.
func ownerTag(nodeID string) string {
	return fmt.Sprintf("%016x", xxhash.Sum64String(nodeID))
}

// batchTag returns the owner tag of a batch id; false for an id that names
// no owner (an id of an older node, or one no node made).
func batchTag(id string) (string, bool) {
	rest, ok := strings.CutPrefix(id, "batch_")
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '_')
	if i < 0 || len(rest)-i-1 != 16 {
		return "", false
	}
	tag := rest[i+1:]
	if _, err := hex.DecodeString(tag); err != nil || tag != strings.ToLower(tag) {
		return "", false
	}
	return tag, true
}

// OwnsBatch reports whether the batch id names an owner (named) and
// whether that owner is the node nodeID (owns). A router or node asks a
// named owner alone for the batch; an id that names none must be asked of
// every node.
func OwnsBatch(nodeID, id string) (owns, named bool) {
	tag, ok := batchTag(id)
	if !ok {
		return false, false
	}
	return tag == ownerTag(nodeID), true
}
