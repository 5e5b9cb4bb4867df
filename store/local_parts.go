package store

import (
	"context"
	"errors"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// SKELETON (issue 23): the API the other packages build against. The
// store helper replaces this file with the implementation.

// ErrPartConflict: a part overlaps cells already stored with different bytes.
var ErrPartConflict = errors.New("store: part conflicts with the stored part it overlaps")

// ClaimStatus is the answer to Claim.
type ClaimStatus uint8

const (
	ClaimWrite    ClaimStatus = iota // send it: the caller holds a claim
	ClaimComplete                    // the block is complete
	ClaimCovered                     // stored parts cover the range
	ClaimClaimed                     // another writer holds an open claim
)

// Claim asks whether part p of key's block still needs to be sent.
func (l *Local) Claim(ctx context.Context, key prefixhash.Key, p block.Part) (ClaimStatus, error) {
	return ClaimWrite, errors.New("store: claims not implemented yet")
}

// PartialInfo describes an incomplete block.
type PartialInfo struct {
	Key       prefixhash.Key
	Namespace uint64
	Tokens    int
	Parts     []block.Part // the covered ranges
	Age       time.Duration
	Bytes     int
}

// Partials lists the incomplete blocks.
func (l *Local) Partials() []PartialInfo { return nil }
