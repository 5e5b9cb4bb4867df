package block

import "fmt"

// ClaimStatus is what a store answers a writer that asks whether a part of
// a block still needs sending (a claim): several parallel ranks that hold
// the same part (the latent of an MLA model, replicated KV heads) ask
// first, so that its bytes cross once. The data plane carries it as one
// byte (package transfer's claim frames).
type ClaimStatus uint8

const (
	// ClaimWrite: send the part; the caller now holds a claim on its
	// range for a while (the store's ClaimTTL), so that other writers of
	// the same range are told ClaimClaimed.
	ClaimWrite ClaimStatus = iota
	// ClaimComplete: the block is complete; nothing to send.
	ClaimComplete
	// ClaimCovered: stored parts cover the range; nothing to send.
	ClaimCovered
	// ClaimClaimed: another writer holds an open claim on an overlapping
	// range; nothing to send unless that claim runs out.
	ClaimClaimed
)

// ClaimStatuses is the number of claim statuses, for counters indexed by
// them.
const ClaimStatuses = 4

func (s ClaimStatus) String() string {
	switch s {
	case ClaimWrite:
		return "write"
	case ClaimComplete:
		return "complete"
	case ClaimCovered:
		return "covered"
	case ClaimClaimed:
		return "claimed"
	}
	return fmt.Sprintf("claim(%d)", uint8(s))
}
