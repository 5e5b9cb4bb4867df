package lint

import (
	"strings"
	"testing"
)

// TestNoBackEdges fails when a package depends on another for want of a
// small type that belongs lower down (docs/ARCHITECTURE.md): gpu names its
// device type from gpu/gpumem (tiers.Device is an alias of it), not from
// tiers; store takes the claim answers from block (block.ClaimStatus), not
// from the wire package transfer.
func TestNoBackEdges(t *testing.T) {
	for _, c := range []struct{ pkg, above string }{
		{"gpu", "tiers"},
		{"store", "transfer"},
	} {
		for _, dep := range deps(t, c.pkg) {
			if dep == module+c.above || strings.HasPrefix(dep, module+c.above+"/") {
				t.Errorf("%s depends on %s: a back-edge", c.pkg, dep)
			}
		}
	}
}
