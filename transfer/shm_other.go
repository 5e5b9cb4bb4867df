//go:build !linux

package transfer

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// ShmServer needs memfd and SCM_RIGHTS: Linux only.
type ShmServer struct{}

// NewShmServer returns ErrUnsupported off Linux.
func NewShmServer(Source, Sink, *ShmServerOptions, *slog.Logger) (*ShmServer, error) {
	return nil, fmt.Errorf("%w: shared memory needs Linux", ErrUnsupported)
}

// Listen returns ErrUnsupported.
func (*ShmServer) Listen(string) error { return ErrUnsupported }

// Stats returns zeros.
func (*ShmServer) Stats() Stats { return Stats{} }

// CloseRevoked disconnects nobody: there are no clients.
func (*ShmServer) CloseRevoked() int { return 0 }

// Close does nothing.
func (*ShmServer) Close() error { return nil }

// ShmClient needs Linux.
type ShmClient struct{}

// Shm is the shared-memory Transport; off Linux it dials nothing.
type Shm struct{ Options *ShmClientOptions }

// Name returns "shm".
func (Shm) Name() string { return "shm" }

// Dial returns ErrUnsupported.
func (Shm) Dial(context.Context, string) (Peer, error) { return nil, ErrUnsupported }

// DialShm returns ErrUnsupported off Linux.
func DialShm(context.Context, string, *ShmClientOptions) (*ShmClient, error) {
	return nil, fmt.Errorf("%w: shared memory needs Linux", ErrUnsupported)
}

// Get returns ErrUnsupported.
func (*ShmClient) Get(context.Context, []prefixhash.Key) (*Result, error) { return nil, ErrUnsupported }

// Put returns ErrUnsupported.
func (*ShmClient) Put(context.Context, []prefixhash.Key, [][]byte) ([]Status, error) {
	return nil, ErrUnsupported
}

// PutPublish returns ErrUnsupported.
func (*ShmClient) PutPublish(context.Context, []prefixhash.Key, []prefixhash.Key, [][]byte, [][]byte) ([]Status, error) {
	return nil, ErrUnsupported
}

// GetParts returns ErrUnsupported.
func (*ShmClient) GetParts(context.Context, []prefixhash.Key, []block.Part) (*Result, error) {
	return nil, ErrUnsupported
}

// Claim returns ErrUnsupported.
func (*ShmClient) Claim(context.Context, []prefixhash.Key, []block.Part) ([]block.ClaimStatus, error) {
	return nil, ErrUnsupported
}

// Close does nothing.
func (*ShmClient) Close() error { return nil }

// InPlace reports false: nothing is shared off Linux.
func (*ShmClient) InPlace() bool { return false }

func (*ShmClient) release(*Result) {}
