// Package chartcheck checks the deployment files offline, in CI: the Helm
// chart in deploy/helm/kvmesh renders for each documented set of values
// and passes helm's linter, and every object it renders, and every plain
// manifest in deploy/kubernetes, decodes strictly (unknown fields refused)
// into the Kubernetes API types: the check kubeconform makes against the
// OpenAPI schemas, made against the Go types those schemas come from.
//
// Package packages the chart for a release (deploy/release.sh, through
// cmd/chartpack), and the tests check what release.sh runs and that the
// chart's default image is the one it builds.
//
// It is a module of its own so that Helm and the Kubernetes libraries stay
// out of kvmesh's go.mod: cd deploy/chartcheck && go test ./...
package chartcheck
