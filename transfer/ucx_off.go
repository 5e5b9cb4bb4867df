//go:build !(ucx && linux && cgo)

package transfer

import "fmt"

// UCXBuilt reports whether this build has the UCX fabric (-tags ucx).
const UCXBuilt = false

// UCX is the UCX fabric; this build has none (see the ucx build tag).
type UCX struct{}

// NewUCX fails: this build has no UCX. The error wraps ErrNoFabric.
func NewUCX(*UCXOptions) (*UCX, error) {
	return nil, fmt.Errorf("%w: this kvmesh was built without UCX (build it with -tags ucx, on Linux with cgo and Debian's libucx-dev)", ErrNoFabric)
}

// Name returns "ucx".
func (*UCX) Name() string { return "ucx" }

// Info describes nothing: there is no UCX.
func (*UCX) Info() UCXInfo { return UCXInfo{} }

// Close does nothing.
func (*UCX) Close() error { return nil }

// Register fails: there is no UCX.
func (*UCX) Register([]byte) (Region, error) { return nil, ErrNoFabric }

// Connect fails: there is no UCX.
func (*UCX) Connect([]byte) (Remote, error) { return nil, ErrNoFabric }

var _ Fabric = (*UCX)(nil)
